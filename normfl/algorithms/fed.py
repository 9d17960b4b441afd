"""Federated algorithms with local steps and partial participation (FEDNORMEC).

Fed-α-NormEC follows FEDNORMEC Algorithm 1 (line numbers in comments); FedAvg / DP-FedAvg is the
baseline of FEDNORMEC §3 and App. D.1 (reading A9, docs/readings.md): the same client computation without
error feedback. Both are built from the same parts: the local operator (``local.pseudo_gradient``),
the participation draw (``ops.Participation``), Ψ (``ops.Bounding``), the Gaussian privatizer and
the server step (``ops.server_step``).
"""

from __future__ import annotations

import torch

from normfl.algorithms.base import Clients, GaussianAlgorithm
from normfl.algorithms.local import pseudo_gradient
from normfl.algorithms.memory import ClientMemory
from normfl.ops import Bounding, Participation, server_step, weighted_mean

BOUNDINGS = ("norm", "clip", "none")          # FedAvg's choices of Ψ (``norm`` is β Norm_α there)
MEMORY_UPDATES = ("all", "participants_only")


def mean_loss(loss: torch.Tensor) -> torch.Tensor | None:
    """The mean client loss of a round (of each run side by side), on the device; None when no client computed
    (an empty Bernoulli draw)."""
    return loss.mean(-1) if loss.shape[-1] else None


class _Federated(GaussianAlgorithm):
    def __init__(self, gamma, beta, alpha=0.01, eta=None, p=1.0, local_steps=1, local_operator="gd",
                 ig_batch_size=1, server_norm=False, participation="bernoulli", cohort_size=None,
                 private=False, name=""):
        super().__init__(gamma, beta, alpha, private, name)
        self.eta = self.gamma if eta is None else float(eta)          # η = γ in the experiments (reading A3)
        self.bernoulli_p, self.server_norm = float(p), bool(server_norm)
        self.local = {"steps": int(local_steps), "operator": local_operator, "ig_batch_size": int(ig_batch_size)}
        self.participation, self.cohort_size = participation, cohort_size

    def setup(self, x0, num_clients, rounds, privacy, seed):
        self.sampling = Participation.of(self.participation, num_clients, seed, self.bernoulli_p, self.cohort_size)
        super().setup(x0, num_clients, rounds, privacy, seed)

    @property
    def scalars(self) -> dict[str, int] | None:
        """Runs side by side take one local gradient step (``run.vectorized``)."""
        return self.SCALARS if self.local["steps"] == 1 and self.local["operator"] == "gd" else None

    def pseudo_gradient(self, x, clients, ids=None):
        return pseudo_gradient(x, clients, self.gamma, ids=ids, **self.local)


class FedNormEC(_Federated):
    """(DP-)Fed-α-NormEC. Every client computes and updates its memory each round (the box); only
    participants upload, each adding its own noise before the 1/p weight. With
    ``memory_update=participants_only`` only participants compute and update their memories, so a
    round costs what its cohort costs; the memories are then kept in a ``ClientMemory`` that holds
    only the rows a round touches when all of them would not fit in RAM."""

    paper_name = "Fed-α-NormEC"
    state = ("v", "vhat")
    SCALARS = {"beta": 2, "gamma": 2, "eta": 1, "server_norm": 1}

    @property
    def scalars(self) -> dict[str, int] | None:
        """As ``_Federated``'s, with every client's memory updated each round and the memories in RAM."""
        return super().scalars if self.memory_update == "all" and not self.v.on_disk else None

    def __init__(self, *args, memory_update="all", **kw):
        super().__init__(*args, **kw)
        self.memory_update = memory_update
        self.bounding = Bounding("norm", alpha=self.alpha)            # ||Δ_i|| <= 1; β weights it outside Ψ

    def setup(self, x0, num_clients, rounds, privacy, seed):
        super().setup(x0, num_clients, rounds, privacy, seed)
        self.v = ClientMemory(num_clients, x0.numel(), x0.device, x0.dtype)   # v_i^0 = 0 (reading A6)
        self.vhat = torch.zeros_like(x0)                                        # v̂^0 = mean v_i^0

    def round(self, k: int, x: torch.Tensor, clients: Clients):
        """The box on one run, or on R runs side by side (``run.vectorized``: x ``[R, d]``, U ``[R, n, d]``, the
        scalars ``[R, 1(, 1)]``, one draw for all): the clients are always axis -2."""
        draw = self.sampling.draw(k, x.device)               # 7: q_i = 1/p w.p. p, else 0
        q, ids = draw.q, None if self.memory_update == "all" else draw.ids
        U, loss = self.pseudo_gradient(x, clients, ids)      # 4: T_i(x^k); U_i = (x^k - T_i(x^k))/γ
        v = self.v[ids]                                      # the memories read once, written once
        delta = self.bounding(U - v)                         # 5: Δ_i = Norm_α(U_i - v_i)
        self.v[ids] = v + self.beta * delta                  # 6: v_i^{k+1} = v_i^k + β Δ_i
        sent = self.privatize(delta, k)                      # 8/9: Δ̂_i = q_i (Δ_i + z_i)
        self.vhat += weighted_mean(q, self.beta * sent, ids)   # 11: v̂^{k+1} = v̂^k + (1/M) Σ β Δ̂_i
        x = server_step(x, self.vhat, self.eta, self.server_norm)   # 12: x - η v̂ (/||v̂|| with SN)
        return x, {"loss": mean_loss(loss), "uploads": draw.count}

    def memory_gap(self) -> float:
        return torch.linalg.vector_norm(self.vhat - self.v.mean()).item()

    def noise_target(self):
        return (f"Δ_i = Norm_α(U_i - v_i), norm ≤ 1, weighted by β/p = {self.beta / self.p:g} at the server "
                f"(β = {self.beta:g}, q_i = 1/p)", self.beta / self.p)


class FedAvg(_Federated):
    """(DP-)FedAvg with a bounding operator Ψ on the pseudo-gradient (FEDNORMEC §3, App. D.1):

        x^{k+1} = x^k - η (1/M) Σ_i q_i (Ψ(U_i) + ζ_i),   U_i = (x^k - T_i(x^k))/γ,

    Ψ = β Norm_α (``norm``), Clip_β (``clip``) or the identity (``none``, non-private only): β sits
    inside Ψ, so the release's bound is β. ``literal_psi`` applies Ψ to x^k - T_i(x^k) = γ U_i instead
    (reading A9's literal option). Noise: each participant adds ζ_i (``noise_by=client``), or the server
    adds one draw to the sum of the participants' bounded updates (``noise_by=server``, central DP-FedAvg)."""

    SCALARS = {"gamma": 2, "eta": 1, "server_norm": 1}

    def __init__(self, *args, bounding="norm", noise_by="client", literal_psi=False, **kw):
        super().__init__(*args, **kw)
        self.noise_by, self.literal_psi = noise_by, bool(literal_psi)
        self.bounding = Bounding({"norm": "scaled_norm"}.get(bounding, bounding), self.beta, self.alpha)

    def round(self, k: int, x: torch.Tensor, clients: Clients):
        """On one run, or on R runs side by side, as ``FedNormEC.round``."""
        draw = self.sampling.draw(k, x.device)
        q, ids = draw.q, draw.ids                            # only participants compute
        U, loss = self.pseudo_gradient(x, clients, ids)
        bounded = self.bounding(self.gamma * U if self.literal_psi else U)
        if self.noise_by == "client":                        # each participant: Ψ(U_i) + ζ_i
            agg = weighted_mean(q, self.privatize(bounded, k), ids)
        else:                                                # server: (Σ_S Ψ(U_i) + ζ) / (p M)
            total = self.p * self.num_clients
            agg = self.privatize(weighted_mean(q, bounded, ids) * total, k) / total
        x = server_step(x, agg, self.eta, self.server_norm)
        return x, {"loss": mean_loss(loss), "uploads": draw.count}

    def noise_target(self):
        u = "γ U_i" if self.literal_psi else "U_i"
        psi = f"β Norm_α({u})" if self.bounding.kind == "scaled_norm" else f"Clip_β({u})"
        if self.noise_by == "client":
            return (f"Ψ = {psi}, norm ≤ β = {self.beta:g}, weighted by 1/p = {1 / self.p:g} at the server",
                    1 / self.p)
        total = self.p * self.num_clients
        return (f"the sum over the round's participants of Ψ = {psi}, each of norm ≤ β = {self.beta:g}; one draw "
                f"by the server, which divides the sum by p·n = {total:g}", 1 / total)
