"""Empirical privacy auditing: the statistics that turn canary scores into a lower bound on ε.

How scores are made belongs to each mechanism's audit; this module only reads them. An audit inserts
canaries into the mechanism ("in") or leaves them out ("out") and scores what the adversary observes, higher
meaning "more likely in". A threshold t, fixed before the scores are seen, makes a test: guess "in" when a
score exceeds t. An (ε, δ)-DP mechanism bounds every such test (Kairouz, Oh and Viswanath's hypothesis-testing
view of differential privacy):

    TPR ≤ e^ε FPR + δ        and        TNR ≤ e^ε FNR + δ,

so exact (Clopper-Pearson) confidence bounds on the rates give, with confidence 1 - α,

    ε ≥ max( log((TPR_lo - δ) / FPR_hi), log((TNR_lo - δ) / FNR_hi) ),

an assumption-free lower bound. The failure probability α is shared (``bonferroni``) by every one-sided
bound used: a lower bound on the hit rate and an upper bound on the miss rate, in each of the two directions, at
each of the T thresholds tried, so each of these 4T bounds fails with probability at most α / (4T) and trying
several thresholds is paid for. Statistics from scipy.

Three bounds, three assumptions:

* ``eps_lower`` assumes nothing but that the canaries are independent trials. It is the weakest: one
  (ε, δ) pair cannot use the shape of the mechanism's trade-off curve.
* ``mu_lower`` tests a Gaussian-DP certificate (Nasr et al. 2023, "Tight auditing of DP ML"). A μ-GDP
  mechanism has FNR ≥ Φ(Φ⁻¹(1 - FPR) - μ) for every test, so upper bounds on both error rates give

      μ ≥ Φ⁻¹(1 - FPR_hi) - Φ⁻¹(FNR_hi),

  one-sided: a score that separates nothing makes this negative, and the bound is then 0. (Taking the
  absolute value, as jax-privacy's ``epsilon_from_gdp`` does, turns the width of the confidence interval
  itself into "evidence": μ ≈ 2 from scores that carry none.) The GDP curve is symmetric, so the reversed
  test gives the same number. ``gdp_epsilon(μ_LB, δ)`` is a lower bound on ε only for a mechanism whose
  trade-off curve *is* Gaussian (an unsampled Gaussian mechanism, or its composition); against any
  other claim it is only a test of the statement "the mechanism is μ-GDP".
* ``curve_eps_lower`` tests a certified trade-off curve given as a dp-accounting privacy-loss distribution
  (for sampled mechanisms, which are not GDP-shaped). A PLD with δ(ε) for every ε ≥ 0 certifies
  TPR ≤ e^ε FPR + δ(ε) and TNR ≤ e^ε FNR + δ(ε) for every test; a point (FPR_hi, FNR_hi) violating one
  of these for some ε refutes it (a finite ε grid only makes the test more conservative). Sweeping the
  noise multiplier z of the claimed mechanism's family (same sampling rate, same number of steps) finds
  the least private member still refuted; the ε reported is that member's, and it bounds the mechanism's
  ε from below only if the mechanism is in that family.

Both curve tests use, at each of the T thresholds, two one-sided Clopper-Pearson upper bounds (on FPR and FNR),
each failing with probability at most α / (2T).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
from scipy.optimize import brentq
from scipy.stats import binom, binomtest, norm


def bonferroni(alpha: float, bounds: int) -> float:
    """The failure probability each of ``bounds`` statements (one-sided bounds, or bounds made of them) may have
    for all of them to hold together with probability at least 1 - α, whatever their dependence: α / ``bounds``
    (the probability that one of them fails is at most the sum of theirs)."""
    return alpha / bounds


def rate_bounds(hits: int, trials: int, alpha: float) -> tuple[float, float]:
    """Exact (Clopper-Pearson) bounds on a rate from ``hits`` of ``trials``: each side holds with probability at
    least 1 - α/2."""
    return _clopper_pearson(int(hits), int(trials), float(alpha))


def rate_lower(hits: int, trials: int, fail: float) -> float:
    """The exact lower bound on a rate from ``hits`` of ``trials``, below the rate with probability at least
    1 - ``fail`` (the lower end of ``rate_bounds`` at level 2·fail)."""
    return rate_bounds(hits, trials, 2 * fail)[0]


def rate_upper(hits: int, trials: int, fail: float) -> float:
    """The exact upper bound on a rate from ``hits`` of ``trials``, above the rate with probability at least
    1 - ``fail`` (the upper end of ``rate_bounds`` at level 2·fail)."""
    return rate_bounds(hits, trials, 2 * fail)[1]


@functools.lru_cache(maxsize=1 << 16)
def _clopper_pearson(hits: int, trials: int, alpha: float) -> tuple[float, float]:
    # scipy finds each end by root-finding (milliseconds); audits over many seeds ask for the same counts again
    ci = binomtest(hits, trials).proportion_ci(confidence_level=1 - alpha, method="exact")
    return float(ci.low), float(ci.high)


class Test(NamedTuple):
    """One test a threshold makes: ``forward`` "score > t" tells in from out (its hits the "in" scores above t,
    its misses the "out" ones), else "score ≤ t" tells out from in. ``lo``: the exact lower bound on its hit
    rate; ``hi``: the upper bound on its miss rate."""

    threshold: float
    forward: bool
    hits: int
    n_hits: int
    misses: int
    n_misses: int
    lo: float
    hi: float


def threshold_tests(scores_in: Sequence[float], scores_out: Sequence[float], thresholds: Sequence[float],
                    alpha: float = 0.05):
    """The two ``Test``s of each threshold, their bounds holding all together with probability at least 1 - α
    (each of the 4·len(thresholds) one-sided bounds fails with probability at most α / (4·len(thresholds)))."""
    s_in, s_out = np.asarray(scores_in, dtype=float), np.asarray(scores_out, dtype=float)
    if not len(s_in) or not len(s_out):
        raise ValueError("an audit needs canaries in and canaries out")
    if not len(thresholds):
        return                        # no threshold, no test
    fail = bonferroni(alpha, 4 * len(thresholds))     # two directions a threshold, a lower and an upper bound each
    for t in thresholds:
        tp, fp = int((s_in > t).sum()), int((s_out > t).sum())
        for forward, hits, n_hits, misses, n_misses in ((True, tp, len(s_in), fp, len(s_out)),       # TPR vs FPR
                                                        (False, len(s_out) - fp, len(s_out), len(s_in) - tp,
                                                         len(s_in))):                                  # TNR vs FNR
            lo, hi = rate_lower(hits, n_hits, fail), rate_upper(misses, n_misses, fail)
            yield Test(float(t), forward, hits, n_hits, misses, n_misses, lo, hi)


def eps_lower(scores_in: Sequence[float], scores_out: Sequence[float], delta: float,
              thresholds: Sequence[float], alpha: float = 0.05) -> dict:
    """The largest ε lower bound over ``thresholds`` (chosen before the scores were seen), holding with
    probability at least 1 - α over the canaries' randomness: ``{"eps_lower", "threshold", "tpr", "fpr"}``
    (0 when no threshold shows anything; the rates are the threshold's, "score > t")."""
    best = {"eps_lower": 0.0, "threshold": None, "tpr": None, "fpr": None}
    for test in threshold_tests(scores_in, scores_out, thresholds, alpha):
        if test.lo > delta and test.hi > 0:
            eps = math.log((test.lo - delta) / test.hi)
            if eps > best["eps_lower"]:
                tp, fp = ((test.hits, test.misses) if test.forward
                          else (test.n_misses - test.misses, test.n_hits - test.hits))
                best = {"eps_lower": eps, "threshold": test.threshold, "tpr": tp / len(scores_in),
                        "fpr": fp / len(scores_out)}
    return best


def error_upper_bounds(scores_in: Sequence[float], scores_out: Sequence[float], thresholds: Sequence[float],
                       alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Upper bounds (FPR_hi, FNR_hi) at each threshold, all 2·len(thresholds) of them holding together with
    probability at least 1 - α (each one-sided bound fails with probability α / (2·len(thresholds)))."""
    s_in, s_out = np.sort(np.asarray(scores_in, dtype=float)), np.sort(np.asarray(scores_out, dtype=float))
    if not len(s_in) or not len(s_out):
        raise ValueError("an audit needs canaries in and canaries out")
    t = np.asarray(thresholds, dtype=float)
    fp = len(s_out) - np.searchsorted(s_out, t, side="right")      # out scores above t: guessed "in"
    fn = np.searchsorted(s_in, t, side="right")                    # in scores at or below t: guessed "out"
    fail = bonferroni(alpha, 2 * len(t))              # two upper bounds a threshold
    fpr_hi = np.array([rate_upper(k, len(s_out), fail) for k in fp])
    fnr_hi = np.array([rate_upper(k, len(s_in), fail) for k in fn])
    return fpr_hi, fnr_hi


def mu_lower(scores_in: Sequence[float], scores_out: Sequence[float], thresholds: Sequence[float],
             alpha: float = 0.05) -> dict:
    """The largest lower bound on a Gaussian-DP μ over ``thresholds``, holding with probability at least 1 - α
    if the mechanism is GDP: ``{"mu_lower", "threshold", "fpr_hi", "fnr_hi"}`` (0 when nothing is shown)."""
    fpr_hi, fnr_hi = error_upper_bounds(scores_in, scores_out, thresholds, alpha)
    with np.errstate(invalid="ignore"):                 # FPR_hi = 1 gives -inf: that threshold shows nothing
        mu = norm.isf(fpr_hi) - norm.ppf(fnr_hi)        # no abs(): a negative μ is "nothing seen", not evidence
    best = {"mu_lower": 0.0, "threshold": None, "fpr_hi": None, "fnr_hi": None}
    i = int(np.argmax(mu))
    if mu[i] > 0:
        best = {"mu_lower": float(mu[i]), "threshold": float(thresholds[i]),
                "fpr_hi": float(fpr_hi[i]), "fnr_hi": float(fnr_hi[i])}
    return best


def gdp_delta(mu: float, eps: float) -> float:
    """δ(ε) of μ-GDP (Dong, Roth and Su): Φ(-ε/μ + μ/2) - e^ε Φ(-ε/μ - μ/2)."""
    if mu <= 0:
        return 0.0
    # e^ε Φ(·) in logs: e^ε overflows long before the product does
    return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps + norm.logcdf(-eps / mu - mu / 2)))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The ε at which μ-GDP has δ(ε) = ``delta`` (0 when μ is 0 or δ(0) is already at most ``delta``)."""
    if mu <= 0 or gdp_delta(mu, 0.0) <= delta:
        return 0.0
    # δ(ε) < Φ(-ε/μ + μ/2), which equals delta here: the root lies below
    high = mu * (mu / 2 + norm.isf(delta))
    return float(brentq(lambda eps: gdp_delta(mu, eps) - delta, 0.0, high, xtol=1e-12))


def _violations(fpr_hi: np.ndarray, fnr_hi: np.ndarray, pld, eps_grid=None) -> np.ndarray:
    """For each point, how far its best side exceeds the certified curve (max over the ε grid); > 0 refutes."""
    fpr_hi, fnr_hi = np.atleast_1d(fpr_hi).astype(float), np.atleast_1d(fnr_hi).astype(float)
    if eps_grid is None:
        # beyond ε = log(1/rate) the line e^ε·rate + δ exceeds 1 and bounds nothing; 0.01 apart below that
        top = math.log(1 / max(min(fpr_hi.min(), fnr_hi.min()), 1e-300))
        eps_grid = np.linspace(0.0, max(top, 0.0), int(top / 0.01) + 2)
    eps = np.asarray(eps_grid, dtype=float)
    delta = np.asarray(pld.get_delta_for_epsilon(eps), dtype=float)
    e = np.exp(eps)[:, None]
    tpr_side = (1 - fnr_hi) - (e * fpr_hi + delta[:, None])     # TPR ≤ e^ε FPR + δ(ε)
    tnr_side = (1 - fpr_hi) - (e * fnr_hi + delta[:, None])     # TNR ≤ e^ε FNR + δ(ε)
    return np.maximum(tpr_side, tnr_side).max(axis=0)


def curve_refutes(fpr_hi, fnr_hi, pld, eps_grid=None) -> bool:
    """Whether the point (FPR_hi, FNR_hi) (or any of several, given as arrays) lies below the trade-off curve
    certified by ``pld`` (a dp-accounting ``PrivacyLossDistribution``) at some ε of ``eps_grid``; by default
    a 0.01 grid over the ε where the curve's lines bind."""
    return bool((_violations(fpr_hi, fnr_hi, pld, eps_grid) > 0).any())


def curve_eps_lower(scores_in: Sequence[float], scores_out: Sequence[float], thresholds: Sequence[float],
                    make_pld: Callable[[float, bool], object], delta: float, alpha: float = 0.05,
                    z_range: tuple[float, float] = (0.05, 50.0)) -> dict:
    """The ε at ``delta`` of the least private claim ``make_pld(z, pessimistic)`` that the scores refute
    (the tests use pessimistic PLDs, whose δ(ε) is too large, the ε read out an optimistic one), holding with
    probability at least 1 - α if the mechanism is in ``make_pld``'s family (larger z: more private):
    ``{"eps_lower_curve", "noise_multiplier_upper", "threshold"}``. The claim ``noise_multiplier_upper`` is
    refuted, and so is every claim with more noise (the family's curves are nested); bisection on log z
    stops within 1% of the boundary, on its refuted side. When even the least private claim ``z_range[0]``
    is refuted the bound stops there; 0 when not even ``z_range[1]`` is."""
    fpr_hi, fnr_hi = error_upper_bounds(scores_in, scores_out, thresholds, alpha)
    pld_of = functools.lru_cache(maxsize=None)(lambda z: make_pld(z, True))

    def refuted(z: float) -> bool:
        return curve_refutes(fpr_hi, fnr_hi, pld_of(z))

    low, high = float(z_range[0]), float(z_range[1])
    if not refuted(high):
        return {"eps_lower_curve": 0.0, "noise_multiplier_upper": None, "threshold": None}
    while high / low > 1.01:                            # refuted at high; bisect on log z
        mid = math.sqrt(low * high)
        if refuted(mid):
            high = mid
        else:
            low = mid
    if low == z_range[0] and refuted(low):              # checked last: the least private claim is the costliest
        high = low
    # report the refuted end: every z above it is refuted too, so the true z is at most it (ε at least its ε),
    # its ε read from an optimistic PLD (a pessimistic one would overstate it by its discretisation)
    return {"eps_lower_curve": float(make_pld(high, False).get_epsilon_for_delta(delta)),
            "noise_multiplier_upper": high,
            "threshold": float(thresholds[int(np.argmax(_violations(fpr_hi, fnr_hi, pld_of(high))))])}


# -- one run: canaries included at random, guesses counted (Steinke, Nasr and Jagielski 2023) ----------------
#
# Canaries inside one run are not independent trials: they share the model. Steinke, Nasr and Jagielski, "Privacy
# auditing with one (1) training run" (NeurIPS 2023), need no independence: each of m canaries is included
# independently with probability 1/2, a guesser reads the run's output and guesses "in" or "out" for r of them (r
# fixed in advance, abstaining on the rest), and if the run is (ε, δ)-DP in each canary's inclusion, the number W
# of correct guesses satisfies, for every v,
#
#     P[W ≥ v] ≤ β + 2·m·δ·max_{1≤i≤v} (P[B ≥ v - i] - β) / i,    β = P[B ≥ v],   B ~ Binomial(r, e^ε / (1 + e^ε)).
#
# A count of correct guesses whose bound falls below α refutes (ε, δ); the largest ε so refuted is a lower bound
# holding with probability 1 - α whatever the run does with its canaries. A certified trade-off curve claims (ε, δ(ε))
# for every ε at once, so the smallest of these bounds over ε bounds P[W ≥ v] under that claim: ``one_run_curve``.


class Guesses(NamedTuple):
    """One guessing rule, fixed before the scores are seen: the ``k`` highest scores guessed "in", the ``k`` lowest
    "out" (``guesses`` = 2k of the m canaries); ``correct`` of them were right."""

    k: int
    guesses: int
    correct: int


def guessed(scores: Sequence[float], inside: Sequence[bool], k: int) -> Guesses:
    """The ``k`` highest of ``scores`` guessed "in" and the ``k`` lowest "out" (2k ≤ m), checked against
    ``inside``."""
    s, inside = np.asarray(scores, dtype=float), np.asarray(inside, dtype=bool)
    if not 0 < 2 * k <= len(s):
        raise ValueError(f"k={k}: 2k guesses must be between 1 and the {len(s)} canaries")
    order = np.argsort(s, kind="stable")
    return Guesses(k, 2 * k, int(inside[order[-k:]].sum() + (~inside[order[:k]]).sum()))


EPS_GRID = np.arange(0.0, 20.0, 0.02)        # where a claimed curve is tested (a grid only loosens the test)


def one_run_terms(m: int, guess: Guesses, eps) -> tuple[np.ndarray, np.ndarray]:
    """(β, s) at each ε of ``eps`` such that Steinke et al.'s bound on P[W ≥ correct] is min(1, β + δ·s): β =
    P[B ≥ v] and s = 2m·max_{1≤i≤v} (P[B ≥ v - i] - β) / i, B ~ Binomial(guesses, e^ε/(1+e^ε)), v = correct
    (summed from the pmf: exact tails)."""
    eps = np.atleast_1d(np.asarray(eps, dtype=float))
    q = 1 / (1 + np.exp(-eps))
    pmf = binom.pmf(np.arange(guess.guesses + 1)[None, :], guess.guesses, q[:, None])
    tails = np.minimum(np.cumsum(pmf[:, ::-1], axis=1)[:, ::-1], 1.0)           # P[B ≥ v], v = 0..guesses
    v = guess.correct
    beta = tails[:, v]
    if v == 0:
        return beta, np.zeros_like(beta)
    i = np.arange(1, v + 1)
    return beta, 2 * m * ((tails[:, v - i] - beta[:, None]) / i).max(axis=1)


def one_run_p(m: int, guess: Guesses, eps, delta) -> np.ndarray:
    """Steinke et al.'s bound on P[W ≥ correct] for a run (ε, δ)-DP in each of its ``m`` canaries' inclusion, at
    each ε of ``eps`` (with its δ: a number, or one per ε)."""
    beta, s = one_run_terms(m, guess, eps)
    return np.minimum(beta + np.asarray(delta, dtype=float) * s, 1.0)


def one_run_eps_lower(m: int, guess: Guesses, delta: float, fail: float, eps_max: float = 30.0) -> float:
    """The largest ε whose (ε, δ) claim ``guess`` refutes at level ``fail`` (its bound on P[W ≥ correct] at most
    ``fail``); 0 when not even ε = 0 is refuted. The bound grows with ε, so the refuted ε form an interval from 0."""
    def excess(eps: float) -> float:
        return float(one_run_p(m, guess, eps, delta)[0]) - fail

    if excess(0.0) > 0:
        return 0.0
    if excess(eps_max) <= 0:
        return eps_max
    return float(brentq(excess, 0.0, eps_max, xtol=1e-6))


def one_run_curve(terms: tuple[np.ndarray, np.ndarray], curve: Callable[[np.ndarray], np.ndarray],
                  eps_grid: np.ndarray = EPS_GRID) -> float:
    """The bound on P[W ≥ correct] under a claimed trade-off curve, given as its δ(ε) (``curve``, on an array), from
    ``one_run_terms`` on ``eps_grid``: the smallest of Steinke et al.'s bounds over the grid, each at the curve's δ
    there. The claim holds at every ε at once, so the smallest is a bound too."""
    beta, s = terms
    return float(np.minimum(beta + np.minimum(curve(eps_grid), 1.0) * s, 1.0).min())


def one_run_curve_lower(m: int, tests: Sequence[Guesses], family: Callable[[float], Callable], fail: float,
                        eps_of: Callable[[float], float], z_range: tuple[float, float] = (0.05, 200.0)) -> dict:
    """The least private member ``family(z)`` (a δ(ε) curve; larger z: more private, the curves nested) that one of
    ``tests`` refutes at level ``fail``, by bisection on log z to 1%: ``{"eps_lower_curve": eps_of(z),
    "noise_multiplier_upper": z}`` (every member with more noise is refuted too); 0 and None when not even
    ``z_range[1]``'s is. Holds with probability 1 - ``fail``·len(tests) if the run is in the family."""
    terms = [one_run_terms(m, g, EPS_GRID) for g in tests]        # the binomial sums, once

    def refuted(z: float) -> bool:
        curve = family(z)
        return any(one_run_curve(t, curve) <= fail for t in terms)

    low, high = (float(v) for v in z_range)
    if not refuted(high):
        return {"eps_lower_curve": 0.0, "noise_multiplier_upper": None}
    if refuted(low):
        high = low
    while high / low > 1.01:                            # refuted at high, not at low
        mid = math.sqrt(low * high)
        if refuted(mid):
            high = mid
        else:
            low = mid
    return {"eps_lower_curve": float(eps_of(high)), "noise_multiplier_upper": high}
