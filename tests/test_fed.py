"""Fed-α-NormEC and FedAvg: reductions to the single-step methods, local steps by hand, participation."""

import pytest
import torch

from normfl.algorithms import DPSGDNorm, FedAvg, FedNormEC, NormEC, memory
from normfl.ops import bernoulli_weights, cohort_weights, norm_alpha
from normfl.privacy import Privacy
from tests.helpers import Quadratic

NOPRIV = Privacy()
F64 = torch.float64


def trajectory(algo, clients, x, rounds, n):
    algo.setup(x, n, rounds, NOPRIV, seed=0)
    out = []
    for k in range(rounds):
        x, _ = algo.round(k, x, clients)
        out.append(x)
    return torch.stack(out)


@pytest.mark.parametrize("sn", [False, True])
def test_fed_normec_with_full_participation_is_normec(sn):
    centers = torch.randn(4, 10, generator=torch.Generator().manual_seed(0), dtype=F64)
    x0 = torch.zeros(10, dtype=F64)
    fed = trajectory(FedNormEC(0.05, 0.2, 0.01, p=1.0, server_norm=sn), Quadratic(centers, 0.5, seed=3), x0, 30, 4)
    ref = trajectory(NormEC(0.05, 0.2, 0.01, server_norm=sn), Quadratic(centers, 0.5, seed=3), x0, 30, 4)
    torch.testing.assert_close(fed, ref, rtol=0, atol=1e-14)


def test_local_gd_steps_match_hand_computation():
    """T = 3 local GD steps of size γ/T with full local gradients, p = 1, η = 0.5, no SN."""
    centers = torch.tensor([[1.0, -2.0], [3.0, 0.5]], dtype=F64)
    gamma, beta, alpha, T, eta = 0.3, 0.4, 0.1, 3, 0.5
    algo = FedNormEC(gamma, beta, alpha, eta=eta, p=1.0, local_steps=T)
    x0 = torch.tensor([0.5, 0.5], dtype=F64)
    got = trajectory(algo, Quadratic(centers), x0, 2, 2)
    x, v, vhat = x0.clone(), torch.zeros(2, 2, dtype=F64), torch.zeros(2, dtype=F64)
    for k in range(2):
        xs = x.expand(2, 2).clone()
        for _ in range(T):
            xs = xs - (gamma / T) * (xs - centers)
        u = (x - xs) / gamma
        d = torch.stack([(u[i] - v[i]) / (alpha + torch.linalg.norm(u[i] - v[i])) for i in range(2)])
        v = v + beta * d
        vhat = vhat + beta * d.mean(0)
        x = x - eta * vhat
        torch.testing.assert_close(got[k], x)


class SampleQuadratic:
    """f_{i,j}(x) = ½||x - c_ij||²; a cyclic pass visits samples j = 0..N-1 in order, b at a time."""

    def __init__(self, c):
        self.c = c                                           # [n, N, d]

    def cyclic_pass(self, b):
        N = self.c.shape[1]
        return [[[(slice(s, s + b), None, min(b, N - s) / N)] for _ in range(len(self.c))] for s in range(0, N, b)]

    def grads(self, x, batches=None):
        """Each piece's gradient times its weight, as ``ClientEngine.grads`` gives it."""
        w = torch.tensor([b[0][2] for b in batches], dtype=x.dtype)
        G = torch.stack([x[i] - self.c[i, batches[i][0][0]].mean(0) for i in range(len(self.c))])
        return w[:, None] * G, w * 0.5 * (G ** 2).sum(1)


@pytest.mark.parametrize("b", [1, 2])
def test_incremental_gradient_pass_matches_hand_computation(b):
    c = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(1), dtype=F64)
    gamma = 0.2
    algo = FedNormEC(gamma, 0.5, 0.01, p=1.0, local_operator="ig", ig_batch_size=b, server_norm=True)
    x0 = torch.zeros(3, dtype=F64)
    got = trajectory(algo, SampleQuadratic(c), x0, 1, 2)[0]
    xs = x0.expand(2, 3).clone()
    for s in range(0, 4, b):                                 # N/b steps of size γ b / N
        xs = xs - gamma * (b / 4) * (xs - c[:, s:s + b].mean(1))
    d = norm_alpha((x0 - xs) / gamma, 0.01)
    vhat = 0.5 * d.mean(0)
    torch.testing.assert_close(got, x0 - gamma * vhat / torch.linalg.norm(vhat))


def test_participation_weight_is_unbiased():
    """E[q_i] = 1: the mean of 1/p-weighted Bernoulli(p) draws over 20,000 rounds of 10 clients.
    Var q = (1-p)/p, so the mean's std is sqrt(3/200000) = 0.0039 at p = 0.25; tolerance 0.02 (5 std)."""
    q = torch.stack([bernoulli_weights(10, 0.25, seed=7, round_=k) for k in range(20_000)])
    assert set(q.unique().tolist()) == {0.0, 4.0}
    assert abs(q.mean().item() - 1.0) < 0.02
    assert abs((q > 0).float().mean().item() - 0.25) < 0.005
    c = torch.stack([cohort_weights(10, 3, seed=7, round_=k) for k in range(2000)])
    assert ((c > 0).sum(1) == 3).all() and abs(c.mean().item() - 1.0) < 1e-6


@pytest.mark.slow
def test_server_increment_is_unbiased_under_partial_participation():
    """FEDNORMEC Alg. 1 lines 6-11 (reading A7): averaged over draws of q, v̂^{k+1} - v̂^k = (β/M) Σ_i Δ_i^k."""
    centers = torch.randn(8, 5, generator=torch.Generator().manual_seed(2), dtype=F64)
    incs = []
    for k in range(4000):
        algo = FedNormEC(0.1, 0.5, 0.01, p=0.5)
        algo.setup(torch.zeros(5, dtype=F64), 8, 1, NOPRIV, seed=k)
        algo.round(0, torch.zeros(5, dtype=F64), Quadratic(centers))
        incs.append(algo.vhat.clone())
    expected = 0.5 * norm_alpha(-centers, 0.01).mean(0)
    torch.testing.assert_close(torch.stack(incs).mean(0), expected, atol=0.01, rtol=0)


def test_memory_updates_all_clients_but_only_participants_upload():
    centers = torch.randn(6, 4, generator=torch.Generator().manual_seed(3), dtype=F64)
    algo = FedNormEC(0.1, 0.5, 0.01, p=0.5)
    algo.setup(torch.zeros(4, dtype=F64), 6, 1, NOPRIV, seed=11)
    _, info = algo.round(0, torch.zeros(4, dtype=F64), Quadratic(centers))
    q = bernoulli_weights(6, 0.5, seed=11, round_=0)
    assert info["uploads"] == int((q > 0).sum()) and 0 < info["uploads"] < 6
    assert (algo.v[None].norm(dim=1) > 0).all()                    # every client's memory moved
    only = FedNormEC(0.1, 0.5, 0.01, p=0.5, memory_update="participants_only")
    only.setup(torch.zeros(4, dtype=F64), 6, 1, NOPRIV, seed=11)
    only.round(0, torch.zeros(4, dtype=F64), Quadratic(centers))
    assert torch.equal(only.v[None].norm(dim=1) > 0, q > 0)


def test_fedavg_without_memory_and_noise_is_dpsgd_with_smoothed_normalization():
    """FEDNORMEC App. D.1 (reading A9): FedAvg (β Norm_α, p = 1, T = 1, σ = 0) equals DP-SGD-norm at step γ."""
    centers = torch.randn(5, 7, generator=torch.Generator().manual_seed(4), dtype=F64)
    x0 = torch.ones(7, dtype=F64)
    a = trajectory(FedAvg(0.1, 0.3, 0.01, bounding="norm"), Quadratic(centers, 0.2, seed=1), x0, 20, 5)
    b = trajectory(DPSGDNorm(0.1, 0.3, 0.01), Quadratic(centers, 0.2, seed=1), x0, 20, 5)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-14)


def test_dp_fed_normec_noise_scales_with_p():
    algo = FedNormEC(0.1, 0.01, 0.01, p=0.25, private=True)
    algo.setup(torch.zeros(3), 20, 300, Privacy(), 0)
    assert algo.noise_std == pytest.approx(1.8366, abs=1e-4)       # p σ_mult on Δ_i (reading A1)
    assert algo.noise_multiplier == pytest.approx(1.8366, abs=1e-4)
    avg = FedAvg(0.1, 0.01, 0.01, bounding="norm", private=True)
    avg.setup(torch.zeros(3), 20, 300, Privacy(), 0)
    assert avg.noise_std == pytest.approx(0.01 * 7.3462, abs=1e-6)  # β σ_mult on β Norm_α (p = 1)
    assert avg.noise_multiplier == pytest.approx(7.3462, abs=1e-4)


def test_central_noise_is_one_draw_on_the_sum():
    centers = torch.zeros(50, 20_000)
    algo = FedAvg(1.0, 1.0, 0.0, bounding="clip", noise_by="server", private=True)
    algo.setup(torch.zeros(20_000), 50, 300, Privacy(noise_multiplier_override=2.0), 0)
    x, _ = algo.round(0, torch.zeros(20_000), Quadratic(centers))
    assert x.std().item() == pytest.approx(2.0 / 50, rel=0.03)     # S z on the sum, divided by M


class CountingQuadratic(Quadratic):
    """Quadratic clients that record which of them computed."""

    def __init__(self, centers):
        super().__init__(centers)
        self.computed = []

    def grads(self, x, batches=None, ids=None):
        self.computed.append(None if ids is None else ids.tolist())
        return super().grads(x, batches, ids)


@pytest.mark.parametrize("make", [
    lambda: FedNormEC(0.1, 0.5, 0.01, participation="cohort", cohort_size=3, memory_update="participants_only"),
    lambda: FedAvg(0.1, 0.5, 0.01, participation="cohort", cohort_size=3),
])
def test_only_the_cohort_computes(make):
    centers = torch.randn(40, 6, generator=torch.Generator().manual_seed(5), dtype=F64)
    algo, clients = make(), CountingQuadratic(centers)
    algo.setup(torch.zeros(6, dtype=F64), 40, 3, NOPRIV, seed=2)
    for k in range(3):
        _, info = algo.round(k, torch.zeros(6, dtype=F64), clients)
        assert clients.computed[-1] == cohort_weights(40, 3, 2, k).nonzero().squeeze(1).tolist()
        assert info["uploads"] == 3


def test_client_memory_on_disk_gives_the_same_run(monkeypatch):
    """Memories too large for RAM go to a sparse file: same trajectory, same memories, zeros unread."""
    centers = torch.randn(30, 5, generator=torch.Generator().manual_seed(6), dtype=F64)

    def go():
        algo = FedNormEC(0.1, 0.5, 0.01, p=0.2, memory_update="participants_only")
        return trajectory(algo, Quadratic(centers), torch.zeros(5, dtype=F64), 12, 30), algo

    ram, a = go()
    monkeypatch.setattr(memory, "DENSE_LIMIT", 0)
    disk, b = go()
    assert not a.v.on_disk and b.v.on_disk
    torch.testing.assert_close(disk, ram, rtol=0, atol=0)
    torch.testing.assert_close(b.v[None], a.v[None], rtol=0, atol=0)
    torch.testing.assert_close(b.v.mean(), a.v.mean(), rtol=0, atol=1e-15)


def test_a_round_without_participants_moves_nothing_and_reports_no_loss():
    algo = FedAvg(0.1, 0.5, 0.01, p=1e-9)
    algo.setup(torch.zeros(4, dtype=F64), 5, 1, NOPRIV, seed=0)
    x, info = algo.round(0, torch.ones(4, dtype=F64), Quadratic(torch.zeros(5, 4, dtype=F64)))
    assert torch.equal(x, torch.ones(4, dtype=F64)) and info == {"loss": None, "uploads": 0}


def test_disk_memories_survive_a_checkpoint(monkeypatch):
    """An on-disk ClientMemory is checkpointed as the rows ever written; restored, the run goes on
    exactly as one never interrupted."""
    import io

    monkeypatch.setattr(memory, "DENSE_LIMIT", 0)
    centers = torch.randn(30, 5, generator=torch.Generator().manual_seed(8), dtype=F64)

    def fresh():
        a = FedNormEC(0.1, 0.5, 0.01, p=0.2, memory_update="participants_only")
        a.setup(torch.zeros(5, dtype=F64), 30, 10, NOPRIV, seed=0)
        return a

    whole, x = fresh(), torch.zeros(5, dtype=F64)
    for k in range(10):
        x, _ = whole.round(k, x, Quadratic(centers))
    first, y = fresh(), torch.zeros(5, dtype=F64)
    for k in range(5):
        y, _ = first.round(k, y, Quadratic(centers))
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)
    buf.seek(0)
    second = fresh()
    second.load_state_dict(torch.load(buf, weights_only=False))
    assert second.v.on_disk and second.v.touched == first.v.touched
    for k in range(5, 10):
        y, _ = second.round(k, y, Quadratic(centers))
    assert torch.equal(x, y) and torch.equal(whole.v[None], second.v[None])


# -- partial participation, checked by value (issue 30.6: four one-line bugs at p < 1 survived the suite) -----

def test_central_noise_under_partial_participation_is_one_draw_divided_by_p_n():
    """Central DP-FedAvg at p = 0.25: the server adds S z to the participants' sum and divides by p·n, so with
    zero updates the step is noise of std S z / (p n) = 2 / 10; dividing by n instead (p times too little
    noise) would give 2 / 40."""
    n, d = 40, 20_000
    algo = FedAvg(1.0, 1.0, 0.0, bounding="clip", noise_by="server", private=True, p=0.25)
    algo.setup(torch.zeros(d), n, 300, Privacy(noise_multiplier_override=2.0), 0)
    x, info = algo.round(0, torch.zeros(d), Quadratic(torch.zeros(n, d)))
    assert 0 < info["uploads"] < n
    assert x.std().item() == pytest.approx(2.0 / (0.25 * n), rel=0.03)


@pytest.mark.parametrize("p", [0.5, 0.25])
def test_fedavg_steps_eta_times_the_weighted_mean_of_the_bounded_updates(p):
    """One FedAvg round by hand at p < 1 and η ≠ γ: x¹ = x⁰ - η (1/n) Σ_i q_i β Norm_α(∇f_i(x⁰)), q_i = 1/p for
    the round's participants (drawn on the host from (seed, round)), 0 for the others."""
    n, d, gamma, beta, alpha, eta = 12, 5, 0.1, 0.3, 0.01, 0.7
    centers = torch.randn(n, d, generator=torch.Generator().manual_seed(8), dtype=F64)
    x0 = torch.ones(d, dtype=F64)
    algo = FedAvg(gamma, beta, alpha, eta=eta, p=p, bounding="norm")
    algo.setup(x0, n, 1, NOPRIV, seed=5)
    x1, info = algo.round(0, x0, Quadratic(centers))
    q = bernoulli_weights(n, p, seed=5, round_=0).to(F64)
    want = x0 - eta * (q[:, None] * beta * norm_alpha(x0 - centers, alpha)).mean(0)
    assert 0 < info["uploads"] == int((q > 0).sum()) < n
    torch.testing.assert_close(x1, want, rtol=0, atol=1e-14)


def test_a_weighted_mean_over_participants_keeps_their_weights():
    """(1/n) Σ_i q_i u_i from the participants' rows alone equals the sum over all n rows, absent clients 0."""
    from normfl.ops import participants, weighted_mean

    q = cohort_weights(10, 4, seed=3, round_=1).to(F64)              # 2.5 for the cohort
    ids = participants(q)
    rows = torch.randn(len(ids), 6, generator=torch.Generator().manual_seed(9), dtype=F64)
    dense = torch.zeros(10, 6, dtype=F64)
    dense[ids] = rows
    torch.testing.assert_close(weighted_mean(q, rows, ids), (q[:, None] * dense).mean(0), rtol=0, atol=1e-15)
    torch.testing.assert_close(weighted_mean(q, rows, ids), 2.5 * rows.sum(0) / 10, rtol=0, atol=1e-15)


@pytest.mark.parametrize("b", [1, 3, 8])
def test_incremental_gradient_pass_with_the_real_engine_steps_gamma_b_over_n(b):
    """The cyclic pass through ClientEngine and ClientData: each step is γ·(b_j/N) times its batch's mean
    gradient, the engine applying the weight b_j/N once (the operator applied it a second time before)."""
    import numpy as np

    from normfl.algorithms.local import pseudo_gradient
    from normfl.data import ClientData, Preprocess
    from normfl.engine import ClientEngine, Clients, FlatModel
    from normfl.models import logreg

    torch.manual_seed(0)
    x_all, y_all = torch.randint(0, 256, (16, 1, 2, 2), dtype=torch.uint8), torch.randint(0, 3, (16,))
    parts = [np.arange(0, 8), np.arange(8, 16)]
    data = ClientData(x_all, y_all, parts, 4, 0, Preprocess((0.5,), (0.5,), torch.device("cpu")), augment=False)
    flat = FlatModel(logreg((1, 2, 2), 3), torch.device("cpu"), "fp32")
    x0, gamma = flat.vector(), 0.5
    U, _ = pseudo_gradient(x0, Clients(ClientEngine(flat, "sequential"), data), gamma, operator="ig",
                           ig_batch_size=b)
    xb_all = (x_all.float() / 255 - 0.5) / 0.5
    for i, p in enumerate(parts):
        x = x0.clone()
        for s in range(0, len(p), b):
            idx = p[s:s + b]
            flat.load(x)
            flat.module.zero_grad()
            torch.nn.functional.cross_entropy(flat.module(xb_all[idx]), y_all[idx]).backward()
            g = torch.cat([q.grad.reshape(-1) for q in flat.module.parameters()])
            x = x - gamma * (len(idx) / len(p)) * g
        torch.testing.assert_close(U[i], (x0 - x) / gamma, rtol=1e-5, atol=1e-6)
