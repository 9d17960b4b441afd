"""Sample-level privacy of one ALI-DPFL client: DP-SGD as composed Sampled Gaussian Mechanisms (ALI Sec. V).

Every local DP-SGD step of a client (ALI Sec. III-C) is one Sampled Gaussian Mechanism SG_{q,sigma}: Poisson
sampling at rate q = B/|D_i|, per-sample clipping to C, Gaussian noise of std sigma*C. Each client is
accounted separately; all clients share q and sigma, hence spend the same epsilon (ALI Sec. V).

The paper's accountant (ALI Sec. V, eqs. 14-18), reproduced here:

- RDP of one step, eqs. 15-17 (Mironov-Talwar-Zhang), for integer orders alpha >= 2::

      eps_RDP(alpha) = 1/(alpha-1) * log sum_{k=0}^{alpha} C(alpha,k) (1-q)^(alpha-k) q^k exp((k^2-k)/(2 sigma^2))

- T steps compose additively (Lemma 2). Eq. 18 sums t = 0..T, an off-by-one (reading C-A16); T is used.
- Conversion to (eps, delta), eq. 14 (Mironov 2017, not the tighter Balle et al. one; reading C-A9)::

      eps(T) = min_{alpha in {2..64}} T * eps_RDP(alpha) + log(1/delta)/(alpha-1)

- R_c, the number of steps the budget supports, by the authors' bisection (``bisect_tol``, the default,
  which reproduces nine of the paper's ten iteration counts) or by an exact integer search (``exact``).

Neighbouring relation (reading C-A15, docs/readings.md): the paper defines neighbours as datasets that "differ
in a single entry" (replace-one), but the SGM RDP bound above is the add/remove-one analysis. We use the paper's
accountant as is, and account with dp-accounting under ``ADD_OR_REMOVE_ONE`` for the comparison values.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from normfl.privacy.accounting import GaussianRelease, Ledger

if TYPE_CHECKING:
    import dp_accounting as dpa

ORDERS_PAPER = tuple(range(2, 65))                            # "we select alpha from {2, 3, ..., 64}"
ORDERS_BISECT = tuple(range(2, 64)) + (128, 256, 512)         # the authors' bisection (reading C-A9); same R_c
METHODS = ("bisect_tol", "exact")
BISECT_MAX_STEPS = 100_000.0      # the bisection's search interval is [0, BISECT_MAX_STEPS]
BISECT_TOL = 0.01                 # stop once eps(steps_high) - target <= BISECT_TOL


def _orders(orders: Iterable[int]) -> tuple[int, ...]:
    given = tuple(orders)
    out = tuple(int(a) for a in given)
    if not out or any(a < 2 or a != b for a, b in zip(out, given, strict=True)):
        raise ValueError(f"orders must be integers >= 2, got {given!r}")
    return out


@functools.lru_cache(maxsize=128)
def _sgm_rdp(q: float, sigma: float, orders: tuple[int, ...]) -> np.ndarray:
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"sampling rate q must be in [0, 1], got {q}")
    if sigma <= 0:
        raise ValueError(f"noise multiplier sigma must be > 0, got {sigma}")
    if q == 0.0:
        return np.zeros(len(orders))
    log_q = math.log(q)
    log_1mq = math.log1p(-q) if q < 1.0 else -math.inf
    out = np.empty(len(orders))
    for i, alpha in enumerate(orders):
        k = np.arange(alpha + 1, dtype=float)
        log_binom = np.array([math.log(math.comb(alpha, j)) for j in range(alpha + 1)])   # exact integers
        with np.errstate(invalid="ignore"):                       # 0 * -inf at k = alpha when q = 1
            log_1mq_terms = np.where(k < alpha, (alpha - k) * log_1mq, 0.0)
        terms = log_binom + log_1mq_terms + k * log_q + (k * k - k) / (2.0 * sigma**2)
        top = terms.max()
        out[i] = (top + math.log(np.exp(terms - top).sum())) / (alpha - 1)
    out.setflags(write=False)
    return out


def sgm_rdp(q: float, sigma: float, orders: Iterable[int] = ORDERS_PAPER) -> np.ndarray:
    """RDP eps_RDP(alpha) of one Sampled Gaussian Mechanism step at each integer order (ALI eqs. 15-17).

    Computed in log space (log-sum-exp over k, exact log-binomials), so large orders do not overflow.
    At q = 1 it is the Gaussian mechanism's alpha/(2 sigma^2); at q = 0 it is 0.
    """
    return _sgm_rdp(float(q), float(sigma), _orders(orders)).copy()


def _epsilon(steps: float, q: float, sigma: float, delta: float, orders: tuple[int, ...]) -> float:
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    if steps == 0:
        return 0.0
    alpha = np.asarray(orders, dtype=float)
    return float(np.min(steps * _sgm_rdp(float(q), float(sigma), orders) + math.log(1.0 / delta) / (alpha - 1.0)))


def paper_epsilon(steps: float, q: float, sigma: float, delta: float, orders: Iterable[int] = ORDERS_PAPER) -> float:
    """Epsilon after ``steps`` DP-SGD steps under the paper's accountant (ALI eq. 14 with eqs. 15-17).

    eps = min over orders of steps * eps_RDP(alpha) + log(1/delta)/(alpha - 1). ``steps`` may be real
    (the bisection evaluates fractional steps); 0 steps cost 0.
    """
    return _epsilon(float(steps), q, sigma, delta, _orders(orders))


def _bisect_tol(epsilon: float, q: float, sigma: float, delta: float) -> int:
    """The authors' bisection over real step counts (reading C-A9): steps_high always has eps > target."""
    def eps(steps: float) -> float:
        return _epsilon(steps, q, sigma, delta, ORDERS_BISECT)

    steps_low, steps_high = 0.0, BISECT_MAX_STEPS
    eps_high = eps(steps_high)
    if eps_high <= epsilon:
        return int(steps_high)          # the budget outlasts the search interval: capped there
    while eps_high - epsilon > BISECT_TOL:
        if steps_high < 1.0:            # floor(steps_high) is 0 from here on; below about 0.02 eps(steps) stays
            return 0                    # above epsilon + BISECT_TOL as steps -> 0, and the search would not end
        steps = (steps_low + steps_high) / 2.0
        eps_mid = eps(steps)
        if eps_mid > epsilon:
            steps_high, eps_high = steps, eps_mid
        else:
            steps_low = steps
    return math.floor(steps_high)


def _exact(epsilon: float, q: float, sigma: float, delta: float) -> int:
    """The largest integer T with eps(T) <= epsilon (eps is increasing in T), by integer bisection."""
    def eps(steps: int) -> float:
        return _epsilon(steps, q, sigma, delta, ORDERS_PAPER)

    lo, hi = 0, 1                        # invariant: eps(lo) <= epsilon < eps(hi)
    while eps(hi) <= epsilon:
        lo, hi = hi, 2 * hi
        if hi > 10**12:
            raise ValueError(f"budget epsilon={epsilon} supports more than 1e12 steps")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if eps(mid) <= epsilon:
            lo = mid
        else:
            hi = mid
    return lo


@functools.lru_cache(maxsize=256)
def iterations_supported(epsilon: float, q: float, sigma: float, delta: float, method: str = "bisect_tol") -> int:
    """R_c: the number of DP-SGD steps a client's budget (epsilon, delta) supports (ALI Sec. V; reading C-A9).

    - ``exact``: the largest integer T with ``paper_epsilon(T) <= epsilon`` (orders {2..64}); never overspends.
    - ``bisect_tol`` (the authors' procedure, reproduces the paper's counts): bisection over real T in
      [0, 100000], keeping ``steps_high`` with eps(steps_high) > epsilon, stopping once
      eps(steps_high) - epsilon <= 0.01, returning floor(steps_high); orders {2..63} U {128, 256, 512}.
      It may overshoot the budget by up to 0.01 in epsilon. A budget that outlasts 100000 steps gives 100000.
    """
    if epsilon <= 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    if method == "bisect_tol":
        return _bisect_tol(float(epsilon), float(q), float(sigma), float(delta))
    if method == "exact":
        return _exact(float(epsilon), float(q), float(sigma), float(delta))
    raise ValueError(f"unknown R_c method {method!r}; allowed: {', '.join(METHODS)}")


@dataclass(frozen=True)
class ClientAccountant:
    """One client's DP-SGD privacy: q, sigma, delta, the budget epsilon and the accountant used for the stop rule.

    The stop rule uses the paper's accountant (``paper_epsilon``, ``budget_steps``); ``spent`` also reports
    what dp-accounting's RDP and PLD accountants certify for the same steps, under add/remove-one (reading C-A15).
    """

    q: float
    sigma: float
    delta: float
    epsilon: float

    def __post_init__(self) -> None:
        if not 0.0 < self.q <= 1.0:
            raise ValueError(f"q must be in (0, 1], got {self.q}")
        if self.sigma <= 0:
            raise ValueError(f"sigma must be > 0, got {self.sigma}")
        if not 0.0 < self.delta < 1.0:
            raise ValueError(f"delta must be in (0, 1), got {self.delta}")
        if self.epsilon <= 0:
            raise ValueError(f"epsilon must be > 0, got {self.epsilon}")

    @functools.cached_property
    def _ledger(self) -> Ledger:
        """dp-accounting's RDP and PLD for Poisson-subsampled Gaussian steps (``accounting.Ledger``)."""
        return Ledger(GaussianRelease(self.sigma, self.q, amplification=True), self.delta)

    def event(self, steps: int) -> dpa.DpEvent:
        """``steps`` DP-SGD steps as a dp-accounting event."""
        return self._ledger.mech.event(steps, "rdp")

    def spent(self, steps: int) -> dict[str, float | None]:
        """Epsilon after ``steps`` steps by accountant: the paper's, dp-accounting's RDP and PLD (add/remove-one;
        no PLD below ``accounting.PLD_MIN_SIGMA``)."""
        steps = int(steps)
        if steps < 0:
            raise ValueError(f"steps must be >= 0, got {steps}")
        tight = self._ledger.spent(steps)
        return {"paper": paper_epsilon(steps, self.q, self.sigma, self.delta), **tight}

    def budget_steps(self, method: str = "bisect_tol") -> int:
        """R_c under the paper's conversion (see ``iterations_supported``)."""
        return iterations_supported(self.epsilon, self.q, self.sigma, self.delta, method)
