"""DP-SGD with smoothed normalization (NORMEC §3.3 eq. 2 with B = n; reading A9).

x^{k+1} = x^k - γ ( (1/n) Σ_i β Norm_α(∇f_i(x^k)) + z^k ),   z^k ~ N(0, σ² I_d) drawn by the server.

The paper's baseline (§6.1) is non-private (z ≡ 0). With ``private=true`` the server adds one
Gaussian draw of std β·σ_mult (eq. 3 with B = n, c = 1) to the aggregate, whose sensitivity is β/n
(``Privacy.gaussian(..., mean_of=n)``). No error feedback.
"""

from __future__ import annotations

from normfl.algorithms.base import Clients, GaussianAlgorithm
from normfl.ops import Bounding, server_step


class DPSGDNorm(GaussianAlgorithm):
    paper_name = "SGD with Norm_α"                            # DP-SGD with smoothed normalization
    noise_by = "server"
    scalars = {"gamma": 1}

    def __init__(self, gamma, beta, alpha, private=False, name="dpsgd_norm"):
        super().__init__(gamma, beta, alpha, private, name)
        self.bounding = Bounding("scaled_norm", self.beta, self.alpha)   # Φ = ||β Norm_α(.)|| <= β

    def setup(self, x0, num_clients, rounds, privacy, seed):
        super().setup(x0, num_clients, rounds, privacy, seed, mean_of=num_clients)

    def round(self, k: int, x, clients: Clients):
        """One run, or R runs side by side (``run.vectorized``): the clients are always axis -2."""
        G, loss = clients.grads(x)                            # ∇f_i(x^k), all n clients (B = n)
        psi = self.bounding(G)                                # Ψ(∇f_i(x^k)) = β Norm_α(∇f_i(x^k))
        agg = self.privatize(psi.mean(-2), k)                 # (1/B) Σ Ψ + z^k
        return server_step(x, agg, self.gamma, False), {"loss": loss.mean(-1), "uploads": G.shape[-2]}

    def noise_target(self):
        return (f"the mean (1/n) Σ_i β Norm_α(∇f_i(x^k)) of the n = {self.num_clients} clients' terms, each of norm "
                f"≤ β = {self.beta:g} (sensitivity β/n); one draw by the server, weight 1", 1.0)
