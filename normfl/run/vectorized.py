"""Runs side by side, vectorized: runs of one algorithm that differ only in scalars take each round as one.

Runs of an algorithm that declares the scalars its runs may differ in (``Algorithm.scalars``: α-NormEC and
Clip21, the DP-SGD baseline, Fed-α-NormEC and FedAvg with one local gradient step, a user's own), private or not,
that share data, model and seed (``setup.SHARED``) and stand at the same step differ only in those scalars, Ψ's β
and α, and the noise their privacy settings give. They step together:
their models are one ``[R, d]`` tensor, their memories ``[R, n, d]`` and ``[R, d]``, each scalar a ``[R, 1, 1]``
tensor where it meets the clients' rows or a ``[R, 1]`` one where it meets a model (``Algorithm.scalars``), and the
algorithm's box, whose clients are axis -2, runs once for all of them. Their clients' gradients come from one
stacked pass over the R·n clients (``engine.lockstep.combined_pass``: each run's BatchNorm statistics stay its
own), each run's noise from its own privatizer and generator; federated runs share one participation draw (their
participation settings are part of the group's key). Where the runs' own passes would run on static buffers
(``capture=auto|on``, equal batches), so does the group's: one ``engine.capture.StaticPass`` of the R·n clients,
each run's BatchNorm copies starting from and folding into its own model (``engine.batchnorm.ClientStats``),
replayed from a CUDA graph on a GPU.

Each run keeps its state as views of the group's, so its metrics, checkpoint and divergence stay its own; when
a run ends, the others are grouped again. Runs that cannot be grouped so go through ``engine.lockstep``.
"""

from __future__ import annotations

import copy

import torch

from normfl.algorithms.memory import ClientMemory
from normfl.engine.batchnorm import ClientStats
from normfl.engine.capture import StaticPass
from normfl.engine.lockstep import combined_pass
from normfl.ops import Bounding


def steps_side_by_side(algo, clients) -> bool:
    """Whether this run's round can take R runs at once: its algorithm declares the scalars they may differ in
    (``Algorithm.scalars``), and its clients are one stacked pass of one minibatch a client a step."""
    return (algo.scalars is not None and clients.engine.backend == "stacked"
            and clients.data.oracle == "minibatch")


def group_key(t) -> tuple | None:
    """What runs must share to step as one (None: this run cannot): the algorithm's class, whether it is private
    and who adds the noise, Ψ's kind, the participation draws and Ψ's argument (federated), and the step it
    stands at. A run audited in-band steps alone: its canaries ride on its own privatizer calls."""
    a = t.algo
    if not steps_side_by_side(a, t.clients) or (t.audit is not None and t.audit.inband):
        return None
    return (type(a), a.private, getattr(a, "noise_by", None), getattr(getattr(a, "bounding", None), "kind", None),
            a.sampling, getattr(a, "literal_psi", None), t.step)


def groups(trainings: list) -> tuple[list[list], list]:
    """The active runs as vectorized groups (two runs or more) and the rest."""
    by_key: dict = {}
    rest = []
    for t in trainings:
        key = group_key(t)
        if key is None:
            rest.append(t)
        else:
            by_key.setdefault(key, []).append(t)
    grouped = [g for g in by_key.values() if len(g) > 1]
    return grouped, rest + [g[0] for g in by_key.values() if len(g) == 1]


class Group:
    """R runs' rounds as one (see the module docstring)."""

    def __init__(self, trainings: list):
        self.trainings = trainings
        algos = [t.algo for t in trainings]
        x0 = trainings[0].x

        def column(name: str, rank: int, of=algos) -> torch.Tensor:
            values = [getattr(a, name) for a in of]
            dtype = torch.bool if isinstance(values[0], bool) else x0.dtype      # server normalisation: a mask
            return torch.tensor(values, device=x0.device, dtype=dtype).view(-1, *(1,) * rank)

        box = copy.copy(algos[0])                        # the class and its settings; scalars and state below
        if getattr(box, "bounding", None) is not None:
            bounds = [a.bounding for a in algos]
            box.bounding = Bounding(bounds[0].kind, beta=column("beta", 2, bounds), alpha=column("alpha", 2, bounds))
        for name, rank in box.scalars.items():
            setattr(box, name, column(name, rank))
        for name in box.state:                           # each run's state: views of the group's
            parts = [getattr(a, name) for a in algos]
            if isinstance(parts[0], ClientMemory):       # dense (as its ``scalars`` ask): its rows
                setattr(box, name, copy.copy(parts[0]))
                getattr(box, name).rows = torch.stack([m.rows for m in parts])
                for r, m in enumerate(parts):
                    m.rows = getattr(box, name).rows[r]
            else:
                setattr(box, name, torch.stack(parts))
                for r, a in enumerate(algos):
                    setattr(a, name, getattr(box, name)[r])
        box.privatize = self.privatize
        self.box, self.algos = box, algos
        self.X = torch.stack([t.x for t in trainings])     # the runs' models; each run's x is a row of it
        datas = [t.clients.data for t in trainings]
        for d in datas[1:]:                              # runs whose batch streams stand where the first's do share
            if d.draws_as(datas[0]):                     # them, and their batches are drawn once a step for all
                d.streams = datas[0].streams
        firsts: dict[int, int] = {}                      # each set of shared streams: the run that draws for it
        self.drawn_by = [firsts.setdefault(id(d.streams), len(firsts)) for d in datas]
        self.drawers = [datas[self.drawn_by.index(j)] for j in range(len(firsts))]
        engine = trainings[0].clients.engine
        self.static = None if engine.static is None else StaticPass(
            engine.stacked, engine.static.capture,
            lambda n: ClientStats([t.setup.flat.module for t in trainings], n // len(trainings)))
        for t in trainings:                              # what their summaries say of how their rounds ran
            t.captured = self.captured

    def captured(self) -> str:
        """How the group's pass ran, for its runs' summaries."""
        runs = f"{len(self.trainings)} runs side by side, one vectorized round"
        engine = self.trainings[0].clients.engine
        if self.static is None:
            return f"{runs}, the plain pass ({engine.captured()})"
        if not self.static.buffers:
            return f"{runs}, the plain pass (batches of unequal size)"
        if self.static.replayed:
            return f"{runs}, their pass replayed from a CUDA graph"
        return f"{runs}, their pass eager on static buffers ({engine.why_eager or 'not yet past its warm-up'})"

    def privatize(self, v: torch.Tensor, k: int) -> torch.Tensor:
        """Each run's releases through its own privatizer, with its own round-k draws."""
        if all(a.mech is None for a in self.algos):
            return v
        return torch.stack([a.privatize(v[r], k) for r, a in enumerate(self.algos)])

    def grads(self, X: torch.Tensor, batches=None, ids=None):
        """``[R, n, d]`` gradients and ``[R, n]`` losses: each run's clients (all, or the round's participants
        ``ids``) on their next batches (drawn once from each set of streams the runs share, one gather for all), in
        one stacked pass."""
        drawn = [d.next_batches(ids) for d in self.drawers]
        batches = [drawn[j] for j in self.drawn_by]
        piece = [b[0] for bs in batches for b in bs]
        if not piece:                                    # nobody computes (an empty Bernoulli draw)
            return X.new_zeros(len(X), 0, X.shape[-1]), X.new_zeros(len(X), 0)
        if self.static is not None and self.static.takes(piece):
            G, loss = self.static(X, piece)
            return G.view(len(X), -1, G.shape[-1]), loss.view(len(X), -1)
        requests = [("grads", t.clients, (X[r], bs)) for r, (t, bs) in enumerate(zip(self.trainings, batches,
                                                                                      strict=True))]
        parts = combined_pass("grads", requests)
        for part in parts:
            if isinstance(part, BaseException):
                raise part
        return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])

    side_by_side = True

    def round(self) -> None:
        """One round of every run of the group, each recorded by its own ``Training``."""
        k = self.trainings[0].step
        self.X, info = self.box.round(k, self.X, self)
        for name in self.box.state:                      # a round may bind its state anew: each run's, a view again
            if isinstance(whole := getattr(self.box, name), torch.Tensor):
                for r, a in enumerate(self.algos):
                    setattr(a, name, whole[r])
        for r, t in enumerate(self.trainings):
            t.record(self.X[r], {"loss": None if info["loss"] is None else info["loss"][r],
                                 "uploads": info["uploads"]})
