"""The committed results store: ``outputs/records/<key>/``, one compact record of each finished run of a
figure's grid, kept in the repository so that the figures and tables travel with the code that made them
and runs made anywhere (a laptop, a GPU box, a SLURM job) add up.

A record is what the figures read of a run and nothing more: ``config.yaml`` (the resolved config; its
key is the folder's name), ``summary.json`` (status, numbers, where it ran: device and its name, library
versions, data source, commit) and ``metrics.csv.xz`` (the per-round table, its numbers to 9 significant
digits, which keeps every float32 value exactly, and integers whole; xz has no timestamp, so the same run
packs to the same bytes). A 500-round run with every column takes about 16 KB. No checkpoints, parameters
or logs. A record is never overwritten: packing a run whose key has a record adds nothing when the two are
the same and is refused when they differ, naming what differs.
"""

from __future__ import annotations

import json
import lzma
import math
import os
import shutil
import tempfile
from pathlib import Path

from omegaconf import OmegaConf

from normfl.config import config_key
from normfl.errors import ConfigError
from normfl.reproduce.jobs import ROOT
from normfl.results import FINISHED, config_file
from normfl.results import RECORD_METRICS as METRICS

RECORDS = Path(os.environ.get("NORMFL_RECORDS") or ROOT / "outputs" / "records")   # the tests keep theirs apart
FILES = ("config.yaml", "summary.json", "metrics.csv.xz")
PLACE_AND_TIME = ("wall_time_s", "training_time_s", "resumed_at_round", "seconds_per_round", "peak_rss_mb", "threads",
                  "backend", "device", "device_name", "data_source", "versions", "commit", "adopted_from",
                  "adopted_key")                                                   # differ between two makings


class RecordError(ConfigError):
    """A run that cannot become a record, or a record that would change a stored one."""

    def __init__(self, where, why: str):
        super().__init__("record", str(where), why, f"refused: {where}: {why}")


def locate(key: str, store: Path) -> Path:
    """Where a run of this key is read from: its record when there is one, else the working store's folder."""
    return RECORDS / key if (RECORDS / key / "summary.json").is_file() else store / key


def contents(run_dir: Path) -> dict[str, bytes]:
    """A finished run directory (or a record) as a record's files, checked: its config gives its key."""
    run_dir = Path(run_dir)
    cfg = config_file(run_dir)
    packed = run_dir / METRICS
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
        files = {"config.yaml": cfg.read_bytes(), "summary.json": (run_dir / "summary.json").read_bytes(),
                 METRICS: packed.read_bytes() if packed.is_file() else compact((run_dir / "metrics.csv").read_text())}
    except (OSError, ValueError) as err:
        raise RecordError(run_dir, f"a finished run's config, summary.json and metrics.csv ({err})") from None
    if summary.get("status") not in FINISHED:
        raise RecordError(run_dir, f"a finished run (its status is {summary.get('status')!r})")
    key = config_key(OmegaConf.create(files["config.yaml"].decode()))
    if summary.get("config_key") != key:
        raise RecordError(run_dir, f"a summary of its config ({key}), not of {summary.get('config_key')}")
    return files


def compact(csv: str) -> bytes:
    """metrics.csv as a record keeps it: integral numbers whole, the others to 9 significant digits, xz."""
    def cell(v: str) -> str:
        try:
            x = float(v)
        except ValueError:
            return v
        return str(int(x)) if x.is_integer() and abs(x) < 2**53 else f"{x:.9g}"
    lines = csv.splitlines()
    rows = [lines[0], *(",".join(cell(v) for v in line.split(",")) for line in lines[1:])]
    return lzma.compress(("\n".join(rows) + "\n").encode(), preset=9)


def differences(a: dict[str, bytes], b: dict[str, bytes]) -> list[str]:
    """What differs between two records' files (``contents``: each config checked against its summary's
    ``config_key``): the per-round tables, and the summaries by field, the run key among them (so threads, paths
    and keys added after a record was made do not count), wall times and where it ran aside: the same run made
    twice differs there and only there."""
    out = [METRICS] * (table_rows(METRICS, a[METRICS]) != table_rows(METRICS, b[METRICS]))
    sa, sb = (json.loads(x["summary.json"]) for x in (a, b))
    fields = [k for k in sorted(set(sa) | set(sb)) if k not in PLACE_AND_TIME and not same(sa.get(k), sb.get(k))]
    return out + [f"summary.json: {', '.join(fields)}"] * bool(fields)


def same(u, v) -> bool:
    """Two summary values equal, NaN equal to NaN (a diverged run's summary holds NaN); two blocks (the privacy
    block) by the recorded one's (``u``) fields: one added to summaries since the record was made is not compared."""
    if isinstance(u, dict) and isinstance(v, dict):
        return all(same(u[k], v.get(k)) for k in u)
    return u == v or (isinstance(u, float) and isinstance(v, float) and math.isnan(u) and math.isnan(v))


def table_rows(name: str, data: bytes):
    """A record file's content as compared: the per-round table's rows without wall time, else the bytes."""
    if name != METRICS:
        return data
    rows = [line.split(",") for line in lzma.decompress(data).decode().splitlines()]
    cut = rows[0].index("wall_time") if rows and "wall_time" in rows[0] else None
    return [r[:cut] + r[cut + 1:] if cut is not None else r for r in rows]


def pack(run_dir: Path) -> str:
    """Record a finished run in ``RECORDS``: ``added``, or ``same`` when its record is there already;
    RecordError when the run is not a finished run of its config, or differs from the record of its key."""
    files = contents(run_dir)
    key = json.loads(files["summary.json"])["config_key"]
    records = RECORDS
    target = records / key
    if (target / "summary.json").is_file():
        if found := differences(contents(target), files):
            raise RecordError(run_dir, f"a run equal to the stored record {key}; they differ in {'; '.join(found)}")
        return "same"
    records.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=records))
    for name, data in files.items():
        (tmp / name).write_bytes(data)
    tmp.chmod(0o755)                                # mkdtemp's 0700 would keep the record from others
    try:
        tmp.rename(target)                          # atomic; a record made meanwhile by another wins
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (target / "summary.json").is_file():
            raise RecordError(run_dir, f"a key whose record folder is whole or absent ({target} holds no "
                              "summary.json: restore it, or move it away)") from None
        return pack(run_dir)
    return "added"
