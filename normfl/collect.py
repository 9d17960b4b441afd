"""Gather finished runs into one table: a row per run directory, its config and its summary.

    python -m normfl.collect outputs/multirun/2026-11-22/03-12-14 --keys algo.name algo.tau rounds

Any folder below the given paths that holds a ``summary.json`` is a run. Columns: the run's path,
the requested config keys (dotted, from ``.hydra/config.yaml``), and the summary's scalars
(``status``, ``final_test_acc``, ``last5_mean_test_acc``, ``wall_time_s``, ...).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

SUMMARY = ("status", "profile", "data", "final_round", "final_test_acc", "best_test_acc", "last5_mean_test_acc",
           "final_train_loss", "bits_per_coord", "backend", "threads", "wall_time_s", "seconds_per_round")


def runs(*paths: str | Path) -> list[Path]:
    """Every run directory (one holding a summary.json) at or below ``paths``, sorted."""
    found = set()
    for p in map(Path, paths):
        found.update(s.parent for s in ([p / "summary.json"] if (p / "summary.json").is_file() else [])
                     + list(p.rglob("*/summary.json")))
    return sorted(found)


def collect(*paths: str | Path, keys: tuple[str, ...] = ()) -> pd.DataFrame:
    rows = []
    for run in runs(*paths):
        summary = json.loads((run / "summary.json").read_text())
        row = {"run": str(run)}
        cfg_file = run / ".hydra" / "config.yaml"
        cfg = OmegaConf.load(cfg_file) if cfg_file.is_file() else OmegaConf.create()
        for key in keys:
            row[key] = OmegaConf.select(cfg, key, default=None)
        row.update({k: summary.get(k) for k in SUMMARY})
        rows.append(row)
    return pd.DataFrame(rows)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--keys", nargs="*", default=[], help="dotted config keys to add as columns")
    args = ap.parse_args(argv)
    print(collect(*args.paths, keys=tuple(args.keys)).to_string(index=False))


if __name__ == "__main__":
    main()
