"""The audit's statistics (``normfl.privacy.audit.stats``): a bound that never claims more than a mechanism leaks,
sees a broken one, and stays at 0 when there is nothing to see. The canaries that feed it through each
mechanism's real code path are issue 30's next step; here the scores are drawn from the mechanism's law."""

import math

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution
from scipy.stats import norm

from normfl.privacy.audit.stats import (
    curve_eps_lower,
    curve_refutes,
    eps_lower,
    error_upper_bounds,
    gdp_delta,
    gdp_epsilon,
    mu_lower,
    rate_bounds,
)

DELTA = 1e-5
THRESHOLDS = np.linspace(0.0, 3.0, 7)


def gaussian_eps(sigma: float) -> float:
    """ε(δ) of one Gaussian release of sensitivity 1 and noise σ (dp-accounting's PLD)."""
    return dpa.pld.PLDAccountant().compose(dpa.GaussianDpEvent(sigma)).get_epsilon(DELTA)


def scores(sigma: float, m: int, seed: int):
    """What the observer sees of a canary of norm 1 under N(0, σ²) noise, projected on its direction."""
    rng = np.random.default_rng(seed)
    return 1.0 + sigma * rng.standard_normal(m), sigma * rng.standard_normal(m)


def test_rate_bounds_are_exact_clopper_pearson():
    lo, hi = rate_bounds(0, 100, 0.05)
    assert lo == 0 and hi == pytest.approx(1 - 0.025 ** (1 / 100), rel=1e-9)
    lo, hi = rate_bounds(100, 100, 0.05)
    assert hi == 1 and lo == pytest.approx(0.025 ** (1 / 100), rel=1e-9)


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0])
def test_a_correct_gaussian_is_bounded_below_its_certificate_and_the_bound_has_power(sigma):
    certified = gaussian_eps(sigma)
    got = eps_lower(*scores(sigma, 20_000, 1), DELTA, THRESHOLDS * sigma)["eps_lower"]
    assert 0.3 * certified < got < certified          # 20,000 canaries a side: 39-45% of the certificate


def test_a_privatizer_with_a_tenth_of_the_noise_is_refuted():
    """Thresholds chosen for the claimed σ = 2 (ε = 1.99); the noise actually added is 0.2."""
    claimed = gaussian_eps(2.0)
    assert eps_lower(*scores(0.2, 5_000, 2), DELTA, THRESHOLDS * 2.0)["eps_lower"] > claimed + 2


def test_null_and_correct_audits_stay_within_their_confidence_over_many_seeds():
    """α = 0.05: canaries never inserted give a positive bound, and a correct mechanism a bound above its
    certificate, in at most 5 of 100 audits (the bound is conservative: Bonferroni over 14 tests)."""
    certified = gaussian_eps(1.0)
    def never_inserted(seed):                         # "in" and "out" canaries alike: nothing to see
        rng = np.random.default_rng(seed)
        return rng.standard_normal(2_000), rng.standard_normal(2_000)

    null = [eps_lower(*never_inserted(seed), DELTA, THRESHOLDS)["eps_lower"] for seed in range(100)]
    correct = [eps_lower(*scores(1.0, 2_000, 1000 + seed), DELTA, THRESHOLDS)["eps_lower"] for seed in range(100)]
    assert np.mean(np.array(null) > 0) <= 0.05 and max(null) < 0.5
    assert np.mean(np.array(correct) > certified) <= 0.05


def never_inserted(m: int, seed: int):
    """"In" and "out" canaries alike: nothing to see."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal(m), rng.standard_normal(m)


def test_the_gdp_route_shows_nothing_on_null_scores_where_an_abs_would_show_mu_2():
    """200 null audits of 1,000 canaries a side: μ_LB stays 0 (at most 5% positive, plus binomial slack).
    The same bounds with |Φ⁻¹(1 - FPR_hi) - Φ⁻¹(FNR_hi)| (jax-privacy's ``epsilon_from_gdp``) give μ ≈ 2 from
    the confidence intervals' width alone: the test below would catch that bug."""
    seeds = range(200)
    got = np.array([mu_lower(*never_inserted(1_000, seed), THRESHOLDS)["mu_lower"] for seed in seeds])
    with_abs = np.array([np.abs(norm.isf(fpr) - norm.ppf(fnr)).max()
                         for fpr, fnr in (error_upper_bounds(*never_inserted(1_000, seed), THRESHOLDS)
                                          for seed in seeds)])
    assert np.mean(got > 0) <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / len(seeds))
    assert np.median(got) == 0 and got.min() >= 0
    assert np.median(with_abs) > 1.5                  # 2.07 measured


def test_the_gdp_route_covers_the_exact_gaussian_and_has_power():
    """Scores N(μ, 1) against N(0, 1) are exactly μ-GDP; μ = 0.502 is ε = 2 at δ = 1e-5. Over 200 audits of
    10,000 canaries a side the bound exceeds ε = 2 in at most 5% (0.5% measured) and its median is 1.75."""
    mu = 0.502
    assert gdp_epsilon(mu, DELTA) == pytest.approx(2.0, abs=0.005)
    eps = []
    for seed in range(200):
        rng = np.random.default_rng(10_000 + seed)
        got = mu_lower(mu + rng.standard_normal(10_000), rng.standard_normal(10_000), THRESHOLDS)
        eps.append(gdp_epsilon(got["mu_lower"], DELTA))
    assert np.mean(np.array(eps) > 2.0) <= 0.05
    assert np.median(eps) >= 1.4


def test_gdp_closed_forms():
    mu = math.sqrt(300) / 7.35                        # 300 full-batch Gaussian steps at σ = 7.35
    assert gdp_epsilon(mu, DELTA) == pytest.approx(12.26, abs=0.02)
    for mu in (0.3, 1.0, 2.5):                        # μ-GDP is the Gaussian mechanism of σ = 1/μ: dp-accounting agrees
        assert gdp_epsilon(mu, DELTA) == pytest.approx(gaussian_eps(1 / mu), rel=2e-3)
        for delta in (1e-3, 1e-6):
            assert gdp_delta(mu, gdp_epsilon(mu, delta)) == pytest.approx(delta, rel=1e-6)
    assert gdp_epsilon(0.0, DELTA) == 0 and gdp_epsilon(1e-3, 0.5) == 0    # δ(0) already below δ


def test_perfect_separation_gives_the_confidence_bounds_own_mu():
    n, alpha = 500, 0.05
    got = mu_lower(np.full(n, 10.0), np.full(n, -10.0), THRESHOLDS, alpha)
    hi = rate_bounds(0, n, alpha / len(THRESHOLDS))[1]                     # one side: α / (2 · thresholds)
    assert hi == pytest.approx(1 - (alpha / (2 * len(THRESHOLDS))) ** (1 / n), rel=1e-9)
    assert got["fpr_hi"] == got["fnr_hi"] == hi
    assert got["mu_lower"] == pytest.approx(norm.isf(hi) - norm.ppf(hi), rel=1e-12)


def test_the_curve_test_of_a_gaussian_pld_is_the_gdp_curve():
    """An unsampled Gaussian of σ = 1 is 1-GDP: a point 10% inside its curve refutes it, 10% outside does not."""
    pld = privacy_loss_distribution.from_gaussian_mechanism(1.0, value_discretization_interval=1e-3)
    fpr = 0.1
    fnr = norm.cdf(norm.isf(fpr) - 1.0)
    assert curve_refutes(fpr, 0.9 * fnr, pld) and curve_refutes(0.9 * fnr, fpr, pld)
    assert not curve_refutes(fpr, 1.1 * fnr, pld) and not curve_refutes(1.1 * fnr, fpr, pld)


Q, STEPS, Z = 0.5, 10, 1.0                            # the claim: Poisson rate 0.5, 10 steps, noise multiplier 1
CURVE_THRESHOLDS = np.linspace(0.0, 8.0, 9)           # over the claimed mechanism's scores, fixed beforehand


def sampled_gaussian(z: float, pessimistic: bool = True):
    return privacy_loss_distribution.from_gaussian_mechanism(
        z, sampling_prob=Q, value_discretization_interval=1e-2, pessimistic_estimate=pessimistic,
        use_connect_dots=pessimistic).self_compose(STEPS)


def sampled_scores(m: int, seed: int, rate: float = Q):
    """Each step includes an "in" canary with probability ``rate`` (sensitivity 1, noise Z); the observer scores
    the log-likelihood ratio of the claimed mechanism, Σ log(1 - q + q·exp((y - ½)/z²))."""
    rng = np.random.default_rng(seed)
    y_in = (rng.random((m, STEPS)) < rate) + Z * rng.standard_normal((m, STEPS))
    y_out = Z * rng.standard_normal((m, STEPS))
    def score(y):
        return np.log(1 - Q + Q * np.exp((y - 0.5) / Z ** 2)).sum(axis=1)
    return score(y_in), score(y_out)


def test_the_curve_route_does_not_refute_a_correct_sampled_gaussian_and_comes_close():
    """4,000 canaries a side: the claim stands, and the family's bound is 88% of its ε (10.46; 9.19 measured)."""
    certified = sampled_gaussian(Z).get_epsilon_for_delta(DELTA)
    s_in, s_out = sampled_scores(4_000, 0)
    assert not curve_refutes(*error_upper_bounds(s_in, s_out, CURVE_THRESHOLDS), sampled_gaussian(Z))
    got = curve_eps_lower(s_in, s_out, CURVE_THRESHOLDS, sampled_gaussian, DELTA)
    assert 0.8 * certified < got["eps_lower_curve"] <= certified and got["noise_multiplier_upper"] > Z


def test_the_curve_route_refutes_a_sampler_that_always_includes():
    """The mechanism includes the canary every step, claiming rate 0.5: refuted; the family's bound 29.1."""
    certified = sampled_gaussian(Z).get_epsilon_for_delta(DELTA)
    s_in, s_out = sampled_scores(4_000, 7, rate=1.0)
    assert curve_refutes(*error_upper_bounds(s_in, s_out, CURVE_THRESHOLDS), sampled_gaussian(Z))
    got = curve_eps_lower(s_in, s_out, CURVE_THRESHOLDS, sampled_gaussian, DELTA)
    assert got["eps_lower_curve"] > certified + 5 and got["noise_multiplier_upper"] < 0.6


def test_the_curve_route_shows_nothing_on_null_scores():
    for seed in range(20):
        got = curve_eps_lower(*never_inserted(2_000, seed), CURVE_THRESHOLDS, sampled_gaussian, DELTA)
        assert got == {"eps_lower_curve": 0.0, "noise_multiplier_upper": None, "threshold": None}
