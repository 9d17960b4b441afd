"""Tensor operations a round launches, counted with the torch profiler on the CPU: what would be kernel
launches on a GPU, and what a captured graph must hold.

    python scripts/launches.py [--settings A B C D] [--backend stacked] [override ...]

For each bench setting (``scripts/bench.py``) it builds the run as ``train.py`` would, takes one round to
warm up, then profiles one round and counts the aten operations that do work: those with no aten
operation inside them, less views and allocations, which launch nothing. Prints a table (operations a
round and a step, and the busiest operations) and writes outputs/bench/launches.csv.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import pandas as pd
import torch
from hydra import compose, initialize_config_dir
from torch.profiler import ProfilerActivity, profile

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
from bench import SETTINGS  # noqa: E402
from normfl.run import build  # noqa: E402

# aten operations that only describe memory (views, shapes, allocations): no kernel runs for them
NO_KERNEL = {"view", "reshape", "_reshape_alias", "as_strided", "expand", "expand_as", "select", "slice", "t",
             "transpose", "unsqueeze", "squeeze", "permute", "detach", "alias", "empty", "empty_like", "empty_strided",
             "split", "split_with_sizes", "unbind", "chunk", "narrow", "flatten", "unflatten", "view_as", "resolve_conj",
             "resolve_neg", "lift_fresh", "_unsafe_view", "numpy_T", "unfold", "result_type", "size", "stride",
             "is_nonzero", "lift", "_local_scalar_dense"}


def working_ops(prof) -> collections.Counter:
    """aten operations without an aten operation inside them, less NO_KERNEL, by name."""
    count: collections.Counter = collections.Counter()
    for e in prof.events():
        if not e.name.startswith("aten::") or any(c.name.startswith("aten::") for c in e.cpu_children):
            continue
        name = e.name.removeprefix("aten::")
        if name not in NO_KERNEL:
            count[name] += 1
    return count


def launches(name: str, overrides: list[str]) -> dict:
    title, own = SETTINGS[name]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[*own, "progress=false", "device=cpu", *overrides])
    setup = build(cfg)
    x, _ = setup.algo.round(0, setup.x, setup.clients)                   # warm-up: what is made on first use
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        setup.algo.round(1, x, setup.clients)
    ops = working_ops(prof)
    steps = setup.algo.local["steps"] if hasattr(setup.algo, "local") else 1
    return {"setting": name, "what": title, "backend": setup.clients.engine.backend, "ops_per_round": sum(ops.values()),
            "local_steps": steps, "ops_per_step": sum(ops.values()) / steps,
            "busiest": ", ".join(f"{k} {v}" for k, v in ops.most_common(6))}


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
