"""QTDL and the cpSGD Binomial baseline (NFA Alg. 1, Theorem 1, Lemma 1, eq. 6/7, Theorem 2; readings C-N7, C-N15)."""

import itertools
import math

import numpy as np
import pytest
import torch

from normfl.privacy.accounting import composed
from normfl.privacy.qtdl import (
    QTDL,
    Binomial,
    Sensitivity,
    binomial_trials,
    bits_per_coordinate,
    centered_binomial_levels,
    heuristic_sensitivity,
    per_message_epsilon,
    qtdl_parameters,
    quantize_levels,
    tdl_delta,
    tdl_levels,
    tdl_normaliser,
    tdl_pmf,
    tdl_variance,
    theorem2_epsilon,
    worst_case_sensitivity,
)

CIFAR_D, FMNIST_D = 2_210_410, 328_810


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------------------------ quantization


@pytest.mark.parametrize("s", [4, 2**20])
def test_quantization_is_unbiased_on_grid_with_bounded_variance(s):
    u = torch.tensor([1.0, -1.0, 0.0, 0.3, -0.77, 0.5 + 1 / (2 * s), -1 + 1 / (3 * s), 0.123456789],
                     dtype=torch.float64)
    n = 20_000
    levels = quantize_levels(u.expand(n, -1), s, gen(1))
    assert levels.dtype == torch.int64
    assert levels.min() >= -s and levels.max() <= s               # on the grid {-s..s}/s
    assert levels[:, 0].eq(s).all() and levels[:, 1].eq(-s).all() and levels[:, 2].eq(0).all()
    frac = (u * s - torch.floor(u * s)).numpy()
    var = frac * (1 - frac) / s**2                                # per-coordinate Var Q(u_i) = f(1-f)/s²
    q = levels.double().numpy() / s
    err = np.abs(q.mean(0) - u.numpy())
    assert np.all(err <= 4 * np.sqrt(var / n) + 1e-15)            # unbiased: within 4 standard errors
    assert set(np.unique(levels[:, 5].numpy()) - np.floor(u[5].numpy() * s)) <= {0, 1}   # the two nearest levels
    mse = ((q - u.numpy()) ** 2).sum(1).mean()
    assert mse == pytest.approx(var.sum(), rel=0.05)              # 5%: ≫ 4 s.e. of the mean of n draws
    assert mse <= 8 / (4 * s**2) * 1.05                           # E||Q(u)-u||² ≤ d/(4s²), 5% tolerance


# ------------------------------------------------------------------------------------------------ TDL pmf


def test_tdl_pmf_support_normalisation_and_closed_form():
    for m, alpha in [(1, 0.5), (5, 0.7), (54, 2.2e-6), (413, 1.12e-5), (7, 3.0)]:
        pmf = tdl_pmf(m, alpha)
        assert pmf.shape == (2 * m + 1,) and pmf.dtype == np.float64 and np.all(pmf > 0)
        assert pmf.sum() == pytest.approx(1.0, abs=1e-14)
        y = np.arange(-m, m + 1)
        z = 1 + 2 * -math.expm1(-alpha * m) / math.expm1(alpha)   # expm1: the naive form loses ~1e-11 here
        np.testing.assert_allclose(pmf, np.exp(-alpha * np.abs(y)) / z, rtol=1e-12)
    np.testing.assert_allclose(tdl_pmf(6, 0.0), np.full(13, 1 / 13), rtol=1e-14)        # α = 0: uniform


# ------------------------------------------------------------------------------------------------ exact privacy


def _privacy_of(m: int, alpha: float, d: int, linf: int, l1: int, eps: float) -> tuple[float, float]:
    """Exact worst (max log-ratio on the common support, hockey-stick divergence at e^eps) over all level shifts b.

    P_0(y) = Π pmf(y_i), P_b(y) = Π pmf(y_i - b_i) on the grid y in [-m-Δ∞, m+Δ∞]^d, computed, not sampled.
    """
    pad = np.zeros(2 * (m + linf) + 1)
    pad[linf:linf + 2 * m + 1] = tdl_pmf(m, alpha)
    worst_ratio, worst_delta = -np.inf, 0.0
    p0 = pad
    for _ in range(d - 1):
        p0 = np.multiply.outer(p0, pad)
    for b in itertools.product(range(-linf, linf + 1), repeat=d):
        if sum(map(abs, b)) > l1 or not any(b):
            continue
        pb = np.roll(pad, b[0])
        for shift in b[1:]:
            pb = np.multiply.outer(pb, np.roll(pad, shift))
        both = (p0 > 0) & (pb > 0)
        worst_ratio = max(worst_ratio, float(np.max(np.log(p0[both]) - np.log(pb[both]))))
        worst_delta = max(worst_delta, float(np.maximum(0, p0 - math.exp(eps) * pb).sum()))
    return worst_ratio, worst_delta


SMALL = [(1, 2, 2, 0.3), (2, 2, 3, 0.5), (2, 1, 2, 0.3), (3, 2, 4, 0.7), (3, 1, 3, 1.0)]


@pytest.mark.parametrize("d,linf,l1,eps", SMALL)
def test_theorem1_exact_privacy_loss_on_small_dimension(d, linf, l1, eps):
    sens = Sensitivity(l1=l1, linf=linf, l2=math.sqrt(l1 * linf))
    alpha, m = qtdl_parameters(eps, sens)
    ratio, delta = _privacy_of(m, alpha, d, linf, l1, eps)
    assert ratio <= eps + 1e-12                                   # eq. 10: pure ε on the common support
    assert delta == pytest.approx(tdl_delta(m, alpha, sens, d), rel=1e-12)   # the closed form is the exact δ
    assert delta <= l1 / tdl_normaliser(m, alpha)                 # union bound: each level has mass ≤ 1/Z
    # negative controls: the check does fail with half the noise (α = 2ε/Δ1) or too few levels (m < Δ∞)
    assert _privacy_of(m, 2 * eps / l1, d, linf, l1, eps)[0] > eps + 0.1
    assert _privacy_of(max(1, linf - 1), alpha, d, linf, l1, eps)[1] > 2.0**-d


def test_theorem1_delta_holds_in_one_dimension():
    for linf, eps in [(1, 0.3), (2, 0.36), (5, 0.1)]:              # Theorem 1 needs ε < e^-1 here (Δ1 = Δ∞)
        sens = Sensitivity(l1=linf, linf=linf, l2=linf)
        alpha, m = qtdl_parameters(eps, sens)
        ratio, delta = _privacy_of(m, alpha, 1, linf, linf, eps)
        assert ratio <= eps + 1e-12 and delta <= 0.5              # d = 1: δ ≤ Δ∞/Z ≤ 2^-1 does hold


@pytest.mark.xfail(strict=True, reason="NFA Theorem 1's δ = 2^-d is wrong for d ≥ 2: its proof (App. B) claims "
                   "|S2 - S1| ≤ Δ∞^d, but an output leaves the other support if ANY coordinate is in the band; "
                   "the exact δ (tdl_delta) is ≈ Δ∞/Z ≈ 1/2 or more")
@pytest.mark.parametrize("d,linf,l1,eps", SMALL[1:])
def test_theorem1_delta_claim_2_to_minus_d(d, linf, l1, eps):
    alpha, m = qtdl_parameters(eps, Sensitivity(l1=l1, linf=linf, l2=math.sqrt(l1 * linf)))
    assert _privacy_of(m, alpha, d, linf, l1, eps)[1] <= 2.0**-d  # hockey stick at e^ε, computed exactly


def test_true_delta_of_the_paper_settings_is_vacuous():
    sens = heuristic_sensitivity(CIFAR_D, 2**20, 0.1)             # NFA Table 2, s = 2^20: per-round (10, 2^-d) claimed
    alpha, m = qtdl_parameters(10.0, sens)
    assert tdl_delta(m, alpha, sens, CIFAR_D) > 1 - 1e-12
    assert tdl_delta(m, alpha, Sensitivity(l1=sens.linf, linf=sens.linf, l2=0), CIFAR_D) > 0.49   # even one coordinate


def test_qtdl_parameters_rejects_outside_theorem1():
    with pytest.raises(ValueError, match="e\\^-1"):
        qtdl_parameters(1.0, Sensitivity(l1=2, linf=1, l2=1))                 # needs ε < 2/e ≈ 0.736
    with pytest.raises(ValueError, match="not positive"):
        qtdl_parameters(7.0, Sensitivity(l1=1, linf=0.05, l2=1))              # ε < 7.36 but (e^7 - 1)·0.05 > 1


# ------------------------------------------------------------------------------------------------ Lemma 1


@pytest.mark.parametrize("m,alpha", [(1, 0.5), (5, 0.7), (54, 2.224e-6), (413, 1.12e-5), (9, 1.5e-5), (100, 3.0),
                                     (2000, 0.0), (1000, 1e-9), (100_000, 1e-6), (100_000, 6e-6), (3000, 1e-3)])
def test_lemma1_variance_matches_direct_sum(m, alpha):
    s = 7
    y = np.arange(-m, m + 1, dtype=np.float64)
    direct = float(np.sum(y**2 * tdl_pmf(m, alpha))) / s**2
    v = tdl_variance(m, alpha, s)
    assert v == pytest.approx(direct, rel=1e-10)                  # float64 direct sum is good to ~1e-13
    assert v <= m**2 / s**2


def test_lemma1_variance_for_huge_m_is_uniform_limit():
    m, s = 2**30 + 2, 2**29
    assert tdl_variance(m, 2e-18, s) == pytest.approx(m * (m + 1) / (3 * s**2), rel=1e-8)   # α·m ≈ 2e-9
    assert tdl_variance(m, 0.0, s) == pytest.approx(m * (m + 1) / (3 * s**2), rel=1e-14)
    assert tdl_variance(0, 0.3, s) == 0.0


# ------------------------------------------------------------------------------------------------ samplers


def test_tdl_sampler_matches_pmf():
    m, alpha, n = 5, 0.7, 200_000
    y = tdl_levels((n,), m, alpha, gen(2))
    assert y.dtype == torch.int64 and y.min() >= -m and y.max() <= m
    freq = np.bincount(y.numpy() + m, minlength=2 * m + 1) / n
    pmf = tdl_pmf(m, alpha)
    chi2 = n * np.sum((freq - pmf) ** 2 / pmf)
    assert chi2 < 29.6                                            # χ²(10 dof) 99.9% quantile
    assert np.all(np.abs(freq - pmf) <= 5 * np.sqrt(pmf * (1 - pmf) / n))


def test_tdl_sampler_tiny_alpha_branches():
    m, n = 10, 100_000
    y = tdl_levels((n,), m, 1e-14, gen(3))                        # α·m = 1e-13 < 1e-12: uniform magnitudes
    freq = np.bincount(y.numpy() + m, minlength=2 * m + 1) / n
    assert np.all(np.abs(freq - 1 / 21) <= 5 * math.sqrt(1 / 21 * 20 / 21 / n))
    big = 2**30 + 2                                               # worst-case regime: α ≈ 2e-18, α·m ≈ 2e-9
    y = tdl_levels((n,), big, 2e-18, gen(4)).double()
    assert y.abs().max() <= big and torch.equal(y, y.round())
    # αm ≈ 2e-9: the magnitude is uniform on {1..m} (mean (m+1)/2, sd m/√12) and the sign a fair coin
    assert abs((y > 0).double().mean().item() - 0.5) <= 5 * math.sqrt(0.25 / n)
    assert abs(y.abs().mean().item() - (big + 1) / 2) <= 5 * big / math.sqrt(12 * n)
    assert y.var().item() == pytest.approx(tdl_variance(big, 2e-18, 1), rel=0.02)   # ~4.5 s.e. of the variance
    assert abs(y.mean().item()) < 4 * math.sqrt(tdl_variance(big, 2e-18, 1) / n)


def test_centered_binomial_large_counts():
    n, trials = 200_000, 12_106_543_048
    z = centered_binomial_levels((n,), trials, gen(5))
    assert z.dtype == torch.float64
    assert torch.equal(z, torch.round(z))                                   # N even: integer levels
    assert abs(z.mean().item()) < 4 * math.sqrt(trials / 4 / n)
    assert z.var().item() == pytest.approx(trials / 4, rel=0.013)           # s.e. of the variance ≈ 0.32%
    assert (z.to(torch.int64) % 2).double().mean().item() == pytest.approx(0.5, abs=0.005)   # low bits not lost
    odd = centered_binomial_levels((1000,), 7, gen(6))
    assert torch.all(odd.abs() <= 3.5) and torch.all((odd * 2) % 2 == 1)     # N odd: half-integers


# ----------------------------------------------------------------------------------- NFA Tables 2 and 4 (t rows)


@pytest.mark.parametrize("d,s,l1,linf,alpha,m,t", [
    (CIFAR_D, 2**20, 1.603e8, 104_859.6, 6.238e-8, 105_205, 22),
    (CIFAR_D, 2**9, 4.497e6, 53.2, 2.224e-6, 54, 11),
    (FMNIST_D, 2**12, 8.925e5, 411.6, 1.120e-5, 413, 14),
    (FMNIST_D, 2**6, 6.613e5, 8.4, 1.512e-5, 9, 8),
])
def test_b8_qtdl_parameters(d, s, l1, linf, alpha, m, t):
    sens = heuristic_sensitivity(d, s, 0.1)
    assert sens.l1 == pytest.approx(l1, rel=5e-4) and sens.linf == pytest.approx(linf, rel=1e-12)
    assert sens.l2 == pytest.approx(2 * math.sqrt(d) + 0.1 * s)
    a, mm = qtdl_parameters(10.0, sens)
    assert a == pytest.approx(alpha, rel=5e-4) and mm == m and bits_per_coordinate(s, mm) == t
    assert mm < math.ceil(2.5 * sens.linf)                                   # Theorem 1: m < ⌈2.5 Δ∞⌉
    assert QTDL(s, mm, a).bits == t


@pytest.mark.parametrize("d,s,trials,t", [(CIFAR_D, 2**20, 12_106_543_048, 35), (FMNIST_D, 2**12, 2_843_701, 23)])
def test_b8_binomial_trials(d, s, trials, t):
    sens = heuristic_sensitivity(d, s, 0.1)
    assert binomial_trials(10.0, 3e-6, d, sens) == trials                     # exact (reading C-N7)
    assert bits_per_coordinate(s, trials) == t and Binomial(s, trials).bits == t


def test_bits_exact_integer_arithmetic():
    assert bits_per_coordinate(1, 0) == 2                # 3 levels
    assert bits_per_coordinate(2, 0) == 3                # 5 levels
    assert bits_per_coordinate(3, 1) == 4                # 9 levels: ⌈log2 9⌉ = 4
    assert bits_per_coordinate(2**29, 0) == 31           # 2^30 + 1 levels


# ------------------------------------------------------------------------------------------------ Theorem 2


def test_theorem2_budget_and_full_precision_runs():
    eps = theorem2_epsilon(0.1, 1e-9, 25, 50)
    assert eps == pytest.approx(0.7990, abs=5e-5)
    assert 1.0 * (eps / 8 + eps**2 / (256 * math.log(1e9))) == pytest.approx(0.1, rel=1e-12)
    assert theorem2_epsilon(0.1, 1e-9, 5, 50) == pytest.approx(theorem2_epsilon(0.5, 1e-9, 25, 50), rel=1e-12)
    eps0 = per_message_epsilon(eps, 1e-9, 500)
    assert eps0 == pytest.approx(6.94e-4, abs=5e-7)
    s = 2**29
    sens = worst_case_sensitivity(FMNIST_D, s)                                 # (ii): Δ∞ = 2s, Δ1 = 2ds
    assert (sens.linf, sens.l1) == (2 * s, 2 * FMNIST_D * s)
    alpha, m = qtdl_parameters(eps0, sens)
    assert m == 2 * s + 2 and bits_per_coordinate(s, m) == 32                  # m checked with mpmath at 60 digits
    assert alpha * m == pytest.approx(2.11e-9, rel=1e-2)
    agg = worst_case_sensitivity(CIFAR_D, s, scale=1 / 25)                     # (iii): Δ∞ = 0.08 s
    alpha, m = qtdl_parameters(eps0, agg)
    assert agg.linf == pytest.approx(0.08 * s) and m == 42_949_673 and bits_per_coordinate(s, m) == 31


def test_composition():
    assert composed(0.1, 1e-6, 0, 1e-9, 0.5) == (0.0, 0.0)
    eps, delta = composed(0.5, 1e-6, 3, 1e-9, 1.0)                # few large messages: basic wins
    assert (eps, delta) == pytest.approx((1.5, 3e-6))
    eps, delta = composed(1e-3, 1e-7, 500, 1e-9, 1.0)             # many small ones: advanced, then ε < 1 but 2q = 2
    adv = 1e-3 * math.sqrt(1000 * math.log(1e9)) + 500 * 1e-3 * math.tanh(5e-4)
    assert eps == pytest.approx(adv) and eps < 0.5 and delta == pytest.approx(500 * 1e-7 + 1e-9)
    assert composed(1e-3, 1e-7, 500, 1e-9, 0.1)[0] == pytest.approx(0.2 * adv)         # amplified by 2r/n
    assert composed(0.5, 0.0, 3, 1e-9, 0.1)[0] == pytest.approx(1.5)                   # ε ≥ 1: no amplification
    eps0 = per_message_epsilon(theorem2_epsilon(0.1, 1e-9, 25, 50), 1e-9, 500)
    assert composed(eps0, 0.0, 500, 1e-9, 0.5)[0] <= 0.1                               # Theorem 2's chain


# ------------------------------------------------------------------------------------------------ mechanisms


@pytest.mark.parametrize("mech", [QTDL(4, 3, 0.3), Binomial(4, 101)])
def test_mechanisms_unbiased_typed_and_reproducible(mech):
    u = torch.tensor([1.0, -1.0, 0.0, 0.3, -0.77, 0.55, 0.9, -0.2], dtype=torch.float32)
    n = 20_000
    out = mech(u.expand(n, -1), gen(7))
    assert out.dtype == torch.float32 and out.device == u.device and out.shape == (n, 8)
    sd = math.sqrt(1 / (4 * 16) + mech.std**2)                   # quantization var ≤ 1/(4s²) plus noise var
    assert torch.all((out.double().mean(0) - u.double()).abs() <= 4 * sd / math.sqrt(n))
    assert torch.equal(out, mech(u.expand(n, -1), gen(7)))
    assert not torch.equal(out, mech(u.expand(n, -1), gen(8)))
    levels = out.double() * 4                                      # s·M(u) on the (half-)integer grid
    assert torch.equal(levels * 2, torch.round(levels * 2))
    noise = mech.noise((n, 8), gen(9), "cpu", torch.float64)
    assert noise.dtype == torch.float64
    assert noise.std().item() == pytest.approx(mech.std, rel=0.02)  # s.e. of the std ≈ 0.3%
    q = mech.quantize(u.double(), gen(10))
    assert q.dtype == torch.float64 and torch.equal(q * 4, torch.round(q * 4))


def test_qtdl_std_is_lemma1():
    mech = QTDL(2**12, 413, 1.12e-5)
    assert mech.std == pytest.approx(math.sqrt(tdl_variance(413, 1.12e-5, 2**12)))
    assert Binomial(2**12, 2_843_701).std == pytest.approx(math.sqrt(2_843_701 / 4) / 2**12)
