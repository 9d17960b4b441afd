"""Runs side by side: several runs' rounds whose client computations go through one stacked pass.

Each run's round is its algorithm's own code, unchanged (``algo.round(k, x, clients)``), run in a
thread of its own. The threads take turns: one runs at a time, until it asks its clients for
gradients or finishes its round. When every run is waiting or done, the waiting requests are served
together: with the stacked backend, one forward and one backward pass over every client of every run
(run r's clients as groups of their own, at run r's points, on run r's batches, with run r's BatchNorm
statistics); otherwise one request after another. So the runs need not be alike: each keeps its own
batch streams, and a run that asks for something else, or for nothing, simply joins fewer passes.

A run's results equal the run made alone, up to float rounding: its batches come from its own
streams, and every client's gradient from its own group.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from normfl.engine.batchnorm import ClientStats, fold_running_stats
from normfl.engine.clients import Clients


class Closed(BaseException):
    """Raised in a run's thread that waits for its clients when the lockstep closes."""


@dataclass
class _Slot:
    """One run's thread and what passes between it and the coordinator."""

    go: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    task: Callable | None = None
    request: tuple | None = None       # (kind, clients, args) while the run waits for its clients
    answer: object = None
    result: object = None              # the round's return value, or the exception it raised
    done: bool = True
    thread: threading.Thread | None = None


class SharedClients(Clients):
    """A run's clients inside a lockstep round: their batches are drawn here, their gradients come from
    the coordinator's next pass."""

    def __init__(self, clients: Clients, lockstep: Lockstep, slot: _Slot):
        super().__init__(clients.engine, clients.data)
        self.lockstep, self.slot = lockstep, slot

    def grads(self, x, batches=None, ids=None):
        if batches is None:
            batches = self.data.next_batches(ids)
        return self.lockstep.ask(self.slot, ("grads", self, (x, batches)))

    def clipped_grad_sums(self, x, rate, clip):
        batches = self.data.poisson_batches(rate)
        capacity = self.data.pad_to(rate)
        return (*self.lockstep.ask(self.slot, ("clip", self, (x, batches, clip, capacity))), batches)


class Lockstep:
    """Rounds of several runs in lockstep (see the module docstring). ``close`` ends the threads."""

    def __init__(self):
        self.slots: list[_Slot] = []
        self.back = threading.Semaphore(0)     # released by a run's thread when it hands control back

    def round(self, rounds: list[tuple[Callable, Clients]]) -> list:
        """Run ``step(shared_clients)`` for each (step, clients) pair, one round of each run; returns their
        results in order, or the exception a run raised."""
        while len(self.slots) < len(rounds):
            slot = _Slot()
            slot.thread = threading.Thread(target=self._work, args=(slot,), daemon=True)
            slot.thread.start()
            self.slots.append(slot)
        slots = self.slots[:len(rounds)]
        for slot, (step, clients) in zip(slots, rounds, strict=True):
            shared = SharedClients(clients, self, slot)
            slot.task, slot.done, slot.request = (lambda step=step, shared=shared: step(shared)), False, None
        pending = slots
        while pending:
            for slot in pending:                 # each runs until it asks its clients or ends its round
                slot.go.release()
                self.back.acquire()
            pending = [s for s in pending if not s.done]
            if pending:
                for slot, answer in zip(pending, self._serve([s.request for s in pending]), strict=True):
                    slot.answer = answer
        return [s.result for s in slots]

    def ask(self, slot: _Slot, request: tuple):
        """Called in a run's thread: hand the request over and wait for the answer."""
        slot.request = request
        self.back.release()
        slot.go.acquire()
        if isinstance(slot.answer, BaseException):
            raise slot.answer
        return slot.answer

    def close(self) -> None:
        """End the threads; a run stopped mid-round (the coordinator raised) has its wait end in ``Closed``."""
        for slot in self.slots:
            if not slot.done:
                slot.answer = Closed("the lockstep was closed mid-round")
                slot.go.release()
                self.back.acquire()
            slot.task = None
            slot.go.release()
            slot.thread.join()
        self.slots = []

    def _work(self, slot: _Slot) -> None:
        while True:
            slot.go.acquire()
            if slot.task is None:
                return
            try:
                slot.result = slot.task()
            except BaseException as err:  # noqa: BLE001 (the run's failure, reported with its result)
                slot.result = err
            slot.done, slot.request = True, None
            self.back.release()

    # -- serving the waiting requests ------------------------------------------------------------
    def _serve(self, requests: list[tuple]) -> list:
        answers: list = [None] * len(requests)
        for kind in ("grads", "clip"):
            idx = [i for i, r in enumerate(requests) if r[0] == kind]
            together = [i for i in idx if _stackable(requests[i])]
            if len(together) > 1:
                try:
                    parts = combined_pass(kind, [requests[i] for i in together])
                except Exception as err:  # noqa: BLE001 (every run in the pass gets the error)
                    parts = [err] * len(together)
                for i, part in zip(together, parts, strict=True):
                    answers[i] = part
            for i in set(idx) - set(together if len(together) > 1 else ()):
                answers[i] = _alone(requests[i])
        return answers


def _stackable(request) -> bool:
    """Whether a request can join a combined stacked pass: one minibatch per client, unweighted."""
    kind, clients, args = request
    if clients.engine.backend != "stacked":
        return False
    if kind == "clip":
        return clients.engine.stacked.norm_layers is not None
    batches = args[1]
    return len(batches) > 0 and all(len(b) == 1 and b[0][2] == 1.0 for b in batches)


def _alone(request):
    kind, clients, args = request
    try:
        if kind == "grads":
            return clients.engine.grads(*args)
        return clients.engine.clipped_sums(*args)
    except Exception as err:  # noqa: BLE001 (the run's failure)
        return err


def _rows(x: torch.Tensor, n: int) -> torch.Tensor:
    return x.expand(n, -1) if x.dim() == 1 else x


def combined_pass(kind: str, requests: list[tuple]) -> list:
    """One stacked pass for every client of every request (``(kind, clients, args)``, as ``ask`` gets them:
    one minibatch a client, on the stacked backend); each request's share of the result, or the exception."""
    engines = [r[1].engine for r in requests]
    if kind == "grads":
        pieces = [[b[0] for b in r[2][1]] for r in requests]
    else:
        pieces = [r[2][1] for r in requests]
    sizes = [len(p) for p in pieces]
    X = torch.cat([_rows(r[2][0], n) for r, n in zip(requests, sizes, strict=True)])
    piece = [p for ps in pieces for p in ps]
    stacked = engines[0].stacked
    if kind == "clip":                          # each run's own clip norm, one per group
        clips = torch.cat([torch.full((n,), float(r[2][2]), device=X.device) for r, n in zip(requests, sizes,
                                                                                           strict=True)])
        capacity = max((r[2][3] or 0 for r in requests), default=0) or None      # the runs' Poisson padding
        sums, losses = stacked.clipped_sums(X, piece, clips.double(), capacity)
        return list(zip(sums.split(sizes), losses.split(sizes), strict=True))
    if stacked.has_batchnorm and not stacked.takes(piece):
        return [_alone(r) for r in requests]
    copies = [ClientStats(e.flat.module, n).fill() for e, n in zip(engines, sizes, strict=True)]
    stats = {k: torch.cat([c[k] for c in copies]) for k in copies[0]} if copies[0] else None
    G, losses = stacked.grads(X, piece, stats)
    first = 0
    for e, n in zip(engines, sizes, strict=True):
        if stats:
            fold_running_stats(e.flat.module, {k: v[first:first + n] for k, v in stats.items()}, n)
        first += n
    return list(zip(G.split(sizes), losses.split(sizes), strict=True))
