"""Does a record still come out of the code? ``python -m normfl.reproduce verify NAMES...`` trains each committed
record's config again, in a scratch folder that is removed afterwards, and compares the two runs: their status and
each evaluation's test accuracy, and every other number of the per-round table and the summary (wall times and
where it ran aside). A run made again on the same machine and code is identical; float rounding (another CPU, a
GPU, a change to how the engine sums) shows as small differences, and the line says how small.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from normfl.config.keys import root
from normfl.errors import ConfigError
from normfl.reproduce import jobs, records


def record_dirs(names: list[str], profile: str) -> list[Path]:
    """The records named by their keys (folders of ``records.RECORDS``, or paths), or by IDs: every committed
    record of the ID's grid under ``profile``."""
    from normfl.reproduce import targets

    out = []
    for name in names:
        if (found := [d for d in (records.RECORDS / name, Path(name)) if (d / "summary.json").is_file()]):
            out.append(found[0])
            continue
        try:
            target = targets.get(name)
        except ConfigError:
            raise ConfigError("verify", name, f"a record's key (a folder of {records.RECORDS}) or an ID (python -m "
                              "normfl.reproduce list)") from None
        grid = [records.RECORDS / j.key for j in jobs.jobs(target.grid, profile)]
        if not (stored := [d for d in grid if (d / "summary.json").is_file()]):
            raise ConfigError("verify", name, f"an ID with committed records under --profile {profile} (none of "
                              f"its {len(grid)} runs has one)")
        out += stored
    return list(dict.fromkeys(out))


# What a record made before a key existed ran, where the key's default now does otherwise: activations laid out as
# the model made them (memory_format=auto is channels-last for a CPU's convolutions, which rounds differently)
BEFORE = {"memory_format": "contiguous"}


def today(recorded: DictConfig) -> DictConfig:
    """A record's config with the top-level keys added to conf/config.yaml since it was made: what does not change
    a run's key (``memory_format``, ``capture``) or leaves it as it was (KEY_DEFAULTS), at what the record ran
    (``BEFORE``), else at their defaults."""
    cfg = recorded.copy()
    for key, value in root().items():
        if key not in ("defaults", "hydra") and key not in cfg and not isinstance(value, DictConfig):
            cfg[key] = BEFORE.get(key, value)
    return cfg


def table(files: dict[str, bytes]) -> pd.DataFrame:
    """The per-round table as ``records`` compares it (wall time left out), as numbers."""
    head, *rows = records.table_rows(records.METRICS, files[records.METRICS])
    return pd.DataFrame(rows, columns=head).apply(pd.to_numeric, errors="coerce")


def compare(recorded: dict[str, bytes], fresh: dict[str, bytes]) -> dict:
    """How the fresh run differs from the record: the statuses and final accuracies of both, the table's columns
    that differ, the largest difference in test accuracy (points) with the evaluations it touches, the largest
    relative difference of any other number, and the summary's differing fields (floats apart)."""
    a, b = table(recorded), table(fresh)
    sa, sb = (json.loads(f["summary.json"]) for f in (recorded, fresh))
    # the record's fields (one added to summaries since it was made is not compared), floats apart
    differ = [k for k in sorted(sa) if k not in records.PLACE_AND_TIME and not records.same(sa[k], sb.get(k))]
    numbers = [k for k in differ if isinstance(sa[k], float) and isinstance(sb.get(k), float)]
    out = {"status": (sa.get("status"), sb.get("status")), "final": (sa.get("final_test_acc"),
           sb.get("final_test_acc")), "fields": [k for k in differ if k not in numbers], "numbers": numbers,
           "columns": [], "relative": max((abs(sa[k] - sb[k]) / max(abs(sb[k]), 1e-12) for k in numbers),
                                          default=0.0),
           "where": [f"{s.get('device_name', '?')}, torch {s.get('versions', {}).get('torch', '?')}, "
                     f"{s.get('threads', '?')} thread{'' if s.get('threads') == 1 else 's'}" for s in (sa, sb)]}
    if list(a.columns) != list(b.columns) or len(a) != len(b):
        out["shape"] = (a.shape, b.shape)
        return out
    for col in a.columns:
        x, y = a[col], b[col]
        gap = (x - y).abs()
        if (x.isna() != y.isna()).any() or gap.max(skipna=True) > 0:
            out["columns"].append(col)
        if col == "test_acc":                # in points, with the evaluations it touches
            out["acc_points"] = 100 * float(gap.max(skipna=True) or 0.0)
            out["acc_evals"] = (int((gap > 0).sum()), int(x.notna().sum()))
        elif (d := (gap / y.abs().clip(lower=1e-12)).max(skipna=True)) > 0:
            out["relative"] = max(out["relative"], float(d) if math.isfinite(d) else math.inf)
    return out


def identical(diff: dict) -> bool:
    return diff["status"][0] == diff["status"][1] and "shape" not in diff and not (
        diff["columns"] or diff["numbers"] or diff["fields"])


def line(key: str, commit: str, diff: dict) -> str:
    """One line for a verified record."""
    where = f"{key} (recorded at {commit[:7] or 'an unknown commit'})"
    if diff["status"][0] != diff["status"][1]:
        return f"{where}: DIFFERS: recorded {diff['status'][0]}, now {diff['status'][1]}"
    if "shape" in diff:
        return f"{where}: DIFFERS: the per-round tables' shapes {diff['shape'][0]} and {diff['shape'][1]}"
    if identical(diff):
        return f"{where}: identical (every number but wall time)"
    was, now = (f"{100 * v:.2f}%" if v is not None else "none" for v in diff["final"])
    parts = [f"final test accuracy {was} recorded, {now} now"]
    if diff.get("acc_evals", (0,))[0]:
        changed, evals = diff["acc_evals"]
        parts.append(f"test accuracy by at most {diff['acc_points']:.2f} pt at {changed} of {evals} evaluations")
    if diff["relative"]:
        names = [c for c in diff["columns"] if c != "test_acc"] or [f"summary's {k}" for k in diff["numbers"]]
        parts.append(f"other numbers by at most {diff['relative']:.1e} relative ({', '.join(names[:4])}"
                     f"{', ...' if len(names) > 4 else ''})")
    elif missing := [c for c in diff["columns"] if c != "test_acc"]:      # no number apart, but a blank apart
        parts.append(f"a number in one run's table only ({', '.join(missing[:4])})")
    if diff["fields"]:
        parts.append(f"summary fields {', '.join(diff['fields'][:6])}")
    if diff["where"][0] != diff["where"][1]:         # float rounding is expected to differ there (threads too)
        parts.append(f"recorded on {diff['where'][0]}, now on {diff['where'][1]}")
    return f"{where}: differs: " + "; ".join(parts)


def verify(run_dirs: list[Path], threads: int | None = None, log=print) -> int:
    """Train each record's config again and print a line comparing the two; returns how many are not identical."""
    from normfl.run.training import run

    differing = 0
    for d in run_dirs:
        recorded = records.contents(d)
        summary = json.loads(recorded["summary.json"])
        cfg = today(OmegaConf.create(recorded["config.yaml"].decode()))
        # the record's own thread count unless told otherwise: a CPU's sums split over more threads round
        # differently (a 300-round ResNet20 record made on 1 thread came out 0.40 pt apart on 2)
        cfg.threads = threads or summary.get("threads") or cfg.get("threads")
        cfg.progress, cfg.checkpoint_every = False, 0
        scratch = Path(tempfile.mkdtemp(prefix=f"normfl-verify-{d.name}-"))
        try:
            log(f"  training {d.name} again (recorded in {summary.get('wall_time_s', 0) / 60:.1f} min)")
            run(cfg, scratch / "run")
            diff = compare(recorded, records.contents(scratch / "run"))
            text, same = line(d.name, summary.get("commit") or "", diff), identical(diff)
        except records.RecordError as err:       # the run failed: no finished run to compare
            text, same = f"{d.name}: DIFFERS: {err}", False
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        differing += not same
        log(text)
    return differing
