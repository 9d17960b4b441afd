"""The run store: every run of a figure or table lives in ``<store>/<key>``, where the key is a hash of
its resolved config (``normfl.config.config_key``), so a grid re-run only trains what is missing and runs
shared between figures (NORMEC's NP-SN group feeds five of them) are trained once. Which runs a figure
needs is ``jobs.py``'s.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from omegaconf import OmegaConf

from normfl import checkpoint
from normfl.reproduce import records
from normfl.reproduce.jobs import ROOT, Job
from normfl.results import FINISHED


def status(run_dir: Path) -> str:
    """completed | diverged | failed | missing (no summary: never run, or killed part-way)."""
    try:
        return json.loads((run_dir / "summary.json").read_text()).get("status", "failed")
    except (OSError, ValueError):
        return "missing"


class Stop:
    """Ctrl-C, or SIGTERM as a batch scheduler sends it, to a driver whose runs train in child processes: the
    first asks every child to save a checkpoint and stop (their own first Ctrl-C, ``run.signals.Interrupts``)
    and starts no more; a second is passed on too, so they stop at once. The children have process groups of
    their own, so a terminal's Ctrl-C reaches each through here, once per press; it goes to a child's whole
    group, which holds the worker processes a child starts (a joblib sweep's: ``run.sweep.SweepStop``). Signals
    reach only the main thread; a driver elsewhere stops as before."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __enter__(self) -> Stop:
        self.count, self.children, self.previous = 0, set(), {}
        self.lock = threading.RLock()
        if threading.current_thread() is threading.main_thread():
            self.previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def _handle(self, signum, frame) -> None:
        with self.lock:
            self.count += 1
            children = list(self.children)
        print(f"\nnormfl: {signal.Signals(signum).name}: " + ("the runs under way save a checkpoint and stop; no "
              "more start (again: they stop at once)" if self.count == 1 else "the runs stop at once"),
              file=sys.stderr, flush=True)
        for proc in children:
            interrupt(proc)

    def popen(self, cmd: list[str], **kwargs) -> subprocess.Popen | None:
        """Start a child in a process group of its own, or None once a stop is asked."""
        with self.lock:
            if self.count:
                return None
            own_group = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
            proc = subprocess.Popen(cmd, **own_group, **kwargs)     # the same session: `nice` and autogroup hold
            self.children.add(proc)
            return proc

    @contextmanager
    def child(self, cmd: list[str], **kwargs):
        """``popen``'s child (None once a stop is asked) for the block, forgotten when the block ends."""
        proc = self.popen(cmd, **kwargs)
        try:
            yield proc
        finally:
            with self.lock:
                self.children.discard(proc)

    def __exit__(self, *exc) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)


def until(stop: Stop, cmd: list[str], deadline: float, **kwargs) -> bool | None:
    """Run ``cmd`` as ``stop``'s child until it ends or ``deadline`` (a ``time.time()``) comes; then a Ctrl-C, so it
    saves a checkpoint and stops, and wait for it. Whether the deadline stopped it; None when a stop was asked
    before it could start."""
    with stop.child(cmd, **kwargs) as proc:
        if proc is None:
            return None
        try:
            proc.wait(timeout=max(0.0, deadline - time.time()))
            return False
        except subprocess.TimeoutExpired:
            interrupt(proc)
            proc.wait()
            return True


def interrupt(proc: subprocess.Popen) -> None:
    """A Ctrl-C to a child that ``Stop.popen`` started, and to the processes it started (its process group)."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
    except ProcessLookupError:                   # it has just ended
        pass


def default_stack() -> int:
    """Runs trained side by side in one process by default: 16 on a GPU, where one stacked pass serves
    them all; 1 on a CPU, where separate processes (``parallel``) do as well or better."""
    import torch

    return 16 if torch.cuda.is_available() else 1


def pending(job_list: list[Job], store: Path, skip=FINISHED, log=print) -> list[Job]:
    """The jobs still to train: not recorded (``records``), not in ``skip`` in the store, and not held by
    another live process (whose run is left to it, never cleared)."""
    from normfl.run.rundir import holder

    todo = []
    for job in job_list:
        if status(records.locate(job.key, store)) in skip:
            continue
        if held := holder(job.dir(store)):
            log(f"  running  {job.key}: held by another live process ({held}); left to it")
        else:
            todo.append(job)
    return todo


def command(job: Job, run_dir: Path, threads: int) -> list[str]:
    """The ``train.py`` command that trains one job into ``run_dir`` (continuing its checkpoint if it has one)."""
    return [sys.executable, str(ROOT / "train.py"), *job.overrides, f"hydra.run.dir={run_dir}", f"threads={threads}",
            "progress=false"]


def threads_each(parallel: int, threads: int | None = None) -> int:
    """Torch threads per process: as given, else the cores shared among ``parallel`` processes."""
    return threads or max(1, (os.cpu_count() or 1) // parallel)


def units(todo: list[Job], stack: int = 1) -> list[list[Job]]:
    """The processes that train ``todo``: one run each, or with ``stack`` > 1 up to ``stack`` runs that share
    model, data and seed (``normfl.run.shared_key``; a job without its config, made by hand, trains alone)."""
    from normfl.run import shared_key

    groups: dict[str, list[Job]] = {}
    for job in todo:
        groups.setdefault(shared_key(job.cfg) if job.cfg is not None and stack > 1 else job.key, []).append(job)
    return [g[i:i + stack] for g in groups.values() for i in range(0, len(g), max(1, stack))]


def unit_command(unit: list[Job], dirs: list[Path], threads: int) -> list[str]:
    """The command that trains ``unit`` into ``dirs``: ``train.py`` for one run; for several,
    ``normfl.reproduce together`` on their folders, where their configs are written first."""
    if len(unit) == 1:
        return command(unit[0], dirs[0], threads)
    for job, d in zip(unit, dirs, strict=True):
        (d / ".hydra").mkdir(parents=True, exist_ok=True)
        OmegaConf.save(job.cfg, d / ".hydra" / "config.yaml")
        OmegaConf.save(OmegaConf.create(job.overrides), d / ".hydra" / "overrides.yaml")
    return [sys.executable, "-m", "normfl.reproduce", "together", *(str(d) for d in dirs), "--threads", str(threads)]


def run_missing(job_list: list[Job], store: Path, parallel: int = 1, threads: int | None = None,
                retry_failed: bool = False, log=print, stack: int = 1) -> dict[str, int]:
    """Train every job whose run is not finished, ``parallel`` processes at a time; returns status counts.

    Each process writes into its runs' store folders, so a crash stays with its runs and the others go
    on. A process trains one run (``train.py``), or with ``stack`` > 1 up to ``stack`` runs that share
    model, data and seed side by side (``normfl.run.train_together``), where a run that diverges or
    fails ends alone. A folder without a summary (a killed run) continues from its checkpoint, or is
    cleared and run again if it has none.
    """
    todo = pending(job_list, store, FINISHED if retry_failed else (*FINISHED, "failed"), log)
    threads = threads_each(parallel, threads)
    log(f"{len(job_list)} runs, {len(job_list) - len(todo)} already stored, {len(todo)} to run "
        f"({parallel} process(es) at a time, {threads} thread(s) each, up to {stack} run(s) per process)")

    def prepare(job: Job) -> tuple[Path, bool]:
        d = job.dir(store)
        resume = (d / checkpoint.NAME).exists()
        if not resume:
            shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True, exist_ok=True)
        return d, resume

    def train(unit: list[Job]) -> list[str]:
        if stop.count:
            return ["not started"] * len(unit)
        dirs = [prepare(job) for job in unit]
        t0 = time.time()
        with stop.child(unit_command(unit, [d for d, _ in dirs], threads), cwd=ROOT, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True) as proc:
            if proc is None:
                return ["not started"] * len(unit)
            output = proc.communicate()[0]
        states = []
        for job, (d, resume) in zip(unit, dirs, strict=True):
            d.mkdir(parents=True, exist_ok=True)          # a run refused in a stack leaves no folder
            with open(d / "stdout.txt", "a" if resume else "w") as fh:
                fh.write(output)
            st = status(d)
            if st == "missing" and stop.count:            # asked to stop: its checkpoint, if any, is continued later
                st = "stopped"
            elif st == "missing":                         # refused or crashed before writing its summary
                (d / "summary.json").write_text(json.dumps({"status": "failed", "error": _tail(d / "stdout.txt")}))
                st = "failed"
            log(f"  {st:9s} {time.time() - t0:7.1f} s  {d.name}  {' '.join(job.overrides)}")
            if st in FINISHED:                            # the committed results store gains it (records.py)
                try:
                    log(f"            record {records.pack(d)}")
                except records.RecordError as err:
                    log(f"            record {err}")
            states.append(st)
        return states

    counts: dict[str, int] = {}
    with Stop() as stop, cf.ThreadPoolExecutor(max_workers=parallel) as pool:
        for states in pool.map(train, units(todo, stack)):
            for st in states:
                counts[st] = counts.get(st, 0) + 1
    if stop.count:
        log(f"stopped: {', '.join(f'{n} {st}' for st, n in counts.items())}; the same command continues the "
            "stopped runs from their checkpoints")
        raise KeyboardInterrupt
    return counts


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return "\n".join(path.read_text().splitlines()[-lines:])
    except OSError:
        return ""
