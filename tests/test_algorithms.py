"""Algorithm rounds on problems whose gradients are known in closed form."""

import pytest
import torch

from normfl.algorithms import Clip21, DPSGDNorm, NormEC
from normfl.ops import norm_alpha
from normfl.privacy import Privacy
from tests.helpers import Quadratic

NOPRIV = Privacy()


def quadratic(centers):
    return Quadratic(centers)


def run(algo, x, grads, rounds, privacy=NOPRIV, n=None):
    algo.setup(x, n or 2, rounds, privacy, seed=0)
    traj = [x]
    for k in range(rounds):
        x, _ = algo.round(k, x, grads)
        traj.append(x)
    return traj


def test_example1_normalized_dpsgd_stalls_but_normec_moves():
    """NORMEC-EX1: f_1 = ½(x-3)², f_2 = ½(x+3)², x^0 = 2; normalized directions cancel."""
    grads = quadratic(torch.tensor([[3.0], [-3.0]], dtype=torch.float64))
    x0 = torch.tensor([2.0], dtype=torch.float64)
    stalled = run(DPSGDNorm(gamma=0.1, beta=1.0, alpha=0.0), x0, grads, 50)
    assert all(torch.equal(x, x0) for x in stalled)
    moved = run(NormEC(gamma=0.05, beta=0.1, alpha=0.01, server_norm=False), x0, grads, 2000)
    assert abs(moved[-1].item()) < 0.05 < abs(x0.item())


def test_normec_two_rounds_by_hand():
    # n = 2, d = 1, f_1 = ½(x-1)², f_2 = ½(x+3)², x^0 = 0, α = 1, β = 0.5, γ = 0.1, with SN.
    grads = quadratic(torch.tensor([[1.0], [-3.0]], dtype=torch.float64))
    algo = NormEC(gamma=0.1, beta=0.5, alpha=1.0, server_norm=True)
    x0 = torch.tensor([0.0], dtype=torch.float64)
    # round 0: ∇f = (-1, 3); Δ = (-1/2, 3/4); g = (-1/4, 3/8); ĝ = ½·½·(1/4) = 1/16; x1 = 0 - 0.1·1
    # round 1: ∇f(-0.1) = (-1.1, 2.9); u = ∇f - g = (-0.85, 2.525); Δ = u/(1+|u|)
    x1 = run(algo, x0, grads, 1)[-1]
    assert x1.item() == pytest.approx(-0.1)
    assert algo.ghat.item() == pytest.approx(1 / 16)
    d = torch.tensor([-0.85 / 1.85, 2.525 / 3.525], dtype=torch.float64)
    ghat2 = 1 / 16 + 0.5 * d.mean().item()
    x2, _ = algo.round(1, x1, grads)
    assert x2.item() == pytest.approx(-0.1 - 0.1 * (1.0 if ghat2 > 0 else -1.0))
    assert algo.ghat.item() == pytest.approx(ghat2)
    algo_nosn = NormEC(gamma=0.1, beta=0.5, alpha=1.0, server_norm=False)
    assert run(algo_nosn, x0, grads, 1)[-1].item() == pytest.approx(-0.1 / 16)


def test_ef21_invariant_without_noise():
    """ĝ^k = (1/n) Σ g_i^k at every round (NORMEC Alg. 1 lines 1, 6 and 10)."""
    centers = torch.randn(5, 30, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    noisy_grads = Quadratic(centers, noise=0.3)

    for algo in (NormEC(0.1, 0.3, 0.01, server_norm=True), Clip21(0.1, 0.5)):
        algo.setup(torch.zeros(30, dtype=torch.float64), 5, 40, NOPRIV, 0)
        x = torch.zeros(30, dtype=torch.float64)
        for k in range(40):
            x, _ = algo.round(k, x, noisy_grads)
            assert algo.memory_gap() < 1e-12


def test_clip21_with_large_threshold_is_minibatch_sgd():
    """τ above every ||∇f_i - g_i||: g_i = ∇f_i(x^k) and x^{k+1} = x^k - γ mean ∇f_i (Clip21, NORMEC §3.5)."""
    centers = torch.tensor([[1.0, 2.0], [-3.0, 0.5], [0.0, -1.0]], dtype=torch.float64)
    grads = quadratic(centers)
    traj = run(Clip21(gamma=0.2, beta=1e6), torch.zeros(2, dtype=torch.float64), grads, 10, n=3)
    x = torch.zeros(2, dtype=torch.float64)
    for xk in traj[1:]:
        x = x - 0.2 * grads.grads(x)[0].mean(0)
        torch.testing.assert_close(xk, x)


def test_dpsgd_norm_step():
    centers = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    grads = quadratic(centers)
    x1 = run(DPSGDNorm(gamma=0.5, beta=2.0, alpha=0.1), torch.zeros(2, dtype=torch.float64), grads, 1)[-1]
    expect = -0.5 * (2.0 * norm_alpha(grads.grads(torch.zeros(2, dtype=torch.float64))[0], 0.1)).mean(0)
    torch.testing.assert_close(x1, expect)


@pytest.mark.parametrize("noise_on, factor", [("scaled_message", 1.0), ("raw_delta", 0.01)])
def test_dp_normec_client_noise(noise_on, factor):
    """Private α-NormEC adds fresh N(0, σ²) per client to Δ_i; ĝ drifts from mean g_i only by the noise."""
    n, d, rounds = 4, 20_000, 300
    centers = torch.randn(n, d, generator=torch.Generator().manual_seed(2))
    algo = NormEC(gamma=0.01, beta=0.01, alpha=0.01, server_norm=False, private=True)
    privacy = Privacy(epsilon=8, delta=1e-5, noise_on=noise_on)
    algo.setup(torch.zeros(d), n, rounds, privacy, seed=5)
    sigma = 7.3462 * factor
    assert algo.noise_std == pytest.approx(sigma, rel=1e-4)
    x, _ = algo.round(0, torch.zeros(d), quadratic(centers))
    # ĝ^1 - mean g^1 = (β/n) Σ z_i: std β σ / sqrt(n) per coordinate
    gap = algo.ghat - algo.g.mean(0)
    assert gap.std().item() == pytest.approx(0.01 * sigma / n ** 0.5, rel=0.03)


def test_dp_clip21_noise_is_beta_times_sigma():
    algo = Clip21(gamma=0.1, beta=0.01, private=True)
    algo.setup(torch.zeros(3), 2, 300, Privacy(), 0)
    assert algo.noise_std == pytest.approx(0.01 * 7.3462, rel=1e-4)
    algo = DPSGDNorm(gamma=0.1, beta=0.1, alpha=0.01)       # non-private by default: no noise
    algo.setup(torch.zeros(3), 2, 300, Privacy(), 0)
    assert algo.noise_std == 0.0
