"""What every algorithm shares: hyper-parameters, privacy set-up, and the round interface."""

from __future__ import annotations

from typing import Protocol

import torch

from normfl.ops import GaussianNoise
from normfl.privacy import Ledger, Privacy


class Clients(Protocol):
    """The clients as an algorithm sees them (``normfl.engine.Clients`` is the real one)."""

    def grads(self, x: torch.Tensor, batches=None, ids=None) -> tuple[torch.Tensor, torch.Tensor]:
        """x (``[d]`` or ``[n, d]``) -> (per-client gradients ``[n, d]``, losses ``[n]``) on the clients'
        next batches (or on ``batches``); with ``ids`` only those clients, one row each."""

    def cyclic_pass(self, batch_size: int) -> list:
        """Each client's local data in a fixed order, as a list of steps of per-client batches."""

    side_by_side: bool
    """Whether the clients are computed together (then local steps are best taken by all clients at once)."""


class Algorithm:
    """One communication round maps the global model x^k to x^{k+1}.

    Subclasses set ``upload_bound``, the largest norm of the vector each client releases (its
    sensitivity before any server-side scaling), and ``noise_by``: 'client' (each client adds its
    own Gaussian to its upload) or 'server' (one central draw on the aggregate).
    """

    upload_bound: float = 1.0
    noise_by: str = "client"
    p: float = 1.0                       # participation probability (1: every client, every round)
    bits_per_coord: int | None = None    # bits per uploaded coordinate (None: the model's float width)

    def __init__(self, gamma: float, beta: float, alpha: float = 0.0, private: bool = False, name: str = ""):
        self.gamma, self.beta, self.alpha, self.private = float(gamma), float(beta), float(alpha), bool(private)
        self.name = name or type(self).__name__
        self.noise = GaussianNoise(0.0, 0)

    def setup(self, x0: torch.Tensor, num_clients: int, rounds: int, privacy: Privacy, seed: int) -> None:
        """Allocate state for ``num_clients`` clients and calibrate the noise for ``rounds`` calls of ``round``
        (communication steps: a run's rounds, or its passes times their steps under reading=pass)."""
        self.num_clients, self.seed = num_clients, seed
        std = privacy.upload_std(self.upload_bound, self.beta, rounds, self.p) if self.private else 0.0
        self.noise = GaussianNoise(std, seed, who=self.noise_by)
        self.privacy, self._ledger = privacy, None

    @property
    def noise_std(self) -> float:
        """Per-coordinate std of the privacy noise on the vector it is added to."""
        return self.noise.std

    def spent(self, k: int) -> dict[str, float | None]:
        """Epsilon spent after k rounds, by column (``eps_rdp``, ``eps_pld``), for a private run."""
        if self._ledger is None:                  # built on first use: a PLD is not free
            self._ledger = Ledger(self.privacy.mechanism(self.noise_multiplier, self.p), self.privacy.delta)
        spent = self._ledger.spent(k)
        return {"eps_rdp": spent["rdp"], "eps_pld": spent["pld"]}

    def privacy_report(self, k: int) -> dict:
        """The summary's privacy block after k rounds: noise, assumptions and epsilon spent."""
        pr = self.privacy
        return {
            "target_epsilon": pr.epsilon, "delta": pr.delta,
            "calibration": "paper formula" if pr.uses_formula else f"solved with {pr.accountant}",
            "noise_by": self.noise_by, "noise_multiplier": self.noise_multiplier, "sampling_rate": self.p,
            "neighbouring": pr.neighbouring, "amplification_claimed": pr.amplification and self.p < 1,
            **{f"epsilon_{col.removeprefix('eps_')}": v for col, v in self.spent(k).items()},
            "assumptions": pr.assumptions(self.noise_by, self.p),
        }

    @property
    def noise_multiplier(self) -> float:
        """Noise std over the sensitivity of the vector it is added to (what an accountant needs)."""
        return self.noise.std / self.upload_bound if self.upload_bound > 0 else 0.0

    def round(self, k: int, x: torch.Tensor, clients: Clients) -> tuple[torch.Tensor, dict]:
        """Run round k from x; return x^{k+1} and {'loss': mean client loss at x^k, 'uploads': int}."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        """Everything a round changes or reads (client memories, τ state, ...), for a checkpoint:
        the instance's attributes less the privacy config and the accountant cache, rebuilt on use."""
        return {k: v for k, v in vars(self).items() if k not in ("privacy", "_ledger")}

    def load_state_dict(self, state: dict) -> None:
        vars(self).update(state)

    def memory_gap(self) -> float | None:
        """||ĝ - mean_i g_i|| for error-feedback methods (0 without noise); None otherwise."""
        return None
