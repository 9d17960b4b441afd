"""Noise calibration.

``paper`` is the rule both NORMEC and FEDNORMEC use in their experiments (spec normec.md §4.3):
a client whose bounded term has sensitivity S adds N(0, (S * sigma_mult)^2) to it, with

    sigma_mult = c * p * sqrt(K * log(1/delta)) / epsilon      (c = 1, natural log, K = rounds).

This is a heuristic calibration from Abadi et al.'s asymptotic bound, not a certificate: a tight
accountant gives a larger epsilon for the same noise (about 14.1 instead of 8 at K = 300, p = 1).
The knobs reproduce the alternative readings listed in spec ambiguity A1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

NOISE_ON = ("scaled_message", "raw_delta")
LOG_BASES = ("e", "10")


@dataclass(frozen=True)
class PaperNoise:
    epsilon: float = 8.0
    delta: float = 1e-5
    c: float = 1.0
    log_base: str = "e"
    sqrt_covers_log: bool = True
    K_plus_one: bool = False
    noise_on: str = "scaled_message"
    noise_multiplier_override: float | None = None

    def noise_multiplier(self, rounds: int, p: float = 1.0) -> float:
        """sigma_mult of spec §4.3 for ``rounds`` rounds and participation probability ``p``."""
        if self.noise_multiplier_override is not None:
            return float(self.noise_multiplier_override)
        k = rounds + 1 if self.K_plus_one else rounds
        log = math.log(1 / self.delta) if self.log_base == "e" else math.log10(1 / self.delta)
        root = math.sqrt(k * log) if self.sqrt_covers_log else math.sqrt(k) * log
        return self.c * p * root / self.epsilon

    def upload_std(self, bound: float, beta: float, rounds: int, p: float = 1.0) -> float:
        """Per-coordinate noise std on an uploaded vector whose norm is at most ``bound``.

        Default (A1, ``scaled_message``): std = bound * sigma_mult, i.e. the noise is proportional
        to the sensitivity of what enters the server. ``raw_delta`` multiplies it by beta once more
        (spec's "alternative B": z on Delta_i with std beta * sigma_mult).
        """
        std = bound * self.noise_multiplier(rounds, p)
        return std * beta if self.noise_on == "raw_delta" else std
