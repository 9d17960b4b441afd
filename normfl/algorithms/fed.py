"""Federated algorithms with local steps and partial participation (FEDNORMEC).

Fed-α-NormEC follows FEDNORMEC Algorithm 1 (line numbers in comments); FedAvg / DP-FedAvg is the
baseline of FEDNORMEC §3 and App. D.1 (spec normec.md §2.6): the same client computation without
error feedback. Both share the local operator, the participation draw and the server step.
"""

from __future__ import annotations

import torch

from normfl.algorithms.base import Algorithm, Clients
from normfl.algorithms.local import pseudo_gradient
from normfl.algorithms.memory import ClientMemory
from normfl.ops import bernoulli_weights, clip, cohort_weights, norm_alpha, server_step

PARTICIPATION = ("bernoulli", "cohort")
BOUNDINGS = ("norm", "clip", "none")
MEMORY_UPDATES = ("all", "participants_only")


def participants(q: torch.Tensor) -> torch.Tensor | None:
    """The ids of the clients with q_i > 0, the only ones that need to compute for their upload
    (None when that is every client)."""
    ids = q.nonzero().squeeze(1)
    return None if len(ids) == len(q) else ids


def mean_loss(loss: torch.Tensor) -> float | None:
    """The mean client loss of a round; None when no client computed (an empty Bernoulli draw)."""
    return loss.mean().item() if len(loss) else None


class _Federated(Algorithm):
    def __init__(self, gamma, beta, alpha=0.01, eta=None, p=1.0, local_steps=1, local_operator="gd",
                 ig_batch_size=1, server_norm=False, participation="bernoulli", cohort_size=None,
                 private=False, name=""):
        super().__init__(gamma, beta, alpha, private, name)
        self.eta = self.gamma if eta is None else float(eta)          # η = γ in the experiments (A3)
        self.p, self.server_norm = float(p), bool(server_norm)
        self.local = {"steps": int(local_steps), "operator": local_operator, "ig_batch_size": int(ig_batch_size)}
        self.participation, self.cohort_size = participation, cohort_size

    def setup(self, x0, num_clients, rounds, privacy, seed):
        if self.participation == "cohort":
            self.p = self.cohort_size / num_clients                   # each client's chance to be picked
        super().setup(x0, num_clients, rounds, privacy, seed)

    def weights(self, k: int, device) -> torch.Tensor:
        """q_i^k: 1/p w.p. p (Bernoulli) or n/B on a uniform cohort of B clients; 0 otherwise."""
        if self.participation == "cohort":
            return cohort_weights(self.num_clients, self.cohort_size, self.seed, k, device)
        return bernoulli_weights(self.num_clients, self.p, self.seed, k, device)

    def pseudo_gradient(self, x, clients, ids=None):
        return pseudo_gradient(x, clients, self.gamma, ids=ids, **self.local)

    def aggregate(self, q: torch.Tensor, rows: torch.Tensor, ids) -> torch.Tensor:
        """(1/M) Σ_i q_i rows_i, where ``rows`` holds every client's row or those of ``ids``."""
        if ids is None:
            return (q[:, None] * rows).mean(0)
        return (q[ids, None] * rows).sum(0) / self.num_clients


class FedNormEC(_Federated):
    """(DP-)Fed-α-NormEC. Every client computes and updates its memory each round (the box); only
    participants upload, each adding its own noise before the 1/p weight. With
    ``memory_update=participants_only`` only participants compute and update their memories, so a
    round costs what its cohort costs; the memories are then kept in a ``ClientMemory`` that holds
    only the rows a round touches when all of them would not fit in RAM."""

    upload_bound = 1.0                   # ||Δ_i|| <= 1

    def __init__(self, *args, memory_update="all", **kw):
        super().__init__(*args, **kw)
        self.memory_update = memory_update

    def setup(self, x0, num_clients, rounds, privacy, seed):
        super().setup(x0, num_clients, rounds, privacy, seed)
        self.v = ClientMemory(num_clients, x0.numel(), x0.device, x0.dtype)   # v_i^0 = 0 (A6)
        self.vhat = torch.zeros_like(x0)                                        # v̂^0 = mean v_i^0

    def round(self, k: int, x: torch.Tensor, clients: Clients):
        q = self.weights(k, x.device)                        # 7: q_i = 1/p w.p. p, else 0
        ids = None if self.memory_update == "all" else participants(q)
        U, loss = self.pseudo_gradient(x, clients, ids)      # 4: T_i(x^k); U_i = (x^k - T_i(x^k))/γ
        v = self.v[ids]                                      # the memories read once, written once
        delta = norm_alpha(U - v, self.alpha)                # 5: Δ_i = Norm_α(U_i - v_i)
        self.v[ids] = v + self.beta * delta                  # 6: v_i^{k+1} = v_i^k + β Δ_i
        sent = self.noise(delta, k)                          # 8/9: Δ̂_i = q_i (Δ_i + z_i)
        self.vhat += self.beta * self.aggregate(q, sent, ids)   # 11: v̂^{k+1} = v̂^k + (β/M) Σ Δ̂_i
        x = server_step(x, self.vhat, self.eta, self.server_norm)   # 12: x - η v̂ (/||v̂|| with SN)
        return x, {"loss": mean_loss(loss), "uploads": int((q > 0).sum())}

    def memory_gap(self) -> float:
        return torch.linalg.vector_norm(self.vhat - self.v.mean()).item()


class FedAvg(_Federated):
    """(DP-)FedAvg with a bounding operator Ψ on the pseudo-gradient (FEDNORMEC §3, App. D.1):

        x^{k+1} = x^k - η (1/M) Σ_i q_i (Ψ(U_i) + ζ_i),   U_i = (x^k - T_i(x^k))/γ,

    Ψ = β Norm_α (``norm``), Clip_β (``clip``) or the identity (``none``, non-private only).
    ``literal_psi`` applies Ψ to x^k - T_i(x^k) = γ U_i instead (spec A9's literal reading).
    Noise: each participant adds ζ_i (``noise_by=client``), or the server adds one draw to the
    sum of the participants' bounded updates (``noise_by=server``, central DP-FedAvg)."""

    def __init__(self, *args, bounding="norm", noise_by="client", literal_psi=False, **kw):
        super().__init__(*args, **kw)
        self.bounding, self.noise_by, self.literal_psi = bounding, noise_by, bool(literal_psi)
        self.upload_bound = self.beta if bounding != "none" else float("inf")

    def psi(self, u: torch.Tensor) -> torch.Tensor:
        if self.bounding == "norm":
            return self.beta * norm_alpha(u, self.alpha)
        return clip(u, self.beta) if self.bounding == "clip" else u

    def round(self, k: int, x: torch.Tensor, clients: Clients):
        q = self.weights(k, x.device)
        ids = participants(q)                                # only participants compute
        U, loss = self.pseudo_gradient(x, clients, ids)
        bounded = self.psi(self.gamma * U if self.literal_psi else U)
        if self.noise_by == "client":                        # each participant: Ψ(U_i) + ζ_i
            agg = self.aggregate(q, self.noise(bounded, k), ids)
        else:                                                # server: (Σ_S Ψ(U_i) + ζ) / (p M)
            agg = self.aggregate(q, bounded, ids)
            agg = self.noise(agg * (self.p * self.num_clients), k) / (self.p * self.num_clients)
        x = server_step(x, agg, self.eta, self.server_norm)
        return x, {"loss": mean_loss(loss), "uploads": int((q > 0).sum())}
