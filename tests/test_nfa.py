"""DP-NormFedAvg and its variants (NFA): rounds by hand, the local optimizer, the privatizers as set up
from the paper's theorems, the ledger at the cohort's own rate, and config refusals."""

import math

import pandas as pd
import pytest
import torch

from normfl.algorithms import NormFedAvg
from normfl.algorithms.local import local_sgd
from normfl.config import ConfigError, validate
from normfl.ops import cohort
from normfl.privacy import Privacy
from normfl.run import run
from tests.helpers import Quadratic, composed, config


def nfa(**kw):
    base = dict(eta0=0.1, lr_decay=1.0, beta=[[0, 0.5]], local_steps=2, momentum=0.0, weight_decay=0.0,
                cohort_size=1)
    return NormFedAvg(**{**base, **kw})


def test_normfedavg_one_client_two_rounds_by_hand():
    # f(w) = ½||w - b||², b = (3, 4), w_0 = 0, E = 2 GD steps of η_k = 0.1 · 0.5^k, β = 0.5.
    b = torch.tensor([[3.0, 4.0]], dtype=torch.float64)
    algo = nfa(lr_decay=0.5)
    algo.setup(torch.zeros(2, dtype=torch.float64), 1, 2, Privacy(), seed=0)
    # round 0: w_{0,1} = 0.1 b, w_{0,2} = 0.1 b + 0.1 (b - 0.1 b) = 0.19 b; unit(w_0 - w_{0,2}) = -b/5
    x1, info = algo.round(0, torch.zeros(2, dtype=torch.float64), Quadratic(b))
    assert torch.allclose(x1, torch.tensor([0.3, 0.4], dtype=torch.float64))          # 0 - 0.5 (-b/5)
    assert info == {"loss": pytest.approx(12.5), "uploads": 1}                        # ½||0 - b||²
    # round 1: η_1 = 0.05; w_1 - w_{1,2} = (1 - 0.95²)(w_1 - b) points along -b again
    x2, _ = algo.round(1, x1, Quadratic(b))
    assert torch.allclose(x2, torch.tensor([0.6, 0.8], dtype=torch.float64))


@pytest.mark.parametrize("side_by_side", [False, True])
def test_local_sgd_is_pytorch_sgd_with_momentum_and_weight_decay(side_by_side):
    """One client at a time, or every client stepping together (a backend that computes them side by side)."""
    b = torch.tensor([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0]], dtype=torch.float64)
    x = torch.tensor([0.2, 0.1, -0.3], dtype=torch.float64)
    clients = Quadratic(b)
    clients.side_by_side = side_by_side
    W, loss = local_sgd(x, clients, torch.tensor([0, 1]), steps=5, lr=0.1, momentum=0.9, weight_decay=0.01)
    for i in range(2):
        w = torch.nn.Parameter(x.clone())
        opt = torch.optim.SGD([w], lr=0.1, momentum=0.9, weight_decay=0.01)
        for _ in range(5):
            opt.zero_grad()
            (0.5 * ((w - b[i]) ** 2).sum()).backward()
            opt.step()
        assert torch.allclose(W[i], w.detach(), atol=1e-12)
    assert torch.allclose(loss, 0.5 * ((x - b) ** 2).sum(1))                          # at the start point
    assert torch.equal(x, torch.tensor([0.2, 0.1, -0.3], dtype=torch.float64))        # not written


def test_fedavg_averages_the_local_models_of_a_uniform_cohort():
    b = torch.arange(12, dtype=torch.float64).reshape(6, 2)
    algo = nfa(upload="update", beta=[[0, 1.0]], cohort_size=3)
    algo.setup(torch.zeros(2, dtype=torch.float64), 6, 1, Privacy(), seed=3)
    x1, info = algo.round(0, torch.zeros(2, dtype=torch.float64), Quadratic(b))
    ids = cohort(6, 3, 3, 0)
    assert info["uploads"] == 3 and len(set(ids.tolist())) == 3
    assert torch.allclose(x1, 0.19 * b[ids].mean(0))                                  # mean of w_{0,2}^(i)


def test_server_step_schedules():
    algo = nfa(beta=[[100, 0.05], [0, 0.1]])
    assert [algo.step(k) for k in (0, 99, 100, 499)] == [0.1, 0.1, 0.05, 0.05]
    algo = nfa(beta=None, beta_over_eta=50, eta0=0.05, lr_decay=0.99)
    assert algo.step(10) == pytest.approx(50 * 0.05 * 0.99 ** 10)


D_FMNIST = 328_810


def test_dp_normfedavg_per_round_parameters_come_from_theorem_1():
    algo = nfa(mechanism="qtdl", s=4096, cohort_size=25)
    algo.setup(torch.zeros(D_FMNIST), 50, 500, Privacy(epsilon=10), seed=0)
    assert (algo.mech.m, algo.bits_per_coord) == (413, 14)                             # NFA Table 4, Theorem 1
    assert algo.mech.alpha == pytest.approx(10 / (2 * D_FMNIST + 0.1 * 4096 * math.sqrt(D_FMNIST)))
    assert algo.spent(1)["eps_composed"] == pytest.approx(10.0)                        # one message
    assert algo.spent(500)["eps_composed"] == pytest.approx(5000.0)                    # basic composition wins


def test_all_rounds_scope_meets_the_whole_run_target():
    """Table 3's setting: (0.1, 1e-9) over 500 rounds, worst-case sensitivity, s = 2^29 (32 bits)."""
    algo = NormFedAvg(eta0=0.005, beta=[[0, 0.02]], mechanism="qtdl", s=2 ** 29, scope="all_rounds",
                      sensitivity="worst_case", cohort_size=25)
    algo.setup(torch.zeros(D_FMNIST), 50, 500, Privacy(epsilon=0.1, delta=1e-9), seed=0)
    assert algo.bits_per_coord == 32 and algo.mech.epsilon == pytest.approx(6.94e-4, rel=1e-3)
    eps, delta = algo.ledger.composed(500)
    assert 0.09 < eps <= 0.1 and delta == pytest.approx(1e-9)
    report = algo.privacy_report(500)
    assert report["per_message"]["delta"] == f"2^-{D_FMNIST}" and "worst case" in report["sensitivity"]["kind"]
    assert report["per_message"]["delta_exact"] > 0.4                                 # Theorem 1's δ is not 2^-d


def test_aggregate_level_noise_is_one_draw_with_sensitivity_over_r():
    server = NormFedAvg(eta0=0.1, beta=[[0, 1.0]], mechanism="qtdl", s=2 ** 29, scope="all_rounds",
                        sensitivity="worst_case", noise_at="server", cohort_size=25)
    server.setup(torch.zeros(D_FMNIST), 50, 500, Privacy(epsilon=0.1, delta=1e-9), seed=0)
    # NFA App. G(iii): Δ∞ = 2s/25 (reading C-N6); s = 2^29 gives 31 bits there (reading C-N4)
    assert server.mech.sensitivity.linf == pytest.approx(2 * 2 ** 29 / 25) and server.bits_per_coord == 31
    b = torch.randn(50, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    small = NormFedAvg(eta0=0.1, beta=[[0, 1.0]], local_steps=1, mechanism="qtdl", s=8, noise_at="server",
                       cohort_size=5)
    small.setup(torch.zeros(6, dtype=torch.float64), 50, 10, Privacy(epsilon=1.0), seed=0)
    x1, _ = small.round(0, torch.zeros(6, dtype=torch.float64), Quadratic(b))
    # the step is the mean of quantized units plus one TDL draw: on the 1/s grid scaled by 1/r and β
    assert torch.allclose(x1 * 8 * 5, torch.round(x1 * 8 * 5), atol=1e-9)


@pytest.mark.slow
def test_private_round_is_seeded_unbiased_and_on_the_grid():
    b = torch.randn(4, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    algo = NormFedAvg(eta0=0.1, beta=[[0, 1.0]], local_steps=1, mechanism="qtdl", s=16, cohort_size=4)
    algo.setup(torch.zeros(5, dtype=torch.float64), 4, 1, Privacy(epsilon=1.0), seed=0)
    x0 = torch.zeros(5, dtype=torch.float64)
    a, _ = algo.round(0, x0, Quadratic(b))
    again, _ = algo.round(0, x0, Quadratic(b))
    assert torch.equal(a, again)                                                       # seeded by (seed, round)
    draws = torch.stack([algo.round(k, x0, Quadratic(b))[0] for k in range(4000)])
    exact = torch.nn.functional.normalize(b, dim=1).mean(0)            # x0 - mean unit(x0 - w_E), w_E = x0 + η b
    se = draws.std(0) / math.sqrt(len(draws))
    assert ((draws.mean(0) - exact).abs() < 5 * se).all()                              # unbiased (5 standard errors)


@pytest.mark.parametrize("C", [0.25, 0.5])
def test_scaled_clipping_steps_the_same_and_puts_c_times_the_noise_on_the_model(C):
    """Reading C-N16: Clip_C(u)/C on the grid and a step β·C. Without noise that is the literal round;
    with QTDL, the noise on the model is C times the literal reading's (the same draws, scaled)."""
    b = 3 * torch.randn(4, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    x0 = torch.zeros(5, dtype=torch.float64)

    def step(mechanism, scaled, k=0):
        algo = NormFedAvg(eta0=0.1, lr_decay=1.0, beta=[[0, 0.5]], local_steps=1, upload="clip", clip=C,
                          scale_to_unit=scaled, mechanism=mechanism, s=2 ** 20, cohort_size=4)
        algo.setup(x0, 4, 1, Privacy(epsilon=0.5), seed=0)
        return algo.round(k, x0, Quadratic(b))[0]

    plain = step("none", False)
    assert torch.allclose(step("none", True), plain, atol=1e-12)                       # the same step
    noise = {scaled: torch.stack([step("qtdl", scaled, k) - plain for k in range(200)]) for scaled in (False, True)}
    assert (noise[True].std() / noise[False].std()).item() == pytest.approx(C, rel=0.2)


def theorem2_by_hand(eps0: float, k: int, delta: float, r: int, n: int) -> float:
    """One client's ε after k (ε_0, ·) messages as NFA Theorem 2's proof composes them, written out here: the smaller of
    basic (k ε_0) and advanced composition, then, below 1, amplified by sampling r of n (factor min(1, 2r/n))."""
    basic = k * eps0
    advanced = eps0 * math.sqrt(2 * k * math.log(1 / delta)) + k * eps0 * math.tanh(eps0 / 2)
    eps = min(basic, advanced)
    return eps * min(1.0, 2 * r / n) if eps < 1 else eps


# cohorts of r of n clients: r/n from 0.02 to 1, where amplification (2r/n) shrinks ε by up to 25 times, or not at
# all (r/n >= 1/2: the one rate where a ledger at any rate agrees)
COHORTS = [(1, 50), (2, 20), (3, 10), (5, 8), (4, 4)]


@pytest.mark.parametrize("mechanism", ["qtdl", "binomial"])
@pytest.mark.parametrize("r, n", COHORTS)
def test_the_ledger_composes_at_the_cohorts_own_rate(r, n, mechanism):
    """DP-NormFedAvg's ledger amplifies by its own cohort's r/n: its ε equals Theorem 2's composition written out by
    hand at that rate, after rounds where basic composition wins, where advanced does, and where the composed ε is
    above 1 and nothing is amplified. A ledger handed another rate (1, or the rate of another run) is up to n/(2r)
    times off, which a test at r/n = 1/2 never sees."""
    algo = nfa(mechanism=mechanism, s=64, cohort_size=r)
    algo.setup(torch.zeros(20), n, 100, Privacy(epsilon=0.01, delta=1e-5), seed=0)
    assert algo.p == r / n and algo.privacy_report(1)["sampling_rate"] == r / n
    for k in (1, 10, 100, 3000):                     # basic, basic, advanced, above 1
        assert algo.spent(k)["eps_composed"] == pytest.approx(theorem2_by_hand(0.01, k, 1e-5, r, n), rel=1e-12), k


@pytest.mark.parametrize("r", [5, 10, 25])
def test_a_whole_run_target_is_met_at_the_cohorts_own_rate(r):
    """scope=all_rounds sizes each message by Theorem 2 at r/n, and the ledger composes them at r/n: the run's 500
    rounds cost its target (0.1, 1e-9) exactly, at r/n = 0.1, 0.2 and 0.5 alike (at a rate other than the cohort's
    the ledger would report up to 5 times the target)."""
    algo = NormFedAvg(eta0=0.1, beta=[[0, 1.0]], mechanism="qtdl", s=2 ** 29, scope="all_rounds",
                      sensitivity="worst_case", cohort_size=r)
    algo.setup(torch.zeros(1000), 50, 500, Privacy(epsilon=0.1, delta=1e-9), seed=0)
    assert algo.ledger.composed(500) == (pytest.approx(0.1, rel=1e-6), 1e-9)
    assert algo.ledger.composed(500)[0] == pytest.approx(theorem2_by_hand(algo.mech.epsilon, 500, 1e-9, r, 50))


@pytest.mark.parametrize("clients, cohort", [(8, 1), (4, 1), (4, 3)])
def test_a_runs_epsilon_column_is_the_composition_at_its_cohorts_rate(clients, cohort, tmp_path, data_root):
    """A whole DP-NormFedAvg run (per-message ε = 0.01): each row's eps_composed and the summary's ε are the
    hand-written composition at the run's own r/n (1/8, 1/4, 3/4), and the summary states that rate."""
    cfg = config(data_root, "algo=dp_normfedavg", "algo.local_steps=1", f"clients={clients}",
                 f"algo.cohort_size={cohort}", "eval_every=1", "privacy.epsilon=0.01")
    summary = run(cfg, tmp_path / "run")
    eps = pd.read_csv(tmp_path / "run" / "metrics.csv")["eps_composed"].tolist()
    assert eps == pytest.approx([theorem2_by_hand(0.01, k, 1e-5, cohort, clients) for k in range(4)], rel=1e-12)
    assert summary["privacy"]["epsilon_composed"] == pytest.approx(eps[-1], rel=1e-12)
    assert summary["privacy"]["sampling_rate"] == cohort / clients


NFA = ["experiment=nfa_t4_qtdl"]


@pytest.mark.parametrize("overrides, key", [
    (["algo.beta_over_eta=50"], "algo.beta"),                                # both schedules
    (["algo.beta=[[10,0.1]]"], "algo.beta"),                                 # no value at round 0
    (["algo.mechanism=binomial", "algo.scope=all_rounds"], "algo.scope"),
    (["algo.upload=update"], "algo.upload"),                                 # quantizer needs |u_i| <= 1
    (["algo.upload=clip", "algo.clip=2.0"], "algo.clip"),
    (["algo.mechanism=none", "algo.noise_at=server"], "algo.noise_at"),
    (["algo.cohort_size=51"], "algo.cohort_size"),
    (["algo.momentum=1.0"], "algo.momentum"),
    (["algo.scale_to_unit=true"], "algo.scale_to_unit"),                     # it scales a clipped update
    (["algo.upload=clip", "algo.scale_to_unit=maybe"], "algo.scale_to_unit"),
])
def test_bad_nfa_settings_are_refused(overrides, key):
    with pytest.raises(ConfigError) as err:
        validate(composed(*NFA, *overrides))
    assert err.value.key == key


def test_theorem_conditions_are_refused_at_setup():
    with pytest.raises(ConfigError, match="privacy.epsilon"):                  # Theorem 2 needs ε < 6
        NormFedAvg(eta0=0.1, beta=[[0, 1.0]], mechanism="qtdl", scope="all_rounds").setup(
            torch.zeros(100), 50, 10, Privacy(epsilon=5.0, delta=1e-9), seed=0)
    with pytest.raises(ConfigError, match="privacy.epsilon"):                  # Theorem 1: ε < e^-1 Δ1/Δ∞
        NormFedAvg(eta0=0.1, beta=[[0, 1.0]], mechanism="qtdl", s=4, mu=0.1).setup(
            torch.zeros(4), 50, 10, Privacy(epsilon=100.0), seed=0)


def test_binomial_baseline_uses_cpsgd_trials_and_eq7_bits():
    algo = nfa(mechanism="binomial", s=4096, cohort_size=25)
    algo.setup(torch.zeros(D_FMNIST), 50, 500, Privacy(epsilon=10, delta=3e-6), seed=0)
    assert (algo.mech.trials, algo.bits_per_coord) == (2_843_701, 23)                  # NFA Table 4; reading C-N7
    assert algo.noise_std == pytest.approx(math.sqrt(2_843_701 / 4) / 4096)
    assert algo.privacy_report(1)["per_message"] == {"epsilon": 10, "delta": 3e-6, "delta_exact": None}


def test_aggregate_level_noise_per_client_or_at_the_server():
    """Aggregate-level privacy divides the sensitivities by r; client_aggregate adds one draw per client
    (std/sqrt(r) on the mean), server one draw on the mean."""
    out = {}
    for at in ("client", "client_aggregate", "server"):
        a = NormFedAvg(0.1, beta=[[0, 1.0]], cohort_size=25, mechanism="qtdl", s=2**29, scope="all_rounds",
                       sensitivity="worst_case", noise_at=at, local_steps=1)
        a.setup(torch.zeros(1000), 50, 500, Privacy(epsilon=0.1, delta=1e-9), seed=0)
        out[at] = a
    sens = {at: a.mech.sensitivity for at, a in out.items()}
    assert sens["client_aggregate"].linf == pytest.approx(sens["client"].linf / 25)
    assert sens["server"].linf == sens["client_aggregate"].linf
    assert out["client_aggregate"].mech.who == "client" and out["server"].mech.who == "server"


def test_what_keeps_an_nfa_epsilon_from_being_a_certificate_is_said():
    """NFA Theorems 1-2 give ε for the sensitivities and noise they are handed: a heuristic sensitivity, noise
    sized for Δ/r drawn by each client (sqrt(r) too little on the mean), or a TDL whose exact δ exceeds the
    run's, each makes the reported ε a claim; cpSGD's Binomial at worst-case sensitivities leaves none."""
    def reasons(mechanism, sensitivity, noise_at):
        a = NormFedAvg(0.1, beta=[[0, 1.0]], cohort_size=25, mechanism=mechanism, s=4096, local_steps=1,
                       sensitivity=sensitivity, noise_at=noise_at)
        a.setup(torch.zeros(1000), 50, 500, Privacy(epsilon=10, delta=3e-6), seed=0)
        return a.not_certified()

    assert reasons("binomial", "worst_case", "client") == []
    assert reasons("binomial", "worst_case", "server") == []            # one draw on the mean: as calibrated
    assert reasons("binomial", "heuristic", "client") == [
        "the sensitivities are NFA eq. 6's heuristic (mu = 0.1), not worst-case bounds"]
    assert reasons("binomial", "worst_case", "client_aggregate") == [
        "each client's noise is sized for sensitivities over r, so the mean of the r = 25 messages carries "
        "sqrt(r) = 5 times less noise than calibrated"]
    assert reasons("qtdl", "worst_case", "client") == [
        "the TDL noise's exact per-message delta is 1, not the 2^-d Theorem 1 states"]
