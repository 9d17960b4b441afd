"""The clients as an algorithm sees them, and the engine that computes their gradients by a backend."""

from __future__ import annotations

import torch

from normfl.data.clients import ClientData
from normfl.engine import analytic, sequential, vmap
from normfl.engine.capture import StaticPass, capturable
from normfl.engine.clipping import clipped_by_norms, clipped_by_vmap, norm_layers
from normfl.engine.stacked import NotStackable, StackedPass

BACKENDS = ("auto", "sequential", "vmap", "analytic", "stacked")
SIDE_BY_SIDE = ("vmap", "stacked")          # backends that compute the clients together, not one by one


def uniform(batches) -> bool:
    """Whether every client's batch pieces have the same shapes, which vmap needs."""
    shapes = {tuple(tuple(p[0].shape) for p in b) for b in batches}
    return len(shapes) == 1


class ClientEngine:
    """Per-client gradients ``G[i] = grad f_i(X[i])`` and losses, by the chosen backend:

    - ``sequential``: a loop over clients with autograd; the reference and the baseline;
    - ``vmap``: ``torch.func.vmap`` over the client axis;
    - ``analytic``: for Linear/ReLU stacks (mlp, logreg), the backward pass written out;
    - ``stacked``: every client as one group of one grouped model, in one forward and one backward pass.

    ``capture`` (``auto``, ``on``: the stacked backend's equal batches go through ``capture.StaticPass``,
    replayed from a CUDA graph where the device allows; ``off``: the pass as it is).
    """

    def __init__(self, flat, backend: str = "sequential", in_shape=None, capture: str = "off"):
        self.flat, self.backend = flat, backend
        self.norm_layers = norm_layers(flat.module)           # per-sample norms from layers, or None: vmap
        self.linear_stack = analytic.linear_stack(flat.module)   # the analytic backend's layers, or None
        try:
            self.stacked = StackedPass(flat)
            if in_shape is not None:
                self.stacked.check(in_shape)
        except NotStackable as err:
            self.stacked, self.not_stackable = None, str(err)
        if backend == "analytic" and not self.linear_stack:
            raise ValueError("analytic takes a Flatten, then Linear layers with a ReLU between each two, "
                             "as model=mlp, logreg build")
        if backend == "stacked" and self.stacked is None:
            raise ValueError(f"stacked cannot run this model group by group: {self.not_stackable}")
        self.static, self.capture, self.why_eager = None, capture, None   # the stacked pass on static buffers
        if capture != "off" and self.stacked is not None:
            self.why_eager = capturable(flat.device, torch.are_deterministic_algorithms_enabled())
            self.static = StaticPass(self.stacked, capture=self.why_eager is None)

    def backends(self) -> tuple[str, ...]:
        """The backends that apply to this model and precision (bf16 autocast: sequential and stacked)."""
        fp32 = self.flat.precision != "bf16"
        return ("sequential",) + (("vmap",) if fp32 else ()) + (("analytic",) if fp32 and self.linear_stack else ()) \
            + (("stacked",) if self.stacked else ())

    def captured(self) -> str:
        """How the pass ran, for a run's summary: replayed from a CUDA graph, eager on static buffers (and why),
        or off."""
        if self.static is None or self.backend != "stacked":
            return "off" if self.capture == "off" else f"off: backend={self.backend} (only stacked captures)"
        if self.static.replayed:
            return "replayed from a CUDA graph"
        return f"eager on static buffers ({self.why_eager or 'no pass of equal batches yet'})"

    @property
    def side_by_side(self) -> bool:
        """Whether the backend computes clients together (then local steps go best all clients at once)."""
        return self.backend in SIDE_BY_SIDE

    def _backend(self, piece):
        if self.backend == "analytic":
            return lambda x, p: analytic.grads(self.flat, self.linear_stack, x, p)
        if self.backend == "stacked" and self.static is not None and self.static.takes(piece):
            return self.static
        if self.backend == "stacked" and self.stacked.takes(piece):
            return self.stacked.grads
        if self.backend == "vmap" and len(piece) > 1 and uniform([[p] for p in piece]):
            return lambda x, p: vmap.grads(self.flat, x, p)
        return lambda x, p: sequential.grads(self.flat, x, p)

    def grads(self, x: torch.Tensor, batches) -> tuple[torch.Tensor, torch.Tensor]:
        """x: ``[d]`` (every client at the same point) or ``[n, d]``; returns ``([n, d], [n])``."""
        if not batches:                                      # nobody computes (an empty Bernoulli draw)
            return x.new_zeros(0, self.flat.dim), x.new_zeros(0)
        if all(len(b) == 1 and b[0][2] == 1.0 for b in batches):     # one minibatch each: no reweighting
            piece = [b[0] for b in batches]
            return self._backend(piece)(x, piece)
        n = len(batches)
        G = torch.zeros(n, self.flat.dim, device=x.device, dtype=x.dtype)
        loss = torch.zeros(n, device=x.device, dtype=x.dtype)
        for j in range(max(len(b) for b in batches)):       # one piece per client at a time
            mine = [i for i, b in enumerate(batches) if j < len(b)]   # clients with a j-th piece
            piece = [batches[i][j] for i in mine]
            # the host's lists go over as queued copies (a tensor made from a list on a GPU waits for it)
            idx = torch.tensor(mine).to(x.device, non_blocking=True)
            w = torch.tensor([p[2] for p in piece], dtype=x.dtype).to(x.device, non_blocking=True)
            g, l = self._backend(piece)(x if x.dim() == 1 else x[idx], piece)
            G[idx] += w[:, None] * g
            loss[idx] += w * l
        return G, loss

    def clipped_sums(self, x: torch.Tensor, pieces, clip: float, capacity: int | None = None):
        """Per client i: sum over the samples s of its piece of ∇ℓ(x_i; s) / max(1, ||∇ℓ(x_i; s)|| / clip),
        and the mean loss (0 for an empty piece). The stacked backend takes every client in one pass; the
        others loop over clients (Poisson batches differ in size). ``capacity``: the stacked pass's batch size
        (``ClientData.pad_to``). Returns ([n, d] sums, [n] losses). See ``normfl.engine.clipping``."""
        flat = self.flat
        sums = torch.zeros(len(pieces), flat.dim, device=x.device, dtype=x.dtype)
        losses = torch.zeros(len(pieces), device=x.device, dtype=x.dtype)
        if not any(len(p[1]) for p in pieces):
            return sums, losses
        if self.backend == "stacked" and self.stacked.norm_layers:
            return self.stacked.clipped_sums(x, pieces, clip, capacity)
        clipped = clipped_by_norms if self.norm_layers else clipped_by_vmap
        for i, (xb, yb, _) in enumerate(pieces):
            if len(yb) == 0:
                continue
            sums[i], losses[i] = clipped(flat, x if x.dim() == 1 else x[i], xb, yb, clip, self.norm_layers)
        return sums, losses


class Clients:
    """The clients as an algorithm sees them: gradients on their next batches, or on given ones."""

    def __init__(self, engine: ClientEngine, data: ClientData):
        self.engine, self.data = engine, data

    @property
    def side_by_side(self) -> bool:
        return self.engine.side_by_side

    def peek(self, ids=None):
        """The next round's batches of every client (or of ``ids``), left in place for ``grads``."""
        return self.data.peek(ids)

    def grads(self, x: torch.Tensor, batches=None, ids=None):
        """Gradients at x (``[d]``, or one row per client) on each client's next batches, or on
        ``batches``; with ``ids``, only those clients compute (x then has one row per id)."""
        if batches is None:
            batches = self.data.next_batches(ids)
        return self.engine.grads(x, batches)

    def cyclic_pass(self, batch_size: int):
        return self.data.cyclic_batches(batch_size)

    def clipped_grad_sums(self, x: torch.Tensor, rate: float, clip: float):
        """DP-SGD's gradient step input: each client Poisson-samples its shard at ``rate`` and sums its
        per-sample gradients at x (``[d]`` or one row per client), each clipped to norm ``clip``.
        Returns ([n, d] sums, [n] mean losses, the batches)."""
        batches = self.data.poisson_batches(rate)
        return (*self.engine.clipped_sums(x, batches, clip, self.data.pad_to(rate)), batches)
