"""Campaigns: train the missing runs of some IDs within a wall-clock budget, wherever there is time (a laptop,
a GPU box for an hour, a SLURM job), and bring them home as an archive (in parts of at most 16 MiB) that
another clone adopts.

    python -m normfl.reproduce campaign normfedavg-t6 alidpfl-t2 --budget 25m [--checkpoints]
    python -m normfl.reproduce adopt outputs/campaigns/<time>.tar.gz          # on another clone

A campaign lists the runs it will train, in order, and trains them one after another (``--parallel``
at once; with ``--stack``, 16 by default on a GPU, runs that share model, data and seed side by side in one
process). A run still going when the budget is nearly spent gets Ctrl-C, so it saves a checkpoint where it
stands and stops (``normfl.run.signals.Interrupts``); so do the runs under way when the campaign itself gets
Ctrl-C or SIGTERM (``store.Stop``), and the archive is then written as at the budget's end. A later campaign,
here or where the archive is adopted with its checkpoints, continues a stopped run. Finished runs become
records (``records.pack``); the archive holds them and, with ``--checkpoints``, each unfinished run's
checkpoint and config.
"""

from __future__ import annotations

import concurrent.futures as cf
import heapq
import json
import re
import statistics
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

from normfl.reproduce import records, store
from normfl.reproduce.jobs import ROOT, Job
from normfl.results import FINISHED

ARCHIVE_MAX = 16 * 2**20               # what one archive part may weigh (a GPU box hands back files up to 16 MiB)
TAR_BLOCK = 1024                       # a member's header and padding in a tar file, at most
GRACE = 0.05                           # of the budget left for the last step and the checkpoint


def seconds(budget: str) -> float:
    """'25m', '90s', '2h' or a number of seconds."""
    m = re.fullmatch(r"\s*([\d.]+)\s*([smh]?)\s*", str(budget))
    if not m:
        raise ValueError(f"--budget={budget!r}; allowed: a duration such as 90s, 25m or 2h")
    return float(m[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[m[2]]


def expected(job_list: list[Job], store_dir: Path, device: str) -> dict[str, float]:
    """Each job's expected training time in seconds: the median wall time of the finished runs of the same
    list that differ from it only in seed, made on the same kind of device (cpu, cuda, mps), at the
    thread counts they had; no entry where there are none."""
    def siblings(job: Job) -> tuple[str, ...]:
        return tuple(o for o in job.overrides if not o.startswith("seed="))

    walls: dict[tuple[str, ...], list[float]] = {}
    for job in job_list:
        try:
            summary = json.loads((records.locate(job.key, store_dir) / "summary.json").read_text())
        except (OSError, ValueError):
            continue
        if summary.get("status") in FINISHED and str(summary.get("device", "")).split(":")[0] == device:
            walls.setdefault(siblings(job), []).append(summary["wall_time_s"])
    return {job.key: statistics.median(walls[siblings(job)]) for job in job_list if siblings(job) in walls}


def fitting(times: list[float], parallel: int, deadline_s: float) -> int:
    """How many runs of these times, trained in order ``parallel`` at a time, finish within ``deadline_s``."""
    lanes, fit = [0.0] * parallel, 0
    for t in times:
        end = heapq.heappop(lanes) + t
        fit += end <= deadline_s
        heapq.heappush(lanes, end)
    return fit


def train(unit: list[Job], store_dir: Path, deadline: float, threads: int, stop: store.Stop) -> list[str]:
    """Train one process's runs (one, or several side by side: ``store.unit_command``) in their store folders
    until they finish, the deadline comes or ``stop`` is asked (then Ctrl-C: each saves a checkpoint and
    stops); their statuses: completed, diverged, failed, stopped or not started."""
    dirs = [job.dir(store_dir) for job in unit]
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
    cmd = store.unit_command(unit, dirs, threads)
    with open(dirs[0] / "stdout.txt", "a") as out:
        start = out.tell()
        stopped = store.until(stop, cmd, deadline, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        if stopped is None:
            return ["not started"] * len(unit)
    if len(dirs) > 1:                                   # the process's output, in each of its runs' folders
        with open(dirs[0] / "stdout.txt") as fh:
            fh.seek(start)
            text = fh.read()
        for d in dirs[1:]:
            with open(d / "stdout.txt", "a") as fh:
                fh.write(text)
    stopped = stopped or stop.count > 0
    return [st if st != "missing" else "stopped" if stopped else "failed" for st in map(store.status, dirs)]


def run(job_list: list[Job], store_dir: Path, budget_s: float, parallel: int = 1, threads: int | None = None,
        checkpoints: bool = False, out: Path | None = None, log=print, dry_run: bool = False,
        stack: int = 1, device: str = "cpu") -> list[Path]:
    """Train the jobs not yet recorded or finished, within ``budget_s`` seconds, ``parallel`` processes at a
    time, each training one run or up to ``stack`` side by side; pack the finished ones into records and
    write the archive's parts (none when nothing finished or stopped). ``dry_run`` lists them only. The list gives
    each run's expected time where runs of its grid on this kind of ``device`` have finished."""
    t0 = time.time()
    deadline = t0 + budget_s * (1 - GRACE)
    todo = store.pending(job_list, store_dir, log=log)
    threads = store.threads_each(parallel, threads)
    log(f"campaign: {len(todo)} of {len(job_list)} runs to train within {budget_s / 60:.1f} min, in this order"
        + (f" (up to {stack} side by side in a process):" if stack > 1 else ":"))
    eta = expected(job_list, store_dir, device)
    for i, job in enumerate(todo, 1):
        resume = " (continues its checkpoint)" if (job.dir(store_dir) / "checkpoint.pt").exists() else ""
        t = eta.get(job.key)
        whole = "" if t is None else f"  [~{t / 60:.0f} min]" if t >= 90 else f"  [~{t:.0f} s]"
        log(f"  {i:3d}. {job.key}  {job.command()}{resume}{whole}")
    if todo and stack == 1 and all(job.key in eta for job in todo):
        fit = fitting([eta[job.key] for job in todo], parallel, deadline - t0)
        log(f"  about {fit} of them fit the budget, by the wall times of their grid's finished runs "
            "(a run continuing its checkpoint takes less)")
    if dry_run:
        return []

    def one(unit: list[Job]) -> None:
        """Train a unit, then say how each of its runs ended and record the finished ones, as soon as it ends."""
        states = (["not started"] * len(unit) if time.time() >= deadline or stop.count
                  else train(unit, store_dir, deadline, threads, stop))
        for job, st in zip(unit, states, strict=True):
            log(f"  {st:11s} at {(time.time() - t0) / 60:5.1f} min of the budget  {job.key}")
            if st in store.FINISHED:
                try:
                    log(f"              record {records.pack(job.dir(store_dir))}")
                    done.append(job)
                except records.RecordError as err:
                    log(f"              record {err}")
            elif st == "stopped":
                stopped.append(job)

    done, stopped = [], []
    with store.Stop() as stop, cf.ThreadPoolExecutor(max_workers=parallel) as pool:
        list(pool.map(one, store.units(todo, stack)))
    order = {job.key: i for i, job in enumerate(todo)}              # the archive lists them in the plan's order
    done.sort(key=lambda job: order[job.key])
    stopped.sort(key=lambda job: order[job.key])
    paths = archive(done, stopped if checkpoints else [], store_dir, out, log)
    if stop.count:
        log(f"campaign stopped by a signal: {len(done)} finished, {len(stopped)} stopped; "
            f"archive: {' '.join(map(str, paths)) or 'none'}")
        raise KeyboardInterrupt
    return paths


def archive(done: list[Job], stopped: list[Job], store_dir: Path, out: Path | None = None,
            log=print) -> list[Path]:
    """The finished runs' records and the stopped runs' checkpoints and configs, as .tar.gz parts of at most
    ``ARCHIVE_MAX`` each: ``out`` first, then ``<out>-2.tar.gz``, ... (adopt them all). Records come first,
    then checkpoints, in order, a new part when the last is full; a checkpoint bigger than a part can hold is
    left out, and the log says so (that run continues only from this machine's store). No parts when there
    is nothing to carry."""
    out = out or ROOT / "outputs" / "campaigns" / f"{time.strftime('%Y-%m-%d_%H-%M-%S')}.tar.gz"
    items = [[(records.RECORDS / job.key, f"records/{job.key}")] for job in done]
    for job in stopped:
        d = job.dir(store_dir)
        if (d / "checkpoint.pt").exists():          # stopped before its first step: nothing to carry
            items.append([(d / name, f"store/{job.key}/{name}") for name in ("checkpoint.pt", ".hydra/config.yaml")])
    room = ARCHIVE_MAX - ARCHIVE_MAX // 64          # gzip can grow data it cannot compress, a little
    parts: list[list] = []
    used = room
    for item in items:
        size = sum(TAR_BLOCK + (f.stat().st_size if f.is_file() else 0) for path, _ in item
                   for f in [path, *(path.rglob("*") if path.is_dir() else [])])
        if size > room:
            log(f"  left out   {item[0][1]}: {size / 2**20:.1f} MiB, more than an archive part holds "
                f"({ARCHIVE_MAX >> 20} MiB); its run continues only from {store_dir}")
            continue
        if used + size > room:
            parts.append([])
            used = 0
        parts[-1].append(item)
        used += size
    paths = [part(out, i) for i in range(1, len(parts) + 1)]
    if paths:
        out.parent.mkdir(parents=True, exist_ok=True)
    tmps = [p.with_name(f".{p.name}.tmp") for p in paths]
    try:
        for members, tmp in zip(parts, tmps, strict=True):
            with tarfile.open(tmp, "w:gz") as tar:
                for path, name in (pair for item in members for pair in item):
                    tar.add(path, arcname=name)
            if tmp.stat().st_size > ARCHIVE_MAX:
                raise ValueError(f"an archive part would weigh more than {ARCHIVE_MAX >> 20} MiB")
    except BaseException:
        for tmp in tmps:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, path in zip(tmps, paths, strict=True):
        tmp.replace(path)
    return paths


def part(out: Path, i: int) -> Path:
    """The archive ``out``'s part ``i`` (from 1): ``out`` itself, then ``<out>-2.tar.gz``, ..."""
    return out if i == 1 else out.with_name(f"{_stem(out)}-{i}.tar.gz")


def parts_there(out: Path) -> list[Path]:
    """The parts of an archive ``out`` that exist already (a campaign never writes over them)."""
    later = re.compile(re.escape(_stem(out)) + r"-\d+\.tar\.gz")
    return sorted(p for p in out.parent.glob("*") if p.is_file() and (p == out or later.fullmatch(p.name)))


def _stem(out: Path) -> str:
    return re.sub(r"(\.tar\.gz|\.tgz)$", "", out.name)


def adopt(path: Path, store_dir: Path, log=print) -> int:
    """Merge an archive into this clone: each record added, or left (the same record is here) or refused (a
    record of the same key differs, or its config is not its key); each checkpoint put where a later
    campaign continues it, unless that run is here already. Returns the number refused."""
    refused = 0
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(path) as tar:
        tar.extractall(tmp, filter="data")
        for rec in sorted((Path(tmp) / "records").glob("*")):
            try:
                log(f"  {records.pack(rec):8s} {rec.name}")
            except records.RecordError as err:
                refused += 1
                log(f"  refused  {err}")
        for saved in sorted((Path(tmp) / "store").glob("*")):
            d = store_dir / saved.name
            if (records.RECORDS / saved.name / "summary.json").is_file() or (d / "summary.json").exists() \
                    or (d / "checkpoint.pt").exists():
                log(f"  left     {saved.name}: its run is here already")
                continue
            (d / ".hydra").mkdir(parents=True, exist_ok=True)
            for name in ("checkpoint.pt", ".hydra/config.yaml"):
                (d / name).write_bytes((saved / name).read_bytes())
            log(f"  resumable {saved.name}: its checkpoint is in {d}")
    return refused
