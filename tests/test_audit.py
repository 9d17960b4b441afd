"""The audit's statistics (``normfl.privacy.audit.stats``): a bound that never claims more than a mechanism leaks,
sees a broken one, and stays at 0 when there is nothing to see. The canaries that feed it through each
mechanism's real code path are issue 30's next step; here the scores are drawn from the mechanism's law."""

import math

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution
from scipy.stats import beta, norm

from normfl.privacy.audit import stats
from normfl.privacy.audit.stats import (
    bonferroni,
    curve_eps_lower,
    curve_refutes,
    eps_lower,
    error_upper_bounds,
    gdp_delta,
    gdp_epsilon,
    mu_lower,
    rate_bounds,
    rate_lower,
    rate_upper,
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


@pytest.mark.slow
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


@pytest.mark.slow
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
    assert np.median(got) == 0                        # nothing seen is 0, not a negative μ
    assert np.median(with_abs) > 1.5                  # 2.07 measured


@pytest.mark.slow
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


# ------------------------------------------------------------------ exact values at known counts
# The expected bounds are Clopper-Pearson's from first principles (beta quantiles), each one-sided bound at the
# failure probability the docstrings state: α / (4T) for eps_lower over T thresholds (two directions, a lower and
# an upper bound each), α / (2T) for the error rates' upper bounds (error_upper_bounds, mu_lower, curve_eps_lower).


def cp_lower(k: int, n: int, fail: float) -> float:
    """The p at which P(Binomial(n, p) ≥ k) = fail (0 when k = 0)."""
    return 0.0 if k == 0 else float(beta.ppf(fail, k, n - k + 1))


def cp_upper(k: int, n: int, fail: float) -> float:
    """The p at which P(Binomial(n, p) ≤ k) = fail (1 when k = n)."""
    return 1.0 if k == n else float(beta.ppf(1 - fail, k + 1, n - k))


# 40 "in" and 60 "out" scores on a grid; 10 "in" and 8 "out" scores equal the threshold 1.0 and are not above it
KNOWN_IN = np.repeat([0.0, 1.0, 2.0, 3.0], [5, 10, 5, 20])
KNOWN_OUT = np.repeat([0.0, 1.0, 3.0], [50, 8, 2])
KNOWN_T = [0.5, 1.0, 2.5]
ABOVE_IN, ABOVE_OUT = [35, 25, 20], [10, 2, 2]          # scores > t at each threshold, counted by hand


def test_bonferroni_shares_alpha_and_the_one_sided_bounds_fail_with_their_share():
    assert bonferroni(0.05, 1) == 0.05 and bonferroni(0.05, 4) == 0.0125 and bonferroni(0.01, 28) == 0.01 / 28
    for k, n, fail in [(0, 40, 0.01), (3, 40, 0.01), (25, 40, 0.05 / 12), (40, 40, 0.05 / 12), (17, 60, 0.2)]:
        assert rate_lower(k, n, fail) == pytest.approx(cp_lower(k, n, fail), rel=1e-9, abs=1e-15)
        assert rate_upper(k, n, fail) == pytest.approx(cp_upper(k, n, fail), rel=1e-9)


def known_tests(delta: float, fail: float) -> dict:
    """ε of each test at the known counts: (threshold, "score > t") from TPR_lo and FPR_hi, (threshold,
    "score ≤ t") from TNR_lo and FNR_hi, each rate bound failing with probability ``fail``."""
    eps = {}
    for t, tp, fp in zip(KNOWN_T, ABOVE_IN, ABOVE_OUT, strict=True):
        eps[t, ">"] = math.log((cp_lower(tp, 40, fail) - delta) / cp_upper(fp, 60, fail))
        eps[t, "≤"] = math.log((cp_lower(60 - fp, 60, fail) - delta) / cp_upper(40 - tp, 40, fail))
    return eps


@pytest.mark.parametrize("alpha", [0.05, 0.01])
@pytest.mark.parametrize("delta", [0.0, 0.02])
def test_eps_lower_at_known_counts_is_the_best_of_the_2T_tests_each_bound_at_alpha_over_4T(alpha, delta):
    expected = known_tests(delta, alpha / (4 * len(KNOWN_T)))
    assert max(expected, key=expected.get) == (1.0, ">")
    got = eps_lower(KNOWN_IN, KNOWN_OUT, delta, KNOWN_T, alpha)
    assert got["eps_lower"] == pytest.approx(expected[1.0, ">"], rel=1e-9)
    assert (got["threshold"], got["tpr"], got["fpr"]) == (1.0, 25 / 40, 2 / 60)


def test_eps_lower_takes_the_reversed_test_when_score_at_or_below_t_tells_more():
    """Every "in" score is 1, the "out" scores are 0 and 2: at t = 0.5 "score ≤ t" never calls an "in" canary
    "out", while "score > t" calls half the "out" ones "in"; at t = 1.5 neither direction shows anything. The
    rates reported stay the threshold's ("score > t")."""
    s_in, s_out, delta, fail = np.full(40, 1.0), np.repeat([0.0, 2.0], 30), 0.02, 0.05 / 8    # α / (4 · 2)
    reversed_ = math.log((cp_lower(30, 60, fail) - delta) / cp_upper(0, 40, fail))
    forward = math.log((cp_lower(40, 40, fail) - delta) / cp_upper(30, 60, fail))
    assert reversed_ > forward + 0.5
    got = eps_lower(s_in, s_out, delta, [0.5, 1.5])
    assert got["eps_lower"] == pytest.approx(reversed_, rel=1e-9)
    assert (got["threshold"], got["tpr"], got["fpr"]) == (0.5, 1.0, 0.5)


def known_error_bounds(alpha: float) -> tuple[np.ndarray, np.ndarray]:
    fail = alpha / (2 * len(KNOWN_T))
    return (np.array([cp_upper(fp, 60, fail) for fp in ABOVE_OUT]),
            np.array([cp_upper(40 - tp, 40, fail) for tp in ABOVE_IN]))


@pytest.mark.parametrize("alpha", [0.05, 0.01])
def test_error_upper_bounds_at_known_counts_each_at_alpha_over_2T(alpha):
    fpr_hi, fnr_hi = error_upper_bounds(KNOWN_IN, KNOWN_OUT, KNOWN_T, alpha)
    expected_fpr, expected_fnr = known_error_bounds(alpha)
    np.testing.assert_allclose(fpr_hi, expected_fpr, rtol=1e-9, atol=0)
    np.testing.assert_allclose(fnr_hi, expected_fnr, rtol=1e-9, atol=0)


def test_mu_lower_at_known_counts_is_the_best_threshold_of_the_error_bounds():
    fpr_hi, fnr_hi = known_error_bounds(0.05)
    mu = norm.isf(fpr_hi) - norm.ppf(fnr_hi)
    assert np.argmax(mu) == 0 and mu[0] > mu[1] + 0.1
    got = mu_lower(KNOWN_IN, KNOWN_OUT, KNOWN_T)
    assert got["threshold"] == 0.5 and got["mu_lower"] == pytest.approx(mu[0], rel=1e-9)
    assert (got["fpr_hi"], got["fnr_hi"]) == (pytest.approx(fpr_hi[0], rel=1e-9), pytest.approx(fnr_hi[0], rel=1e-9))


def test_curve_eps_lower_tests_the_error_bounds_at_alpha_over_2T(monkeypatch):
    seen = []
    def refutes_nothing(fpr_hi, fnr_hi, pld):
        seen.append((fpr_hi, fnr_hi))
        return False
    monkeypatch.setattr(stats, "curve_refutes", refutes_nothing)
    got = curve_eps_lower(KNOWN_IN, KNOWN_OUT, KNOWN_T, lambda z, pessimistic: None, DELTA, alpha=0.01)
    assert got["eps_lower_curve"] == 0 and len(seen) == 1
    for got_bounds, expected in zip(seen[0], known_error_bounds(0.01), strict=True):
        np.testing.assert_allclose(got_bounds, expected, rtol=1e-9, atol=0)


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


# -- one run (Steinke, Nasr and Jagielski 2023): canaries in one run, guesses counted ---------------------------------

def test_the_one_run_bound_at_known_counts_is_the_binomial_tail_and_its_delta_term():
    """P[W ≥ v] ≤ β + 2mδ·max_i (P[B ≥ v - i] - β)/i, B ~ Binomial(r, e^ε/(1+e^ε)): by hand at r = 4, v = 3."""
    from scipy.stats import binom

    g = stats.Guesses(2, 4, 3)
    q = math.exp(1.0) / (1 + math.exp(1.0))
    tail = lambda v: binom.sf(v - 1, 4, q)                                # noqa: E731  P[B ≥ v]
    beta = tail(3)
    step = max((tail(3 - i) - beta) / i for i in (1, 2, 3))
    assert stats.one_run_p(10, g, 1.0, 0.0)[0] == pytest.approx(beta, rel=1e-12)
    assert stats.one_run_p(10, g, 1.0, 1e-3)[0] == pytest.approx(beta + 2 * 10 * 1e-3 * step, rel=1e-12)
    assert stats.one_run_p(10, g, [0.0, 1.0], [0.0, 1e-3])[1] == pytest.approx(beta + 2 * 10 * 1e-3 * step)


@pytest.mark.parametrize("r", [10, 100, 1000])
def test_all_guesses_right_bound_epsilon_at_the_closed_form(r):
    """δ = 0, r of r right: P = q^r, so the bound is logit(α^(1/r)): 4.39 at r = 100, 6.87 at r = 1,000 (α = 0.05)."""
    got = stats.one_run_eps_lower(2 * r, stats.Guesses(r // 2, r, r), 0.0, 0.05)
    q = 0.05 ** (1 / r)
    assert got == pytest.approx(math.log(q / (1 - q)), abs=1e-5)
    assert stats.one_run_eps_lower(2 * r, stats.Guesses(r // 2, r, r // 2), 0.0, 0.05) == 0.0   # chance: nothing


def test_guesses_are_the_k_highest_in_and_the_k_lowest_out():
    scores, inside = [5.0, 1.0, 3.0, 0.0, 4.0, 2.0], [True, False, False, False, True, True]
    assert stats.guessed(scores, inside, 1) == stats.Guesses(1, 2, 2)      # 5.0 in, 0.0 out
    assert stats.guessed(scores, inside, 2) == stats.Guesses(2, 4, 4)      # 5.0, 4.0 in; 0.0, 1.0 out
    assert stats.guessed(scores, inside, 3) == stats.Guesses(3, 6, 4)      # 2.0 "out" is wrong, 3.0 "in" is wrong
    with pytest.raises(ValueError):
        stats.guessed(scores, inside, 4)


def randomized_response(m: int, eps: float, delta: float, seed: int):
    """m canaries each in w.p. 1/2 and a mechanism exactly (ε, δ)-DP in each: with probability δ it tells the
    truth outright, else randomized response (the truth w.p. e^ε/(1+e^ε)); the score is what it says."""
    rng = np.random.default_rng(seed)
    inside = rng.random(m) < 0.5
    told = np.where(rng.random(m) < math.exp(eps) / (1 + math.exp(eps)), inside, ~inside)
    told = np.where(rng.random(m) < delta, inside, told)
    return told + 1e-3 * rng.random(m), inside                          # ties broken at random


@pytest.mark.slow
@pytest.mark.parametrize("eps, delta", [(1.0, 0.0), (2.0, 1e-3)])
def test_the_one_run_bound_refutes_a_true_claim_no_more_often_than_alpha_and_a_false_one_always(eps, delta):
    """Over 300 runs of a mechanism exactly (ε, δ)-DP, (ε, δ) is refuted in at most 5% (expected: far fewer, the
    bound is conservative); the claim ε/4 is refuted in most, and the lower bound sits between."""
    m, fail = 1000, 0.05 / 2
    refuted = weak = 0
    for seed in range(300):
        scores, inside = randomized_response(m, eps, delta, seed)
        tests = [stats.guessed(scores, inside, k) for k in (100, 400)]
        lower = max(stats.one_run_eps_lower(m, g, delta, fail) for g in tests)
        refuted += lower > eps
        weak += lower > eps / 4
    assert refuted <= 0.05 * 300 and weak >= 0.9 * 300


def test_the_curve_test_is_the_smallest_bound_along_the_curve_and_finds_the_least_private_member():
    """A claimed curve δ(ε) is refuted where the smallest of the bounds over ε is at most the level; the member
    reported is the least private refuted, to 1%: all guesses right refute GDP μ ≤ 1.3 here, not μ = 3."""
    from normfl.privacy.audit.release import gdp_curve

    g = stats.Guesses(200, 400, 400)
    terms = stats.one_run_terms(1000, g, stats.EPS_GRID)
    for mu in (0.5, 3.0):
        by_hand = min(stats.one_run_p(1000, g, e, gdp_delta(mu, e))[0] for e in stats.EPS_GRID)
        assert stats.one_run_curve(terms, gdp_curve(mu)) == pytest.approx(by_hand, rel=1e-9)
    got = stats.one_run_curve_lower(1000, [g], lambda z: gdp_curve(1 / z), 0.05, lambda z: 1 / z)
    mu = got["eps_lower_curve"]                                          # eps_of: the member's μ here
    assert stats.one_run_curve(terms, gdp_curve(mu)) <= 0.05 < stats.one_run_curve(terms, gdp_curve(mu * 1.02))
    assert 1.0 < mu < 3.0
    none = stats.one_run_curve_lower(1000, [stats.Guesses(200, 400, 200)], lambda z: gdp_curve(1 / z), 0.05,
                                     lambda z: 1 / z)
    assert none == {"eps_lower_curve": 0.0, "noise_multiplier_upper": None}
