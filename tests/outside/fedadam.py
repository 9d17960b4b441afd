"""A held-out algorithm written outside normfl, as a user would, on the base class alone (no Gaussian family to
inherit): DP-FedAdam, the server's Adam over the clients' clipped, noised gradients (Reddi et al. 2021,
"Adaptive Federated Optimization", Alg. 2 with one local step). tests/test_own_algorithm.py runs it."""

import torch

from normfl.algorithms.base import Algorithm
from normfl.ops import Bounding


class FedAdam(Algorithm):
    """Δ = (1/n) Σ_i (Clip_C(∇f_i(x)) + z_i);  m = b1 m + (1 - b1) Δ;  v = b2 v + (1 - b2) Δ²;
    x = x - η m / (√v + τ)."""

    state = ("m", "v")
    canaries = True                               # a Gaussian per client on a release bounded by ``bounding``

    def __init__(self, lr, clip, b1=0.9, b2=0.99, tau=1e-3, private=False, name="fedadam"):
        super().__init__(private, name)
        self.lr, self.b1, self.b2, self.tau = float(lr), float(b1), float(b2), float(tau)
        self.bounding = Bounding("clip", beta=float(clip))

    def setup(self, x0, num_clients, rounds, privacy, seed):
        super().setup(x0, num_clients, rounds, privacy, seed)
        if self.private:
            self.mech = privacy.gaussian(self.bounding.bound, 1.0, rounds)
        self.m, self.v = torch.zeros_like(x0), torch.zeros_like(x0)

    def round(self, k, x, clients):
        G, loss = clients.grads(x)
        delta = self.privatize(self.bounding(G), k).mean(-2)
        self.m = self.b1 * self.m + (1 - self.b1) * delta
        self.v = self.b2 * self.v + (1 - self.b2) * delta ** 2
        return x - self.lr * self.m / (self.v.sqrt() + self.tau), {"loss": loss.mean(), "uploads": len(G)}

    def noise_target(self):
        return f"Clip_C(∇f_i(x^k)), norm ≤ C = {self.bounding.bound:g}, weighted by 1", 1.0


class ForgetfulFedAdam(FedAdam):
    """The same with ``v`` left out of its declaration: a resumed run would restart it from zero."""

    state = ("m",)
