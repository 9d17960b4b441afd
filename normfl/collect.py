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
``--plot`` (.png; .pdf, .svg: vector) draws ``--metric`` against ``--x``: a column of the runs' ``metrics.csv``, or
``test_error`` (100 − test accuracy, %), ``test_acc_last5`` / ``test_error_last5`` (at each evaluation the mean
of the last five, the statistic NormFedAvg's tables report); a diverged run up to its divergence. No title unless
``--title``. The legend names each algorithm as its reader does (``Algorithm.title``: α-NormEC) and only the keys
that differ between the plotted runs that read them, by their last part (``β=0.1``), inside the axes where it fits;
each algorithm keeps one colour in every figure (``colours``).

From Python: ``collect(*paths, keys=(...))`` is a DataFrame of each run's config keys and summary scalars. The rows
and the table are ``normfl.table``'s, the table a sweep prints when it ends; the curves are drawn here.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import unicodedata
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.ticker import LogFormatterSciNotation

from normfl.config.keys import CONF
from normfl.render import curve, plt, round_axis, save
from normfl.results import metrics_file, write_atomic
from normfl.table import (
    algorithm_title,
    cell,
    collect,
    fold,
    folded_markdown,
    groups,
    leaves,
    markdown,
    reads,
    runs,
    table,
    varying,
)

OUT, PLOT = (".md", ".csv"), (".png", ".pdf", ".svg")
LEGEND_MAX = 30                      # curves a legend can tell apart
ALGORITHM = ("algo._target_", "algo.name", "algo.private")    # what a legend's name of an algorithm (title) says
LINES = ("-", "--", ":", "-.")       # an algorithm's settings, where colour tells the algorithms apart
AXES = {"steps": "communication step", "wall_time": "wall time (s)", "transmissions_total": "client uploads",
        "bytes_total": "bytes uploaded", "train_loss": "training loss", "test_loss": "test loss",
        "full_train_loss": "training loss (whole training set)", "eps_rdp": "ε (RDP)", "eps_pld": "ε (PLD)",
        "eps_composed": "ε (composed)", "noise_std": "noise std"}     # a metrics.csv column's name on an axis
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
    """Each key's short name in a legend: its last dotted part (a group's ``_target_``: the group), the Greek letter
    where it names one (``algo.beta``: β), the whole key where two would read alike."""
    last = [_greek(k.split(".")[-2] if k.endswith("._target_") else k.rsplit(".", 1)[-1]) for k in keys]
    return {k: s if last.count(s) == 1 else k for k, s in zip(keys, last, strict=True)}


def _greek(name: str) -> str:
    try:
        return unicodedata.lookup(f"GREEK SMALL LETTER {name}")
    except KeyError:
        return name


def _short(key: str, value: str) -> str:
    return value.rsplit(".", 1)[-1] if key.endswith("_target_") else value      # normfl.models.cnn: cnn


def names(t: pd.DataFrame, by: list[str]) -> dict[tuple[str, ...], str]:
    """A legend's name for each group of ``t``'s runs agreeing on ``by``: the keys whose values differ between the
    runs that read them (``labels``), the algorithm (``ALGORITHM``) by what its reader calls it (``title``:
    α-NormEC), and that alone where nothing differs; every key that differs where two groups would read alike."""
    dirs = [Path(d) for d in t.dir]
    differ = sorted((k for k in by if len({cell(v) for v, d in zip(t[k], dirs, strict=True) if reads(d, k)}) > 1),
                    key=lambda k: k == "seed")                                  # the seed last
    named = any(k in ALGORITHM for k in differ)
    for every in (False, True):
        short, out = labels([k for k in differ if every or not named or k not in ALGORITHM]), {}
        for key, g in groups(t, by).items():
            value = dict(zip(by, key, strict=True))
            parts = [f"{s}={_short(k, value[k])}" for k, s in short.items() if value[k] != "–"]
            out[key] = ", ".join([algorithm_title(Path(g.dir.iloc[0]))] * (not parts or named and not every) + parts)
        if len(set(out.values())) == len(out):
            break
    return out


def colours(algorithms) -> dict[str, str]:
    """A colour for each of a figure's algorithms (``algo.name``): by its place among conf/algo's options, so the
    same in every figure; the next one free where two would share one (a user's own algorithm: the first free)."""
    shipped = sorted(p.stem for p in (CONF / "algo").glob("*.yaml"))
    out: dict[str, str] = {}
    for name in sorted(set(algorithms), key=lambda n: (n not in shipped, n)):
        i = shipped.index(name) if name in shipped else 0
        while f"C{i % 10}" in out.values() and len(out) < 10:
            i += 1
        out[name] = f"C{i % 10}"
    return out


def plot(t: pd.DataFrame, by: list[str], path: Path, metric: str = "test_acc", x: str = "round",
         per_seed: bool = False, title: str | None = None) -> list[Path]:
    """Draw ``metric`` against ``x`` for ``table``'s ``t``: a line per run with ``per_seed``, else a line per
    group of runs agreeing on ``by`` (their mean where at least one has the point) with a band of ± one std. Where
    the figure holds several algorithms each has its colour (``colours``) and its settings a line style each;
    else each setting its colour. The legend (``names``) sits inside the axes where it covers under a third of
    them, else beside; no title but ``title``."""
    need = {x, "test_acc" if metric in DERIVED else metric}
    t = t[[metrics_file(Path(d)).is_file() and need <= set(curve(Path(d)).columns) for d in t.dir]]
    parts, legend = groups(t, by), names(t, by)
    algo = {key: json.loads(leaves(Path(g.dir.iloc[0])).get("algo.name", "null")) for key, g in parts.items()}
    palette, drawn = colours(algo.values()) if len(set(algo.values())) > 1 else {}, Counter()
    sizes = {len(g) for g in parts.values()}

    def style(a: str) -> dict:               # the next line of algorithm a: its colour, a style of its own
        drawn[a] += 1
        return {"color": palette[a], "ls": LINES[(drawn[a] - 1) % len(LINES)]} if palette else {}
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for key, g in parts.items():
        name = legend[key] + (f" (n = {len(g)})" if len(sizes) > 1 and not per_seed else "")
        if per_seed or len(g) == 1:
            for r in g.to_dict("records"):
                d = Path(r["dir"])
                y = points(d, metric, x)
                ax.plot(y.index, y, lw=1.3, **style(algo[key]), label=name + (f", seed={cell(leaves(d).get('seed'))}"
                        if len(g) > 1 else "") + ("" if r["status"] == "completed" else f" ({r['status']})"))
        else:
            ys = pd.concat([points(Path(d), metric, x) for d in g.dir], axis=1).sort_index()
            mean, std = ys.mean(axis=1), ys.std(axis=1).fillna(0)
            (line,) = ax.plot(mean.index, mean, lw=1.3, **style(algo[key]), label=name)
            ax.fill_between(mean.index, mean - std, mean + std, color=line.get_color(), alpha=0.2, lw=0)
    readings = {json.loads(leaves(Path(d)).get("reading", '"text"')) for d in t.dir}
    ax.set_xlabel(round_axis(readings) if x == "round" else AXES.get(x, x))
    ax.set_ylabel(DERIVED[metric][0] if metric in DERIVED else AXES.get(metric, metric))
    if metric.endswith("loss"):
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(_Plain()), ax.yaxis.set_minor_formatter(_Plain(labelOnlyBase=False))
        _first_off_scale(ax)
    if len(ax.lines) > LEGEND_MAX:
        print(f"normfl: --plot {path}: {len(ax.lines)} curves, drawn without a legend (above {LEGEND_MAX}; fewer "
              "paths, or --by, tell them apart)", file=sys.stderr)
    elif ax.lines:
        _legend(fig, ax, f"mean ± std of {min(sizes)} seeds" if sizes == {min(sizes)} and min(sizes) > 1
                and not per_seed else None)
    return save(fig, path, title, suffixes=(path.suffix,))


SPIKE = 5.0                 # a loss curve's first point this many times above all the rest is left off the scale


def _first_off_scale(ax) -> None:
    """A loss whose first point is far above the rest (a model with BatchNorm evaluated with its initial running
    statistics: ResNet20 at round 0, test loss 55) would set the scale of the whole figure: the axis ends above the
    other points, and a note says where the first ones are."""
    data = [line.get_data() for line in ax.lines]
    start = min((min(x) for x, _ in data if len(x)), default=None)
    first = [y for x, ys in data for xv, y in zip(x, ys, strict=True) if xv == start and np.isfinite(y)]
    rest = [y for x, ys in data for xv, y in zip(x, ys, strict=True) if xv != start and np.isfinite(y) and y > 0]
    if first and rest and min(first) > SPIKE * max(rest):
        ax.set_ylim(top=max(rest) * 1.5)
        ax.text(0.01, 0.99, f"at {start:g}: {min(first):.3g}–{max(first):.3g}, above the axis" if len(set(first)) > 1
                else f"at {start:g}: {first[0]:.3g}, above the axis", transform=ax.transAxes, va="top", fontsize=7,
                color="0.35")


class _Plain(LogFormatterSciNotation):
    """A log axis's ticks as plain numbers (0.4, not 4 × 10⁻¹), where matplotlib would label them."""

    def __call__(self, x, pos=None):
        return f"{x:g}" if super().__call__(x, pos) else ""


def _legend(fig, ax, heading: str | None) -> None:
    """The legend inside the axes, where it covers least; beside them, the figure grown to hold it, where it would
    cover a third of them (long labels wrapped)."""
    for line in ax.lines:
        line.set_label(textwrap.fill(line.get_label(), 48, break_long_words=False))
    kw = {"fontsize": 8, "title": heading, "title_fontsize": 8}
    renderer = fig.canvas.get_renderer()
    box, axes = ax.legend(loc="best", **kw).get_window_extent(renderer), ax.get_window_extent(renderer)
    if box.width * box.height < axes.width * axes.height / 3:
        return
    box = ax.legend(ncol=1 + (len(ax.lines) - 1) // 15, loc="upper left", bbox_to_anchor=(1.02, 1), borderaxespad=0,
                    **kw).get_window_extent(renderer)
    fig.set_size_inches(fig.get_figwidth() + 0.2 + box.width / fig.dpi,
                        max(fig.get_figheight(), 1.2 + box.height / fig.dpi))


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
    ap.add_argument("--plot", type=Path, help="draw a curve per setting (run) into this .png, .pdf or .svg file")
    ap.add_argument("--metric", default="test_acc", help="what --plot draws, and with test_error* the table's "
                    f"measure: a column of metrics.csv or {', '.join(DERIVED)} (default: test_acc)")
    ap.add_argument("--x", help="the metrics.csv column on --plot's x-axis (default: round)")
    ap.add_argument("--title", help="a caption-like line above --plot's figure (default: none, as a paper's figure)")
    args = ap.parse_args(argv)
    for flag, path, allowed in (("--out", args.out, OUT), ("--plot", args.plot, PLOT)):
        if path is not None and (path.suffix.lower() not in allowed or path.is_dir()):
            fail(f"invalid {flag}={path}{' (a directory)' if path.is_dir() else ''}; "
                 f"allowed: a file path ending in {' or '.join(allowed)}")
    for flag, value in (("--x", args.x), ("--title", args.title)):
        if value is not None and args.plot is None:
            fail(f"invalid {flag}={value} without --plot; allowed: --plot FILE beside it (the table draws no curve)")
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
        plot(t, by, args.plot, args.metric, args.x, per_seed=args.per_seed, title=args.title)


if __name__ == "__main__":
    main()
