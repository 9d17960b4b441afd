"""ALI-DPFL's per-client DP-SGD accountant (ALI Sec. V; reading C-A9): the SGM RDP bound, the R_c table,
dp-accounting cross-checks."""

from __future__ import annotations

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting import rdp

from normfl.privacy.sgm import (
    METHODS,
    ORDERS_BISECT,
    ORDERS_PAPER,
    ClientAccountant,
    iterations_supported,
    paper_epsilon,
    sgm_rdp,
)

Q, SIGMA, DELTA = 0.015, 1.1, 1e-5
BUDGETS = (1.55, 1.65, 1.75, 1.85, 2, 2.25, 2.5, 2.75, 3.25, 3.75)
PAPER_COUNTS = (79, 122, 177, 231, 317, 457, 598, 775, 1123, 1585)          # ALI Sec. VI-B
BISECT_ROW = (79, 122, 177, 231, 317, 457, 598, 775, 1123, 1538)            # reading C-A9: bisection
EXACT_ROW = (78, 118, 174, 230, 314, 454, 596, 770, 1119, 1537)
SPENT_ROW = (1.5504, 1.6569, 1.7551, 1.8515, 2.005, 2.255, 2.5024, 2.7562, 3.2554, 3.8063)


def dp_accounting_rdp(q: float, sigma: float, orders) -> np.ndarray:
    acc = rdp.RdpAccountant(orders=list(orders))
    acc.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)))
    return np.asarray(acc._rdp)           # one step's RDP curve (as normfl.privacy.accounting.Ledger reads it)


def test_sgm_rdp_gaussian_limit_and_agrees_with_dp_accounting():
    alpha = np.asarray(ORDERS_PAPER, dtype=float)
    for sigma in (0.8, 1.1, 3.0):
        np.testing.assert_allclose(sgm_rdp(1.0, sigma), alpha / (2 * sigma**2), rtol=1e-12)   # Gaussian closed form
        assert np.all(sgm_rdp(Q, sigma) < alpha / (2 * sigma**2))                               # amplification
    assert np.all(sgm_rdp(0.0, SIGMA) == 0)
    big = (128, 256, 512)                                           # log space: no overflow at large orders
    assert np.all(np.isfinite(sgm_rdp(Q, SIGMA, big))) and np.all(np.diff(sgm_rdp(Q, SIGMA, big)) > 0)
    for q in (0.001, Q, 0.1, 0.5, 1.0):
        for sigma in (0.7, SIGMA, 2.5):
            ours, ref = sgm_rdp(q, sigma), dp_accounting_rdp(q, sigma, ORDERS_PAPER)
            assert np.all(ours >= ref - 1e-9)                       # dp-accounting is never looser
            np.testing.assert_allclose(ours, ref, rtol=1e-9, atol=1e-12)   # same integer-order sum here
    with pytest.raises(ValueError):
        sgm_rdp(Q, SIGMA, (1.5, 2))


def test_rc_table_of_spec_a7():
    ours = [iterations_supported(e, Q, SIGMA, DELTA) for e in BUDGETS]
    assert ours == list(BISECT_ROW)
    assert [iterations_supported(e, Q, SIGMA, DELTA, "bisect_tol") for e in BUDGETS] == list(BISECT_ROW)
    assert [iterations_supported(e, Q, SIGMA, DELTA, "exact") for e in BUDGETS] == list(EXACT_ROW)
    misses = [(e, a, b) for e, a, b in zip(BUDGETS, ours, PAPER_COUNTS, strict=True) if a != b]
    assert misses == [(3.75, 1538, 1585)]                                   # the paper's counts but one
    assert iterations_supported(2, 0.0125, SIGMA, DELTA, "exact") == 496                  # reading C-A8: FMNIST's q
    spent = [paper_epsilon(n, Q, SIGMA, DELTA) for n in PAPER_COUNTS]
    np.testing.assert_allclose(spent, SPENT_ROW, atol=5e-5)
    # the bisection's orders {2..63} U {128, 256, 512} give the same epsilon as {2..64} in this range
    for n in (*PAPER_COUNTS, *EXACT_ROW, 1.5, 40.25):
        assert paper_epsilon(n, Q, SIGMA, DELTA, ORDERS_BISECT) == pytest.approx(paper_epsilon(n, Q, SIGMA, DELTA))
    # bisect_tol overshoots by at most its tolerance 0.01; exact never overshoots
    for e, nb, ne in zip(BUDGETS, BISECT_ROW, EXACT_ROW, strict=True):
        assert paper_epsilon(nb, Q, SIGMA, DELTA) <= e + 0.01 and ne <= nb


def test_epsilon_monotone_and_exact_rc_is_tight():
    assert paper_epsilon(0, Q, SIGMA, DELTA) == 0.0
    steps = np.concatenate([np.linspace(0.5, 50, 40), np.arange(87.5, 3000, 37.5)])
    eps = [paper_epsilon(s, Q, SIGMA, DELTA) for s in steps]
    assert all(a < b for a, b in zip(eps, eps[1:], strict=False))
    for e in (0.5, 1.3, *BUDGETS[::3], 6.0):
        rc = iterations_supported(e, Q, SIGMA, DELTA, "exact")
        assert paper_epsilon(rc, Q, SIGMA, DELTA) <= e < paper_epsilon(rc + 1, Q, SIGMA, DELTA)
    assert iterations_supported(0.1, Q, SIGMA, DELTA, "exact") == 0    # below eps(1) = log(1/delta)/63 + ...
    for e in (0.1, 0.012, 0.005, 1e-6):   # the authors' bisection hung below about 0.0125 (eps stays above e)
        assert iterations_supported(e, Q, SIGMA, DELTA, "bisect_tol") == 0


def test_client_accountant_spent_and_budget():
    acc = ClientAccountant(q=Q, sigma=SIGMA, delta=DELTA, epsilon=1.75)
    assert acc.spent(0) == {"paper": 0.0, "rdp": 0.0, "pld": 0.0}
    assert acc.budget_steps() == 177 and acc.budget_steps("exact") == 174
    rows = [acc.spent(s) for s in (1, 20, 177, 400)]
    for key in ("paper", "rdp", "pld"):
        assert all(0 < a[key] < b[key] for a, b in zip(rows, rows[1:], strict=False))
    at = rows[2]
    assert at["paper"] == pytest.approx(1.7551, abs=5e-5)
    assert at["pld"] <= at["rdp"] + 1e-6 <= at["paper"] + 2e-6     # PLD tighter, both below the paper
    ref = rdp.RdpAccountant().compose(acc.event(177)).get_epsilon(DELTA)
    assert at["rdp"] == pytest.approx(ref, rel=1e-12)
    assert acc.spent(177) == at                                                # cached PLD, same answer
    with pytest.raises(ValueError):
        ClientAccountant(q=0.0, sigma=SIGMA, delta=DELTA, epsilon=1.0)


def test_unknown_method_names_the_allowed_ones():
    assert METHODS == ("bisect_tol", "exact")
    with pytest.raises(ValueError, match="bisect_tol.*exact"):
        iterations_supported(2.0, Q, SIGMA, DELTA, "bisect")
    with pytest.raises(ValueError, match="bisect_tol.*exact"):
        ClientAccountant(Q, SIGMA, DELTA, 2.0).budget_steps("tight")
