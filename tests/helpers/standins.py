"""Clients that stand in for a model and data, with gradients known in closed form."""

from types import SimpleNamespace

import torch


class Quadratic:
    """Clients with f_i(x) = ½ ||x - b_i||², so ∇f_i(x) = x - b_i (x of shape [d] or [n, d])."""

    side_by_side = False                                    # clients one at a time, as the sequential backend

    def __init__(self, centers, noise=0.0, seed=0):
        self.centers, self.noise = centers, noise
        self.gen = torch.Generator().manual_seed(seed)

    def grads(self, x, batches=None, ids=None):
        G = x - (self.centers if ids is None else self.centers[ids])
        if self.noise:                                      # stochastic: fresh every call
            G = G + self.noise * torch.randn(G.shape, generator=self.gen, dtype=G.dtype)
        return G, 0.5 * (G ** 2).sum(1)


class DPSGDClients:
    """n clients whose clipped per-sample sums pull client i towards b_i (its batch: 5 samples of 1 feature), as
    DP-SGD's clients (ALI-DPFL, fixed-τ DPFL) see them."""

    def __init__(self, centers, sizes):
        self.centers = centers
        self.data = SimpleNamespace(parts=[range(s) for s in sizes])
        self.steps = 0

    def clipped_grad_sums(self, W, rate, clip):
        self.steps += 1
        G = torch.clamp(W - self.centers, -clip, clip)                      # a bounded "gradient sum"
        batches = [(torch.zeros(5, 1), torch.zeros(5, dtype=torch.long), 1.0) for _ in self.centers]
        return G, 0.5 * ((W - self.centers) ** 2).sum(1), batches

    def grads(self, X, batches):
        G = X - self.centers[: len(batches)]
        return G, 0.5 * (G ** 2).sum(-1)


def run_dpfl(algo, rounds, epsilon, n=3, sizes=None, seed=0):
    """``algo`` (DPFL) on ``n`` ``DPSGDClients`` (centres 0, 1, ..., 2n - 1; ``sizes`` samples each) at
    (ε, 1e-5) for up to ``rounds`` rounds: (x, each round's info, the clients)."""
    from normfl.privacy import Privacy

    centers = torch.arange(n * 2, dtype=torch.float64).reshape(n, 2)
    clients = DPSGDClients(centers, sizes or [100] * n)
    algo.setup(torch.zeros(2, dtype=torch.float64), n, rounds, Privacy(epsilon=epsilon, delta=1e-5), seed)
    x, infos = torch.zeros(2, dtype=torch.float64), []
    for k in range(rounds):
        x, info = algo.round(k, x, clients)
        infos.append(info)
        if info["done"]:
            break
    return x, infos, clients
