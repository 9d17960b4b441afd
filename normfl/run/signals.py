"""Signals while runs train: the first Ctrl-C or SIGTERM asks them to stop after the step under way and save
a checkpoint (``Interrupts``), a second stops at once; a run stopped so ends the process with ``Stopped``."""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Protocol


class Training(Protocol):
    """What stopping needs of a run (normfl.run.training.Training has it): whether it is still going, where
    it stands, and a way to save its checkpoint."""
    active: bool
    step: int
    out_dir: Path

    def save(self) -> None: ...


class Stopped(KeyboardInterrupt):
    """Runs stopped by a signal after saving their checkpoints; the process ends with 128 + ``signum``. ``why``:
    what stopped them, where the signal alone does not say (a scheduler's refusal to requeue)."""

    def __init__(self, signum: int, why: str | None = None):
        super().__init__(signal.Signals(signum).name)
        self.signum, self.why = signum, why


HELD: list[int] = []


def hold(signum, frame) -> None:
    """A SIGTERM that comes before a SLURM job's run trains (``normfl_launchers.slurm`` sets this handler as the job
    starts; submitit's own only logs it): held for ``Interrupts``, which takes it after the run's first step."""
    HELD.append(signum)


def signal_name(signum: int) -> str:
    """A signal as a message names it: Ctrl-C for SIGINT."""
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


class Interrupts:
    """A signal to stop while runs train: the first asks them to stop after the step under way, so that
    they save a checkpoint where they stand (``asked``); a second stops at once. Signals taken:

    - Ctrl-C (SIGINT), always, and SIGTERM where its default action is in force (a container's stop, ``kill``)
      or in a job submitit runs (``scancel``, a preemption, a node's shutdown: submitit's own handler only logs
      it, and the run trained on until SIGKILL came KillWait seconds later): the process then ends with
      ``Stopped`` (exit 130 or 143);
    - a scheduler's warning that the job is about to be preempted or timed out, where a handler is
      already set for it: submitit's signal (SIGUSR2, or ``$SUBMITIT_PREEMPT_SIGNAL``), under Hydra's
      SLURM launcher. After the checkpoint, that handler runs (submitit requeues the job and exits), so the
      requeued job resumes from where the signal came, not from its last ``checkpoint_every``; where it
      will not requeue (``max_num_timeout`` spent), the run ends ``Stopped`` with its reason, its checkpoint kept.

    Only the main thread receives signals, so elsewhere they act as they always do. A joblib sweep's worker
    holds them blocked between runs (``run.cli.SweepStop``); they are unblocked here while it trains. A signal
    that reached only the sweep's own process (``kill <pid>``, a container's stop) comes as ``stop_asked``: a
    callable giving the signal that asked the sweep to stop, or None, read after a step at most once a second."""

    POLL_S = 1.0

    def __init__(self, stop_asked=None):
        self.stop_asked, self.polled = stop_asked, -math.inf

    def __enter__(self):
        self.asked, self.previous, self.handover, self.mask = None, {}, set(), None
        if threading.current_thread() is not threading.main_thread():
            return self
        wanted = [signal.SIGINT]
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL or "SUBMITIT_EXECUTOR" in os.environ:
            wanted.append(signal.SIGTERM)
        preempt = getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), None)
        if preempt is not None and callable(signal.getsignal(preempt)):
            self.handover.add(preempt)
            wanted.append(preempt)
        for signum in dict.fromkeys(wanted):
            self.previous[signum] = signal.signal(signum, self._handle)
        if hasattr(signal, "pthread_sigmask"):
            self.mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, self.previous)
        if HELD:                                     # a stop that came before the run trained (``hold``)
            self._handle(HELD.pop(), None)
            HELD.clear()
        return self

    def _handle(self, signum, frame) -> None:
        if self.asked is not None:
            return self._stop(signum, frame)
        self.asked = (signum, frame)
        name = signal_name(signum)
        said = "" if signum == signal.SIGINT else f"{name}: "
        print(f"\nnormfl: {said}stopping after this step to save a checkpoint ({name} again stops at once)",
              file=sys.stderr)

    def _stop(self, signum, frame) -> None:
        if signum not in self.handover:
            raise Stopped(signum)
        try:                                 # the scheduler's handler: submitit requeues the job and exits
            self.previous[signum](signum, frame)
        except Exception as err:             # noqa: BLE001 (submitit's refusal to requeue: timed out too often)
            raise Stopped(signum, f"{signal_name(signum)}: {err}") from err

    def stop_if_asked(self, trainings: list[Training]) -> None:
        """After a step: if a signal came while runs are still going, each saves a checkpoint, and all stop (runs
        that have just ended finish as usual)."""
        going = [t for t in trainings if t.active]
        if self.asked is None and self.stop_asked is not None and time.monotonic() - self.polled >= self.POLL_S:
            self.polled = time.monotonic()
            if (signum := self.stop_asked()) is not None:
                self._handle(signum, None)
        if self.asked and going:
            (signum, frame), self.asked = self.asked, None
            for t in going:
                t.save()
                if signum in self.handover:
                    print(f"normfl: checkpoint saved at step {t.step} in {t.out_dir}; the scheduler's handler of "
                          f"{signal.Signals(signum).name} takes over (submitit: requeue)", file=sys.stderr)
            self._stop(signum, frame)        # a handler that returns (submitit on a rank other than 0): go on

    def __exit__(self, *exc) -> None:
        if self.mask is not None:                    # blocked again first: one arriving now waits for the next run
            signal.pthread_sigmask(signal.SIG_SETMASK, self.mask)
        for signum, previous in self.previous.items():
            signal.signal(signum, previous)
