"""Tensor operations a round launches, counted with the torch profiler on the CPU: what would be kernel
launches on a GPU, and what a captured graph must hold.

    python scripts/launches.py [--settings A B C D] [--backend stacked] [override ...]

For each bench setting (``scripts/bench.py``) it builds the run as ``train.py`` would, takes one round to
warm up, then profiles one round and counts the outermost aten operations that do work (those called from
Python or the autograd engine, less views and allocations, which launch nothing): on a GPU, about one
kernel launch each. Prints a table (operations a
round and a step, and the busiest operations) and writes outputs/bench/launches.csv.

With ``device=cuda`` it profiles the GPU's side too: the kernels the round ran, their device time, and the
kernels that took most of it (the round profiled is eager: a captured pass records after three).
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import pandas as pd
import torch
from hydra import compose, initialize_config_dir
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
from bench import SETTINGS  # noqa: E402

from normfl.run import build  # noqa: E402

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


def launches(name: str, overrides: list[str]) -> dict:
    title, own = SETTINGS[name]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[*own, "progress=false", "device=cpu", *overrides])
    setup = build(cfg)
    cuda = setup.device.type == "cuda"
    x, _ = setup.algo.round(0, setup.x, setup.clients)                   # warm-up: what is made on first use
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
        setup.algo.round(1, x, setup.clients)
        if cuda:
            torch.cuda.synchronize()
    ops = working_ops(prof)
    steps = setup.algo.local["steps"] if hasattr(setup.algo, "local") else 1
    row = {"setting": name, "what": title, "backend": setup.clients.engine.backend, "ops_per_round": sum(ops.values()),
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
    ap.add_argument("--out", type=Path, default=REPO / "outputs" / "bench" / "launches.csv")
    args, overrides = ap.parse_known_args()
    rows = [launches(s, [f"backend={args.backend}", *overrides]) for s in args.settings]
    table = pd.DataFrame(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False)
    with pd.option_context("display.max_colwidth", 90, "display.width", 200):
        print(table.drop(columns=["what"]).to_string(index=False))


if __name__ == "__main__":
    main()
