"""The stacked pass, and a whole error-feedback round, on buffers made once, so that a CUDA graph can replay
them (``capture``).

A graph replays the kernels it recorded on the memory it recorded them on. ``StaticPass`` therefore keeps,
per shape of pass (clients, batch, sample shape), the clients' points ``X [n, d]``, their stacked inputs
``[b, n·C, ...]`` and labels ``[b, n]`` in buffers of its own; a step copies its inputs into them and runs
the pass, which writes the gradients and losses (and, with BatchNorm, folds the clients' running statistics
into the model's buffers, through ``ClientStats``' buffers) always at the same addresses.

- Eager (``capture=off``, the CPU, or a setting that cannot be captured): the pass runs on the buffers as it
  is. It is the step a graph replays, and gives the same numbers as ``StackedPass.grads``.
- Captured (``capture=auto`` or ``on`` on CUDA): after ``WARMUP`` eager steps on a side stream (cuDNN and the
  autograd engine settle there), one step is recorded in a ``torch.cuda.CUDAGraph``; every later step copies
  its inputs and replays it.

``CapturedRound`` goes further for α-NormEC and Clip21: the pass and the algorithm's vector work around it
in one graph, the batches and the noise seed set outside it before each replay.

What cannot be captured runs eagerly (``capturable`` says why): a pass whose batches differ in size (DP-SGD's
Poisson batches, uneven shards), and ``deterministic=true``, whose promise (a rerun repeats every bit) is
made for eager rounds only.
"""

from __future__ import annotations

import logging

import torch

from normfl.engine.batchnorm import ClientStats
from normfl.ops import NOISE

log = logging.getLogger(__name__)
CAPTURES = ("auto", "on", "off")
WARMUP = 3          # eager steps before a capture


def capturable(device: torch.device, deterministic: bool) -> str | None:
    """Why a run on ``device`` cannot capture its pass (None: it can)."""
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device; this run computes on {device.type}"
    if deterministic:
        return "deterministic=true: its rerun-repeats-every-bit promise is made for eager rounds"
    if not hasattr(torch.cuda.CUDAGraph, "register_generator_state"):
        return f"torch {torch.__version__} cannot register a generator with a CUDA graph"
    return None


class _Replay:
    """How a static step runs: ``WARMUP`` eager steps (on a side stream when a capture follows: cuDNN and the
    autograd engine settle there), then, when capturing, one recording in a CUDA graph, and replays after it."""

    def __init__(self, capture: bool):
        self.capture, self.steps, self.graph = capture, 0, None

    def __call__(self, body, generator: torch.Generator | None = None, what: str = "a step") -> None:
        if self.graph is None and self.capture and self.steps >= WARMUP:
            self.graph = torch.cuda.CUDAGraph()
            if generator is not None:                    # replayed from the seed set before each replay
                self.graph.register_generator_state(generator)
            with torch.cuda.graph(self.graph):
                body()
            log.info("captured %s in a CUDA graph", what)
        if self.graph is not None:
            self.graph.replay()
        elif self.capture:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                body()
            torch.cuda.current_stream().wait_stream(stream)
        else:
            body()
        self.steps += 1


class _Buffers:
    """One shape of pass: its input buffers, its outputs (made by its first step, written in place after), and
    how it runs (``_Replay``)."""

    def __init__(self, stacked, piece, dtype: torch.dtype, capture: bool, stats):
        (x0, y0, _), n = piece[0], len(piece)
        self.n, self.replay = n, _Replay(capture)
        self.X = torch.zeros(n, stacked.flat.dim, device=x0.device, dtype=dtype, requires_grad=True)
        self.xb = x0.new_empty(len(y0), n * x0.shape[1], *x0.shape[2:])
        self.yb = y0.new_empty(len(y0), n)
        self.stats = stats(n) if stacked.has_batchnorm else None
        self.G = self.loss = None


class StaticPass:
    """``StackedPass.grads`` on static buffers, replayed from a CUDA graph when ``capture`` (see the module
    docstring). Takes pieces of equal size only (``takes``). ``stats(n)``: the BatchNorm copies of a pass of n
    clients (``ClientStats`` of the stacked model's module, or of each run's for runs side by side)."""

    def __init__(self, stacked, capture: bool, stats=None):
        self.stacked, self.capture = stacked, capture
        self.stats = stats or (lambda n: ClientStats(stacked.flat.module, n))
        self.buffers: dict[tuple, _Buffers] = {}

    @property
    def replayed(self) -> bool:
        """Whether a pass of it has been recorded in a CUDA graph (and is replayed from it)."""
        return any(b.replay.graph is not None for b in self.buffers.values())

    @staticmethod
    def takes(piece) -> bool:
        """Whether these batches have one shape (a static pass needs no padding mask)."""
        return len({(tuple(p[0].shape), tuple(p[1].shape)) for p in piece}) == 1

    def load(self, x: torch.Tensor, piece) -> _Buffers:
        """The buffers of this shape of pass, holding the step's points and batches (copied: outside a graph).
        x: one point for every client (``[d]``), one per client (``[n, d]``) or one per run of R side by side
        (``[R, d]``, the clients run after run). A pass is recorded for one precision and memory layout: a change
        of either (the bench's variants) makes buffers and a graph of its own."""
        n, flat = len(piece), self.stacked.flat
        key = (n, tuple(piece[0][0].shape), piece[0][0].dtype, tuple(piece[0][1].shape), flat.precision,
               flat.grouped_layout.on)
        if key not in self.buffers:
            self.buffers[key] = _Buffers(self.stacked, piece, x.dtype, self.capture, self.stats)
        buf = self.buffers[key]
        with torch.no_grad():
            rows = x if x.dim() == 2 else x[None]
            buf.X.view(len(rows), n // len(rows), -1).copy_(rows[:, None])
            torch.stack([p[0] for p in piece], 1, out=buf.xb.view(len(piece[0][1]), n, *piece[0][0].shape[1:]))
            torch.stack([p[1] for p in piece], 1, out=buf.yb)
        return buf

    def __call__(self, x: torch.Tensor, piece) -> tuple[torch.Tensor, torch.Tensor]:
        buf = self.load(x, piece)
        buf.replay(lambda: self._pass(buf), what=f"the stacked pass of {buf.n} clients")
        return buf.G.clone(), buf.loss.clone()           # the caller's own: the next step overwrites the buffers

    def _pass(self, buf: _Buffers) -> None:
        """The step a graph records: the clients' losses and gradients at X on the buffered batches, into
        ``buf.G`` and ``buf.loss``."""
        stats = buf.stats.fill() if buf.stats is not None else None
        loss, _ = self.stacked.losses_stacked(buf.X, buf.xb, buf.yb, None, stats)
        (G,) = torch.autograd.grad(loss.sum(), buf.X)
        if buf.stats is not None:
            buf.stats.fold()
        if buf.G is None:
            buf.G, buf.loss = G, loss.detach()
        else:                                            # later steps (and the graph) write where the first did
            buf.G.copy_(G)
            buf.loss.copy_(loss.detach())


class _Loaded:
    """The clients inside a captured round: their batches already in the static pass's buffers; ``grads(x)``
    puts x in the buffers and runs the pass (no draw, no copy from a tensor made outside the graph)."""

    side_by_side = True

    def __init__(self, static: StaticPass, buf: _Buffers):
        self.static, self.buf = static, buf

    def grads(self, x: torch.Tensor, batches=None, ids=None):
        with torch.no_grad():
            self.buf.X.copy_(x.expand(self.buf.n, -1))
        self.static._pass(self.buf)
        return self.buf.G, self.buf.loss


class CapturedRound:
    """A whole round of an error-feedback algorithm (α-NormEC, Clip21: one stacked pass, then vector work)
    replayed from one CUDA graph. Outside the graph, each round the host draws the clients' batches, the device
    gathers them into the static pass's buffers, x goes into a buffer of its own and the noise generator is
    reseeded for the round (``ops.Streams.hold``: the graph replays it from its seed and offset); the graph
    holds the pass, the BatchNorm fold, Ψ, the memories, the noise and the server step, and writes the new x
    and the loss at fixed addresses. Eager (``capture=False``, a CPU) it runs the same body on the same buffers:
    the numbers of the algorithm's own round, bit for bit (``tests/test_capture.py``)."""

    def __init__(self, algo, static: StaticPass, capture: bool, why_eager: str | None = None):
        self.algo, self.static, self.why_eager = algo, static, why_eager
        self.replay, self.x_in, self.out = _Replay(capture), None, None

    def captured(self) -> str:
        """How the rounds ran, for a run's summary."""
        if self.replay.graph is not None:
            return "whole round replayed from a CUDA graph"
        return f"whole round eager on static buffers ({self.why_eager or 'not yet past its warm-up'})"

    def __call__(self, k: int, x: torch.Tensor, clients) -> tuple[torch.Tensor, dict]:
        piece = [b[0] for b in clients.data.next_batches()]    # host draws, device gather: outside the graph
        buf = self.static.load(x, piece)
        if self.x_in is None:
            self.x_in = x.detach().clone()
        else:
            self.x_in.copy_(x)
        gen = self.algo.generator.reseed(NOISE, k, x.device) if self.algo.mech is not None else None
        self.replay(lambda: self._body(k, buf), gen, what=f"a whole {self.algo.name} round ({buf.n} clients)")
        x_new, loss = self.out
        return x_new.clone(), {"loss": loss.clone(), "uploads": len(piece)}

    def _body(self, k: int, buf: _Buffers) -> None:
        with self.algo.generator.hold():
            x_new, info = type(self.algo).round(self.algo, k, self.x_in, _Loaded(self.static, buf))
        if self.out is None:
            self.out = (x_new, info["loss"])
        else:                                            # later rounds (and the graph) write where the first did
            self.out[0].copy_(x_new)
            self.out[1].copy_(info["loss"])
