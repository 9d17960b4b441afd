"""Mechanism-level audits of the discrete mechanisms (QTDL and the cpSGD Binomial, the DP-NormFedAvg family):
one message, a pair of inputs at the calibrated shift, scored by the exact likelihood ratio.

What is observed. The claim under test is the per-message one, ``mech.release()``: a message M(u) is
(ε₀, δ)-DP for any two inputs whose levels s·Q(u) differ within the mechanism's ``Sensitivity``. The audit
takes two such inputs u, u′ and draws n messages from each through the privatizer's own call ``mech(u, gen)``
(its quantizer, its noise sampler, its scaling by 1/s), with generators of the audit's stream
(``ops.round_generator(seed, ops.AUDIT, 0 | 1)``). The observer reads a message back as levels (value·s)
and scores it by the exact log-likelihood ratio log P(msg | u) / P(msg | u′): both laws are known, the
mechanism's noise pmf (``qtdl.tdl_pmf``; scipy's binomial) shifted by each input's levels, a product over
the coordinates. Outside one support the ratio is ±inf, and it is kept: an output that only u can produce is
exactly what δ pays for. By Neyman-Pearson these scores are the most powerful tests of u against u′.

Why inputs on the grid. With u·s an integer the stochastic rounding of Alg. 1 is deterministic (its
Bernoulli has probability 0), so P(msg | u) is the noise pmf alone and the ratio is exact; the audit tests
the noise and the calibration, not the rounding (off the grid the law is a mixture over nearby level
vectors, whose ratio is no longer a product of pmfs). ``grid_pair`` builds the pair: the level shift
b = s(u - u′) that the sensitivities allow and that ``qtdl.tdl_delta`` analyses, ⌊Δ∞⌋ levels on
⌊Δ1⌋ // ⌊Δ∞⌋ coordinates and the remainder on one more, built greedily so that ||b||∞ ≤ Δ∞, ||b||1 ≤ Δ1
and also ||b||2 ≤ Δ2 (the Binomial's theorem uses all three; the heuristic Δ2 of eq. 6 is smaller than
√(Δ1 Δ∞), so for some (d, s) the l2 bound cuts the shift below the one ``tdl_delta`` takes as worst).
``audit_message`` refuses a pair that the sensitivity does not allow.

What is reported. For thresholds t fixed by ε₀ before any score is seen (0, ±ε₀·2^k for k = -6..1 and the
two infinite events; see ``thresholds``), each test "score > t" (u against u′) and "score ≤ t" (u′ against
u) gives, with exact Clopper-Pearson bounds (``stats.rate_bounds``, Bonferroni over the tests),
δ_LB(ε₀) = max(TPR_lo - e^ε₀ FPR_hi), a lower bound on the δ the mechanism has at the claimed ε₀, and
``stats.eps_lower`` gives ε_LB at the claimed δ. Each holds with probability 1 - α/2, so the verdict,
"refutes the claim" when δ_LB > δ claimed or ε_LB > ε₀ claimed, is wrong with probability at most α. For
QTDL the report also has ``tdl_delta`` (the exact worst δ over the shifts Δ1, Δ∞ allow) and the exact δ of
this pair, P_u(the message leaves u′'s support), which is the whole δ(ε₀) since α·||b||1 ≤ ε₀.

What it shows and what it does not. A refutation is a statistical proof that the message does not have
the claimed (ε₀, δ) for this pair, whatever the analysis says: for QTDL with d ≥ 2 it shows, through the real
sampler, what ``tdl_delta`` computes, that NFA Theorem 1's δ = 2^-d is wrong (δ ≈ 1 - (1 - Δ∞/Z)^k, not
(Δ∞/Z)^d). "Consistent" proves nothing: one pair, n messages, and thresholds at one ε₀ see only so far (for
the Binomial the cpSGD bound is far from tight and ε_LB stays near 0). It audits one message; neither the
composition over rounds (Theorem 2) nor whether eq. 6's heuristic sensitivity bounds what one sample of a
client's data can move, which the pair takes as given.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.stats import binom

from normfl.ops import AUDIT, round_generator
from normfl.privacy.audit.stats import bonferroni, eps_lower, threshold_tests
from normfl.privacy.qtdl import (
    QTDL,
    Binomial,
    Sensitivity,
    heuristic_sensitivity,
    tdl_delta,
    tdl_pmf,
    worst_case_sensitivity,
)

ALPHA = 0.05                          # the verdict is wrong with probability at most ALPHA
INF_EVENT = float(np.finfo(np.float64).max)   # "score > INF_EVENT": the ratio is +inf (u′ cannot give it)
CHUNK = 2**20                         # coordinates drawn and scored at a time
TOL = 1e-9                            # relative slack on the sensitivities' float values


# ---------------------------------------------------------------------------------------------- the pair


def calibrated_shift(sens: Sensitivity, d: int) -> np.ndarray:
    """The level shift b (int64, length d, b ≥ 0) at the calibrated sensitivity: greedily the largest shift
    each coordinate can take within ||b||∞ ≤ ⌊Δ∞⌋, ||b||1 ≤ ⌊Δ1⌋ and ||b||2 ≤ Δ2. When l2 does not bind, this
    is ``tdl_delta``'s worst case: ⌊Δ∞⌋ on ⌊Δ1⌋ // ⌊Δ∞⌋ coordinates, the remainder on the next."""
    top, l1_left, l2_left = int(math.floor(sens.linf)), int(math.floor(sens.l1)), sens.l2**2 * (1 + TOL)
    b = np.zeros(d, dtype=np.int64)
    for i in range(d):
        c = min(top, l1_left, int(math.floor(math.sqrt(max(l2_left, 0.0)))))
        if c <= 0:
            break
        b[i], l1_left, l2_left = c, l1_left - c, l2_left - c * c
    return b


def grid_pair(sens: Sensitivity, d: int, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two float64 inputs on the level grid (u·s integers in [-s, s]) whose levels differ by
    ``calibrated_shift(sens, d)``: u = ⌈b/2⌉/s, u′ = (⌈b/2⌉ - b)/s."""
    b = calibrated_shift(sens, d)
    if b.max(initial=0) > 2 * s:
        raise ValueError(f"a shift of {b.max()} levels does not fit in [-s, s] with s={s}")
    up = -(-b // 2)
    return torch.from_numpy(up / s), torch.from_numpy((up - b) / s)


def _levels(u: torch.Tensor, s: int) -> np.ndarray:
    """u·s as int64, checking it is on the grid (so the quantizer is deterministic) as the quantizer computes it."""
    us = u.detach().to(torch.float64).cpu() * s
    if not torch.equal(us, us.round()) or us.abs().max() > s:
        raise ValueError("the audit's inputs must be on the level grid: u·s integers in [-s, s]")
    return us.numpy().astype(np.int64)


def _check_allowed(b: np.ndarray, sens: Sensitivity) -> dict:
    norms = {"linf": float(np.abs(b).max(initial=0)), "l1": float(np.abs(b).sum()),
             "l2": float(np.sqrt((b.astype(np.float64) ** 2).sum()))}
    over = [k for k, v in norms.items() if v > getattr(sens, k) * (1 + TOL)]
    if over:
        raise ValueError(f"the pair's level shift {norms} exceeds the mechanism's sensitivity {sens} in {over}")
    return norms


# ---------------------------------------------------------------------------------------------- scores


def _noise_logpmf(mech):
    """noise levels (float64, integers up to rounding) -> log P(noise) per coordinate, -inf off the support."""
    if isinstance(mech, QTDL):
        m, logp = mech.m, np.log(tdl_pmf(mech.m, mech.alpha))

        def tdl(noise: np.ndarray) -> np.ndarray:
            k = np.rint(noise).astype(np.int64)
            inside = np.abs(k) <= m
            return np.where(inside, logp[np.clip(k + m, 0, 2 * m)], -np.inf)

        return tdl
    if isinstance(mech, Binomial):
        return lambda noise: binom.logpmf(np.rint(noise + mech.trials * mech.p), mech.trials, mech.p)
    raise TypeError(f"no exact message law for {type(mech).__name__}: the audit knows QTDL and the Binomial")


def _offset(mech) -> float:
    """The noise levels' offset from an integer: N·p for the centred Binomial (half-integers for N odd)."""
    return mech.trials * mech.p if isinstance(mech, Binomial) else 0.0


def _scores(mech, q: np.ndarray, q_prime: np.ndarray, msgs: torch.Tensor) -> np.ndarray:
    """log P(msg | u) - log P(msg | u′) for each row of ``msgs`` (values), exactly; ±inf off one support."""
    y = msgs.to(torch.float64).cpu().numpy() * mech.s           # the message as levels
    off = _offset(mech)
    frac = (y + off) - np.rint(y + off)
    if np.abs(frac).max(initial=0) > 1e-6:
        raise ValueError("messages off the mechanism's output grid: the sampler does not follow its stated law")
    logpmf = _noise_logpmf(mech)
    lp, lp_prime = logpmf(y - q).sum(1), logpmf(y - q_prime).sum(1)
    impossible = np.isneginf(lp) & np.isneginf(lp_prime)
    if impossible.any():
        raise ValueError(f"{int(impossible.sum())} messages are impossible under the mechanism's stated law for "
                         "both inputs: the sampler does not follow it")
    return lp - lp_prime


def _draw_scores(mech, u: torch.Tensor, q: np.ndarray, q_prime: np.ndarray, n: int, seed: int,
                 draw: int) -> np.ndarray:
    gen = round_generator(seed, AUDIT, draw, "cpu")
    rows = max(1, CHUNK // len(q))
    out = [_scores(mech, q, q_prime, mech(u.expand(k, -1), gen))
           for k in (min(rows, n - i) for i in range(0, n, rows))]
    return np.concatenate(out)


# ---------------------------------------------------------------------------------------------- bounds


def thresholds(eps0: float) -> tuple[float, ...]:
    """The score thresholds, fixed by the claim before any score is seen: 0, ±ε₀·2^k for k = -6..1, and the
    infinite events (a score > INF_EVENT is +inf; one ≤ -INF_EVENT is -inf).

    The scores are the claimed law's ratio. Where the sampler adds less noise than it claims, the real
    privacy loss of a message is a multiple of that score (σ²/σ′² for Gaussian-like noise of std σ′ < σ), so the
    test that sees it thresholds the score at ε₀ divided by that multiple: the grid below ε₀ covers up to 64."""
    grid = [eps0 * 2.0**k for k in range(-6, 2)]
    return (-INF_EVENT, *(-t for t in reversed(grid)), 0.0, *grid, INF_EVENT)


def delta_lower(scores_u: np.ndarray, scores_u_prime: np.ndarray, eps0: float, ts: tuple[float, ...],
                alpha: float) -> dict:
    """max over the thresholds t and the two directions of TPR_lo - e^ε₀ FPR_hi, with probability ≥ 1 - α:
    "score > t" tells u from u′, "score ≤ t" tells u′ from u (``stats.threshold_tests``, the tests
    ``stats.eps_lower`` makes). ``{"delta_lower", "threshold", "direction", "tpr", "fpr"}``; 0 when no test
    shows anything."""
    best = {"delta_lower": 0.0, "threshold": None, "direction": None, "tpr": None, "fpr": None}
    for test in threshold_tests(scores_u, scores_u_prime, ts, alpha):
        bound = test.lo - math.exp(eps0) * test.hi
        if bound > best["delta_lower"]:
            best = {"delta_lower": bound, "threshold": test.threshold,
                    "direction": "u vs u'" if test.forward else "u' vs u",
                    "tpr": test.hits / test.n_hits, "fpr": test.misses / test.n_misses}
    return best


def _pair_delta_qtdl(mech: QTDL, b: np.ndarray) -> float:
    """P_u(the message leaves u′'s support) = 1 - Π_i (1 - mass of the |b_i| outermost noise levels), from the
    pmf: the exact δ(ε) of the pair for every ε ≥ α·||b||1 (on the common support the ratio is ≤ e^{α||b||1})."""
    pmf, y = tdl_pmf(mech.m, mech.alpha), np.arange(-mech.m, mech.m + 1)
    keep = [1.0 - pmf[np.abs(y + bi) > mech.m].sum() for bi in np.abs(b) if bi]
    return float(1.0 - np.prod(keep))


def _label(t: float | None) -> float | str | None:
    """A threshold for the report: the infinite events as "+inf" / "-inf" (JSON has no infinities)."""
    return {INF_EVENT: "+inf", -INF_EVENT: "-inf"}.get(t, t)


# ---------------------------------------------------------------------------------------------- audits


def audit_message(mech, u: torch.Tensor, u_prime: torch.Tensor, n: int, seed: int,
                  claimed: tuple[float, float] | None = None, alpha: float = ALPHA) -> dict:
    """Audit one message of ``mech`` (QTDL or Binomial) on the inputs u, u′ (on the level grid, their shift
    within ``mech.sensitivity``): n messages from each through ``mech(u, gen)``, exact likelihood-ratio scores,
    and the bounds and verdict of the module docstring. ``claimed`` = (ε₀, δ) defaults to ``mech.release()``.
    A plain, JSON-ready dict."""
    eps0, delta0 = claimed if claimed is not None else (mech.release().epsilon, mech.release().delta)
    q, q_prime = _levels(u, mech.s), _levels(u_prime, mech.s)
    if q.shape != q_prime.shape or q.ndim != 1:
        raise ValueError("u and u′ must be two vectors of the same dimension")
    d, sens = len(q), mech.sensitivity
    shift = _check_allowed(q - q_prime, sens)
    u64, v64 = torch.from_numpy(q / mech.s), torch.from_numpy(q_prime / mech.s)   # float64: exact releases
    s_u = _draw_scores(mech, u64, q, q_prime, n, seed, 0)
    s_v = _draw_scores(mech, v64, q, q_prime, n, seed, 1)
    ts = thresholds(eps0)
    each = bonferroni(alpha, 2)                       # two routes to a refutation: δ_LB and ε_LB
    found_delta = delta_lower(s_u, s_v, eps0, ts, each)
    found_eps = eps_lower(s_u, s_v, delta0, ts, each)
    refutes = found_delta["delta_lower"] > delta0 or found_eps["eps_lower"] > eps0
    result = {
        "mechanism": mech.name, "d": d, "s": mech.s, "m": mech.m, "alpha_tdl": mech.alpha, "trials": mech.trials,
        "sensitivity": {"l1": sens.l1, "linf": sens.linf, "l2": sens.l2},
        "shift": {**shift, "levels": [int(x) for x in q - q_prime]},
        "messages_each": n, "seed": seed,
        "observer": "one message M(u) or M(u′) through the privatizer's own call, scored by the exact log "
                    "P(msg|u)/P(msg|u′)",
        "claimed": {"epsilon": eps0, "delta": delta0, "delta_label": str(getattr(mech, "delta_label", delta0))},
        "delta_lower": found_delta["delta_lower"], "delta_threshold": _label(found_delta["threshold"]),
        "delta_direction": found_delta["direction"], "tpr": found_delta["tpr"], "fpr": found_delta["fpr"],
        "eps_lower": found_eps["eps_lower"], "eps_threshold": _label(found_eps["threshold"]),
        "off_support": {"u": float(np.isposinf(s_u).mean()), "u_prime": float(np.isneginf(s_v).mean())},
        "confidence": 1 - alpha,
        "verdict": "refutes the claim" if refutes else "consistent with the claim",
    }
    if isinstance(mech, QTDL):
        result["delta_exact"] = tdl_delta(mech.m, mech.alpha, sens, d)    # worst over the shifts Δ1, Δ∞ allow
        result["delta_exact_pair"] = _pair_delta_qtdl(mech, q - q_prime)
    return result


def _sensitivity(kind: str, d: int, s: int, mu: float) -> Sensitivity:
    if kind == "heuristic":
        return heuristic_sensitivity(d, s, mu)
    if kind == "worst":
        return worst_case_sensitivity(d, s)
    raise ValueError(f"sensitivity is 'heuristic' (eq. 6) or 'worst' (Definition 1), got {kind!r}")


def audit_qtdl(d: int, s: int, eps0: float, sensitivity: str = "heuristic", mu: float = 0.1, n: int = 10_000,
               seed: int = 0, alpha: float = ALPHA) -> dict:
    """QTDL with Theorem 1's (α, m) for an ε₀-message (``QTDL.calibrated``), audited on ``grid_pair``
    against Theorem 1's claim (ε₀, 2^-d)."""
    sens = _sensitivity(sensitivity, d, s, mu)
    mech = QTDL.calibrated(s, eps0, sens, d)
    return {"sensitivity_kind": sensitivity, **audit_message(mech, *grid_pair(sens, d, s), n, seed, alpha=alpha)}


def audit_binomial(d: int, s: int, eps0: float, delta0: float, sensitivity: str = "heuristic", mu: float = 0.1,
                   n: int = 10_000, seed: int = 0, alpha: float = ALPHA) -> dict:
    """The cpSGD Binomial with the fewest trials cpSGD Theorem 1 makes (ε₀, δ₀)-DP (``Binomial.calibrated``),
    audited on ``grid_pair`` against that claim."""
    sens = _sensitivity(sensitivity, d, s, mu)
    mech = Binomial.calibrated(s, eps0, delta0, sens, d)
    return {"sensitivity_kind": sensitivity, **audit_message(mech, *grid_pair(sens, d, s), n, seed, alpha=alpha)}
