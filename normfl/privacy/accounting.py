"""Privacy accounting: a privatizer hands over one release (``mechanisms.Privatizer.release``) and
a ledger composes k of them.

- ``GaussianRelease``, composed by Google's dp-accounting (RDP and PLD; no accountant math is
  written here). Seen from one client, each release is its bounded vector (norm <= S) plus Gaussian
  noise of std sigma, so the noise multiplier is z = sigma / S. For the client-level mechanisms the
  privacy unit is one client (its whole local dataset):

- ``add_remove``: neighbouring runs differ by the presence of one client (sensitivity S);
- ``replace``: they differ by replacing one client's data (the released vector can move by 2S).

``amplification=true`` claims amplification by Poisson sampling at rate q (each client takes part
independently with probability p). That needs the participation to be secret from the observer;
when every client adds its own noise and the server sees who sent what, it is not, so the default
claims none and charges every round.

- ``EpsDeltaRelease``, an (epsilon, delta)-DP message (QTDL, Binomial), composed as in the proof of
  NFA Theorem 2 (``qtdl.composed``: basic or advanced composition, then amplification by sampling).

``ledger(release, delta, sampling)`` picks the right one.

dp-accounting is imported where it is used: it brings scipy with it, about a second at the start of
every process, which a run that is not private (``make run``, every test's subprocess) does not need.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from normfl.cache import memo
from normfl.errors import ConfigError

if TYPE_CHECKING:
    import dp_accounting as dpa

RELATIONS = ("add_remove", "replace")
ACCOUNTANTS = ("rdp", "pld")
PLD_INTERVAL = 1e-3       # pessimistic discretisation: an upper bound on epsilon, tight to ~1e-4 here
PLD_MIN_SIGMA = 0.3       # no PLD for a subsampled Gaussian below this noise: it would not fit in memory
PLD_MAX_EPSILON = 1000.0  # nor for releases RDP puts above this ε: their loss spans about ε / PLD_INTERVAL points


def _not_an_order_dropped(record: logging.LogRecord) -> bool:
    """dp-accounting's RDP drops an order α whose series does not converge (ε is then the minimum over the
    other orders: still an upper bound) and logs a warning for each order and noise multiplier it tries, 90
    lines in one calibration of the README's first run; they are not shown."""
    return not record.getMessage().startswith("_compute_log_a_frac failed to converge")


logging.getLogger("absl").addFilter(_not_an_order_dropped)


@dataclass(frozen=True)
class GaussianRelease:
    noise_multiplier: float          # z = noise std / per-client sensitivity
    sampling: float = 1.0            # q, the participation probability
    amplification: bool = False      # claim amplification by Poisson(q) sampling
    neighbouring: str = "add_remove"

    @property
    def sampled(self) -> bool:
        return self.amplification and self.sampling < 1.0

    def event(self, rounds: int, accountant: str) -> dpa.DpEvent | None:
        """The dp-accounting event of ``rounds`` rounds, or None if ``accountant`` cannot handle it."""
        import dp_accounting as dpa

        z = self.noise_multiplier
        if not self.sampled:
            # dp-accounting's RDP ignores the relation for a plain Gaussian: replacing a client
            # moves the vector by 2S, i.e. halves z. Its PLD applies the relation itself.
            if accountant == "rdp" and self.neighbouring == "replace":
                z = z / 2
            return dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z), rounds)
        if accountant == "rdp" and self.neighbouring == "replace":
            return None                  # dp-accounting's RDP has no Poisson sampling under replace-one
        return dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(self.sampling, dpa.GaussianDpEvent(z)), rounds)

    def relation(self, accountant: str) -> dpa.NeighboringRelation:
        import dp_accounting as dpa

        if accountant == "pld" and self.neighbouring == "replace":
            return dpa.NeighboringRelation.REPLACE_ONE
        return dpa.NeighboringRelation.ADD_OR_REMOVE_ONE

    def accountant(self, name: str) -> dpa.PrivacyAccountant:
        from dp_accounting import pld, rdp

        if name == "rdp":
            return rdp.RdpAccountant(neighboring_relation=self.relation(name))
        return pld.PLDAccountant(self.relation(name), value_discretization_interval=PLD_INTERVAL)

    def epsilon(self, rounds: int, delta: float, accountant: str) -> float | None:
        """Epsilon after ``rounds`` rounds at ``delta``; inf without noise; None if unsupported."""
        if rounds == 0:
            return 0.0
        if self.noise_multiplier <= 0:
            return math.inf
        event = self.event(rounds, accountant)
        if event is None:
            return None
        acc = self.accountant(accountant)
        acc.compose(event)
        return float(acc.get_epsilon(delta))


class Ledger:
    """Epsilon spent after k Gaussian releases, under RDP and PLD (cheap per call:
    RDP is additive over rounds and PLD self-composes one round's distribution)."""

    def __init__(self, mech: GaussianRelease, delta: float):
        from dp_accounting.pld import privacy_loss_distribution as plds

        self.mech, self.delta = mech, delta
        self._rdp_one = self._pld_one = None
        if mech.noise_multiplier > 0:
            ev = mech.event(1, "rdp")
            if ev is not None:
                acc = mech.accountant("rdp")
                acc.compose(ev)
                self._orders, self._rdp_one = acc._orders, np.asarray(acc._rdp)   # one round's RDP curve
            q = mech.sampling if mech.sampled else 1.0
            if q < 1.0 and mech.noise_multiplier < PLD_MIN_SIGMA or (self._rdp(1) or 0.0) > PLD_MAX_EPSILON:
                return                               # eps_pld is then None (one release at σ = 0.001 took 21 GB)
            self._pld_one = plds.from_gaussian_mechanism(
                mech.noise_multiplier, sampling_prob=q, value_discretization_interval=PLD_INTERVAL,
                neighboring_relation=mech.relation("pld"))

    def spent(self, k: int, accountants: tuple[str, ...] = ACCOUNTANTS) -> dict[str, float | None]:
        """ε after k releases by each of ``accountants`` (PLD's self-composition is slow for small noise)."""
        if k == 0:
            return {"rdp": 0.0, "pld": 0.0}
        if self.mech.noise_multiplier <= 0:
            return {"rdp": math.inf, "pld": math.inf}
        eps_rdp, eps_pld = self._rdp(k), None
        if self._pld_one is not None and "pld" in accountants and not (eps_rdp or 0.0) > PLD_MAX_EPSILON:
            eps_pld = float(self._pld_one.self_compose(k).get_epsilon_for_delta(self.delta))
        return {"rdp": eps_rdp, "pld": eps_pld}

    def _rdp(self, k: int) -> float | None:
        """ε after k releases by RDP (None where dp-accounting's RDP does not apply: sampling under replace-one)."""
        from dp_accounting import rdp

        if self._rdp_one is None:
            return None
        return float(rdp.rdp_privacy_accountant.compute_epsilon(self._orders, k * self._rdp_one, self.delta)[0])


@dataclass(frozen=True)
class EpsDeltaRelease:
    """One message that is (epsilon, delta)-DP by the theorem that calibrated its mechanism."""

    epsilon: float
    delta: float


def composed(eps0: float, delta0: float, k: int, delta_prime: float, sample_fraction: float) -> tuple[float, float]:
    """(ε, δ) of one client's k messages, each (ε_0, δ_0)-DP, following the proof of NFA Theorem 2 (App. C).

    The better (smaller ε) of basic composition (kε_0, kδ_0) and advanced composition
    (ε_0 sqrt(2k log(1/δ')) + kε_0 tanh(ε_0/2), kδ_0 + δ'); then, if that ε < 1, amplification by sampling
    r of n clients (Lemma 3 of [28]) multiplies it by min(1, 2r/n), ``sample_fraction`` = r/n. δ is kept as is,
    as in Theorem 2's statement.
    """
    if k == 0:
        return 0.0, 0.0
    basic = (k * eps0, k * delta0)
    advanced = (eps0 * math.sqrt(2 * k * math.log(1 / delta_prime)) + k * eps0 * math.tanh(eps0 / 2),
                k * delta0 + delta_prime)
    eps, delta = min(basic, advanced, key=lambda pair: pair[0])
    if eps < 1:
        eps *= min(1.0, 2 * sample_fraction)
    return eps, delta


class Composition:
    """Epsilon spent after k (ε_0, δ_0) messages of one client (``composed``), as column ``composed``."""

    def __init__(self, release: EpsDeltaRelease, delta: float, sample_fraction: float):
        self.release, self.delta, self.sample_fraction = release, delta, sample_fraction

    def composed(self, k: int) -> tuple[float, float]:
        return composed(self.release.epsilon, self.release.delta, k, self.delta, self.sample_fraction)

    def spent(self, k: int) -> dict[str, float]:
        return {"composed": self.composed(k)[0]}


def ledger(release: GaussianRelease | EpsDeltaRelease, delta: float, sampling: float = 1.0) -> Ledger | Composition:
    """The ledger that composes ``release``: dp-accounting for a Gaussian, NFA Theorem 2's proof otherwise
    (``sampling``: the fraction of clients a round samples, which that proof amplifies by)."""
    if isinstance(release, EpsDeltaRelease):
        return Composition(release, delta, sampling)
    return Ledger(release, delta)


@functools.lru_cache(maxsize=256)
def calibrate(epsilon: float, delta: float, rounds: int, accountant: str, sampling: float = 1.0,
              amplification: bool = False, neighbouring: str = "add_remove") -> float:
    """The smallest noise multiplier z whose ``rounds`` rounds cost at most (epsilon, delta)."""
    key = f"{accountant}|{epsilon!r}|{delta!r}|{rounds}|{sampling!r}|{amplification}|{neighbouring}"

    def solve():
        import dp_accounting as dpa

        def mech(z):
            return GaussianRelease(z, sampling, amplification, neighbouring)

        if mech(1.0).event(rounds, accountant) is None:
            raise ValueError(f"accountant={accountant} cannot account Poisson sampling under {neighbouring}")
        if accountant == "rdp":
            bracket = dpa.LowerEndpointAndGuess(0.05, 5.0)
        else:
            # A PLD of a tiny noise multiplier is huge (memory), so bracket the search with RDP, which
            # never certifies less than PLD: z_pld <= z_rdp (twice that under replace-one).
            z_rdp = calibrate(epsilon, delta, rounds, "rdp", sampling, amplification, "add_remove")
            hi = 1.05 * z_rdp * (2 if neighbouring == "replace" else 1)
            bracket = dpa.ExplicitBracketInterval(hi / 4, hi)
        z = float(dpa.calibrate_dp_mechanism(
            lambda: mech(1.0).accountant(accountant), lambda z: mech(z).event(rounds, accountant),
            epsilon, delta, bracket_interval=bracket, tol=1e-5))
        # The search stops within its tolerance, and the run reports ε by its own ledger: raise z until
        # that report certifies at most the target (never spend more than asked).
        def certifies(z):
            reports = (Ledger(mech(z), delta).spent(rounds)[accountant], mech(z).epsilon(rounds, delta, accountant))
            return all(e is None or e <= epsilon for e in reports)

        for _ in range(1000):
            if certifies(z):
                return z
            z *= 1 + 1e-5
        # The ledger's PLD (one release self-composed) and the accountant's can differ by more than that 1 %
        # (1.4 % at ε = 0.5 over 3,000 releases): grow z geometrically, then bisect to 1e-5.
        lo, step = z, 1e-5
        while not certifies(z := lo * (1 + step)):
            if step > 1e3:                  # discretised at PLD_INTERVAL, k releases cannot certify so small an ε
                raise ConfigError("privacy.epsilon", epsilon, f"a larger ε with accountant={accountant}, which "
                                  f"cannot certify this one over {rounds} releases; or accountant=rdp")
            lo, step = z, 2 * step
        hi = z
        while hi / lo - 1 > 1e-5:
            mid = math.sqrt(lo * hi)
            lo, hi = (lo, mid) if certifies(mid) else (mid, hi)
        return hi

    return memo("calibration", "certified|" + key, solve)
