"""Compare runs: a table with a row per run, and their curves, told apart by the settings that differ.

    python train.py -m algo.beta=0.01,0.1 algo.gamma=0.01,0.1 hydra.sweep.dir=outputs/sweep
    python -m normfl.collect outputs/sweep          # a markdown table of its 4 runs, by algo.beta and algo.gamma
    python -m normfl.collect outputs/sweep outputs/runs/2026-11-22/10-01-02_normec --by algo.beta,algo.gamma \\
        --out table.csv --plot curves.png --metric test_acc --x round

A run is any folder at or below the paths with a ``summary.json`` (a sweep's ``0/``, ``1/`` or ``0_algo.beta=0.1``,
or a committed record of ``outputs/records``, so one's own runs sit beside the reproduction's).
``--by``: dotted keys of the runs' ``.hydra/config.yaml`` (a record's ``config.yaml``), comma-separated or
repeated; by default the keys whose values differ between the runs, less ``normfl.config.NOT_IN_KEY``.
Columns: those keys (rows sorted by them), status, final and best test accuracy (%), best round, the certified
ε (the tighter of PLD and RDP, else the composed bound) beside the target, rounds run, wall time, directory; a
diverged or failed run has no accuracy. Printed as markdown;
``--out`` also writes it as .md or .csv; ``--plot`` (.png, .pdf) draws each run's ``metrics.csv`` column
``--metric`` against ``--x``, a line per run labelled by its keys (a diverged run up to its divergence).

From Python: ``collect(*paths, keys=(...))`` is a DataFrame of each run's config keys and summary scalars. The rows
and the table are ``normfl.table``'s, the table a sweep prints when it ends; the curves are drawn here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from normfl.render import curve, plt, save
from normfl.results import metrics_file, write_atomic
from normfl.table import cell, collect, leaves, markdown, runs, table, varying

OUT, PLOT = (".md", ".csv"), (".png", ".pdf")


def plot(t: pd.DataFrame, by: list[str], path: Path, metric: str = "test_acc", x: str = "round") -> list[Path]:
    """Draw ``metric`` against ``x`` for each run of ``table``'s ``t`` with those columns in its metrics.csv,
    skipping rows where either is empty or not finite (a diverged run ends at its divergence)."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    scale = 100 if metric == "test_acc" else 1
    for r in t.to_dict("records"):
        d = Path(r["dir"])
        if not metrics_file(d).is_file() or not {x, metric} <= set(curve(d).columns):
            continue
        pts = curve(d)[[x, metric]].apply(pd.to_numeric, errors="coerce")
        pts = pts[np.isfinite(pts).all(axis=1)]
        label = ", ".join(f"{k}={cell(r[k])}" for k in by) or d.name
        ax.plot(pts[x], scale * pts[metric], lw=1.2, label=label + ("" if r["status"] == "completed" else
                                                                     f" ({r['status']})"))
    ax.set_xlabel(x), ax.set_ylabel("test accuracy (%)" if metric == "test_acc" else metric)
    ax.set_yscale("log" if metric.endswith("loss") else "linear")
    if ax.lines:
        ax.legend(fontsize=7, ncol=1 + len(ax.lines) // 12)
    return save(fig, path, f"{metric} against {x}", f"{len(ax.lines)} runs", suffixes=(path.suffix,))


def fail(message: str, code: int = 2):
    print(f"normfl: {message}", file=sys.stderr)
    raise SystemExit(code)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m normfl.collect", description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+", help="run or sweep directories")
    ap.add_argument("--by", "--keys", action="extend", nargs="+", default=[],
                    help="dotted config keys, comma-separated (default: the keys that differ between the runs)")
    ap.add_argument("--out", type=Path, help="also write the table to this .md or .csv file")
    ap.add_argument("--plot", type=Path, help="draw a curve per run into this .png or .pdf file")
    ap.add_argument("--metric", help="the metrics.csv column --plot draws (default: test_acc)")
    ap.add_argument("--x", help="the metrics.csv column on --plot's x-axis (default: round)")
    args = ap.parse_args(argv)
    for flag, path, allowed in (("--out", args.out, OUT), ("--plot", args.plot, PLOT)):
        if path is not None and (path.suffix.lower() not in allowed or path.is_dir()):
            fail(f"invalid {flag}={path}{' (a directory)' if path.is_dir() else ''}; "
                 f"allowed: a file path ending in {' or '.join(allowed)}")
    for flag, col in (("--metric", args.metric), ("--x", args.x)):
        if col is not None and args.plot is None:
            fail(f"invalid {flag}={col} without --plot; allowed: --plot FILE beside it (the table draws no curve)")
    args.metric, args.x = args.metric or "test_acc", args.x or "round"
    for p in args.paths:
        if not Path(p).is_dir():
            fail(f"invalid path {p}: {'not a directory' if Path(p).exists() else 'no such directory'}")
    dirs = runs(*args.paths)
    if not dirs:
        fail(f"no run (a folder holding a summary.json) at or below {', '.join(args.paths)}", 1)
    known = dict.fromkeys(k for d in dirs for k in leaves(d))
    by = [k for arg in args.by for k in arg.split(",") if k] or varying(dirs)
    for k in by:
        if k not in known:
            fail(f"invalid --by={k}: no run's config has it; allowed: dotted config keys, such as "
                 + ", ".join(list(dict.fromkeys([*varying(dirs), *known]))[:6]))
    if args.plot:
        cols = list(dict.fromkeys(c for d in dirs if metrics_file(d).is_file() for c in curve(d).columns))
        for flag, col in (("--metric", args.metric), ("--x", args.x)):
            if col not in cols:
                fail(f"invalid {flag}={col}; allowed: a column of metrics.csv: {', '.join(cols) or '(none has one)'}")
    t = table(collect(*dirs, keys=tuple(by)), by)
    md = markdown(t, by) + "\n"
    print(md, end="")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(args.out, md if args.out.suffix.lower() == ".md" else t.to_csv(index=False))
    if args.plot:
        plot(t, by, args.plot, args.metric, args.x)


if __name__ == "__main__":
    main()
