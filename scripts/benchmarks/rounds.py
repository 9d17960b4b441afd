"""normfl's round instrumented: where its time goes (``Phases``), what it computes (``LoggedClients``), and
every backend's round on the same inputs (``Replay``, ``agreement``)."""

from __future__ import annotations

import copy
import time

import torch

from normfl.engine import Clients


class Phases:
    """Where a round's time goes: ``data`` (drawing and making the clients' batches), ``pass`` (their
    gradients) and the rest of the round (``update``: the algorithm's vector work). On CUDA each phase is
    bracketed by CUDA events (device time, read once the round is over); on a CPU by the wall clock."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list = []

    def mark(self, phase: str, start: bool):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        else:
            event = time.perf_counter()
        self.marks.append((phase, start, event, time.perf_counter()))

    def totals(self) -> dict[str, float]:
        """Seconds per phase since the last call (``round`` marks the whole round), and the host's own seconds
        in it (``<phase>_host``: on a GPU, a phase whose host time is its device time keeps the device waiting)."""
        if self.cuda:
            torch.cuda.synchronize()
        out: dict[str, float] = {}
        opened = {}
        for phase, start, event, host in self.marks:
            if start:
                opened[phase] = (event, host)
                continue
            (begin, since) = opened.pop(phase)
            secs = begin.elapsed_time(event) / 1e3 if self.cuda else event - begin
            out[phase] = out.get(phase, 0.0) + secs
            out[f"{phase}_host"] = out.get(f"{phase}_host", 0.0) + host - since
        self.marks = []
        out["update"] = out.get("round", 0.0) - out.get("data", 0.0) - out.get("pass", 0.0)
        return out


class LoggedClients(Clients):
    """The run's clients, noting what each round computes, (kind, client ids, per-client pieces), and
    timing its data and pass phases (``Phases``)."""

    def __init__(self, clients: Clients, phases: Phases):
        super().__init__(clients.engine, clients.data)
        self.log: list = []
        self.phases = phases

    def grads(self, x, batches=None, ids=None):
        if batches is None:
            self.phases.mark("data", True)
            batches = self.data.next_batches(ids)
            self.phases.mark("data", False)
        ids = list(range(len(self.data))) if ids is None else [int(i) for i in ids]
        self.log.append(("grad", ids, batches))
        self.phases.mark("pass", True)
        out = self.engine.grads(x, batches)
        self.phases.mark("pass", False)
        return out

    def clipped_grad_sums(self, x, rate, clip):
        self.phases.mark("data", True)
        batches = self.data.poisson_batches(rate)
        self.phases.mark("data", False)
        self.phases.mark("pass", True)
        out = self.engine.clipped_sums(x, batches, clip, self.data.pad_to(rate))
        self.phases.mark("pass", False)
        self.log.append(("clip", list(range(len(self.data))), [[p] for p in batches]))
        return (*out, batches)


class Replay(Clients):
    """A logged round's batches handed out again, each client's in the order it asked for them (a backend that
    steps clients together asks in another order than one that steps them one by one): every backend computes
    on the same inputs (``agreement``)."""

    def __init__(self, clients: Clients, log: list):
        super().__init__(clients.engine, clients.data)
        self.queues: dict[int, list] = {}
        for _, ids, batches in log:
            for i, b in zip(ids, batches, strict=True):
                self.queues.setdefault(i, []).append(b)

    def _next(self, ids):
        return [self.queues[i].pop(0) for i in (range(len(self.data)) if ids is None else [int(i) for i in ids])]

    def grads(self, x, batches=None, ids=None):
        return self.engine.grads(x, self._next(ids) if batches is None else batches)

    def clipped_grad_sums(self, x, rate, clip):
        pieces = [b[0] for b in self._next(None)]
        return (*self.engine.clipped_sums(x, pieces, clip, self.data.pad_to(rate)), pieces)


def agreement(setup, clients, variants, apply, x, k: int, log: list) -> dict[str, dict]:
    """For each backend variant, one round from the same state on the same batches as the first: the largest
    relative difference of its first gradients and of its new x from the first variant's."""
    def rel(a, b):
        return float(torch.linalg.vector_norm((a - b).double()) / torch.linalg.vector_norm(b.double()).clamp_min(1e-30))

    out, ref = {}, None
    for v in variants:
        apply(v)
        algo = copy.deepcopy(setup.algo)
        buffers = setup.flat.buffers()
        first = Replay(clients, log)
        call = log[0]
        if call[0] == "grad":
            G = clients.engine.grads(x, call[2])[0]
        else:
            G = clients.engine.clipped_sums(x, [b[0] for b in call[2]], setup.algo.mech.clip)[0]
        x_new, _ = algo.round(k, x, first)
        setup.flat.set_buffers(buffers)
        if ref is None:
            ref = (G, x_new)
        out[v] = {"grad_rel_diff": rel(G, ref[0]), "update_rel_diff": rel(x_new, ref[1])}
    return out
