"""Runs side by side: the runs of a sweep that share data, model and seed trained in one process, their
clients' gradients from one stacked pass a round (``normfl.engine.lockstep``)."""

from __future__ import annotations

import functools
import logging
from pathlib import Path

from normfl.config import config_key
from normfl.engine.lockstep import Lockstep
from normfl.results import record_failure
from normfl.run import vectorized
from normfl.run.setup import shared_key
from normfl.run.signals import Interrupts
from normfl.run.training import INPUT_ERRORS, Training, start

log = logging.getLogger("normfl")


def train_together(jobs: list[tuple], max_runs: int = 32, log_name: str = "train.log") -> list[dict]:
    """Train the jobs of a sweep, each (config, run directory[, overrides[, Hydra's config]]), those that
    share ``SHARED`` side by side in one process, at most ``max_runs`` at a time
    (``normfl.engine.lockstep``); returns each job's summary, or ``{"status": "refused" | "failed",
    "error": ...}`` for a job refused (nothing of it left, as ``main`` does) or failed (recorded as failed).
    One run that fails or diverges ends alone; the others go on."""
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
                _side_by_side(list(trainings.values()))
                for i, t in trainings.items():
                    results[i] = t.finish() if t.status != "failed" else {"status": "failed", "error": t.error}
            finally:
                for t in trainings.values():
                    t.rundir.release()
    return results


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
                    results = lockstep.round([(functools.partial(t.algo.round, t.step, t.x), t.clients) for t in rest])
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
    record_failure(t.out_dir, t.out_dir.name, err, t.key)
