"""One paper setting's bench: each variant of its round, the floors, the paper-style code and the evaluation,
timed taking turns (``bench``)."""

from __future__ import annotations

import statistics
import time

import torch
from hydra import compose, initialize_config_dir

from normfl.run import build

from .facts import device_facts
from .floors import DenseFloor, Floor
from .paper_style import PaperStyle
from .rounds import LoggedClients, Phases, agreement
from .settings import PAPER_REPS, REPO, SETTINGS


def bench(name: str, overrides: list[str], reps: int, paper_reps: int = PAPER_REPS) -> list[dict]:
    """Setting ``name``'s rows: every variant's median seconds over ``reps`` rounds after a warm-up round (the
    paper-style variant's over its first ``paper_reps``), with its ratios to the floors, its round's phases, its
    agreement with the first backend and what it was measured on (``facts.device_facts``)."""
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
