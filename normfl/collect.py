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

From Python: ``collect(*paths, keys=(...))`` is a DataFrame of each run's config keys and summary scalars.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import numbers
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from normfl.config import KEY_DEFAULTS, NOT_IN_KEY
from normfl.privacy import certified
from normfl.reproduce import records
from normfl.reproduce.figures import _save, curve, markdown_table, plt
from normfl.results import write_atomic

SUMMARY = ("status", "profile", "data", "final_round", "final_test_acc", "best_test_acc", "best_round",
           "last5_mean_test_acc", "final_train_loss", "bits_per_coord", "backend", "threads", "wall_time_s",
           "seconds_per_round")
OUT, PLOT = (".md", ".csv"), (".png", ".pdf")


def runs(*paths: str | Path) -> list[Path]:
    """Every run directory (one holding a summary.json) at or below ``paths``, in natural order (2 before 10)."""
    found = {s.parent for p in map(Path, paths) for s in [*p.glob("summary.json"), *p.rglob("*/summary.json")]}
    return sorted(found, key=lambda d: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(d))])


def _config(run: Path):
    f = records.config_file(run)                     # a run directory's, or a committed record's
    return OmegaConf.load(f) if f.is_file() else OmegaConf.create()


@functools.cache
def _leaves(run: Path) -> dict[str, str]:
    """``{dotted key: value as written}`` of a run's config (``${data_root}`` is the same in every run)."""
    def flat(node, prefix):
        for k, v in node.items():
            yield from flat(v, f"{prefix}{k}.") if isinstance(v, dict) else [(prefix + k, json.dumps(v, default=str))]
    return dict(flat(OmegaConf.to_container(_config(run), resolve=False), ""))


def varying(dirs: list[Path]) -> list[str]:
    """The config keys whose values differ between the runs ``dirs`` (an absent key at its ``KEY_DEFAULTS``)."""
    leaves = [_leaves(d) for d in dirs]
    keys = dict.fromkeys(k for f in leaves for k in f if k.split(".")[0] not in NOT_IN_KEY)
    return [k for k in keys if len({f.get(k, json.dumps(KEY_DEFAULTS.get(k))) for f in leaves}) > 1]


def collect(*paths: str | Path, keys: tuple[str, ...] = ()) -> pd.DataFrame:
    """One row per run at or below ``paths``: its directory (``run``), the config ``keys``, the summary's
    scalars and the certified and target ε (``epsilon``, ``target_epsilon``; None where not private, and
    ``epsilon`` None where the run reports its ε as a claim: ``privacy.not_certified``)."""
    rows = []
    for run in runs(*paths):
        s, cfg = json.loads((run / "summary.json").read_text()), _config(run)
        privacy = s.get("privacy") or {}
        rows.append({"run": str(run),
                     **{k: OmegaConf.select(cfg, k, default=None, throw_on_resolution_failure=False) for k in keys},
                     **{k: s.get(k) for k in SUMMARY if k not in keys},
                     "epsilon": None if privacy.get("not_certified") else certified(privacy)[0],
                     "target_epsilon": privacy.get("target_epsilon")})
    return pd.DataFrame(rows)


def _order(v):
    """Sort key of a cell: numbers by value, then text, then nothing."""
    return (2, 0) if _key(v) == "–" else (0, v) if isinstance(v, numbers.Number) else (1, str(v))


def _key(v) -> str:
    """A config value as a table cell or label: as written (β = 0.001 stays 0.001), whole floats as integers."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return str(int(v)) if isinstance(v, float) and v.is_integer() and abs(v) < 1e15 else str(v)   # 1e+300 stays


def table(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """The comparison of ``collect(..., keys=by)``'s runs, sorted by ``by``; accuracy only for completed runs."""
    done = df.status == "completed"
    num = lambda col: pd.to_numeric(df[col]).astype(float)  # noqa: E731
    out = pd.DataFrame({**{k: df[k] for k in by}, "status": df.status,
                        "final acc %": 100 * num("final_test_acc").where(done),
                        "best acc %": 100 * num("best_test_acc").where(done),
                        "best round": num("best_round").where(done).astype("Int64"),
                        "ε (certified)": num("epsilon"), "ε (target)": num("target_epsilon"),
                        "rounds run": num("final_round").astype("Int64"), "wall time (s)": num("wall_time_s"),
                        "dir": df.run})
    order = sorted(range(len(df)), key=lambda i: [_order(df[k].iloc[i]) for k in by])
    return out.iloc[order].reset_index(drop=True)


def markdown(t: pd.DataFrame, by: list[str]) -> str:
    return markdown_table(t.assign(**{k: t[k].map(_key) for k in by}))


def sweep_table(dirs: list[Path], swept: list[str]) -> str:
    """A sweep's runs (``dirs``) as a markdown table by the keys its command swept (a config group by its
    ``name``)."""
    known = dict.fromkeys(k for d in dirs for k in _leaves(d))
    keys = [k.lstrip("+~") for k in swept]
    by = [k if k in known else f"{k}.name" for k in keys if k in known or f"{k}.name" in known] or varying(dirs)
    return markdown(table(collect(*dirs, keys=tuple(by)), by), by)


def plot(t: pd.DataFrame, by: list[str], path: Path, metric: str = "test_acc", x: str = "round") -> list[Path]:
    """Draw ``metric`` against ``x`` for each run of ``table``'s ``t`` with those columns in its metrics.csv,
    skipping rows where either is empty or not finite (a diverged run ends at its divergence)."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    scale = 100 if metric == "test_acc" else 1
    for r in t.to_dict("records"):
        d = Path(r["dir"])
        if not records.metrics_file(d).is_file() or not {x, metric} <= set(curve(d).columns):
            continue
        pts = curve(d)[[x, metric]].apply(pd.to_numeric, errors="coerce")
        pts = pts[np.isfinite(pts).all(axis=1)]
        label = ", ".join(f"{k}={_key(r[k])}" for k in by) or d.name
        ax.plot(pts[x], scale * pts[metric], lw=1.2, label=label + ("" if r["status"] == "completed" else
                                                                     f" ({r['status']})"))
    ax.set_xlabel(x), ax.set_ylabel("test accuracy (%)" if metric == "test_acc" else metric)
    ax.set_yscale("log" if metric.endswith("loss") else "linear")
    if ax.lines:
        ax.legend(fontsize=7, ncol=1 + len(ax.lines) // 12)
    return _save(fig, path, f"{metric} against {x}", f"{len(ax.lines)} runs", suffixes=(path.suffix,))


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
    known = dict.fromkeys(k for d in dirs for k in _leaves(d))
    by = [k for arg in args.by for k in arg.split(",") if k] or varying(dirs)
    for k in by:
        if k not in known:
            fail(f"invalid --by={k}: no run's config has it; allowed: dotted config keys, such as "
                 + ", ".join(list(dict.fromkeys([*varying(dirs), *known]))[:6]))
    if args.plot:
        cols = list(dict.fromkeys(c for d in dirs if records.metrics_file(d).is_file() for c in curve(d).columns))
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
