"""EF21-style error feedback with a bounding operator Ψ (NORMEC §3.5, eqs. 9-11).

α-NormEC (NORMEC Algorithm 1) takes Ψ = Norm_α and weights it by β; Clip21 takes Ψ = Clip_τ with
τ = β and no extra weight (reading A9, docs/readings.md). Both rounds are the same box; line numbers
below are those of NORMEC Algorithm 1 (Clip21 has no box of its own: NORMEC §3.5, eqs. 9-11). The release is
Ψ's output, of norm at most ``bounding.bound``; when private each client adds its own Gaussian to it
(``GaussianAlgorithm``, ``privacy.mechanisms.Gaussian``).
"""

from __future__ import annotations

import torch

from normfl.algorithms.base import Clients, GaussianAlgorithm
from normfl.ops import Bounding, server_step


class EF21(GaussianAlgorithm):
    """The box; a subclass sets Ψ (``bounding``), the weight of Ψ's output in the memories and the server step."""

    state = ("g", "ghat")
    scalars = {"weight": 2, "gamma": 1, "server_norm": 1}
    captures_round = True
    weight: float = 1.0            # multiplies Ψ(.) in the client and server memories
    server_norm: bool = False
    bounding: Bounding

    def setup(self, x0, num_clients, rounds, privacy, seed):
        super().setup(x0, num_clients, rounds, privacy, seed)
        self.g = torch.zeros(num_clients, x0.numel(), device=x0.device, dtype=x0.dtype)   # g_i^0 = 0 (reading A6)
        self.ghat = self.g.mean(0)                                                        # ĝ^0 = mean g_i^0

    def round(self, k: int, x: torch.Tensor, clients: Clients):
        """The box on one run (G: ``[n, d]``), or on R runs side by side (``run.vectorized``: x ``[R, d]``, G
        ``[R, n, d]``, the scalars ``[R, 1(, 1)]``): the clients are always axis -2."""
        G, loss = clients.grads(x)                           # 4: local gradients at x^k
        delta = self.bounding(G - self.g)                    # 5: Δ_i = Ψ(∇f_i(x^k) - g_i^k)
        self.g += self.weight * delta                        # 6: g_i^{k+1} = g_i^k + β Δ_i
        sent = self.privatize(delta, k)                      # 7/8: Δ̂_i = Δ_i (+ z_i if private)
        self.ghat += (self.weight * sent).mean(-2)           # 10: ĝ^{k+1} = ĝ^k + (1/n) Σ β Δ̂_i
        x = server_step(x, self.ghat, self.gamma, self.server_norm)   # 11: x^{k+1} = x^k - γ ĝ(/||ĝ||)
        return x, {"loss": loss.mean(-1), "uploads": G.shape[-2]}

    def memory_gap(self) -> float:
        return torch.linalg.vector_norm(self.ghat - self.g.mean(0)).item()


class NormEC(EF21):
    """(DP-)α-NormEC, NORMEC Algorithm 1; ``server_norm=False`` replaces line 11 by x - γ ĝ."""

    paper_name = "α-NormEC"

    def __init__(self, gamma, beta, alpha, server_norm: bool = True, private=False, name="normec"):
        super().__init__(gamma, beta, alpha, private, name)
        self.bounding = Bounding("norm", alpha=self.alpha)   # ||Δ_i|| <= 1; β weights it outside Ψ
        self.weight, self.server_norm = self.beta, bool(server_norm)

    def noise_target(self):
        return f"Δ_i = Norm_α(∇f_i(x^k) - g_i^k), norm ≤ 1, weighted by β = {self.beta:g} at the server", self.beta


class Clip21(EF21):
    """(DP-)Clip21: EF21 with Ψ = Clip_τ, τ = β, and plain server step x - γ ĝ (reading A9)."""

    def __init__(self, gamma, beta, private=False, name="clip21"):
        super().__init__(gamma, beta, 0.0, private, name)
        self.bounding = Bounding("clip", beta=self.beta)     # ||Clip_β(.)|| <= β; weight 1

    def noise_target(self):
        return f"Δ_i = Clip_β(∇f_i(x^k) - g_i^k), norm ≤ β = {self.beta:g}, weighted by 1 at the server", 1.0
