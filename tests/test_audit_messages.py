"""Mechanism-level audits of QTDL and the Binomial (``normfl.privacy.audit.messages``): through the real sampler,
with exact likelihood ratios, NFA Theorem 1's δ = 2^-d is refuted for d ≥ 2 and agrees with ``tdl_delta``; in one
dimension it holds; the cpSGD Binomial is consistent with its claim; a sampler with too little noise is caught."""

import json
import math

import numpy as np
import pytest
import torch

from normfl.privacy.audit import messages
from normfl.privacy.audit.messages import (
    audit_binomial,
    audit_message,
    audit_qtdl,
    calibrated_shift,
    grid_pair,
)
from normfl.privacy.qtdl import (
    QTDL,
    Binomial,
    Sensitivity,
    centered_binomial_levels,
    heuristic_sensitivity,
    tdl_delta,
    tdl_levels,
    worst_case_sensitivity,
)

N = 10_000


# ------------------------------------------------------------------------------------------------ the pair


def test_the_pair_is_on_the_grid_at_the_calibrated_shift_and_within_every_sensitivity():
    for sens, d, s in [(heuristic_sensitivity(8, 4, 0.1), 8, 4), (worst_case_sensitivity(8, 4), 8, 4),
                       (heuristic_sensitivity(8, 16, 0.1), 8, 16), (heuristic_sensitivity(1, 256, 0.1), 1, 256)]:
        u, v = grid_pair(sens, d, s)
        assert u.dtype == torch.float64 and torch.equal(u * s, (u * s).round()) and (u * s).abs().max() <= s
        b = ((u - v) * s).round().long().numpy()
        assert np.array_equal(b, calibrated_shift(sens, d)) and b.max() == math.floor(sens.linf)
        assert b.sum() <= sens.l1 and math.sqrt((b.astype(float) ** 2).sum()) <= sens.l2 * (1 + 1e-9)
    # eq. 6 at d = 8, s = 4: l2 does not bind, so the pair is tdl_delta's worst case, 2 levels on all 8 coordinates
    assert calibrated_shift(heuristic_sensitivity(8, 4, 0.1), 8).tolist() == [2] * 8
    # s = 16: tdl_delta's worst (3 on six coordinates, 2 on one) has l2 = 7.6 > Δ2 = 7.26, so it is cut
    assert calibrated_shift(heuristic_sensitivity(8, 16, 0.1), 8).tolist() == [3, 3, 3, 3, 3, 2, 1, 1]


def test_the_audit_refuses_pairs_off_the_grid_or_beyond_the_sensitivity():
    sens = Sensitivity(l1=4, linf=2, l2=3)
    mech = QTDL.calibrated(4, 0.5, sens, 4)
    zero = torch.zeros(4, dtype=torch.float64)
    with pytest.raises(ValueError, match="level grid"):
        audit_message(mech, zero + 0.1, zero, 10, 0)
    with pytest.raises(ValueError, match="exceeds"):
        audit_message(mech, torch.tensor([0.75, 0, 0, 0], dtype=torch.float64), zero, 10, 0)     # 3 > Δ∞ = 2
    with pytest.raises(ValueError, match="exceeds"):
        audit_message(mech, torch.tensor([0.5, 0.5, 0.25, 0], dtype=torch.float64), zero, 10, 0)  # l1 = 5 > 4


# ------------------------------------------------------------------------------------------------ T10: QTDL


@pytest.mark.parametrize("d,s,eps0,kind", [(8, 4, 1.0, "heuristic"), (8, 4, 1.0, "worst"), (8, 16, 1.0, "heuristic"),
                                           (2, 16, 0.5, "heuristic")])
def test_theorem1_delta_is_refuted_through_the_sampler_and_matches_tdl_delta(d, s, eps0, kind):
    r = audit_qtdl(d, s, eps0, sensitivity=kind, n=N, seed=1)
    json.dumps(r, allow_nan=False)                                           # a plain, JSON-ready dict
    assert r["claimed"] == {"epsilon": eps0, "delta": 2.0**-d, "delta_label": f"2^-{d}"}
    assert r["verdict"] == "refutes the claim"
    assert r["delta_lower"] > 2.0**-d and r["eps_lower"] > eps0              # Theorem 1's (ε₀, 2^-d) is refuted
    assert r["delta_lower"] <= r["delta_exact_pair"] <= r["delta_exact"] + 1e-12   # sampler and analysis agree ...
    assert r["delta_lower"] >= r["delta_exact_pair"] - 0.03                  # ... and the bound is tight (n = 10^4)
    assert abs(r["off_support"]["u"] - r["delta_exact_pair"]) < 4 * math.sqrt(0.25 / N)
    sens = heuristic_sensitivity(d, s, 0.1) if kind == "heuristic" else worst_case_sensitivity(d, s)
    mech = QTDL.calibrated(s, eps0, sens, d)
    assert r["delta_exact"] == tdl_delta(mech.m, mech.alpha, sens, d) == mech.delta_exact
    if r["shift"]["l1"] == math.floor(sens.l1) or r["shift"]["l1"] == d * math.floor(sens.linf):   # l2 did not bind
        assert r["delta_exact_pair"] == pytest.approx(r["delta_exact"], rel=1e-12)


@pytest.mark.parametrize("s", [16, 256])
def test_theorem1_delta_holds_in_one_dimension(s):
    """d = 1 (Theorem 1 then needs ε₀ < e^-1): δ = Δ∞/Z ≤ 2^-1, and the audit sees it, but not above the claim."""
    r = audit_qtdl(1, s, 0.3, n=N, seed=2)
    assert r["verdict"] == "consistent with the claim"
    assert r["delta_exact_pair"] == pytest.approx(r["delta_exact"], rel=1e-12)
    assert 0.2 < r["delta_lower"] <= r["delta_exact"] < 0.5
    assert r["eps_lower"] <= 0.3


@pytest.mark.parametrize("alpha", [0.05, 0.01])
def test_the_verdicts_two_routes_each_hold_at_half_of_alpha(alpha, monkeypatch):
    """δ_LB and ε_LB each hold with probability 1 - α/2, so the verdict is wrong with probability at most α."""
    seen = []
    def spy(route):
        def call(*args):
            seen.append((route.__name__, args[-1]))
            return route(*args)
        return call
    monkeypatch.setattr(messages, "delta_lower", spy(messages.delta_lower))
    monkeypatch.setattr(messages, "eps_lower", spy(messages.eps_lower))
    r = audit_qtdl(1, 16, 0.3, n=500, seed=2, alpha=alpha)
    assert sorted(seen) == [("delta_lower", alpha / 2), ("eps_lower", alpha / 2)] and r["confidence"] == 1 - alpha


# ------------------------------------------------------------------------------------------------ T11: Binomial


@pytest.mark.parametrize("d,s", [(8, 4), (8, 16)])
def test_the_binomial_is_consistent_with_cpsgd(d, s):
    r = audit_binomial(d, s, 1.0, 1e-5, n=N, seed=3)
    assert r["claimed"]["epsilon"] == 1.0 and r["claimed"]["delta"] == 1e-5
    assert r["verdict"] == "consistent with the claim"
    assert r["eps_lower"] <= 1.0 and r["delta_lower"] <= 1e-5
    assert r["off_support"] == {"u": 0.0, "u_prime": 0.0}


# ------------------------------------------------------------------------------------------------ broken samplers


def _qtdl_1d(s):
    sens = heuristic_sensitivity(1, s, 0.1)
    return QTDL.calibrated(s, 0.3, sens, 1), grid_pair(sens, 1, s)


def test_a_qtdl_sampler_with_a_tenth_of_the_spread_or_no_noise_is_refuted(monkeypatch):
    mech, pair = _qtdl_1d(256)                                                # m = 34: consistent when honest
    assert audit_message(mech, *pair, N, 4)["verdict"] == "consistent with the claim"
    monkeypatch.setattr(mech, "noise_levels", lambda shape, gen, device: tdl_levels(shape, mech.m // 10, mech.alpha,
                                                                                    gen, device))
    r = audit_message(mech, *pair, N, 4)
    assert r["verdict"] == "refutes the claim" and r["delta_lower"] > 0.9
    monkeypatch.setattr(mech, "noise_levels", lambda shape, gen, device: torch.zeros(shape, dtype=torch.int64))
    assert audit_message(mech, *pair, N, 4)["delta_lower"] > 0.9


def test_a_binomial_sampler_with_a_tenth_of_the_spread_is_refuted(monkeypatch):
    sens = heuristic_sensitivity(8, 16, 0.1)
    mech = Binomial.calibrated(16, 1.0, 1e-5, sens, 8)
    few = mech.trials // 100 + (mech.trials - mech.trials // 100) % 2      # same parity: the same output grid
    monkeypatch.setattr(mech, "noise_levels", lambda shape, gen, device: centered_binomial_levels(shape, few, gen,
                                                                                                   device))
    r = audit_message(mech, *grid_pair(sens, 8, 16), N, 5)
    assert r["verdict"] == "refutes the claim" and r["delta_lower"] > 0.05 and r["eps_lower"] > 1.0


def test_a_sampler_outside_its_stated_law_is_reported_not_scored(monkeypatch):
    mech, pair = _qtdl_1d(16)
    monkeypatch.setattr(mech, "noise_levels", lambda shape, gen, device: tdl_levels(shape, 3 * mech.m, mech.alpha,
                                                                                    gen, device))
    with pytest.raises(ValueError, match="impossible"):                      # wider noise: no score is exact
        audit_message(mech, *pair, 1000, 6)
