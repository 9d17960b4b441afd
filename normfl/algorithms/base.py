"""What every algorithm shares: hyper-parameters, privacy set-up, and the round interface."""

from __future__ import annotations

from collections.abc import Callable

import torch

from normfl.ops import GaussianNoise
from normfl.privacy import PaperNoise

GradFn = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""Client oracle: x (``[d]`` or ``[n, d]``) -> (per-client gradients ``[n, d]``, losses ``[n]``)."""


class Algorithm:
    """One communication round maps the global model x^k to x^{k+1}.

    Subclasses set ``upload_bound``: the largest norm of the vector a client uploads (its
    sensitivity before any server-side scaling), and ``noise_by``: 'client' (each client adds its
    own Gaussian to its upload) or 'server' (one central draw on the aggregate).
    """

    upload_bound: float = 1.0
    noise_by: str = "client"

    def __init__(self, gamma: float, beta: float, alpha: float = 0.0, private: bool = False, name: str = ""):
        self.gamma, self.beta, self.alpha, self.private = float(gamma), float(beta), float(alpha), bool(private)
        self.name = name or type(self).__name__
        self.noise = GaussianNoise(0.0, 0)

    def setup(self, x0: torch.Tensor, num_clients: int, rounds: int, privacy: PaperNoise, seed: int) -> None:
        """Allocate state for ``num_clients`` clients and calibrate the noise for ``rounds`` rounds."""
        std = privacy.upload_std(self.upload_bound, self.beta, rounds) if self.private else 0.0
        self.noise = GaussianNoise(std, seed, who=self.noise_by)
        self.num_clients = num_clients

    def round(self, k: int, x: torch.Tensor, grads: GradFn) -> tuple[torch.Tensor, dict]:
        """Run round k from x; return x^{k+1} and {'loss': mean client loss at x^k, 'uploads': int}."""
        raise NotImplementedError

    def memory_gap(self) -> float | None:
        """||ĝ - mean_i g_i|| for error-feedback methods (0 without noise); None otherwise."""
        return None
