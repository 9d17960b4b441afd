"""``hydra/launcher=slurm``: hydra-submitit-launcher's SLURM launcher, with what a sweep on a cluster needs of it.

- A job that the scheduler ends before it says how it went (``scancel``, a preemption, a node lost) is noted with
  its SLURM state, and the sweep goes on to its table. hydra-submitit-launcher waited on the jobs in order and
  raised the first such job's ``UncompletedJobError``: a traceback, no table, the other jobs' outcomes unread.
- A job whose run did not finish (refused, failed, stopped) ends with an error, so that SLURM records it FAILED
  (or CANCELLED, TIMEOUT), never COMPLETED: ``sacct`` and a cluster's e-mails tell the truth. Its reason is in the
  sweep's lines and ``jobs.csv``.
- Ctrl-C or SIGTERM to the sweep cancels its jobs: each running one saves a checkpoint (a job under submitit takes
  SIGTERM: ``normfl.run.signals``), none starts after, and the sweep prints the command that continues it; a second
  one stops waiting for them.

The jobs run this module's code, pickled by value: the SLURM job's Python need not find ``normfl/launchers``
(``train.py`` puts it on the sweep's import path only), just ``normfl`` itself.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as SubmititSlurmLauncher
from omegaconf import OmegaConf, open_dict

log = logging.getLogger(__name__)
RUNS_AGAIN = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED")        # SLURM states of a job yet to run (again)
ENDED = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
         "DEADLINE")                                                         # and of one that has ended
FAILED = ("FAILED", "OUT_OF_MEMORY")      # a job whose run broke; the others (CANCELLED, TIMEOUT, PREEMPTED,
                                          # NODE_FAIL, ...) stopped it, and the same sweep continues it


class NotFinished(Exception):
    """A job's run did not finish: raised at the job's end so that SLURM records the job as failed."""


class SlurmLauncher(SubmititSlurmLauncher):
    def __call__(self, *args, **kwargs) -> JobReturn:
        """In the SLURM job: the job's run, as hydra-submitit-launcher runs it, and an error where it did not finish
        (``normfl.run.cli`` returns a sweep job's outcome rather than raising). A SIGTERM that comes before the run
        trains (submitit would only log it) is held for it: the run takes it after its first step, and saves a
        checkpoint (``normfl.run.signals.hold``)."""
        from normfl.run.signals import hold

        signal.signal(signal.SIGTERM, hold)
        job = super().__call__(*args, **kwargs)
        outcome = job.return_value
        if isinstance(outcome, dict) and outcome.get("status") not in ("completed", "diverged"):
            raise NotFinished(f"normfl: job {args[2]} {outcome.get('status')}: {outcome.get('error')}")
        return job

    def launch(self, job_overrides, initial_job_idx: int) -> list[JobReturn]:
        """Submit the jobs as one job array, then wait for each in turn to end, however it ends."""
        import submitit

        from normfl.run.sweep import ask_stop

        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        params = dict(self.params)
        executor = submitit.AutoExecutor(folder=params.pop("submitit_folder"), cluster="slurm",
                                         slurm_max_num_timeout=params.pop("max_num_timeout"))
        common = set(OmegaConf.structured(BaseQueueConf).keys())    # submitit's names shared by its executors
        executor.update_parameters(**{k if k in common else f"slurm_{k}": v for k, v in params.items()})
        nums = range(initial_job_idx, initial_job_idx + len(job_overrides))
        runs = [list(o) for o in job_overrides]
        log.info(f"Submitting {len(runs)} jobs to SLURM as one job array; its logs: {executor.folder}")
        for num, overrides in zip(nums, runs, strict=True):
            log.info(f"\t#{num} : {' '.join(filter_overrides(overrides))}")
        state = Singleton.get_state()
        import cloudpickle

        cloudpickle.register_pickle_by_value(sys.modules[__name__])    # Hydra's plugin scan runs it unregistered
        jobs = executor.map_array(self, runs, ["hydra.sweep.dir"] * len(runs), list(nums),
                                  [f"job_id_for_{n}" for n in nums], [state] * len(runs))
        log.info(f"SLURM job array {jobs[0].job_id.split('_')[0]}")

        def wait():
            return [self.ended(sweep_dir, *job) for job in zip(jobs, nums, runs, strict=True)]

        with sigterm_stops():
            try:
                return wait()
            except KeyboardInterrupt as stop:
                ask_stop(sweep_dir, getattr(stop, "signum", signal.SIGINT))   # a job starting now does not start
                for job in jobs:
                    job.cancel(check=False)
                print("\nnormfl sweep: stopping: its SLURM jobs are cancelled, and each running one saves a checkpoint "
                      "(again: stop waiting for them)", file=sys.stderr)
                return wait()

    def ended(self, sweep_dir: Path, job, num: int, overrides: list[str]) -> JobReturn:
        """Wait for one job to end. A job that ended without noting its outcome (the scheduler ended it before it
        could, or killed it) is noted here, with its SLURM state; a stopped job's reason gains that state."""
        from normfl.run.sweep import note, noted

        state = over(job)
        outcome = noted(sweep_dir, num)
        if outcome is None:
            status = "failed" if state.partition(" ")[0] in FAILED else "stopped"
            why = f"SLURM: {state}" + (f"; its log: {job.paths.stderr}" if status == "failed" else "")
            run_dir = self.run_dir(num, overrides)
            note(sweep_dir, num, overrides, status, run_dir if run_dir and run_dir.is_dir() else None, why=why)
            outcome = noted(sweep_dir, num)
        elif outcome["status"] == "stopped" and "SLURM" not in (outcome.get("why") or ""):
            note(sweep_dir, num, overrides, "stopped", outcome["dir"], why=f"{outcome.get('why')} (SLURM: {state})")
        done = JobReturn(overrides=overrides, status=JobStatus.COMPLETED)
        done.return_value = {"status": outcome["status"], "error": outcome.get("why")}
        return done

    def run_dir(self, num: int, overrides: list[str]) -> Path | None:
        """Where Hydra puts the job's run (``hydra.sweep.subdir``: its number, or its run store key)."""
        try:
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(cfg):
                cfg.hydra.job.num = num
            return Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)
        except Exception:  # noqa: BLE001 (a job whose config does not compose: it has no folder)
            return None


def over(job) -> str:
    """Wait for a SLURM job to end; its state then (``COMPLETED``, ``CANCELLED by 0``, ...). SLURM's own queue
    (``squeue``, which keeps an ended job a few minutes) says whether the job runs, will run again or has ended:
    sacct, which submitit reads, lags behind it under load and never records an array task cancelled while pending
    (submitit waited on such a task for ever). The queue is asked every 10 s, and every second once the job leaves a
    result, until it has ended (a job still COMPLETING has not): a job requeued after leaving one (an administrator's
    requeue stops a run, which says so) runs again."""
    stale, asked = None, -math.inf
    while True:
        result = job.paths.result_pickle
        made = result.stat().st_mtime if result.exists() else None
        fresh = made is not None and made != stale
        if fresh or time.monotonic() - asked > 10:
            asked, state = time.monotonic(), queued(job)
            if state is None:                                          # no queue to ask: sacct, as submitit does
                if job.watcher.is_done(job.job_id, mode="force"):
                    return job.watcher.get_state(job.job_id, mode="cache")
            elif state in RUNS_AGAIN:
                stale = made
            elif state == "" or state in ENDED:                        # COMPLETING and RUNNING: not yet
                return accounted(job, state)
        time.sleep(1)


def queued(job) -> str | None:
    """The job's state in SLURM's queue; "" where the queue holds no such job (it ended minutes ago, or was
    cancelled before it started), None where SLURM cannot be asked."""
    out = subprocess.run(["squeue", "-h", "-r", "-t", "all", "-j", job.job_id, "-o", "%T"], capture_output=True,
                         text=True)
    return out.stdout.strip() if out.returncode == 0 or "Invalid job id" in out.stderr else None


def accounted(job, listed: str) -> str:
    """A job's final state as sacct records it (``CANCELLED by 0``: who cancelled it), else as the queue ``listed``
    it; a task that neither knows was cancelled before it started."""
    state = job.watcher.get_state(job.job_id, mode="force")
    return state if state.partition(" ")[0] in ENDED else \
        listed or "CANCELLED before it started (sacct keeps no record of it)"


@contextlib.contextmanager
def sigterm_stops():
    """SIGTERM to the sweep's process (a container's stop, the end of a job the sweep runs in) stops it as Ctrl-C
    does, where nothing else takes it."""
    from normfl.run.signals import Stopped

    def stop(signum, frame):
        raise Stopped(signum)

    take = threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    previous = signal.signal(signal.SIGTERM, stop) if take else None
    try:
        yield
    finally:
        if take:
            signal.signal(signal.SIGTERM, previous)
