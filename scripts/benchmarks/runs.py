"""Rounds as runs take them: a grid of runs of setting A side by side (``together``) and one setting's rounds one
after another (``in_a_row``), not each from a synchronised device as in ``setting.bench``."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from normfl.run import build, vectorized
from normfl.run import start as start_run
from normfl.run.setup import round_of

from .floors import DenseFloor
from .settings import REPO, SETTINGS, WARMUP_IN_A_ROW


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
