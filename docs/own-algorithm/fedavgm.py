"""DP-FedAvg with server momentum (FedAvgM, Hsu, Qi and Brown 2019, arXiv:1909.06335, Alg. 1 with one local
step), each participant's gradient clipped and noised as in DP-FedAvg. How to run it: docs/own-algorithm.md."""

import torch

from normfl.algorithms.base import GaussianAlgorithm
from normfl.algorithms.fed import mean_loss
from normfl.ops import Bounding, Participation, weighted_mean


class FedAvgM(GaussianAlgorithm):
    """x^{k+1} = x^k - γ m^{k+1},   m^{k+1} = μ m^k + (1/n) Σ_i q_i (Clip_β(∇f_i(x^k)) + z_i)."""

    state = ("m",)                                # changed by a round: checkpointed, restored on resume
    scalars = {"gamma": 1, "mu": 1}               # runs side by side may differ in these ([R, 1] columns)
    # inherited from GaussianAlgorithm: canaries = True, noise_by = "client", the gamma/beta checks

    def __init__(self, gamma, beta, mu=0.9, p=1.0, private=False, name="fedavgm"):
        super().__init__(gamma, beta, private=private, name=name)
        self.mu, self.bernoulli_p = float(mu), float(p)
        self.bounding = Bounding("clip", beta=self.beta)        # Ψ = Clip_β: a release's norm is at most β

    @classmethod
    def check(cls, cfg, rules):
        super().check(cfg, rules)
        rules.number(cfg, "algo.mu", lambda v: 0 <= v < 1, "a number in [0, 1)")

    def setup(self, x0, num_clients, rounds, privacy, seed):
        self.sampling = Participation.of("bernoulli", num_clients, seed, self.bernoulli_p)
        super().setup(x0, num_clients, rounds, privacy, seed)    # the Gaussian, calibrated for Ψ's bound
        self.m = torch.zeros_like(x0)                            # m^0 = 0

    def round(self, k, x, clients):
        draw = self.sampling.draw(k, x.device)                   # q_i = 1/p with chance p, else 0
        G, loss = clients.grads(x, ids=draw.ids)                 # the participants' gradients at x^k
        sent = self.privatize(self.bounding(G), k)               # Clip_β(∇f_i(x^k)) + z_i
        self.m = self.mu * self.m + weighted_mean(draw.q, sent, draw.ids)
        return x - self.gamma * self.m, {"loss": mean_loss(loss), "uploads": draw.count}

    def noise_target(self):
        return f"Clip_β(∇f_i(x^k)), norm ≤ β = {self.beta:g}, weighted by 1/p = {1 / self.p:g}", 1 / self.p
