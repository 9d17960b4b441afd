"""How much noise a private run adds, and what it costs.

Two ways to set the noise (``privacy.calibration``):

- ``paper``: the rule both NORMEC and FEDNORMEC use in their experiments (NORMEC §6.2, FEDNORMEC §5; reading A1).
  A term of sensitivity S gets N(0, (S * sigma_mult)^2) with

      sigma_mult = c * p * sqrt(K * log(1/delta)) / epsilon      (c = 1, natural log, K = rounds).

  Under ``reading=pass`` a round is a pass of many communication steps, each a noisy release;
  ``K=rounds`` keeps the papers' count, ``K=releases`` counts every release.

  It comes from Abadi et al.'s asymptotic bound and is a heuristic, not a certificate: a tight
  accountant gives a larger epsilon for the same noise. The knobs reproduce the alternative
  readings of A1 (docs/readings.md).
- ``accountant``: the noise multiplier is solved so that the ``accountant`` group's accountant
  (RDP or PLD, from dp-accounting) certifies (epsilon, delta) for the run, under the configured
  neighbouring relation and amplification claim (see ``accounting.py``).

Whatever sets it, every private run also reports the epsilon that RDP and PLD give for the noise
actually used (``Ledger``).

The privatizers themselves (Gaussian per client or central, DP-SGD's sampled Gaussian, QTDL,
Binomial) are in ``mechanisms.py``; ``Privacy.gaussian`` builds the Gaussian this config asks for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from normfl.privacy.accounting import ACCOUNTANTS, RELATIONS, GaussianRelease, Ledger, calibrate, ledger
from normfl.privacy.mechanisms import Gaussian, Privatizer

NOISE_ON = ("scaled_message", "raw_delta")
K_COUNTS = ("rounds", "releases")
LOG_BASES = ("e", "10")
CALIBRATIONS = ("paper", "accountant")

__all__ = ["Privacy", "Privatizer", "Gaussian", "GaussianRelease", "Ledger", "ledger", "calibrate", "certified",
           "NOISE_ON", "LOG_BASES", "CALIBRATIONS", "ACCOUNTANTS", "RELATIONS", "K_COUNTS"]


def certified(spent: dict) -> tuple[float | None, str | None]:
    """(ε, by what) a run certifies, from its ε by accountant (``Ledger.spent``'s names, bare or as the columns
    ``eps_pld`` and the summary's ``epsilon_pld`` write them): the tighter of dp-accounting's PLD and RDP, else
    NFA Theorem 2's composition; (∞, "no noise") for a summary whose noise multiplier is 0 (JSON has no ∞, so its
    ε are null); (None, None) where none was computed."""
    eps = {k.removeprefix("epsilon_").removeprefix("eps_"): v for k, v in spent.items()}
    found = [(eps[name], name) for name in ("pld", "rdp") if isinstance(eps.get(name), (int, float))]
    if found:
        return min(found)
    if isinstance(eps.get("composed"), (int, float)):
        return eps["composed"], "composed"
    if spent.get("noise_multiplier") == 0:
        return math.inf, "no noise"
    return None, None


@dataclass(frozen=True)
class Privacy:
    epsilon: float = 8.0
    delta: float = 1e-5
    calibration: str = "paper"
    accountant: str = "paper"            # which accountant calibrates when calibration=accountant
    neighbouring: str = "add_remove"
    amplification: bool = False
    c: float = 1.0
    log_base: str = "e"
    sqrt_covers_log: bool = True
    K_plus_one: bool = False
    noise_on: str = "scaled_message"
    noise_multiplier_override: float | None = None
    K: str = "rounds"
    releases_per_round: int = 1          # communication steps a round makes (reading=pass: a pass's steps)

    @property
    def uses_formula(self) -> bool:
        return self.calibration == "paper" or self.accountant == "paper"

    def noise_multiplier(self, releases: int, p: float = 1.0) -> float:
        """sigma_mult for a run of ``releases`` noisy uploads per client: by the papers' formula, or solved by
        the accountant, which always counts every release."""
        if self.noise_multiplier_override is not None:
            return float(self.noise_multiplier_override)
        if not self.uses_formula:
            return calibrate(self.epsilon, self.delta, releases, self.accountant, p, self.amplification,
                             self.neighbouring)
        k = releases if self.K == "releases" else releases // self.releases_per_round
        k = k + 1 if self.K_plus_one else k
        log = math.log(1 / self.delta) if str(self.log_base) == "e" else math.log10(1 / self.delta)
        root = math.sqrt(k * log) if self.sqrt_covers_log else math.sqrt(k) * log
        return self.c * p * root / self.epsilon

    def upload_std(self, bound: float, beta: float, releases: int, p: float = 1.0) -> float:
        """Per-coordinate noise std on a released vector whose norm is at most ``bound``.

        Default (reading A1, ``scaled_message``): std = bound * sigma_mult, i.e. noise proportional to the
        sensitivity. ``raw_delta`` (paper formula only) multiplies by beta once more: reading A1's
        alternative, z on Delta_i with std beta * sigma_mult.
        """
        std = bound * self.noise_multiplier(releases, p)
        return std * beta if self.noise_on == "raw_delta" and self.uses_formula else std

    def gaussian(self, bound: float, beta: float, releases: int, p: float = 1.0, who: str = "client",
                 mean_of: int = 1) -> Gaussian:
        """The Gaussian privatizer of a run of ``releases`` releases of a vector of norm at most ``bound``
        (``upload_std``), added by ``who``; ``mean_of=n`` when the noise goes on the mean of n such vectors,
        whose sensitivity is then bound / n. ``p`` is each client's chance to take part in a release."""
        sensitivity = bound / mean_of
        # the papers' rule puts std = bound·σ_mult on the vector however many releases it averages (NORMEC eq. 3);
        # an accountant's multiplier is of the sensitivity, so the mean of n gets n times less noise for its ε
        std = self.upload_std(bound if self.uses_formula else sensitivity, beta, releases, p)
        return Gaussian(sensitivity, std, who, p, self.amplification,
                        self.neighbouring)
