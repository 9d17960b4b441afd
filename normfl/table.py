"""Runs side by side: a row per run, told apart by the settings that differ. What a sweep prints when it ends
(``sweep_table``: ``normfl.run.sweep``) and what ``python -m normfl.collect`` prints, from the same rows.

A run is any folder at or below the paths with a ``summary.json`` (a sweep's ``0/``, ``1/`` or ``0_algo.beta=0.1``,
or a committed record of ``outputs/records``). Columns: the keys (rows sorted by them), status, final and best test
accuracy (%), best round, the certified ε (the tighter of PLD and RDP, else the composed bound) beside the target,
rounds run, wall time, directory; a diverged or failed run has no accuracy.
"""

from __future__ import annotations

import functools
import json
import math
import numbers
import re
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from normfl.config import KEY_DEFAULTS, NOT_IN_KEY
from normfl.privacy import certified
from normfl.render import markdown_table
from normfl.results import config_file

SUMMARY = ("status", "profile", "data", "final_round", "final_test_acc", "best_test_acc", "best_round",
           "last5_mean_test_acc", "final_train_loss", "bits_per_coord", "backend", "threads", "wall_time_s",
           "seconds_per_round")


def runs(*paths: str | Path) -> list[Path]:
    """Every run directory (one holding a summary.json) at or below ``paths``, in natural order (2 before 10)."""
    found = {s.parent for p in map(Path, paths) for s in [*p.glob("summary.json"), *p.rglob("*/summary.json")]}
    return sorted(found, key=lambda d: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(d))])


def _config(run: Path):
    f = config_file(run)                             # a run directory's, or a committed record's
    return OmegaConf.load(f) if f.is_file() else OmegaConf.create()


@functools.cache
def leaves(run: Path) -> dict[str, str]:
    """``{dotted key: value as written}`` of a run's config (``${data_root}`` is the same in every run)."""
    def flat(node, prefix):
        for k, v in node.items():
            yield from flat(v, f"{prefix}{k}.") if isinstance(v, dict) else [(prefix + k, json.dumps(v, default=str))]
    return dict(flat(OmegaConf.to_container(_config(run), resolve=False), ""))


def varying(dirs: list[Path]) -> list[str]:
    """The config keys whose values differ between the runs ``dirs`` (an absent key at its ``KEY_DEFAULTS``)."""
    all_leaves = [leaves(d) for d in dirs]
    keys = dict.fromkeys(k for f in all_leaves for k in f if k.split(".")[0] not in NOT_IN_KEY)
    return [k for k in keys if len({f.get(k, json.dumps(KEY_DEFAULTS.get(k))) for f in all_leaves}) > 1]


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
    return (2, 0) if cell(v) == "–" else (0, v) if isinstance(v, numbers.Number) else (1, str(v))


def cell(v) -> str:
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
    return markdown_table(t.assign(**{k: t[k].map(cell) for k in by}))


def sweep_table(dirs: list[Path], swept: list[str]) -> str:
    """A sweep's runs (``dirs``) as a markdown table by the keys its command swept (a config group by its
    ``name``)."""
    known = dict.fromkeys(k for d in dirs for k in leaves(d))
    keys = [k.lstrip("+~") for k in swept]
    by = [k if k in known else f"{k}.name" for k in keys if k in known or f"{k}.name" in known] or varying(dirs)
    return markdown(table(collect(*dirs, keys=tuple(by)), by), by)
