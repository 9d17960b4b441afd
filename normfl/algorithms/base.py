"""What every algorithm shares: hyper-parameters, privacy set-up, and the round interface."""

from __future__ import annotations

from typing import Protocol

import torch

from normfl.ops import GaussianNoise
from normfl.privacy import Privacy


class Clients(Protocol):
    """The clients as an algorithm sees them (``normfl.engine.Clients`` is the real one)."""

    def grads(self, x: torch.Tensor, batches=None) -> tuple[torch.Tensor, torch.Tensor]:
        """x (``[d]`` or ``[n, d]``) -> (per-client gradients ``[n, d]``, losses ``[n]``) on the clients'
        next batches (or on ``batches``)."""

    def cyclic_pass(self, batch_size: int) -> list:
        """Each client's local data in a fixed order, as a list of steps of per-client batches."""


class Algorithm:
    """One communication round maps the global model x^k to x^{k+1}.

    Subclasses set ``upload_bound``, the largest norm of the vector each client releases (its
    sensitivity before any server-side scaling), and ``noise_by``: 'client' (each client adds its
    own Gaussian to its upload) or 'server' (one central draw on the aggregate).
    """

    upload_bound: float = 1.0
    noise_by: str = "client"
    p: float = 1.0                       # participation probability (1: every client, every round)

    def __init__(self, gamma: float, beta: float, alpha: float = 0.0, private: bool = False, name: str = ""):
        self.gamma, self.beta, self.alpha, self.private = float(gamma), float(beta), float(alpha), bool(private)
        self.name = name or type(self).__name__
        self.noise = GaussianNoise(0.0, 0)

    def setup(self, x0: torch.Tensor, num_clients: int, rounds: int, privacy: Privacy, seed: int) -> None:
        """Allocate state for ``num_clients`` clients and calibrate the noise for ``rounds`` rounds."""
        self.num_clients, self.seed = num_clients, seed
        std = privacy.upload_std(self.upload_bound, self.beta, rounds, self.p) if self.private else 0.0
        self.noise = GaussianNoise(std, seed, who=self.noise_by)

    @property
    def noise_multiplier(self) -> float:
        """Noise std over the sensitivity of the vector it is added to (what an accountant needs)."""
        return self.noise.std / self.upload_bound if self.upload_bound > 0 else 0.0

    def round(self, k: int, x: torch.Tensor, clients: Clients) -> tuple[torch.Tensor, dict]:
        """Run round k from x; return x^{k+1} and {'loss': mean client loss at x^k, 'uploads': int}."""
        raise NotImplementedError

    def memory_gap(self) -> float | None:
        """||ĝ - mean_i g_i|| for error-feedback methods (0 without noise); None otherwise."""
        return None
