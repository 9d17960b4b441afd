"""Runs side by side: a row per run, told apart by the settings that differ. What a sweep prints when it ends
(``sweep_table``: ``normfl.run.sweep``) and what ``python -m normfl.collect`` prints, from the same rows.

A run is any folder at or below the paths with a ``summary.json`` (a sweep's ``0/``, ``1/`` or ``0_algo.beta=0.1``,
or a committed record of ``outputs/records``). Columns: the keys (rows sorted by them), status, final, best and
last-5 test accuracy (%) or error (``error=True``: 100 − accuracy, the NormFedAvg paper's measure), best round, the
certified ε (the tighter of PLD and RDP, else the composed bound) beside the target, rounds run, wall time,
directory; a diverged or failed run has no accuracy. A key a run does not read (``privacy.*`` in a run that adds
no noise) is empty in its row and does not count as differing. ``fold`` makes the runs that differ only in their
seed one row: each number's mean ± std over them and how many there are.
"""

from __future__ import annotations

import functools
import importlib
import json
import math
import numbers
import re
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from normfl.algorithms.base import Algorithm
from normfl.config import KEY_DEFAULTS, NOT_IN_KEY, READ_BESIDE, config_key
from normfl.config.keys import parameters
from normfl.config.run_key import unread
from normfl.privacy import certified
from normfl.render import fmt, markdown_table
from normfl.results import config_file

SUMMARY = ("status", "profile", "data", "final_round", "final_test_acc", "best_test_acc", "best_round",
           "last5_mean_test_acc", "final_train_loss", "bits_per_coord", "backend", "threads", "wall_time_s",
           "seconds_per_round")


def runs(*paths: str | Path) -> list[Path]:
    """Every run directory (one holding a summary.json) at or below ``paths``, in natural order (2 before 10)."""
    found = {s.parent for p in map(Path, paths) for s in [*p.glob("summary.json"), *p.rglob("*/summary.json")]}
    return sorted(found, key=lambda d: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(d))])


@functools.cache
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


@functools.cache
def _summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


@functools.cache
def _unread(run: Path) -> tuple[str, ...]:
    """What the run does not read: a run that adds no noise (no ``privacy`` in its summary) no privacy or
    accountant key, and the keys its config leaves unread (``run_key.unread``: the τ rule's, raw pixels' mean)."""
    noiseless = ("privacy", "accountant") if not _summary(run).get("privacy") else ()
    return (*noiseless, *unread(OmegaConf.to_container(_config(run), resolve=False)))


@functools.cache
def _class(target: str):
    """What ``target`` names; None where it does not import here (a user's own algorithm, off ``PYTHONPATH``)."""
    module, _, name = target.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except Exception:
        return None


def reads(run: Path, key: str) -> bool:
    """Whether the run reads config ``key``: not where ``_unread`` says so, nor a key its config lacks that its
    group's target does not take (``algo.alpha`` of a Clip21 run: α-NormEC's alone)."""
    if any(key == u or key.startswith(f"{u}.") for u in _unread(run)):
        return False
    group, _, rest = key.partition(".")
    target = leaves(run).get(f"{group}._target_")
    if key in leaves(run) or target is None or "." in rest:
        return True
    built = _class(json.loads(target))
    return built is None or rest in {p.name for p in parameters(built)} | set(READ_BESIDE.get(group, ()))


@functools.cache
def algorithm_title(run: Path) -> str:
    """What a reader calls the run's algorithm (its class's ``title``: DP-α-NormEC); its ``algo.name`` where the
    class does not import here (a user's own, off ``PYTHONPATH``)."""
    node = _config(run).get("algo") or {}
    cls = _class(str(node.get("_target_")))
    return cls.title(node) if isinstance(cls, type) and issubclass(cls, Algorithm) else str(node.get("name", "?"))


@functools.cache
def audit_in_key(run: Path) -> bool:
    """Whether the run's audit changes what it computes (canaries in its own draws or among its clients): its run key
    holds the audit then (``config_key``'s rule), as it holds no audit made beside the run."""
    cfg = _config(run)
    if not OmegaConf.select(cfg, "audit.canaries", default=None, throw_on_resolution_failure=False):
        return False
    without = OmegaConf.merge(cfg, {"audit": {"canaries": 0}})
    try:
        return config_key(cfg) != config_key(without)
    except Exception:                                # a config that does not resolve here: no key to tell by
        return False


def varying(dirs: list[Path]) -> list[str]:
    """The config keys whose values differ between the runs ``dirs`` that read them (an absent key at its
    ``KEY_DEFAULTS``), as a run's key sees them: NOT_IN_KEY left out, but an audit that changes what a run computes
    (``audit_in_key``) differs from none."""
    all_leaves = [(d, leaves(d)) for d in dirs]
    keys = dict.fromkeys(k for _, f in all_leaves for k in f
                         if k.split(".")[0] not in NOT_IN_KEY or k.startswith("audit."))

    def value(d: Path, f: dict, k: str) -> str | None:
        if k.startswith("audit.") and not audit_in_key(d):
            return None                              # no audit, or one beside the run: the same computation
        return f.get(k, json.dumps(KEY_DEFAULTS.get(k)))
    return [k for k in keys if len({value(d, f, k) for d, f in all_leaves if reads(d, k)}) > 1]


def collect(*paths: str | Path, keys: tuple[str, ...] = (), as_key: bool = False) -> pd.DataFrame:
    """One row per run at or below ``paths``: its directory (``run``), the config ``keys``, the summary's
    scalars and the certified and target ε (``epsilon``, ``target_epsilon``; None where not private, and
    ``epsilon`` None where the run reports its ε as a claim: ``privacy.not_certified``); a key the run does not
    read is None. ``as_key``: the keys as the run's key sees them, for folding: an audit key of a run whose audit
    does not change what it computes (``audit_in_key``) is None too, so such a run folds with the run unaudited."""
    rows = []
    for run in runs(*paths):
        s, cfg = _summary(run), _config(run)
        privacy = s.get("privacy") or {}
        rows.append({"run": str(run),
                     **{k: OmegaConf.select(cfg, k, default=KEY_DEFAULTS.get(k), throw_on_resolution_failure=False)
                        if reads(run, k) and not (as_key and k.startswith("audit.") and not audit_in_key(run))
                        else None
                        for k in keys},
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


def table(df: pd.DataFrame, by: list[str], error: bool = False) -> pd.DataFrame:
    """The comparison of ``collect(..., keys=by)``'s runs, sorted by ``by``; accuracy (or, with ``error``, test
    error: 100 − accuracy) only for completed runs."""
    done = df.status == "completed"
    num = lambda col: pd.to_numeric(df[col]).astype(float)  # noqa: E731
    pct = lambda col: (100 - 100 * num(col) if error else 100 * num(col)).where(done)  # noqa: E731
    what = "error" if error else "acc"
    out = pd.DataFrame({**{k: df[k] for k in by}, "status": df.status,
                        f"final {what} %": pct("final_test_acc"),
                        f"best {what} %": pct("best_test_acc"),
                        f"last-5 {what} %": pct("last5_mean_test_acc"),
                        "best round": num("best_round").where(done).astype("Int64"),
                        "ε (certified)": num("epsilon"), "ε (target)": num("target_epsilon"),
                        "rounds run": num("final_round").astype("Int64"), "wall time (s)": num("wall_time_s"),
                        "dir": df.run})
    order = sorted(range(len(df)), key=lambda i: [_order(df[k].iloc[i]) for k in by])
    return out.iloc[order].reset_index(drop=True)


def markdown(t: pd.DataFrame, by: list[str]) -> str:
    return markdown_table(t.assign(**{k: t[k].map(cell) for k in by}))


def groups(t: pd.DataFrame, by: list[str]) -> dict[tuple[str, ...], pd.DataFrame]:
    """The rows of ``t`` by their values of ``by`` (as cells, so lists and None group too), in ``t``'s order."""
    key = [tuple(cell(r[k]) for k in by) for r in t.to_dict("records")]
    return {k: t[[x == k for x in key]] for k in dict.fromkeys(key)}


def fold(t: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """``table``'s rows that agree on ``by`` (every differing key but the seed) as one: ``n`` runs, their
    statuses, and for each number its mean, ``<column> std`` (sample std, none for one run) and ``<column> n``
    (how many runs have it: a diverged run has no accuracy)."""
    numeric = [c for c in t.columns if c not in (*by, "status", "dir") and pd.api.types.is_numeric_dtype(t[c])]
    rows = []
    for g in groups(t, by).values():
        row = {**{k: g[k].iloc[0] for k in by}, "n": len(g),
               "status": ", ".join(f"{n} {s}" if len(g) > 1 else s for s, n in g.status.value_counts().items())}
        for c in numeric:
            v = g[c].dropna().astype(float)
            row |= {c: v.mean() if len(v) else math.nan, f"{c} std": v.std() if len(v) > 1 else math.nan,
                    f"{c} n": len(v)}
        rows.append(row | {"dir": " ".join(g.dir)})
    f = pd.DataFrame(rows)
    for c in numeric:              # a count (best round, rounds run) stays whole where its mean is
        if pd.api.types.is_integer_dtype(t[c]) and (f[c].dropna() % 1 == 0).all():
            f[c] = f[c].astype("Int64")
    return f


def folded_markdown(f: pd.DataFrame, by: list[str]) -> str:
    """``fold``'s table as a paper prints it: ``mean ± std`` in each cell (the mean alone where the runs agree),
    ``(n = k)`` where fewer than the row's runs have the number."""
    numbers = [c for c in f.columns if f"{c} std" in f.columns]

    def shown(r, c):
        text = fmt(r[c]) + ("" if pd.isna(r[f"{c} std"]) or r[f"{c} std"] == 0 else f" ± {fmt(r[f'{c} std'])}")
        return text + (f" (n = {r[f'{c} n']})" if 0 < r[f"{c} n"] < r["n"] else "")
    out = pd.DataFrame({**{k: f[k].map(cell) for k in by}, "n": f["n"], "status": f.status,
                        **{c: [shown(r, c) for r in f.to_dict("records")] for c in numbers}, "dirs": f.dir})
    return markdown_table(out)


def sweep_table(dirs: list[Path], swept: list[str]) -> str:
    """A sweep's runs (``dirs``) as a markdown table by the keys its command swept (a config group by its
    ``name``)."""
    known = dict.fromkeys(k for d in dirs for k in leaves(d))
    keys = [k.lstrip("+~") for k in swept]
    by = [k if k in known else f"{k}.name" for k in keys if k in known or f"{k}.name" in known] or varying(dirs)
    return markdown(table(collect(*dirs, keys=tuple(by)), by), by)
