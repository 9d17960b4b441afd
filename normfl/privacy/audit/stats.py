"""Empirical privacy auditing: the statistics that turn canary scores into a lower bound on ε.

How scores are made belongs to each mechanism's audit; this module only reads them. An audit inserts
canaries into the mechanism ("in") or leaves them out ("out") and scores what the adversary observes, higher
meaning "more likely in". A threshold t, fixed before the scores are seen, makes a test: guess "in" when a
score exceeds t. An (ε, δ)-DP mechanism bounds every such test (Kairouz, Oh and Viswanath's hypothesis-testing
view of differential privacy):

    TPR ≤ e^ε FPR + δ        and        TNR ≤ e^ε FNR + δ,

so exact (Clopper-Pearson) confidence bounds on the rates give, with confidence 1 - α,

    ε ≥ max( log((TPR_lo - δ) / FPR_hi), log((TNR_lo - δ) / FNR_hi) ),

an assumption-free lower bound. The failure probability α is split over the two directions and over the
thresholds tried (Bonferroni), so trying several thresholds is paid for. Statistics from scipy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.stats import binomtest


def rate_bounds(hits: int, trials: int, alpha: float) -> tuple[float, float]:
    """Exact (Clopper-Pearson) bounds on a rate from ``hits`` of ``trials``: each side holds with probability at
    least 1 - α/2."""
    ci = binomtest(int(hits), int(trials)).proportion_ci(confidence_level=1 - alpha, method="exact")
    return float(ci.low), float(ci.high)


def eps_lower(scores_in: Sequence[float], scores_out: Sequence[float], delta: float,
              thresholds: Sequence[float], alpha: float = 0.05) -> dict:
    """The largest ε lower bound over ``thresholds`` (chosen before the scores were seen), holding with
    probability at least 1 - α over the canaries' randomness: ``{"eps_lower", "threshold", "tpr", "fpr"}``
    (0 when no threshold shows anything)."""
    s_in, s_out = np.asarray(scores_in, dtype=float), np.asarray(scores_out, dtype=float)
    if not len(s_in) or not len(s_out):
        raise ValueError("an audit needs canaries in and canaries out")
    tests = 2 * len(thresholds)       # two directions a threshold, two one-sided bounds each: α shared (Bonferroni)
    best = {"eps_lower": 0.0, "threshold": None, "tpr": None, "fpr": None}
    for t in thresholds:
        tp, fp = int((s_in > t).sum()), int((s_out > t).sum())
        for hits, n_hits, misses, n_misses in ((tp, len(s_in), fp, len(s_out)),                 # TPR vs FPR
                                               (len(s_out) - fp, len(s_out), len(s_in) - tp, len(s_in))):  # TNR vs FNR
            lo, _ = rate_bounds(hits, n_hits, alpha / tests)
            _, hi = rate_bounds(misses, n_misses, alpha / tests)
            if lo > delta and hi > 0:
                eps = math.log((lo - delta) / hi)
                if eps > best["eps_lower"]:
                    best = {"eps_lower": eps, "threshold": float(t), "tpr": tp / len(s_in), "fpr": fp / len(s_out)}
    return best
