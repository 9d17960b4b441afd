import pytest
import torch

from normfl.ops import NOISE, clip, norm_alpha, round_generator, row_norms, server_step
from normfl.privacy import Gaussian, Privacy


@pytest.fixture
def vecs():
    g = torch.Generator().manual_seed(0)
    v = torch.randn(64, 50, generator=g, dtype=torch.float64)
    return v * torch.logspace(-6, 6, 64, dtype=torch.float64)[:, None]    # tiny to huge norms


@pytest.mark.parametrize("alpha", [0.0, 0.01, 1.0, 100.0])
def test_norm_alpha_bounded_and_lemma1_identity(vecs, alpha):
    out = norm_alpha(vecs, alpha)
    assert (row_norms(out) <= 1 + 1e-12).all()
    n = row_norms(vecs)
    for beta in (0.1, 1.0, 10.0):                 # eq. (8): ||g - β Norm_α(g)||² = (1 - β/(α+||g||))² ||g||²
        lhs = row_norms(vecs - beta * out) ** 2
        rhs = (1 - beta / (alpha + n)) ** 2 * n ** 2
        torch.testing.assert_close(lhs, rhs, rtol=1e-9, atol=1e-18)


def test_norm_zero_conventions():
    z = torch.zeros(3, 4)
    assert torch.equal(norm_alpha(z, 0.0), z)                 # Norm_0(0) = 0
    assert torch.equal(clip(z, 1.0), z)
    x = torch.ones(4)
    assert torch.equal(server_step(x, torch.zeros(4), 0.5, normalized=True), x)   # 0/0 = 0
    unit = norm_alpha(torch.tensor([[3.0, 4.0]]), 0.0)
    torch.testing.assert_close(unit, torch.tensor([[0.6, 0.8]]))


def test_clip_bound_and_table1_property(vecs):
    for tau in (1e-3, 1.0, 1e3):
        out = clip(vecs, tau)
        n = row_norms(vecs)
        assert (row_norms(out) <= tau * (1 + 1e-12)).all()
        lhs = row_norms(out - vecs) ** 2
        torch.testing.assert_close(lhs, torch.clamp(n - tau, min=0) ** 2, rtol=1e-9, atol=1e-12)
        small = n.squeeze(1) <= tau
        assert torch.equal(out[small], vecs[small])            # below the threshold nothing changes


def test_gaussian_privatizer_std_fresh_and_seeded():
    mech = Gaussian(sensitivity=2.0, std=0.5)
    v = torch.zeros(20, 50_000)

    def draw(k, seed=3):
        return mech(v, round_generator(seed, NOISE, k, "cpu"))

    a, b = draw(0), draw(1)
    assert abs(a.std().item() - 0.5) < 0.005
    assert not torch.equal(a, b)                               # fresh per round
    assert not torch.equal(a[0], a[1])                         # fresh per client
    assert torch.equal(a, draw(0)) and not torch.equal(a, draw(0, seed=4))   # reproducible from (seed, round)
    assert torch.equal(Gaussian(1.0, 0.0)(v, None), v)         # no noise: no draws
    assert mech.noise_multiplier == 0.25 and mech.release().noise_multiplier == 0.25


def test_privacy_builds_the_gaussian_it_calibrates():
    """The privatizer knows its sensitivity, std and who adds it; noise on the mean of n releases of
    norm <= β has sensitivity β/n, so the same std is n times the noise multiplier."""
    pr = Privacy(epsilon=8, delta=1e-5)
    client = pr.gaussian(1.0, 0.01, 300)
    assert (client.sensitivity, client.who) == (1.0, "client")
    assert client.noise_multiplier == pytest.approx(7.3462, abs=1e-4) == client.std
    central = pr.gaussian(0.5, 0.5, 300, who="server", mean_of=10)
    assert central.sensitivity == 0.05 and central.std == pytest.approx(0.5 * 7.3462, abs=1e-4)
    assert central.noise_multiplier == pytest.approx(10 * 7.3462, abs=1e-3)
    info = central.describe()
    assert info["noise_by"] == "server" and "trusted server" in info["assumptions"]


def test_an_accountant_calibrates_noise_on_a_mean_to_its_sensitivity():
    """make audit found the DP-SGD baseline asked for ε = 4 by PLD certifying 0.31: the solved multiplier was
    applied to β instead of the mean's sensitivity β/n. Now the run certifies what it was asked for."""
    from normfl.privacy import ledger

    pr = Privacy(epsilon=4, delta=1e-5, calibration="accountant", accountant="pld")
    central = pr.gaussian(0.5, 0.5, 100, who="server", mean_of=10)
    assert central.sensitivity == 0.05 and central.std == pytest.approx(0.05 * central.noise_multiplier)
    assert 3.9 < ledger(central.release(), 1e-5).spent(100)["pld"] <= 4.0


def test_paper_noise_multiplier_matches_spec_table():
    # reading A1 (σ_mult and its options; docs/privacy-table.md), ε = 8, δ = 1e-5
    pn = Privacy(epsilon=8, delta=1e-5)
    assert pn.noise_multiplier(300) == pytest.approx(7.3462, abs=1e-4)
    assert pn.noise_multiplier(300, p=0.25) == pytest.approx(1.8366, abs=1e-4)
    assert pn.noise_multiplier(150) == pytest.approx(5.1946, abs=1e-4)
    assert Privacy(K_plus_one=True).noise_multiplier(300) == pytest.approx(7.3584, abs=1e-4)
    assert Privacy(log_base="10").noise_multiplier(300) == pytest.approx(4.8412, abs=1e-4)
    assert Privacy(sqrt_covers_log=False).noise_multiplier(300) == pytest.approx(24.926, abs=1e-3)
    # std on an upload bounded by 1 whose server weight is β: σ_mult (default) or β σ_mult (alt B)
    assert pn.upload_std(1.0, 0.01, 300) == pytest.approx(7.3462, abs=1e-4)
    assert Privacy(noise_on="raw_delta").upload_std(1.0, 0.01, 300) == pytest.approx(0.073462, abs=1e-6)


def test_appc_ef21_memory_recursion():
    """NORMEC-APPC: the single-node memory g^{k+1} = g^k + Ψ(g* - g^k). Clipping reaches g* after
    ceil(||g^0 - g*|| / τ) steps; β·Norm_α shrinks the error by (1 - β/(α + ||g* - g^k||)) per step."""
    g_star, g0 = torch.tensor([[3.0, 4.0]], dtype=torch.float64), torch.zeros(1, 2, dtype=torch.float64)
    g, tau = g0.clone(), 0.7
    for k in range(1, 9):                         # ||g0 - g*|| = 5, so ceil(5 / 0.7) = 8 steps
        g = g + clip(g_star - g, tau)
        expected = max(0.0, 5.0 - k * tau)
        assert abs(row_norms(g_star - g).item() - expected) < 1e-12
    assert torch.allclose(g, g_star)
    g, alpha, beta, err2 = g0.clone(), 1.0, 0.5, 25.0
    for _ in range(200):
        gap = row_norms(g_star - g).item()
        err2 *= (1 - beta / (alpha + gap)) ** 2
        g = g + beta * norm_alpha(g_star - g, alpha)
        assert abs(row_norms(g_star - g).item() ** 2 - err2) < 1e-9
    assert err2 < 1e-6                            # β/α < 1: g^k → g*


def test_a_runs_generators_are_reseeded_not_remade():
    """A run keeps one generator per (stream, device) and reseeds it each round: the same object every
    round (what a captured graph registers), the same draws as a fresh generator of (seed, stream, round)."""
    from normfl.ops import PARTICIPATION, Streams

    streams = Streams(5)
    first = streams(NOISE, 0, "cpu")
    for k in (0, 1, 7):
        for stream in (NOISE, PARTICIPATION):
            gen = streams(stream, k, "cpu")
            fresh = round_generator(5, stream, k, "cpu")
            assert torch.equal(torch.randn(5, generator=gen), torch.randn(5, generator=fresh))
    assert streams(NOISE, 3, "cpu") is first and streams(PARTICIPATION, 3, "cpu") is not first
    other = Streams(6)(NOISE, 3, "cpu")
    assert not torch.equal(torch.rand(3, generator=other), torch.rand(3, generator=streams(NOISE, 3, "cpu")))
