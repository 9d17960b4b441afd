"""Compare runs the way a paper does: a row per setting (the seeds folded into mean ± std), a curve per setting
with a band, told apart by the settings that differ.

    python train.py -m algo.beta=0.01,0.1 seed=0,1,2 hydra.sweep.dir=outputs/sweep
    python -m normfl.collect outputs/sweep          # 2 rows (β), each the mean ± std of its 3 seeds, n = 3
    python -m normfl.collect outputs/sweep outputs/runs/2026-11-22/10-01-02_normec --by algo.beta,algo.gamma \\
        --out table.csv --plot curves.png --metric test_error --x round

A run is any folder at or below the paths with a ``summary.json`` (a sweep's ``0/``, ``1/`` or ``0_algo.beta=0.1``,
or a committed record of ``outputs/records``, so one's own runs sit beside the reproduction's).
``--by``: dotted keys of the runs' ``.hydra/config.yaml`` (a record's ``config.yaml``), comma-separated or
repeated; by default the keys whose values differ between the runs that read them (``privacy.epsilon`` does not
differ for a run that adds no noise), less ``normfl.config.NOT_IN_KEY`` (an audit that changes what a run computes
counts: ``normfl.table.audit_in_key``); a key a config lacks is at its ``normfl.config.KEY_DEFAULTS`` value.
Runs that differ only in ``seed`` are one row and one curve: each number's mean ± std and, where fewer runs have
it than the row holds (a diverged run has no accuracy), how many; the curve is the mean with a band of ± one
std. ``--per-seed`` keeps them apart (a row and a curve per run, ``seed`` a column). When folding, every other
key that differs is a column, also beside ``--by``, so no two rows look alike.
Columns: those keys (rows sorted by them), status, final, best and last-5 test accuracy (%), best round, the
certified ε (the tighter of PLD and RDP, else the composed bound) beside the target, rounds run, wall time,
directory; a diverged or failed run has no accuracy. ``--metric test_error`` (or ``test_error_last5``) gives the
table in test error (100 − accuracy) instead. Printed as markdown; ``--out`` also writes it as .md or .csv
(folded: a column per number, its ``std`` and ``n`` beside it).
``--plot`` (.png, .pdf) draws ``--metric`` against ``--x``: a column of the runs' ``metrics.csv``, or
``test_error`` (100 − test accuracy, %), ``test_acc_last5`` / ``test_error_last5`` (at each evaluation the mean
of the last five, the statistic NormFedAvg's tables report); a diverged run up to its divergence. The legend
names only the keys that differ, by their last part (``beta=0.1``), beside the axes.

From Python: ``collect(*paths, keys=(...))`` is a DataFrame of each run's config keys and summary scalars. The rows
and the table are ``normfl.table``'s, the table a sweep prints when it ends; the curves are drawn here.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from normfl.render import curve, plt, save
from normfl.results import metrics_file, write_atomic
from normfl.table import cell, collect, fold, folded_markdown, groups, leaves, markdown, runs, table, varying

OUT, PLOT = (".md", ".csv"), (".png", ".pdf")
LEGEND_MAX = 30                      # curves a legend can tell apart
DERIVED = {   # what a paper plots that metrics.csv holds as test_acc: name -> (label, from the evaluations' accuracy)
    "test_acc": ("test accuracy (%)", lambda acc: 100 * acc),
    "test_error": ("test error (%)", lambda acc: 100 - 100 * acc),
    "test_acc_last5": ("test accuracy, mean of the last 5 evaluations (%)",
                       lambda acc: 100 * acc.rolling(5, min_periods=1).mean()),
    "test_error_last5": ("test error, mean of the last 5 evaluations (%)",
                         lambda acc: 100 - 100 * acc.rolling(5, min_periods=1).mean()),
}


def points(run: Path, metric: str, x: str) -> pd.Series:
    """``metric`` against ``x`` in a run's metrics.csv, the rows where both are finite numbers (a diverged run
    ends at its divergence; a derived metric is computed over the evaluations, the rows with a test accuracy)."""
    pts = curve(run)[[x, "test_acc" if metric in DERIVED else metric]].apply(pd.to_numeric, errors="coerce")
    pts = pts[np.isfinite(pts).all(axis=1)]
    y = pts.iloc[:, 1]
    return pd.Series((DERIVED[metric][1](y) if metric in DERIVED else y).to_numpy(), index=pts[x].to_numpy())


def labels(keys: list[str]) -> dict[str, str]:
    """Each key's short name in a legend: its last dotted part (a group's ``_target_``: the group), the whole key
    where two would read alike."""
    last = [k.split(".")[-2] if k.endswith("._target_") else k.rsplit(".", 1)[-1] for k in keys]
    return {k: s if last.count(s) == 1 else k for k, s in zip(keys, last, strict=True)}


def _short(key: str, value: str) -> str:
    return value.rsplit(".", 1)[-1] if key.endswith("_target_") else value      # normfl.models.cnn: cnn


def plot(t: pd.DataFrame, by: list[str], path: Path, metric: str = "test_acc", x: str = "round",
         per_seed: bool = False) -> list[Path]:
    """Draw ``metric`` against ``x`` for ``table``'s ``t``: a line per run with ``per_seed``, else a line per
    group of runs agreeing on ``by`` (their mean where at least one has the point) with a band of ± one std."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    short = labels([k for k in by if len({cell(v) for v in t[k]}) > 1])
    for key, g in groups(t, list(short)).items():
        runs_ = [(Path(r["dir"]), r["status"]) for r in g.to_dict("records")
                 if metrics_file(Path(r["dir"])).is_file() and {x, "test_acc" if metric in DERIVED else metric}
                 <= set(curve(Path(r["dir"])).columns)]
        name = ", ".join(f"{s}={_short(k, v)}" for (k, s), v in zip(short.items(), key, strict=True) if v != "–")
        if per_seed or len(runs_) == 1:
            for d, status in runs_:
                y = points(d, metric, x)
                ax.plot(y.index, y, lw=1.2, label=(name or d.name) + (f", seed={cell(leaves(d).get('seed'))}"
                        if len(runs_) > 1 else "") + ("" if status == "completed" else f" ({status})"))
        elif runs_:
            ys = pd.concat([points(d, metric, x) for d, _ in runs_], axis=1).sort_index()
            mean, std = ys.mean(axis=1), ys.std(axis=1).fillna(0)
            (line,) = ax.plot(mean.index, mean, lw=1.2, label=f"{name or 'all runs'} (n = {len(runs_)})")
            ax.fill_between(mean.index, mean - std, mean + std, color=line.get_color(), alpha=0.2, lw=0)
    ax.set_xlabel(x), ax.set_ylabel(DERIVED[metric][0] if metric in DERIVED else metric)
    ax.set_yscale("log" if metric.endswith("loss") else "linear")
    note = f"{len(ax.lines)} curve{'s' * (len(ax.lines) != 1)}"
    if len(ax.lines) > LEGEND_MAX:
        note += f"; no legend above {LEGEND_MAX} (fewer paths, or --by, tell them apart)"
    elif ax.lines:                   # beside the axes, the figure grown to hold it (long labels wrapped)
        for line in ax.lines:
            line.set_label(textwrap.fill(line.get_label(), 48))
        legend = ax.legend(fontsize=7, ncol=1 + (len(ax.lines) - 1) // 15, loc="upper left",
                           bbox_to_anchor=(1.02, 1), borderaxespad=0)
        fig.canvas.draw()
        box = legend.get_window_extent()
        fig.set_size_inches(6 + box.width / fig.dpi, max(4.2, 1.6 + box.height / fig.dpi))
    return save(fig, path, f"{metric} against {x}", note, suffixes=(path.suffix,))


def fail(message: str, code: int = 2):
    print(f"normfl: {message}", file=sys.stderr)
    raise SystemExit(code)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m normfl.collect", description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+", help="run or sweep directories")
    ap.add_argument("--by", "--keys", action="extend", nargs="+", default=[],
                    help="dotted config keys, comma-separated (default: the keys that differ between the runs)")
    ap.add_argument("--per-seed", action="store_true", help="a row and a curve per run, instead of per setting")
    ap.add_argument("--out", type=Path, help="also write the table to this .md or .csv file")
    ap.add_argument("--plot", type=Path, help="draw a curve per setting (run) into this .png or .pdf file")
    ap.add_argument("--metric", default="test_acc", help="what --plot draws, and with test_error* the table's "
                    f"measure: a column of metrics.csv or {', '.join(DERIVED)} (default: test_acc)")
    ap.add_argument("--x", help="the metrics.csv column on --plot's x-axis (default: round)")
    args = ap.parse_args(argv)
    for flag, path, allowed in (("--out", args.out, OUT), ("--plot", args.plot, PLOT)):
        if path is not None and (path.suffix.lower() not in allowed or path.is_dir()):
            fail(f"invalid {flag}={path}{' (a directory)' if path.is_dir() else ''}; "
                 f"allowed: a file path ending in {' or '.join(allowed)}")
    if args.x is not None and args.plot is None:
        fail(f"invalid --x={args.x} without --plot; allowed: --plot FILE beside it (the table draws no curve)")
    args.x = args.x or "round"
    for p in args.paths:
        if not Path(p).is_dir():
            fail(f"invalid path {p}: {'not a directory' if Path(p).exists() else 'no such directory'}")
    dirs = runs(*args.paths)
    if not dirs:
        fail(f"no run (a folder holding a summary.json) at or below {', '.join(args.paths)}", 1)
    known = dict.fromkeys(k for d in dirs for k in leaves(d))
    differ = varying(dirs)
    by = [k for arg in args.by for k in arg.split(",") if k] or differ
    for k in by:
        if k not in known:
            fail(f"invalid --by={k}: no run's config has it; allowed: dotted config keys, such as "
                 + ", ".join(list(dict.fromkeys([*differ, *known]))[:6]))
    cols = list(dict.fromkeys(c for d in dirs if metrics_file(d).is_file() for c in curve(d).columns))
    if args.metric not in DERIVED and (args.plot is None or args.metric not in cols):
        fail(f"invalid --metric={args.metric}; allowed: {', '.join(DERIVED)}"
             + (f", or a column of metrics.csv: {', '.join(cols) or '(none has one)'}" if args.plot else
                " (the table's measure; with --plot also a column of metrics.csv)"))
    if args.plot and args.x not in cols:
        fail(f"invalid --x={args.x}; allowed: a column of metrics.csv: {', '.join(cols) or '(none has one)'}")
    if not args.per_seed:          # a setting is every differing key but the seed
        by = [k for k in dict.fromkeys([*by, *differ]) if k != "seed"]
    t = table(collect(*dirs, keys=tuple(by), as_key=not args.per_seed), by, error=args.metric.startswith("test_error"))
    folded = None if args.per_seed else fold(t, by)
    md = (markdown(t, by) if folded is None else folded_markdown(folded, by)) + "\n"
    print(md, end="")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        csv = (t if folded is None else folded).to_csv(index=False)
        write_atomic(args.out, md if args.out.suffix.lower() == ".md" else csv)
    if args.plot:
        plot(t, by, args.plot, args.metric, args.x, per_seed=args.per_seed)


if __name__ == "__main__":
    main()
