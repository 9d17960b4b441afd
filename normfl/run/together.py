"""Runs side by side: the runs of a sweep that share data, model and seed trained in one process, their
clients' gradients from one stacked pass a round (``normfl.engine.lockstep``)."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from pathlib import Path

from normfl.config import config_key
from normfl.engine.lockstep import Lockstep
from normfl.results import record_failure
from normfl.run import vectorized
from normfl.run.setup import shared_key
from normfl.run.signals import Interrupts
from normfl.run.terminal import progress_bar, progress_label
from normfl.run.training import INPUT_ERRORS, Training, start

log = logging.getLogger("normfl")


def train_together(jobs: list[tuple], max_runs: int = 32, log_name: str = "train.log",
                   ended: Callable[[int, dict], None] | None = None) -> list[dict]:
    """Train the jobs of a sweep, each (config, run directory[, overrides[, Hydra's config]]), those that
    share ``SHARED`` side by side in one process, at most ``max_runs`` at a time
    (``normfl.engine.lockstep``); returns each job's summary, or ``{"status": "refused" | "failed",
    "error": ...}`` for a job refused (nothing of it left, as ``main`` does) or failed (recorded as failed).
    One run that fails or diverges ends alone; the others go on. ``ended(i, result)`` is called for each job of
    a group once the group's bars are gone (the stacked launcher prints its closing line)."""
    results: list = [None] * len(jobs)
    groups: dict[str, list[int]] = {}
    for i, (cfg, *_) in enumerate(jobs):
        groups.setdefault(shared_key(cfg), []).append(i)
    for members in groups.values():
        for first in range(0, len(members), max_runs):
            chunk, cache, trainings = members[first:first + max_runs], {}, {}
            for i in chunk:
                cfg, out_dir, overrides, hydra_cfg = (*jobs[i], None, None)[:4]
                try:
                    t = start(cfg, out_dir, cache, progress=False, log_name=log_name, overrides=overrides,
                              hydra_cfg=hydra_cfg)
                except INPUT_ERRORS as err:
                    log.error("job %s refused: %s", i, err)
                    results[i] = {"status": "refused", "error": str(err)}
                    continue
                except Exception as err:
                    record_failure(Path(out_dir), i, err, config_key(cfg))
                    results[i] = {"status": "failed", "error": repr(err)}
                    continue
                if isinstance(t, dict):
                    results[i] = t
                else:
                    trainings[i] = t
            try:
                with _bars(list(trainings.values())):
                    _side_by_side(list(trainings.values()))
                    for i, t in trainings.items():
                        results[i] = t.finish() if t.status != "failed" else {"status": "failed", "error": t.error}
            finally:
                for t in trainings.values():
                    t.rundir.release()
            if ended is not None:
                for i in chunk:
                    ended(i, results[i])
    return results


def _round(t: Training):
    """A run's round in a lockstep: its algorithm's own, or its in-band or release audit's, which wraps it (the
    round ``round_of`` may capture whole runs alone)."""
    return t.audit.round if t.audit is not None and t.audit.inband else t.algo.round


@contextlib.contextmanager
def _bars(trainings: list[Training]):
    """A progress bar for each run whose config asks for one (``progress``), each on its own line and labelled as a
    parallel sweep's jobs' are (``terminal.progress_label``: ``#1 algo.beta=0.1``). While they are drawn, log lines go
    through tqdm, which lifts the bars, writes the line and draws them again below it; they are gone at the end."""
    shown = [t for t in trainings if t.cfg.progress]
    for position, t in enumerate(shown):
        t.bar = progress_bar(t.cfg, t.k, True, progress_label(t.rundir.hydra_cfg), position)
    if not shown:
        yield
        return
    from tqdm.contrib.logging import logging_redirect_tqdm

    try:
        with logging_redirect_tqdm():
            yield
    finally:
        for t in shown:
            t.bar.close()


def _side_by_side(trainings: list[Training]) -> None:
    """Their rounds until each is over: runs that differ only in scalars as vectorized groups
    (``run.vectorized``), the others in lockstep; a run whose round raises is recorded as failed."""
    lockstep, made = Lockstep(), {}
    try:
        with Interrupts() as ctrl_c:
            while active := [t for t in trainings if t.active]:
                grouped, rest = vectorized.groups(active)
                current = {}
                for members in grouped:                  # a new membership: its runs' state grouped anew
                    key = tuple(id(t) for t in members)
                    current[key] = made.get(key) or vectorized.Group(members)
                    try:
                        current[key].round()
                    except Exception as err:  # noqa: BLE001 (every run of the group fails with it)
                        for t in members:
                            _failed(t, err)
                made = current
                if rest:
                    results = lockstep.round([(functools.partial(_round(t), t.step, t.x), t.clients) for t in rest])
                    for t, result in zip(rest, results, strict=True):
                        if isinstance(result, BaseException):
                            if not isinstance(result, Exception):
                                raise result             # KeyboardInterrupt, SystemExit: stop everything
                            _failed(t, result)
                        else:
                            t.record(*result)
                ctrl_c.stop_if_asked(trainings)
    finally:
        lockstep.close()


def _failed(t: Training, err: Exception) -> None:
    """A run whose round raised: recorded as failed, unless reading its rows shows it had diverged before."""
    if not t.read():
        return
    t.status, t.active, t.error = "failed", False, repr(err)
    t.bar.close()
    t.rec.close(1)
    record_failure(t.out_dir, t.out_dir.name, err, t.key)
