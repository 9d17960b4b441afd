"""Canary audits beside a private run (``audit.canaries=N``): an empirical lower bound on ε next to the
certified one, through the run's own Ψ and privatizer.

This module makes the scores; ``audit`` turns them into a bound. So far one mechanism family is audited:
client-level Gaussian noise added by each client (DP-α-NormEC, DP-Clip21, DP-Fed-α-NormEC, DP-FedAvg with
``noise_by=client``). N canary clients stand beside the run's clients, half of them "in": each has a fixed
random direction u_c, and its release every round is Ψ(u_c) at Ψ's bound, through the run's own bounding
operator; the other half are "out" and have nothing to release (zero). Each round a canary takes part with
the run's participation probability p, and every taking part canary's release goes through the run's
privatizer (its Gaussian, its std) with draws from a stream of its own. What the accountant assumes the
adversary sees is each upload, so the observer sees each canary's noisy upload, and scores it by the
likelihood-ratio statistic of the Gaussian: Σ_k <y_c^k, u_c>.

The canaries stay out of the model (their draws come from their own stream), so a run's parameters are the
same bits with and without its audit.
"""

from __future__ import annotations

import numpy as np
import torch

from normfl.ops import round_generator
from normfl.privacy.audit.stats import eps_lower

AUDIT = 4                      # the canaries' random stream (ops: NOISE 0, PARTICIPATION 1, DPSGD 2, EVALUATION 3)
ALPHA = 0.05                   # the bound holds with probability 1 - ALPHA
FAMILY = "client-level Gaussian, noise added by each client"


class ClientCanaries:
    """N canary clients beside a run (see the module docstring); ``observe`` after each of its steps,
    ``result`` at its end."""

    def __init__(self, algo, n: int, d: int, seed: int, device: torch.device, dtype: torch.dtype):
        self.algo, self.n, self.seed = algo, n, seed
        gen = round_generator(seed, AUDIT, 0, "cpu")              # the directions: draw 0; step k's: draw k
        u = torch.randn(n, d, generator=gen, dtype=torch.float64)
        self.u = (u / torch.linalg.vector_norm(u, dim=1, keepdim=True)).to(device, dtype)
        self.is_in = torch.arange(n, device=device) < n // 2
        at_bound = algo.bounding(self.u * 1e6)                      # Ψ(u_c) at its bound, through the run's Ψ
        self.release = at_bound * self.is_in[:, None]
        self.scores = torch.zeros(n, device=device, dtype=torch.float64)
        self.steps = 0

    def observe(self, step: int) -> None:
        """Step ``step``'s releases (steps count from 1): each canary takes part w.p. p, and the observer scores
        its noisy upload."""
        gen = round_generator(self.seed, AUDIT, step, self.u.device)
        takes_part = torch.rand(self.n, generator=gen, device=self.u.device) < self.algo.p
        y = self.algo.mech(self.release, gen)                       # the run's privatizer, the canaries' draws
        self.scores += takes_part * (y * self.u).sum(1, dtype=torch.float64)
        self.steps += 1

    def result(self, eps_certified: float | None, delta: float) -> dict:
        """The summary's ``audit`` block."""
        bound = self.algo.bounding.bound
        expected = self.steps * self.algo.p * float(torch.linalg.vector_norm(self.release[0]))   # an "in" mean
        thresholds = expected * np.linspace(0.25, 1.75, 7)          # fixed by the claim, before any score is seen
        s = self.scores.cpu().numpy()
        inside = self.is_in.cpu().numpy()
        found = eps_lower(s[inside], s[~inside], delta, thresholds, ALPHA)
        refutes = eps_certified is not None and found["eps_lower"] > eps_certified
        return {"family": FAMILY, "canaries": self.n, "in": int(inside.sum()), "releases_each": self.steps,
                "observer": "each canary's noisy upload, every step it takes part", "sensitivity": bound,
                "eps_lower": found["eps_lower"], "confidence": 1 - ALPHA, "threshold": found["threshold"],
                "eps_certified": eps_certified, "delta": delta,
                "verdict": "refutes the certificate" if refutes else "consistent with the certificate"}
