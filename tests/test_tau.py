"""Tests of the ALI-DPFL τ* selection (normfl/algorithms/tau.py; ALI Sec. III-D, IV; readings C-A1 to C-A5, C-A13)."""

from __future__ import annotations

import math
from fractions import Fraction
from itertools import pairwise

import numpy as np
import pytest

from normfl.algorithms.tau import (
    SQRT3_OVER_3,
    Estimates,
    TauSelector,
    argmin_G,
    bound_G,
    closed_form_tau,
    code_estimates,
    h,
    noise_constant,
    total_iterations,
    weighted_estimates,
)

# (eta, beta, xi, noise): moderate, the paper's η = 0.5 with a large δn, large ηβ, tiny ηβ.
PARAMS = [(0.1, 1.0, 0.5, 0.5), (0.5, 1.0, 0.3, 2.75), (0.5, 3.9, 1.0, 1.9), (0.05, 1e-4, 0.2, 0.1)]


def h_exact(x: int, eta: float, beta: float, xi: float, noise: float) -> Fraction:
    """eq. 11 in exact rational arithmetic (the float inputs are converted exactly)."""
    a, b, e = Fraction(xi) + Fraction(noise), Fraction(beta), Fraction(eta)
    return a / b * ((1 + e * b) ** x - 1) - e * a * x


def h_direct(x: float, eta: float, beta: float, xi: float, noise: float) -> float:
    a = xi + noise
    return a / beta * ((1 + eta * beta) ** x - 1) - eta * a * x


def G_by_hand(tau: int, T: float, eta: float, phi: float, rho: float, lam: float, beta: float, xi: float,
              noise: float) -> float:
    """eq. 13 written out independently of the module (exact h)."""
    D = eta * phi - rho * float(h_exact(tau, eta, beta, xi, noise)) / (tau * lam ** 2)
    return 1.0 / (T * D) + math.sqrt(3) / 3 if D > 0 and T > 0 else math.inf


# ---------------------------------------------------------------------------------------------------------------------
# h (eq. 11), δn (Lemma 3)
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eta,beta,xi,noise", PARAMS)
def test_h_zero_at_0_and_1_nonnegative_and_monotone(eta, beta, xi, noise):
    assert h(0, eta, beta, xi, noise) == 0.0
    assert h(1, eta, beta, xi, noise) == 0.0
    values = [h(x, eta, beta, xi, noise) for x in range(1, 51)]
    assert all(v >= 0 for v in values)
    assert all(b > a for a, b in pairwise(values)), "h is increasing on 1..50"
    ratios = [v / x for x, v in enumerate(values, start=1)]
    assert all(b > a for a, b in pairwise(ratios)), "h(τ)/τ is increasing on 1..50"


@pytest.mark.parametrize("eta,beta,xi,noise", PARAMS[:3])
def test_h_matches_direct_formula_for_moderate_eta_beta(eta, beta, xi, noise):
    for x in (2, 3, 7, 20, 2.5):
        assert h(x, eta, beta, xi, noise) == pytest.approx(h_direct(x, eta, beta, xi, noise), rel=1e-10)


@pytest.mark.parametrize("eta,beta", [(0.5, 1.0), (0.1, 1e-6), (0.5, 1e-12), (1e-3, 1e-9), (0.5, 3.9)])
def test_h_accurate_against_exact_rational_arithmetic(eta, beta):
    for x in (2, 3, 10, 50, 100):
        exact = h_exact(x, eta, beta, 0.3, 2.0)
        assert abs(Fraction(h(x, eta, beta, 0.3, 2.0)) - exact) <= 1e-13 * exact


def test_h_tiny_eta_beta_beats_the_naive_formula():
    # The direct formula cancels catastrophically here; the module must not.
    eta, beta, x = 0.5, 1e-12, 5
    exact = float(h_exact(x, eta, beta, 0.3, 2.0))
    assert h(x, eta, beta, 0.3, 2.0) == pytest.approx(exact, rel=1e-13)
    assert abs(h_direct(x, eta, beta, 0.3, 2.0) - exact) > 1e-3 * exact
    assert h(7, 0.5, 0.0, 0.3, 2.0) == 0.0  # the β → 0 limit


def test_h_non_integer_against_mpmath():
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 40
    for eta, beta in [(0.5, 1.0), (0.1, 1e-7)]:
        for x in (1.5, 2.25, 0.5, 13.7):
            a, b, e = mpmath.mpf(2.3), mpmath.mpf(beta), mpmath.mpf(eta)
            ref = float(a / b * ((1 + e * b) ** mpmath.mpf(x) - 1) - e * a * mpmath.mpf(x))
            assert h(x, eta, beta, 0.3, 2.0) == pytest.approx(ref, rel=1e-12)


def test_h_overflow_gives_inf_and_G_inf():
    assert h(5000, 0.5, 3.0, 1.0, 1.0) == math.inf
    assert bound_G(5000, 1e6, 0.5, 1.0, 1.0, 0.5, 3.0, 1.0, 1.0) == math.inf


def test_noise_constant():
    assert noise_constant(100, 1.0, 0.1, 10) == pytest.approx(2 * 10 * 1.0 * 0.1 / 10)
    assert noise_constant(878_538, 1.1, 0.1, 75) == pytest.approx(2 * math.sqrt(878_538) * 0.11 / 75)


# ---------------------------------------------------------------------------------------------------------------------
# G (eq. 13) and T(τ) (reading C-A2)
# ---------------------------------------------------------------------------------------------------------------------


def test_bound_G_value_and_infeasible_cases():
    eta, phi, rho, lam, beta, xi, noise = 0.1, 0.95, 0.4, 0.5, 1.0, 0.5, 0.5
    for tau in (1, 2, 5):
        assert bound_G(tau, 50, eta, phi, rho, lam, beta, xi, noise) == pytest.approx(
            G_by_hand(tau, 50, eta, phi, rho, lam, beta, xi, noise), rel=1e-12)
    assert bound_G(1, 50, eta, phi, rho, lam, beta, xi, noise) == pytest.approx(1 / (50 * eta * phi) + SQRT3_OVER_3)
    assert bound_G(3, 0, eta, phi, rho, lam, beta, xi, noise) == math.inf  # T <= 0
    assert bound_G(1, 50, eta, 0.0, rho, lam, beta, xi, noise) == math.inf  # D = 0
    assert bound_G(40, 50, eta, phi, rho, lam, beta, xi, noise) == math.inf  # D < 0 for large τ


def test_total_iterations_modes():
    assert total_iterations(3, 10, 100) == 30
    assert total_iterations(20, 10, 100) == 100
    assert total_iterations(3, 10, 100, "remaining", rounds_done=4, used=12) == 12 + 18
    assert total_iterations(30, 10, 100, "remaining", rounds_done=4, used=12) == 100
    assert total_iterations(5, 10, 100, "remaining", rounds_done=10, used=40) == 40
    with pytest.raises(ValueError):
        total_iterations(1, 10, 100, "bogus")


@pytest.mark.parametrize("eta,beta,xi,noise", PARAMS[:3])
@pytest.mark.parametrize("rho", [0.05, 0.5])
def test_argmin_is_1_when_T_is_fixed(eta, beta, xi, noise, rho):
    phi = 1.0 * (1 - beta * eta / 2)
    best, values = argmin_G(50, lambda t: 1000, eta, phi, rho, 0.9, beta, xi, noise)
    assert best == 1
    assert all(v > values[0] for v in values[1:])


@pytest.mark.parametrize("mode", ["static", "remaining"])
@pytest.mark.parametrize("R_s,R_c", [(100, 100), (300, 100), (1000, 177)])
def test_condition_I_gives_tau_1(mode, R_s, R_c):
    eta, phi, rho, lam, beta, xi, noise = 0.1, 0.95, 0.4, 0.5, 1.0, 0.5, 0.5
    for k in (1, 5, 40):  # with τ ≡ 1 so far, used = rounds done
        best, _ = argmin_G(60, lambda t, k=k: total_iterations(t, R_s, R_c, mode, k, k), eta, phi, rho, lam, beta,
                           xi, noise)
        assert best == 1
    sel = TauSelector(eta, noise, R_s, R_c, lambda_const=lam, omega_const=1.0)
    assert not sel.adaptive
    assert [sel.update(Estimates(rho, beta, xi, 0.5, 1.0), k, k) for k in (1, 2, 3)] == [1, 1, 1]


# Hand-built case with R_s < R_c where a bigger T outweighs h: T = 10τ, G(τ) − √3/3 = 1/(10τ·D(τ)) with
# D(τ) = 0.095 − 1.6·h(τ)/τ, h(τ) = ((1.1)^τ − 1) − 0.1τ; 10τ·D(τ) = 0.95, 1.74, 2.354, 2.7744, 2.98184, 2.955, …
HAND = dict(eta=0.1, noise=0.5, R_s=10, R_c=10_000, lambda_const=0.5, omega_const=1.0)
HAND_EST = Estimates(rho=0.4, beta=1.0, xi=0.5, loss=0.7, grad_norm=1.0)


def brute_force_tau(tau_max: int, T_of, est: Estimates, eta: float, lam: float, omega: float, noise: float) -> int:
    phi = omega * (1 - est.beta * eta / 2)
    values = [G_by_hand(t, T_of(t), eta, phi, est.rho, lam, est.beta, est.xi, noise) for t in range(1, tau_max + 1)]
    return int(np.argmin(values)) + 1


def test_argmin_above_1_when_R_s_below_R_c():
    eta, noise = HAND["eta"], HAND["noise"]
    best = brute_force_tau(100, lambda t: min(10 * t, 10_000), HAND_EST, eta, 0.5, 1.0, noise)
    assert best == 5  # 10τ·D(τ) peaks at τ = 5 (2.98184 > 2.955024 at τ = 6)
    sel = TauSelector(**HAND)
    assert sel.adaptive
    used = 0
    for k in range(1, 8):
        used += sel.tau
        tau_m = min(2 * sel.tau, 100, 10_000 - used)
        expected = brute_force_tau(tau_m, lambda t: min(10 * t, 10_000), HAND_EST, eta, 0.5, 1.0, noise)
        assert sel.update(HAND_EST, k, used) == expected
    assert sel.history == [2, 4, 5, 5, 5, 5, 5]
    assert sel.infeasible_rounds == 0
    assert sel.last_G[4] == pytest.approx(G_by_hand(5, 50, eta, 0.95, 0.4, 0.5, 1.0, 0.5, noise), rel=1e-12)


def test_selector_matches_brute_force_with_R_c_cap_and_remaining_mode():
    eta, noise = HAND["eta"], HAND["noise"]
    sel = TauSelector(**{**HAND, "R_c": 35})  # T = min(10τ, 35): no gain beyond τ = 4
    sel.tau = 4
    assert sel.update(HAND_EST, 1, 4) == brute_force_tau(8, lambda t: min(10 * t, 35), HAND_EST, eta, 0.5, 1.0,
                                                         noise) == 4
    sel = TauSelector(**HAND, T_mode="remaining")
    sel.tau = 8
    T_of = lambda t: total_iterations(t, 10, 10_000, "remaining", 3, 20)  # noqa: E731
    expected = brute_force_tau(16, T_of, HAND_EST, eta, 0.5, 1.0, noise)
    assert sel.update(HAND_EST, 3, 20) == expected
    assert 1 < expected < 16


# ---------------------------------------------------------------------------------------------------------------------
# Search range, running λ/ω, infeasibility (ALI Sec. IV-B; readings C-A1, C-A13)
# ---------------------------------------------------------------------------------------------------------------------


def test_search_range_doubles_at_most_and_respects_caps():
    # ρ = 0: D is the same for all τ and T = R_s·τ grows, so G decreases and τ* = τ_m every round.
    est = Estimates(rho=0.0, beta=1.0, xi=0.5, loss=0.7, grad_norm=1.0)
    sel = TauSelector(eta=0.1, noise=0.5, R_s=5, R_c=100_000, tau_cap=100, lambda_const=0.5, omega_const=1.0)
    used, prev = 0, 1
    for k in range(1, 10):
        used += sel.tau
        tau = sel.update(est, k, used)
        assert tau == min(2 * prev, 100)
        prev = tau
    assert sel.history == [2, 4, 8, 16, 32, 64, 100, 100, 100]
    assert sel.update(est, 10, 100_000 - 3) == 3  # R_c − used binds
    assert sel.update(est, 11, 100_000 - 3) == 3
    assert sel.update(est, 12, 100_000) == 3  # budget spent: nothing to search, τ* kept
    assert sel.infeasible_rounds == 0


def test_running_lambda_and_omega():
    sel = TauSelector(eta=0.1, noise=0.5, R_s=10, R_c=10_000)
    sel.update(Estimates(0.4, 1.0, 0.5, loss=2.0, grad_norm=1.0), 1, 1)
    assert sel.lam == 1 - 1e-6  # clipped below 1 (Theorem 2 condition 4)
    assert sel.omega == pytest.approx(0.25)
    assert sel.phi == pytest.approx(0.25 * (1 - 0.05))
    sel.update(Estimates(0.4, 2.0, 0.5, loss=0.5, grad_norm=2.0), 2, 3)
    assert sel.lam == 0.5 and sel.omega == pytest.approx(0.25)  # (2/0.5)² = 16 is not a new minimum
    assert sel.phi == pytest.approx(0.25 * (1 - 0.1))
    sel.update(Estimates(0.4, 1.0, 0.5, loss=0.7, grad_norm=0.07), 3, 5)
    assert sel.lam == 0.5 and sel.omega == pytest.approx(0.01)
    sel.update(Estimates(0.4, 1.0, 0.5, loss=0.0, grad_norm=0.07), 4, 7)
    assert sel.lam == 1e-8 and sel.omega == pytest.approx(0.01)  # loss 0: λ floored, ω not updated
    fixed = TauSelector(eta=0.1, noise=0.5, R_s=10, R_c=10_000, lambda_const=0.3, omega_const=2.0)
    fixed.update(Estimates(0.4, 1.0, 0.5, loss=0.05, grad_norm=1.0), 1, 1)
    assert fixed.lam == 0.3 and fixed.omega == 2.0


def test_infeasible_bound_keeps_tau_and_counts():
    sel = TauSelector(**HAND)
    for k, used in ((1, 1), (2, 3)):
        sel.update(HAND_EST, k, used)
    assert sel.tau == 4
    bad = Estimates(rho=0.4, beta=2.0 / HAND["eta"], xi=0.5, loss=0.7, grad_norm=1.0)  # ηβ = 2: φ = 0
    assert sel.update(bad, 3, 7) == 4
    assert sel.infeasible_rounds == 1 and all(g == math.inf for g in sel.last_G)
    worse = Estimates(rho=0.4, beta=3.0 / HAND["eta"], xi=0.5, loss=0.7, grad_norm=1.0)  # φ < 0
    assert sel.update(worse, 4, 11) == 4
    nan = Estimates(rho=math.nan, beta=1.0, xi=0.5, loss=0.7, grad_norm=1.0)  # unusable estimate (Δw = 0)
    assert sel.update(nan, 5, 15) == 4
    assert sel.infeasible_rounds == 3
    assert sel.update(HAND_EST, 6, 19) == 5  # feasible again
    assert sel.history == [2, 4, 4, 4, 4, 5]


# ---------------------------------------------------------------------------------------------------------------------
# Estimates (Alg. 2 lines 17-18)
# ---------------------------------------------------------------------------------------------------------------------


def test_weighted_estimates_hand_computed():
    est = weighted_estimates([1, 3], [2.0, 4.0], [10.0, 2.0], [np.array([1.0, 0.0]), np.array([0.0, 2.0])],
                             [1.0, 0.6])
    # p = (1/4, 3/4); ĝ = (0.25, 1.5); g_1 − ĝ = (0.75, −1.5); g_2 − ĝ = (−0.25, 0.5)
    assert est.rho == pytest.approx(0.25 * 2 + 0.75 * 4)
    assert est.beta == pytest.approx(0.25 * 10 + 0.75 * 2)
    assert est.xi == pytest.approx(0.25 * math.sqrt(2.8125) + 0.75 * math.sqrt(0.3125))
    assert est.loss == pytest.approx(0.25 * 1.0 + 0.75 * 0.6)
    assert est.grad_norm == pytest.approx(math.sqrt(0.25 ** 2 + 1.5 ** 2))


def test_weighted_estimates_accepts_torch_tensors():
    torch = pytest.importorskip("torch")
    est = weighted_estimates([1, 1], [1.0, 1.0], [1.0, 1.0], [torch.tensor([3.0, 0.0]), torch.tensor([[0.0], [4.0]])],
                             [1.0, 1.0])
    assert est.grad_norm == pytest.approx(2.5)
    assert est.xi == pytest.approx(2.5)
    stacked = weighted_estimates([1, 3], [2.0, 4.0], [10.0, 2.0], torch.tensor([[1.0, 0.0], [0.0, 2.0]]), [1.0, 0.6])
    assert stacked.xi == pytest.approx(0.25 * math.sqrt(2.8125) + 0.75 * math.sqrt(0.3125))
    assert stacked.grad_norm == pytest.approx(math.sqrt(0.25 ** 2 + 1.5 ** 2))


# ---------------------------------------------------------------------------------------------------------------------
# closed_form_code: the authors' later public code, not the paper (reading C-A1)
# ---------------------------------------------------------------------------------------------------------------------


def test_code_estimates_hand_computed():
    mu, gamma = code_estimates([1, 1], [1.0, 3.0], [0.5, 1.5], [-0.1, 0.02])
    assert mu == pytest.approx(0.5 * (1.0 / (0.5 + 1e-6) + 3.0 / (1.5 + 1e-6)), rel=1e-12)
    assert gamma == pytest.approx(0.04)


def test_closed_form_hand_computed():
    # μ̂=2, C=0.1, Γ̂=0.05, σ=1, d=100, B̂=10 ⇒ N_σ = 0.01.
    # τ*_prev = 1 ⇒ T = min(10·1, 1000) = 10: num = 1 + 0.03 + 2 + 0.01 = 3.04, den = 2.2·0.02 = 0.044
    #   τ_raw = sqrt(1 + 3.04/0.044001) = 8.3719… → 8
    # τ*_prev = 8 ⇒ T = 80: num = 17.04, den = 2.025·0.02 = 0.0405 ⇒ τ_raw = sqrt(1 + 17.04/0.040501) = 20.536… → 21
    tau, raw = closed_form_tau(2.0, 0.05, 0.1, 1.0, 100, 10, 10)
    assert raw == pytest.approx(math.sqrt(1 + 3.04 / 0.044001), rel=1e-12) and tau == 8
    sel = TauSelector(eta=0.5, noise=1.0, R_s=10, R_c=1000, rule="closed_form_code", clip=0.1, sigma=1.0, dim=100,
                      batch_hat=10)
    est = Estimates(mu=2.0, gamma=0.05)
    assert sel.update(est, 1, 1) == 8
    assert sel.update(est, 2, 9) == 21
    assert closed_form_tau(2.0, 0.05, 0.1, 1.0, 100, 10, 80)[1] == pytest.approx(math.sqrt(1 + 17.04 / 0.040501))
    assert closed_form_tau(1e-3, 0.05, 0.1, 1.0, 100, 10, 80)[0] == 100  # clamped to the cap
    assert closed_form_tau(1e3, 0.0, 10.0, 0.0, 100, 10, 80)[0] == 2  # σ = 0: sqrt(1 + 3/2.025) = 1.576…
    assert closed_form_tau(1e3, 0.0, 10.0, 0.0, 100, 10, 1)[0] == 1  # sqrt(1 + 3/4) = 1.32…
    assert sel.update(Estimates(mu=0.0, gamma=0.05), 3, 30) == 21  # unusable μ̂: kept and counted
    assert sel.infeasible_rounds == 1
    with pytest.raises(ValueError):
        TauSelector(eta=0.5, noise=1.0, R_s=10, R_c=1000, rule="closed_form_code")


def test_bad_options_refused():
    with pytest.raises(ValueError):
        TauSelector(eta=0.5, noise=1.0, R_s=10, R_c=1000, rule="min_h")
    with pytest.raises(ValueError):
        TauSelector(eta=0.5, noise=1.0, R_s=10, R_c=1000, T_mode="total")
