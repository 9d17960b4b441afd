"""Tensor operations a round launches, counted with the torch profiler on the CPU: what would be kernel
launches on a GPU, and what a captured graph must hold.

    python scripts/launches.py [--settings A B C D] [--backend stacked] [--together R] [override ...]

For each bench setting (``scripts/bench.py``) it builds the run as ``train.py`` would, takes one round to
warm up, then profiles one round and counts the outermost aten operations that do work (those called from
Python or the autograd engine, less views and allocations, which launch nothing): on a GPU, about one
kernel launch each. Prints a table (operations a
round and a step, and the busiest operations) and writes outputs/bench/launches.csv.

``--together R`` adds R runs of setting A (a grid of β) side by side as one vectorized round
(``normfl.run.vectorized.Group``): its operations a round and per run-round.

With ``device=cuda`` it profiles the GPU's side too: the kernels the round ran, their device time, and the
kernels that took most of it (the round profiled is eager: a captured pass records after three).
"""

from __future__ import annotations

import argparse
import collections
import functools
import sys
import tempfile
from pathlib import Path

import pandas as pd
import torch
from hydra import compose, initialize_config_dir
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
from benchmarks.settings import SETTINGS  # noqa: E402

from normfl.run import build, vectorized  # noqa: E402
from normfl.run import start as start_run  # noqa: E402

# aten operations that only describe memory (views, shapes, allocations): no kernel runs for them
NO_KERNEL = {"view", "reshape", "_reshape_alias", "as_strided", "expand", "expand_as", "select", "slice", "t",
             "transpose", "unsqueeze", "squeeze", "permute", "detach", "alias", "empty", "empty_like",
             "empty_strided", "split", "split_with_sizes", "unbind", "chunk", "narrow", "flatten", "unflatten",
             "view_as", "resolve_conj", "resolve_neg", "lift_fresh", "_unsafe_view", "numpy_T", "unfold",
             "result_type", "size", "stride", "is_nonzero", "lift", "_local_scalar_dense"}


def _outermost(e) -> bool:
    """Whether an event is an aten operation that no other aten operation called (the operations dispatched
    from Python or from the autograd engine; what an op does inside, such as a CPU scalar's conversion or a
    reduction's zero fill, is not a launch of its own on a GPU)."""
    p = e.cpu_parent
    while p is not None:
        if p.name.startswith("aten::"):
            return False
        p = p.cpu_parent
    return e.name.startswith("aten::")


def working_ops(prof) -> collections.Counter:
    """The outermost aten operations that do work, by name: less views and allocations (NO_KERNEL), and
    less a ``to`` that changed nothing (the tensor was already on its device, in its dtype)."""
    count: collections.Counter = collections.Counter()
    for e in prof.events():
        name = e.name.removeprefix("aten::")
        if _outermost(e) and name not in NO_KERNEL and not (name == "to" and not e.cpu_children):
            count[name] += 1
    return count


def compose_setting(name: str, overrides: list[str]):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("config", overrides=[*SETTINGS[name][1], "progress=false", "device=cpu", *overrides])


def profiled(round_, cuda: bool):
    """The profile of one call of ``round_`` after one unprofiled call (what is made on first use)."""
    round_(0)
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
        round_(1)
        if cuda:
            torch.cuda.synchronize()
    return prof


def launches(name: str, overrides: list[str]) -> dict:
    setup = build(compose_setting(name, overrides))
    cuda = setup.device.type == "cuda"
    state = {"x": setup.x}

    def round_(k):
        state["x"], _ = setup.algo.round(k, state["x"], setup.clients)

    prof = profiled(round_, cuda)
    steps = setup.algo.local["steps"] if hasattr(setup.algo, "local") else 1
    return row_of(prof, name, SETTINGS[name][0], setup.clients.engine.backend, steps, cuda)


def together(runs: int, overrides: list[str]) -> dict:
    """One vectorized round of ``runs`` runs of setting A (β on a grid), as the stacked launcher trains them."""
    with tempfile.TemporaryDirectory() as tmp:
        trainings, cache = [], {}
        try:
            for i in range(runs):
                cfg = compose_setting("A", [f"algo.beta={0.01 * 2 ** i:g}", "checkpoint_every=0", "rounds=10",
                                             "eval_every=10", *overrides])
                trainings.append(start_run(cfg, Path(tmp) / str(i), cache, progress=False))
            group, cuda = vectorized.Group(trainings), trainings[0].setup.device.type == "cuda"
            prof = profiled(lambda k: group.round(), cuda)
        finally:
            for t in trainings:
                t.rundir.release()
    row = row_of(prof, f"A x {runs}", f"{runs} runs of setting A side by side", "stacked", 1, cuda)
    return row | {"ops_per_run_round": row["ops_per_round"] / runs}


def row_of(prof, setting: str, title: str, backend: str, steps: int, cuda: bool) -> dict:
    ops = working_ops(prof)
    row = {"setting": setting, "what": title, "backend": backend, "ops_per_round": sum(ops.values()),
           "local_steps": steps, "ops_per_step": sum(ops.values()) / steps,
           "busiest": ", ".join(f"{k} {v}" for k, v in ops.most_common(6))}
    if cuda:
        kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
        spent: collections.Counter = collections.Counter()
        for e in kernels:
            spent[e.name[:48]] += e.self_device_time_total / 1e3
        row |= {"kernels": len(kernels), "kernel_ms": sum(spent.values()),
                "slowest": ", ".join(f"{k} {v:.2f} ms" for k, v in spent.most_common(4))}
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--backend", default="stacked")
    ap.add_argument("--together", type=int, default=0, metavar="R", help="also R runs of A as one vectorized round")
    ap.add_argument("--out", type=Path, default=REPO / "outputs" / "bench" / "launches.csv")
    args, overrides = ap.parse_known_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    parts = [functools.partial(launches, s, [f"backend={args.backend}", *overrides]) for s in args.settings]
    if args.together:
        parts.append(functools.partial(together, args.together, ["backend=stacked", *overrides]))
    rows = []
    for part in parts:                      # the CSV after each row: a run stopped at a time limit keeps them
        rows.append(part())
        table = pd.DataFrame(rows)
        table.to_csv(args.out, index=False)
    with pd.option_context("display.max_colwidth", 90, "display.width", 200):
        print(table.drop(columns=["what"]).to_string(index=False))


if __name__ == "__main__":
    main()
