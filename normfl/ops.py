"""The parts every algorithm is built from: pure functions on tensors with a leading client axis.

A "stack" is a ``[clients, d]`` tensor (one flat vector per client). Norms are one global l2 norm
per row (reading A15, docs/readings.md), never per layer. Four kinds of part, each used by every algorithm
that needs it (the privatizers are in ``normfl.privacy.mechanisms``):

- random streams: ``round_generator(seed, STREAM, round)``, one independent stream per use (a run's
  own reseeded generators: ``Streams``);
- Ψ, the bounding operator a client applies to what it uploads (``bounding``);
- participation: who takes part in a round and with which weight (``Participation``);
- server steps: plain, normalized (``server_step``) and model averaging (``average``).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np
import torch

from normfl.syncs import host_side

# -- random streams: (seed, stream, round) -> a generator; one stream per use, never shared ------------------
NOISE = 0            # privacy noise (and NFA's quantizer)
PARTICIPATION = 1    # who takes part in a round
DPSGD = 2            # ALI-DPFL's Poisson batches and DP-SGD noise
EVALUATION = 3       # the test subset of ``eval_subset``
AUDIT = 4            # privacy audits' canaries (``privacy.audit``): never drawn by a run itself


def round_seed(seed: int, stream: int, round_: int) -> int:
    """The seed of one (seed, stream, round): independent streams for noise and participation."""
    state = np.random.SeedSequence([seed, stream, round_]).generate_state(1, dtype=np.uint64)[0]
    return int(state) & (2**63 - 1)


def round_generator(seed: int, stream: int, round_: int, device) -> torch.Generator:
    """A new generator for one (seed, stream, round)."""
    return torch.Generator(device=device).manual_seed(round_seed(seed, stream, round_))


class Streams:
    """A run's generators: one per (stream, device), made once and reseeded for each round, so that its draws
    depend only on (seed, stream, round), as ``round_generator``'s, while the generator itself stays the
    same object (what a captured CUDA graph registers). One run's own: runs side by side must not share it."""

    def __init__(self, seed: int):
        self.seed, self.made, self.held = seed, {}, False

    def __call__(self, stream: int, round_: int, device) -> torch.Generator:
        """Round ``round_``'s generator of ``stream`` (under ``hold``: as the last ``reseed`` left it)."""
        device = torch.device(device)
        if self.held and (stream, device) in self.made:
            return self.made[stream, device]
        return self.reseed(stream, round_, device)

    def reseed(self, stream: int, round_: int, device) -> torch.Generator:
        device = torch.device(device)
        if (stream, device) not in self.made:
            self.made[stream, device] = torch.Generator(device=device)
        return self.made[stream, device].manual_seed(round_seed(self.seed, stream, round_))

    @contextlib.contextmanager
    def hold(self):
        """Calls return the generators as they stand, unseeded: a captured round seeds them before each
        replay, and a graph cannot seed them inside."""
        self.held = True
        try:
            yield
        finally:
            self.held = False


# -- Ψ: bounding operators ---------------------------------------------------------------------------------


def row_norms(v: torch.Tensor) -> torch.Tensor:
    """l2 norm of each row of ``[n, d]`` as ``[n, 1]`` (or of a vector as a 0-d tensor)."""
    return torch.linalg.vector_norm(v, dim=-1, keepdim=v.dim() > 1)


def norm_alpha(v: torch.Tensor, alpha: float) -> torch.Tensor:
    """Smoothed normalization Norm_α(v) = v / (α + ||v||), row-wise; Norm_0(0) = 0 (reading A15)."""
    denom = alpha + row_norms(v)
    return v / torch.where(denom > 0, denom, torch.ones_like(denom))


def clip(v: torch.Tensor, tau: float) -> torch.Tensor:
    """Clipping Clip_τ(v) = min(1, τ/||v||) v, row-wise; Clip_τ(0) = 0."""
    n = row_norms(v)
    return v * torch.clamp(tau / torch.where(n > 0, n, torch.ones_like(n)), max=1.0)


def normalize(v: torch.Tensor) -> torch.Tensor:
    """v / ||v|| with 0/0 = 0 (NORMEC §4, server normalization)."""
    return norm_alpha(v, 0.0)


BOUNDINGS = ("norm", "scaled_norm", "clip", "unit_clip", "unit", "none")


@dataclass(frozen=True)
class Bounding:
    """Ψ, what a client applies to its vector before it is released, and ``bound``, the largest norm of
    Ψ's output (the release's sensitivity before any server-side weight):

    - ``norm``: Norm_α (bound 1); the algorithm weights the release by β after it (α-NormEC,
      Fed-α-NormEC: β multiplies Δ_i in the memories, outside Ψ);
    - ``scaled_norm``: β Norm_α (bound β; β inside Ψ: FedAvg's and DP-SGD's Ψ);
    - ``clip``: Clip_β (bound β: Clip21, DP-FedAvg with clipping, NFA's clipping baseline);
    - ``unit_clip``: Clip_β / β (bound 1); the algorithm weights the release by β after it (NFA's clipping
      baseline under reading C-N16: its quantizer's unit grid holds the whole ball of radius β);
    - ``unit``: v / ||v|| (bound 1: NormFedAvg);
    - ``none``: the identity (unbounded: non-private only).
    """

    kind: str
    beta: float = 1.0
    alpha: float = 0.0

    def __post_init__(self):
        if self.kind not in BOUNDINGS:
            raise ValueError(f"bounding={self.kind!r}; allowed: {', '.join(BOUNDINGS)}")

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        if self.kind == "norm":
            return norm_alpha(v, self.alpha)
        if self.kind == "scaled_norm":
            return self.beta * norm_alpha(v, self.alpha)
        if self.kind == "clip":
            return clip(v, self.beta)
        if self.kind == "unit_clip":
            return clip(v, self.beta) / self.beta
        return normalize(v) if self.kind == "unit" else v

    @property
    def bound(self) -> float:
        return {"norm": 1.0, "unit_clip": 1.0, "unit": 1.0, "none": math.inf}.get(self.kind, self.beta)

    @property
    def weight(self) -> float:
        """What the algorithm multiplies the release by after it: β for ``unit_clip`` (undoing its 1/β), else 1."""
        return self.beta if self.kind == "unit_clip" else 1.0


# -- participation --------------------------------------------------------------------------------------------


def bernoulli_weights(n: int, p: float, seed: int, round_: int, device=None) -> torch.Tensor:
    """q_i = 1/p with probability p, else 0, independently per client (FEDNORMEC Alg. 1 line 7)."""
    if p >= 1.0:
        return torch.ones(n, device=device)
    gen = round_generator(seed, PARTICIPATION, round_, device)
    return (torch.rand(n, generator=gen, device=device) < p).float() / p


def poisson_sample(rng: np.random.Generator, n: int, rate: float) -> np.ndarray:
    """DP-SGD's Poisson sampling, as a mask of n items: each taken independently with probability ``rate``, so
    a batch's size varies and can be 0. The clients sample their shards with it, the audit's sample canaries
    too (a change of the rule reaches both)."""
    return rng.random(n) < rate


def cohort(n: int, size: int, seed: int, round_: int, device=None) -> torch.Tensor:
    """The ids (sorted) of a uniform cohort of ``size`` of the n clients, drawn without replacement."""
    gen = round_generator(seed, PARTICIPATION, round_, device)
    return torch.randperm(n, generator=gen, device=device)[:size].sort().values


def cohort_weights(n: int, size: int, seed: int, round_: int, device=None) -> torch.Tensor:
    """The cohort weighted n/size (0 for the rest), so that (1/n) sum_i q_i u_i is the cohort mean."""
    q = torch.zeros(n, device=device)
    q[cohort(n, size, seed, round_, device)] = n / size
    return q


PARTICIPATIONS = ("bernoulli", "cohort")


@dataclass(frozen=True)
class Participation:
    """Who takes part in round k, and the weights q_i that keep the aggregate unbiased:

    - ``bernoulli``: each of the n clients independently with probability p, q_i = 1/p (FEDNORMEC
      Alg. 1 line 7; p = 1 is full participation);
    - ``cohort``: a uniform cohort of ``size`` clients without replacement, q_i = n/size (NFA Alg. 2
      line 3; each client's chance p = size/n).
    """

    n: int
    seed: int
    kind: str = "bernoulli"
    p: float = 1.0
    size: int | None = None

    @classmethod
    def of(cls, kind: str, n: int, seed: int, p: float = 1.0, size: int | None = None) -> Participation:
        if kind == "cohort":
            return cls(n, seed, kind, size / n, size)
        return cls(n, seed, kind, p)

    def weights(self, k: int, device=None) -> torch.Tensor:
        """q^k, ``[n]``: q_i > 0 for the clients taking part in round k."""
        if self.kind == "cohort":
            return cohort_weights(self.n, self.size, self.seed, k, device)
        return bernoulli_weights(self.n, self.p, self.seed, k, device)

    def cohort(self, k: int) -> torch.Tensor:
        """The sorted ids of round k's cohort (``cohort`` only), drawn on the host."""
        with host_side():
            return cohort(self.n, self.size, self.seed, k)

    def draw(self, k: int, device) -> Draw:
        """Round k's participants, drawn on the host (a CPU generator, so CPU and GPU runs draw alike and
        the host knows whose batches to draw without waiting for the device); q then goes to ``device``."""
        with host_side():
            q = self.weights(k)
            ids = participants(q)
            return Draw(q.to(device, non_blocking=True), ids, len(q) if ids is None else len(ids))


@dataclass(frozen=True)
class Draw:
    """Who takes part in a round: the weights ``q`` (``[n]``, on the run's device), the participants' ids on
    the host (None: every client) and their ``count``."""

    q: torch.Tensor
    ids: torch.Tensor | None
    count: int


def participants(q: torch.Tensor) -> torch.Tensor | None:
    """The ids of the clients with q_i > 0, the only ones that need to compute for their upload
    (None when that is every client)."""
    ids = q.nonzero().squeeze(1)
    return None if len(ids) == len(q) else ids


def weighted_mean(q: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor:
    """(1/n) Σ_i q_i rows_i over all n clients, where ``rows`` holds every client's row or those of ``ids``; the
    clients are axis -2 (runs side by side: ``rows`` ``[R, n, d]``, one q for all)."""
    if ids is None:
        return (q[:, None] * rows).mean(-2)
    return (q[ids.to(q.device, non_blocking=True), None] * rows).sum(-2) / len(q)     # host ids: a queued copy


# -- server steps ---------------------------------------------------------------------------------------------


def server_step(x: torch.Tensor, direction: torch.Tensor, step, normalized=False) -> torch.Tensor:
    """x - step * direction, or x - step * direction / ||direction|| with server normalization (row-wise; with
    runs side by side ``step`` is ``[R, 1]`` and ``normalized`` a ``[R, 1]`` boolean tensor)."""
    if isinstance(normalized, torch.Tensor):
        return x - step * torch.where(normalized, normalize(direction), direction)
    return x - step * (normalize(direction) if normalized else direction)


def average(W: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The new global model as the weighted average Σ_i w_i W_i of the clients' local models ``[n, d]``."""
    return weights @ W
