"""The benchmark suite: normfl's round time against the compute floor and against paper-style code.

    python scripts/bench.py [--settings A B C D] [--reps 5] [--threads N] [override ...]

For each paper setting it times, in one process and taking turns so that machine drift hits every
variant alike (medians over ``--reps`` rounds, after one warm-up round; the paper-style variant over the
first ``--paper-reps`` of them):

- ``normfl/<backend>``: one whole round of the algorithm (client computation, its vector work,
  noise) through ``normfl.run.build``, the objects a run uses, for each backend that applies;
- ``floor``: the bare forward + backward (+ optimizer step where the clients take local steps) of
  exactly the samples that round used, in plain PyTorch on one ordinary model, data already in memory,
  one client's batch at a time (the per-client loop floor);
- ``dense floor``: the same samples, every client's batch of one step in ONE batch through one plain
  model (what a round costs if per-client gradients were free); on CUDA in channels_last and replayed
  from a CUDA graph;
- ``paper-style``: the same work done the way the papers' public code does it: a deepcopy of the
  global model per client, a torch DataLoader over PIL images with torchvision transforms, and
  state-dict averaging (per-sample gradients by a loop over samples for DP-SGD);
- ``eval``: one pass over the test set (normfl's evaluation; for a convolutional model also in the other
  memory format);
- ``+bf16``: normfl's sequential and stacked backends and the floors under bf16 autocast
  (``precision=bf16``; not for DP-SGD, whose per-sample clipping stays fp32);
- ``+contiguous`` / ``+channels_last``: for a convolutional model, each variant (but vmap, which stays
  plain) and the evaluation again in the memory format the run would not give it (``memory_format``), so
  that one table says which layout is faster where.

Settings: A NORMEC (CIFAR-10 ResNet20, 10 clients x one gradient of batch 32); B NormFedAvg
(Fashion-MNIST MLP, 25 of 50 clients x 20 local steps x batch 256); C FEDNORMEC (20 clients,
p = 0.25: every client computes, the box); D DPFL (Fashion-MNIST CNN, per-sample clipped DP-SGD, one
local step). Extra overrides apply to every setting. ``--together N`` runs of setting A (a grid of β and γ)
trained side by side as ``hydra/launcher=stacked`` trains such a grid, one vectorized round of all of them
(``normfl.run.vectorized``, backend stacked), against the dense floor of their N x 320 images (default 16 on
CUDA, 0 on a CPU, where it takes minutes), and ``--in-a-row`` (default on CUDA) the first setting's rounds as a
run takes them, one after another without a synchronisation between them, are timed right after the first
setting. Last, sweep-level
parallelism: runs per hour of a 2 x 2 grid, one job at a time with all threads against joblib jobs with one
thread each. Prints one table (seconds and ratio to the floor) and writes outputs/bench/bench.csv.
"""

from __future__ import annotations

import argparse
import copy
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from PIL import Image
from torch.utils.data import DataLoader, Dataset, Subset

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from normfl.engine import Clients  # noqa: E402
from normfl.run import build, vectorized  # noqa: E402
from normfl.run import start as start_run  # noqa: E402
from normfl.run.setup import round_of  # noqa: E402

SETTINGS = {
    "A": ("NORMEC CIFAR-10 ResNet20, 10 clients x 1 gradient, batch 32",
          ["algo=normec", "algo.beta=0.1", "algo.gamma=0.1"]),
    "B": ("NormFedAvg FMNIST MLP, 25 of 50 clients x 20 steps, batch 256",
          ["experiment=nfa_t6_fmnist_normfedavg"]),
    "C": ("FEDNORMEC CIFAR-10 ResNet20, 20 clients, p = 0.25",
          ["experiment=fednormec_f_ec", "p=0.25", "algo.beta=0.01", "algo.gamma=0.01"]),
    "D": ("DPFL FMNIST CNN, per-sample DP-SGD, 10 clients",
          ["experiment=alidpfl_fmnist", "budget=e175_r177", "algo=dpfl", "algo.tau=1"]),
}


WARMUP_IN_A_ROW = 5       # rounds before ``in_a_row`` times any: a captured round records after three
PAPER_REPS = 5            # rounds the paper-style variant is timed on: its PIL DataLoader runs on the host, slowly


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


def local_steps(cfg) -> bool:
    """Whether the clients take optimizer steps (then the floor and paper-style code step too)."""
    return bool(cfg.algo.get("local_steps", 1) > 1 or cfg.algo.get("sample_rate"))


def sgd(cfg, params):
    """The clients' optimizer as the algorithm configures it (NFA: momentum 0.9, weight decay 1e-4)."""
    return torch.optim.SGD(params, lr=1e-3, momentum=cfg.algo.get("momentum") or 0.0,
                           weight_decay=cfg.algo.get("weight_decay") or 0.0)


class Floor:
    """Forward + backward (+ SGD step) of each logged piece on one plain model, nothing else
    (optionally under bf16 autocast, the floor of precision=bf16)."""

    def __init__(self, cfg, ds, device, bf16: bool = False):
        self.model = instantiate(cfg.model, in_shape=tuple(ds.x_train.shape[1:]), num_classes=ds.num_classes)
        self.model.to(device).train()
        self.opt = sgd(cfg, self.model.parameters()) if local_steps(cfg) else None
        self.autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)

    def step(self, xb, yb):
        self.model.zero_grad(set_to_none=True)
        with self.autocast:
            loss = F.cross_entropy(self.model(xb).float(), yb)
        loss.backward()
        if self.opt:
            self.opt.step()

    def __call__(self, log):
        for _, _, batches in log:
            for pieces in batches:
                for xb, yb, _ in pieces:
                    if len(yb):
                        self.step(xb, yb)


class DenseFloor(Floor):
    """Each logged step's samples, every client's batch together, in ONE forward + backward (+ SGD step) of
    one plain model: the round without per-client gradients. On CUDA the model and inputs are channels_last
    and each step shape is replayed from a CUDA graph captured by ``prepare`` (untimed)."""

    def __init__(self, cfg, ds, device, bf16: bool = False):
        super().__init__(cfg, ds, device, bf16)
        self.cuda = device.type == "cuda"
        if self.cuda and ds.x_train.dim() == 4:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.graphs: dict = {}

    @staticmethod
    def steps(log):
        """One (inputs, labels) batch per logged call: every client's pieces of that step, concatenated."""
        for _, _, batches in log:
            width = max(len(b) for b in batches)
            for j in range(width):
                pieces = [b[j] for b in batches if j < len(b) and len(b[j][1])]
                if pieces:
                    yield torch.cat([p[0] for p in pieces]), torch.cat([p[1] for p in pieces])

    def prepare(self, log):
        """On CUDA: capture a graph for every step shape of the log not yet seen (warm-up on a side stream)."""
        if not self.cuda:
            return
        for xb, yb in self.steps(log):
            key = (tuple(xb.shape), tuple(yb.shape))
            if key in self.graphs:
                continue
            static_x = xb.clone().contiguous(memory_format=torch.channels_last) if xb.dim() == 4 else xb.clone()
            static_y = yb.clone()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    self.step(static_x, static_y)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.step(static_x, static_y)
            self.graphs[key] = (graph, static_x, static_y)

    def __call__(self, log):
        for xb, yb in self.steps(log):
            entry = self.graphs.get((tuple(xb.shape), tuple(yb.shape)))
            if entry is None:
                self.step(xb, yb)
            else:
                graph, static_x, static_y = entry
                static_x.copy_(xb)
                static_y.copy_(yb)
                graph.replay()


class PILImages(Dataset):
    """Samples as PIL images through torchvision transforms, the way the papers' code loads data."""

    def __init__(self, x, y, transform):
        self.x, self.y, self.transform = x, y, transform

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        img = self.x[i].permute(1, 2, 0).numpy()
        img = Image.fromarray(img[:, :, 0] if img.shape[2] == 1 else img)
        return self.transform(img), int(self.y[i])


class PaperStyle:
    """The round as the papers' public code writes it: per client a deepcopy of the global model and a
    DataLoader over PIL images; gradients or models averaged through state dicts."""

    def __init__(self, cfg, setup):
        from torchvision import transforms as T

        ds, self.device = setup.ds, setup.device
        aug = [T.RandomCrop(ds.x_train.shape[-1], padding=4), T.RandomHorizontalFlip()] if cfg.dataset.augment else []
        images = PILImages(ds.x_train, ds.y_train, T.Compose([*aug, T.ToTensor(), T.Normalize(ds.mean, ds.std)]))
        self.subsets = [Subset(images, p.tolist()) for p in setup.parts]
        self.loaders: dict = {}
        self.model = instantiate(cfg.model, in_shape=tuple(ds.x_train.shape[1:]), num_classes=ds.num_classes)
        self.model.to(self.device).train()
        self.cfg, self.step, self.clip = cfg, local_steps(cfg), cfg.algo.get("clip")

    def _batch(self, i: int, size: int):
        key = (i, size)
        if key not in self.loaders:
            self.loaders[key] = [DataLoader(self.subsets[i], batch_size=size, shuffle=True, drop_last=True), None]
        entry = self.loaders[key]
        try:
            xb, yb = next(entry[1])
        except (StopIteration, TypeError):
            entry[1] = iter(entry[0])
            xb, yb = next(entry[1])
        return xb.to(self.device), yb.to(self.device)

    def __call__(self, log):
        work: dict[int, list[tuple[str, int]]] = {}          # client -> its steps (kind, batch size)
        for kind, ids, batches in log:
            for i, pieces in zip(ids, batches, strict=True):
                work.setdefault(i, []).extend((kind, len(p[1])) for p in pieces if len(p[1]))
        states = []
        for i, steps in work.items():
            local = copy.deepcopy(self.model)
            opt = sgd(self.cfg, local.parameters())
            for kind, size in steps:
                xb, yb = self._batch(i, size)
                opt.zero_grad(set_to_none=True)
                if kind == "clip":                           # per-sample gradients, one sample at a time
                    total = [torch.zeros_like(p) for p in local.parameters()]
                    for s in range(size):
                        grads = torch.autograd.grad(F.cross_entropy(local(xb[s:s + 1]), yb[s:s + 1]),
                                                    list(local.parameters()))
                        scale = min(1.0, self.clip / (torch.sqrt(sum((g ** 2).sum() for g in grads)) + 1e-12))
                        for t, g in zip(total, grads, strict=True):
                            t.add_(g, alpha=float(scale))
                    for p, t in zip(local.parameters(), total, strict=True):
                        p.grad = t / size
                else:
                    F.cross_entropy(local(xb), yb).backward()
                if self.step:
                    opt.step()
            states.append(local.state_dict())
        avg = {k: torch.stack([s[k].float() for s in states]).mean(0).to(v.dtype)
               for k, v in self.model.state_dict().items()}
        self.model.load_state_dict(avg)


def bench(name: str, overrides: list[str], reps: int, paper_reps: int = PAPER_REPS) -> list[dict]:
    title, own = SETTINGS[name]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[*own, "progress=false", *overrides])
    setup = build(cfg)
    phases = Phases(setup.device)
    clients = LoggedClients(setup.clients, phases)
    floor, paper = Floor(cfg, setup.ds, setup.device), PaperStyle(cfg, setup)
    floor_bf16 = Floor(cfg, setup.ds, setup.device, bf16=True)
    dense, dense_bf16 = (DenseFloor(cfg, setup.ds, setup.device, bf16=b) for b in (False, True))
    sync = torch.cuda.synchronize if setup.device.type == "cuda" else (lambda: None)
    dp = bool(cfg.algo.get("sample_rate"))
    stacked = ["stacked"] if clients.engine.stacked else []
    backends = (["layer norms", "vmap", *stacked] if dp else
                [*clients.engine.backends(), "sequential+bf16", *(f"{s}+bf16" for s in stacked)])
    flat = setup.flat
    own = {"stacked": flat.grouped_layout.on, "model": flat.layout.on}     # the run's layouts (memory_format)

    def channels_last(b: str) -> bool:                      # a variant's layout in the run
        return own["stacked" if b.split("+")[0] == "stacked" else "model"]

    def lay_out(on: bool):
        flat.layout.on = flat.grouped_layout.on = flat.layout.applies and on

    if flat.layout.applies:                                 # each variant in the other memory format too
        backends += [f"{b}+{'contiguous' if channels_last(b) else 'channels_last'}" for b in backends
                     if not b.startswith("vmap")]            # vmap stays plain
    layers = clients.engine.norm_layers
    x, k, times, split = setup.x, 0, {}, {}
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()

    def timed(label, fn, *args):
        sync()
        t = time.perf_counter()
        out = fn(*args)
        sync()
        times.setdefault(label, []).append(time.perf_counter() - t)
        return out

    def use(variant):
        b, *marks = variant.split("+")
        lay_out("channels_last" in marks or (channels_last(b) and "contiguous" not in marks))
        if dp:                                               # per-sample clipping: layer norms, vmap, stacked
            clients.engine.norm_layers = None if b == "vmap" else layers
            clients.engine.backend = "stacked" if b == "stacked" else "sequential"
        else:                                                # precision=bf16: the sequential or stacked backend
            clients.engine.backend = b
            setup.flat.precision = "bf16" if "bf16" in marks else "fp32"

    for rep in range(reps + 1):
        for b in backends:
            use(b)
            clients.log = []
            phases.mark("round", True)
            x_before = x
            x, _ = timed(f"normfl/{b}", setup.algo.round, k, x, clients)
            phases.mark("round", False)
            for phase, secs in phases.totals().items():
                split.setdefault((f"normfl/{b}", phase), []).append(secs)
            if rep == 0 and b == backends[0]:                # the backends on this round's inputs, from its start
                agree = agreement(setup, clients, backends, use, x_before, k, clients.log)
                use(b)
            k += 1
        timed("floor", floor, clients.log)
        for d in (dense, *(() if dp else (dense_bf16,))):
            d.prepare(clients.log)
        timed("dense floor", dense, clients.log)
        if not dp:                                           # DP-SGD's clipping is never autocast
            timed("floor+bf16", floor_bf16, clients.log)
            timed("dense floor+bf16", dense_bf16, clients.log)
        if rep <= paper_reps:                               # the papers' style: its first rounds only
            timed("paper-style", paper, clients.log)
        setup.flat.precision = cfg.precision                 # evaluation in the run's own numerics
        lay_out(own["model"])
        timed("eval", setup.flat.evaluate, x, setup.x_test, setup.y_test)
        if flat.layout.applies:
            lay_out(not own["model"])
            timed(f"eval+{'contiguous' if own['model'] else 'channels_last'}", flat.evaluate, x, setup.x_test,
                  setup.y_test)
    med = {label: statistics.median(v[1:]) for label, v in times.items()}   # the first round warms up
    phase = {key: statistics.median(v[1:]) for key, v in split.items()}
    facts = device_facts(setup.device)
    return [{"setting": name, "what": title, "variant": label, "seconds": s, "vs_floor": s / med["floor"],
             "vs_dense": s / med["dense floor"],
             "vs_dense_same_precision": s / med["dense floor+bf16" if "+bf16" in label and not dp
                                               else "dense floor"],
             **{f"{p}_s": phase.get((label, p)) for p in ("data", "pass", "update", "data_host", "pass_host")},
             "other_s": s - phase[label, "round"] if (label, "round") in phase else None,
             **agree.get(label.removeprefix("normfl/"), {}),
             "reps": len(times[label]) - 1,                  # the rounds timed after the warm-up
             "threads": torch.get_num_threads(), "device": str(setup.device), **facts}
            for label, s in med.items()]


def device_facts(device: torch.device) -> dict:
    """What the numbers were measured on: the device's name, the numerics flags, and the peak memory."""
    from normfl.engine.flat import device_name, numerics
    from normfl.run.training import peak_rss_mb

    peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else peak_rss_mb()
    return {"device_name": device_name(device), **numerics(), "peak_memory_mb": peak,
            "torch": torch.__version__, "cuda": torch.version.cuda if device.type == "cuda" else None,
            **(cpu_facts() if device.type == "cpu" else {})}


def cpu_facts() -> dict:
    """What decides a CPU's bf16 speed, which the model name does not say: the vector instructions torch
    dispatches to and the CPU's bf16 units (setting A's floor in bf16: 1.64x faster than fp32 on a host
    with AMX, 1.23x slower on one with AVX512-BF16 alone; docs/engine.md)."""
    from normfl.engine.flat import cpuinfo

    flags = (cpuinfo("flags") or "").split()
    return {"cpu_isa": torch.backends.cpu.get_cpu_capability(),
            "cpu_bf16": " ".join(f for f in ("avx512_bf16", "amx_bf16") if f in flags) or "none"}


def together(overrides: list[str], reps: int, runs: int) -> list[dict]:
    """``runs`` runs of setting A (a grid of β and γ) trained side by side as the stacked launcher trains such a
    grid (``run.vectorized.Group``: one EF21 round for all of them, one stacked pass over their clients), against
    the dense floor of their runs x 320 images in one batch; fp32, and bf16 on CUDA. Each round from a
    synchronised device, then (``normfl in a row``) ``reps`` more taken one after another as the launcher takes
    them, timed together, the host drawing the next batches while the device computes."""
    grid = [(b, g) for b in (0.01, 0.1, 1.0, 10.0) for g in (0.01, 0.1, 1.0, 10.0)]
    grid = (grid * (runs // len(grid) + 1))[:runs]
    rows = []
    for precision in ("fp32", "bf16") if torch.cuda.is_available() else ("fp32",):
        with tempfile.TemporaryDirectory() as tmp:
            cache, trainings = {}, []
            try:
                for i, (beta, gamma) in enumerate(grid):
                    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
                        cfg = compose("config", overrides=[
                            *SETTINGS["A"][1], f"algo.beta={beta}", f"algo.gamma={gamma}", "backend=stacked",
                            f"precision={precision}", "progress=false", f"rounds={2 * reps + 3}",
                            f"eval_every={2 * reps + 3}", "checkpoint_every=0", *overrides])
                    trainings.append(start_run(cfg, Path(tmp) / str(i), cache, progress=False))
                group, device = vectorized.Group(trainings), trainings[0].setup.device
                dense = DenseFloor(cfg, trainings[0].setup.ds, device, bf16=precision == "bf16")
                sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
                times = {"normfl": [], "dense floor": []}
                for _ in range(reps + 1):
                    log = [("grad", [], [b for t in trainings for b in t.clients.peek()])]   # this round's batches
                    sync()
                    t0 = time.perf_counter()
                    group.round()
                    sync()
                    times["normfl"].append(time.perf_counter() - t0)
                    dense.prepare(log)
                    sync()
                    t0 = time.perf_counter()
                    dense(log)
                    sync()
                    times["dense floor"].append(time.perf_counter() - t0)
                sync()
                t0 = time.perf_counter()
                for _ in range(reps):
                    group.round()
                sync()
                in_a_row = (time.perf_counter() - t0) / reps
            finally:
                for t in trainings:
                    t.rundir.release()
        med = {label: statistics.median(v[1:]) for label, v in times.items()}
        for label, s in {**med, "normfl in a row": in_a_row}.items():
            rows.append({"setting": f"A x {runs}", "what": f"{runs} runs of setting A side by side ({precision})",
                         "variant": f"{label} ({precision})", "seconds": s, "per_run": s / runs,
                         "vs_dense": s / med["dense floor"], "threads": torch.get_num_threads(),
                         "device": str(device)})
    return rows


def in_a_row(name: str, overrides: list[str], reps: int) -> list[dict]:
    """Setting ``name``'s rounds as a run takes them: its own round (for α-NormEC on a GPU the whole round
    replayed from one CUDA graph), ``reps`` in a row after a warm-up, timed together, so that, as in a run, the
    host draws the next batches while the device computes the last; fp32, and bf16 on CUDA. The rows of
    ``bench`` start each round from a synchronised device instead."""
    rows = []
    for precision in ("fp32", "bf16") if torch.cuda.is_available() else ("fp32",):
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            cfg = compose("config", overrides=[*SETTINGS[name][1], "backend=stacked", f"precision={precision}",
                                               "progress=false", *overrides])
        setup = build(cfg)
        round_, x = round_of(setup.algo, setup.clients), setup.x
        sync = torch.cuda.synchronize if setup.device.type == "cuda" else (lambda: None)
        for k in range(WARMUP_IN_A_ROW):                 # the capture's warm-up and recording among them
            x, _ = round_(k, x, setup.clients)
        sync()
        t = time.perf_counter()
        for k in range(WARMUP_IN_A_ROW, WARMUP_IN_A_ROW + reps):
            x, _ = round_(k, x, setup.clients)
        sync()
        rows.append({"setting": name, "what": f"{SETTINGS[name][0]}, {reps} rounds in a row",
                     "variant": f"normfl/in a row ({precision})", "seconds": (time.perf_counter() - t) / reps,
                     "reps": reps, "device": str(setup.device),
                     "capture": getattr(round_, "captured", setup.clients.engine.captured)()})
    return rows


def sweep_throughput(overrides: list[str], rounds: int) -> list[dict]:
    """Runs per hour of a 2 x 2 NORMEC grid (β, γ), one job at a time with every core, against Hydra's
    joblib launcher with the cores split between jobs (each a ``train.py -m`` sweep in its own dir)."""
    cores = os.cpu_count() or 1
    grid = ["algo=normec", "algo.beta=0.01,0.1", "algo.gamma=0.01,0.1", f"rounds={rounds}", f"eval_every={rounds}",
            "progress=false", "backend=sequential", *(o for o in overrides if not o.startswith("threads="))]
    modes = {f"1 job x {cores} threads": [f"threads={cores}"],
             f"{cores} jobs x 1 thread (joblib)": ["threads=1", "hydra/launcher=joblib",
                                                   f"hydra.launcher.n_jobs={cores}"]}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, extra) in enumerate(modes.items()):
            t = time.perf_counter()
            subprocess.run([sys.executable, str(REPO / "train.py"), "-m", *grid, *extra, f"hydra.sweep.dir={tmp}/{i}"],
                           cwd=REPO, check=True, capture_output=True)
            rows.append({"setting": "sweep", "what": f"2 x 2 NORMEC grid, {rounds} rounds", "variant": label,
                         "seconds": time.perf_counter() - t, "runs_per_hour": 4 * 3600 / (time.perf_counter() - t)})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--reps", type=int, default=30 if torch.cuda.is_available() else 5,
                    help="timed rounds per variant, after one warm-up (default 30 on CUDA, 5 on a CPU)")
    ap.add_argument("--paper-reps", type=int, default=PAPER_REPS,
                    help=f"timed rounds of the paper-style variant, at most --reps (default {PAPER_REPS}): its "
                         "DataLoader over PIL images runs on the host, 7.2 times the floor for setting B on a 2-core "
                         "CPU (9.2 s a round), and B's bench at 10 rounds did not finish in 150 s on an H200 machine")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--sweep-rounds", type=int, default=30, help="rounds per run of the sweep comparison (0: skip)")
    ap.add_argument("--together", type=int, default=16 if torch.cuda.is_available() else 0,
                    help="runs of setting A trained side by side (0: skip; default 16 on CUDA, 0 otherwise)")
    ap.add_argument("--in-a-row", action=argparse.BooleanOptionalAction, default=torch.cuda.is_available(),
                    help="the first setting's rounds as a run takes them, timed in a row (default: on CUDA)")
    ap.add_argument("--out", type=Path, default=REPO / "outputs" / "bench" / "bench.csv")
    args, overrides = ap.parse_known_args()
    if args.paper_reps < 1:
        ap.error(f"--paper-reps={args.paper_reps}: at least 1 (the paper-style variant is timed on that many rounds)")
    if args.threads:
        overrides.append(f"threads={args.threads}")
    rows = []
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save(new_rows):             # after each part: a bench stopped at a time limit keeps what it measured
        rows.extend(new_rows)
        pd.DataFrame(rows).to_csv(args.out, index=False)

    parts = [(name, functools.partial(bench, name, overrides, args.reps, args.paper_reps)) for name in args.settings]
    if args.together:               # right after the first setting: with A, the GPU's targets, before a limit cuts
        parts.insert(1, (f"{args.together} runs side by side", functools.partial(together, overrides, args.reps,
                                                                                  args.together)))
    if args.in_a_row:
        parts.insert(1, (f"{args.settings[0]} in a row", functools.partial(in_a_row, args.settings[0], overrides,
                                                                            args.reps)))
    for name, part in parts:
        save(part())
        print(f"  {name} done", file=sys.stderr)
    if args.sweep_rounds:
        save(sweep_throughput(overrides, args.sweep_rounds))
    df = pd.DataFrame(rows)
    print(df.drop(columns=["what"]).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    for name in args.settings:
        print(f"{name}: {SETTINGS[name][0]}")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
