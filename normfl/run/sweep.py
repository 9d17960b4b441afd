"""A sweep (``train.py -m``): its jobs checked before any starts, each job's outcome and its reason noted beside
them whichever process or machine ran it, and a table of its jobs when it ends, its exit status non-zero, with a line
per job, when any job was refused, failed or stopped. In a sweep whose jobs run in worker processes (joblib), Ctrl-C
(or SIGTERM) makes the running jobs save their checkpoints, none starts after, and the sweep prints the command that
continues it; so does a SLURM sweep (``normfl_launchers.slurm``), and a job the scheduler stops saves its own. A job
itself is ``cli``'s, as a single run is."""

from __future__ import annotations

import _thread
import json
import logging
import os
import shlex
import shutil
import signal
import sys
import threading
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from normfl.config import NOT_IN_KEY
from normfl.config.hydra_private import basic_sweep
from normfl.errors import ConfigError
from normfl.results import FINISHED, shown, write_atomic
from normfl.run.signals import Stopped, signal_name

OUTCOMES = ".normfl-jobs"                      # a sweep's job outcomes, in its directory until it ends
JOBS = "jobs"                                  # the sweep's table of jobs: jobs.csv and jobs.md at its root
STOP = "stop"                                  # in OUTCOMES once a sweep is asked to stop: the signal's number
SWEEP_PID = "NORMFL_SWEEP_PID"                 # a joblib sweep's own process, so its workers know they are not it
SWEPT = "NORMFL_SWEPT"                         # the keys a sweep varies (a JSON list): its jobs' labels and names


def swept_keys() -> list[str] | None:
    """The keys the sweep running this job varies (``SWEPT``, set by the sweep's process when it has more than one
    job, inherited by joblib's workers); None outside such a sweep."""
    return json.loads(os.environ[SWEPT]) if SWEPT in os.environ else None


def resume_command(sweep_dir=None) -> str:
    """This process's command line with the run directory (a sweep's: its directory) fixed and resume on (also
    what ``cli`` prints after Ctrl-C stops a single run)."""
    from hydra.core.hydra_config import HydraConfig

    where = (f"hydra.sweep.dir={shown(sweep_dir)}" if sweep_dir is not None
             else f"hydra.run.dir={shown(HydraConfig.get().runtime.output_dir)}")
    keep = [a for a in sys.argv[1:] if not a.startswith(("hydra.run.dir=", "hydra.sweep.dir=", "resume="))]
    return " ".join(shlex.quote(a) for a in [interpreter(), sys.argv[0], *keep, where])


def interpreter() -> str:
    """How to call this Python again: ``python`` when that is the one on PATH, else its path."""
    on_path = shutil.which("python")
    if on_path and os.path.realpath(on_path) == os.path.realpath(sys.executable):
        return "python"
    return shown(sys.executable)


def scheduled() -> bool:
    """Whether this process is a job that submitit runs for a sweep (on SLURM, or its local executor): a signal it
    gets is its own (``scancel``, a time limit), not its sweep's, as a joblib worker's is."""
    return "SUBMITIT_EXECUTOR" in os.environ


def in_worker() -> bool:
    """Whether this process runs jobs for a sweep's own process (joblib's workers, submitit's jobs), not the sweep
    itself."""
    return scheduled() or os.environ.get(SWEEP_PID, str(os.getpid())) != str(os.getpid())


def stop_asked(sweep_dir) -> int | None:
    """The signal that asked the sweep in ``sweep_dir`` to stop, if one did."""
    try:
        return int((Path(sweep_dir) / OUTCOMES / STOP).read_text())
    except (OSError, ValueError):
        return None


def ask_stop(sweep_dir, signum: int) -> None:
    if stop_asked(sweep_dir) is None:
        (Path(sweep_dir) / OUTCOMES).mkdir(parents=True, exist_ok=True)
        write_atomic(Path(sweep_dir) / OUTCOMES / STOP, str(int(signum)))


def not_started(sweep_dir, num, overrides: list[str], out_dir: Path) -> dict:
    """A job whose sweep was asked to stop before it began: it leaves nothing but its outcome (the folder
    Hydra made for it goes if it holds nothing)."""
    try:
        out_dir.rmdir()
    except OSError:                             # not empty: an earlier run's, kept as it is
        pass
    forget_log(out_dir)
    note(sweep_dir, num, overrides, "not started", out_dir if out_dir.is_dir() else None)
    return {"status": "not started"}


def forget_log(out_dir: Path) -> None:
    """Detach the log file of a job that did not run (Hydra's handler, which opens it at its first line): a line
    logged after the job (submitit's "Job completed successfully") made the handler open it in the folder the
    refusal removed, and that FileNotFoundError failed the whole sweep under the submitit and SLURM launchers;
    where the folder stays (an earlier run's), the line went into that run's log."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).parent == out_dir.absolute():
            root.removeHandler(handler)
            handler.close()


def note(sweep_dir, num, overrides: list[str], status: str, out_dir=None, why: str | None = None) -> None:
    """Record a sweep job's outcome, and why where it did not finish, beside the sweep's jobs, where
    ``SweepReport`` finds it after the sweep, whichever process or machine ran the job (Hydra's launchers: basic,
    joblib, SLURM, stacked), and rewrite the sweep's table of jobs (``jobs.csv``: job, folder, status, reason and
    swept values)."""
    d = Path(sweep_dir) / OUTCOMES
    d.mkdir(parents=True, exist_ok=True)
    write_atomic(d / f"{num}.json", json.dumps({"job": int(num), "overrides": list(overrides), "status": status,
                                                "dir": str(out_dir) if out_dir is not None else None, "why": why}))
    write_jobs(Path(sweep_dir), outcomes(Path(sweep_dir)))


def noted(sweep_dir, num) -> dict | None:
    """The outcome a sweep's job noted, if it did."""
    try:
        return json.loads((Path(sweep_dir) / OUTCOMES / f"{num}.json").read_text())
    except (OSError, ValueError):
        return None


def outcomes(sweep_dir: Path) -> list[dict]:
    return sorted((json.loads(p.read_text()) for p in (sweep_dir / OUTCOMES).glob("*.json")), key=lambda o: o["job"])


def swept(jobs: list[dict]) -> dict[int, dict[str, str]]:
    """Each job's values of the keys that differ between the jobs (all its overrides if there is one job)."""
    values = {o["job"]: dict(a.split("=", 1) for a in o["overrides"] if "=" in a) for o in jobs}
    keys = list(dict.fromkeys(k for v in values.values() for k in v))
    if len(values) > 1:
        keys = [k for k in keys if len({v.get(k) for v in values.values()}) > 1]
    return {job: {k: v.get(k, "") for k in keys} for job, v in values.items()}


def wandb_names(hydra_cfg: DictConfig | None) -> dict:
    """A job's W&B ``name`` and ``group`` where the user set none (``logger.group``), from Hydra's settings of it
    (none without them: wandb's own). The name: in a sweep, the job's overrides of the keys the sweep varies
    (``SWEPT``, which the sweep's process sets: ``algo.beta=0.1,algo.gamma=0.01``); in a single run, a sweep of one
    job or of another sweeper, its overrides less those that leave its key unchanged (``logger=wandb``,
    ``progress=false``). The group: the experiment named (``experiment=...``, unless swept), else in a sweep the
    sweep's directory's name (a single run: none)."""
    from hydra.types import RunMode

    if hydra_cfg is None:
        return {}
    hc = hydra_cfg.hydra
    multirun = hc.mode == RunMode.MULTIRUN
    keys = swept_keys() if multirun else None

    def named(override: str) -> bool:
        key = override.split("=", 1)[0]
        return key in keys if keys is not None else key.lstrip("+~").split(".")[0] not in NOT_IN_KEY

    picked = [o for o in hc.overrides.task if named(o)]
    experiment = OmegaConf.select(hc, "runtime.choices.experiment")
    group = experiment if experiment and "experiment" not in (keys or ()) else (
        Path(str(hc.sweep.dir)).name if multirun else None)
    return {"name": ",".join(picked) or None, "group": group}


def write_jobs(sweep_dir: Path, jobs: list[dict]) -> None:
    """``jobs.csv`` at the sweep's root: which folder holds which swept values, how each job ended, and why where it
    did not finish."""
    import pandas as pd

    values = swept(jobs)
    rows = [{"job": o["job"], "folder": Path(o["dir"]).name if o.get("dir") else str(o["job"]), "status": o["status"],
             "reason": o.get("why") or "", **values[o["job"]]} for o in jobs]
    write_atomic(sweep_dir / f"{JOBS}.csv", pd.DataFrame(rows).to_csv(index=False))


class SweepStop:
    """A joblib sweep's own process while its jobs run in worker processes. Without it, joblib meets the first
    Ctrl-C by killing its workers, mid-checkpoint. With it, the first Ctrl-C or SIGTERM asks the sweep to stop:
    no job starts after it, and each running job saves a checkpoint after its step and returns ``stopped``; a
    second signal stops everything at once. A job hears of it by the signal itself (Ctrl-C in a terminal reaches
    the whole process group) or, when only this process got it (``kill <pid>``, a container's stop), from the
    stop this process writes in the sweep's directory, which a running job reads after a step (at most once a
    second: ``signals.Interrupts``). The signal is not passed on: a job in the group would get it twice.

    A worker must not die of the signal while it waits for a job or starts (joblib would then stop the sweep
    at once): the signals are blocked in this process, so the workers it starts inherit them blocked, and a
    worker's run unblocks them while it trains (``signals.Interrupts``). Here a thread takes them with
    ``sigwait`` and hands each to the main thread's handler."""

    def __init__(self, sweep_dir: Path):
        self.sweep_dir, self.asked, self.previous, self.waiter = sweep_dir, False, {}, None
        os.environ[SWEEP_PID] = str(os.getpid())
        for signum in (signal.SIGINT, signal.SIGTERM):
            if signum == signal.SIGINT or signal.getsignal(signum) == signal.SIG_DFL:
                self.previous[signum] = signal.signal(signum, self._handle)
        if hasattr(signal, "pthread_sigmask"):
            from multiprocessing import resource_tracker

            resource_tracker.ensure_running()   # started later, it would unblock them here (Python < 3.14)
            signal.pthread_sigmask(signal.SIG_BLOCK, self.previous)
            self.waiter = threading.Thread(target=self._wait, name="normfl-sweep-signals", daemon=True)
            self.waiter.start()

    def _wait(self) -> None:
        while self.previous:
            signum = signal.sigwait(self.previous)
            if self.previous:                   # not restore()'s wake-up call
                _thread.interrupt_main(signum)  # runs _handle in the main thread

    def _handle(self, signum, frame) -> None:
        if self.asked:                          # joblib then stops its workers where they stand
            self.restore()
            print(f"\nnormfl sweep: stopped at once; continue it with:\n  {resume_command(self.sweep_dir)}",
                  file=sys.stderr)
            raise Stopped(signum)
        self.asked = True
        ask_stop(self.sweep_dir, signum)
        name = signal_name(signum)
        print(f"\nnormfl sweep: stopping: no job starts after this, and each running job saves a checkpoint and "
              f"stops ({name} again stops at once)", file=sys.stderr)

    def restore(self) -> None:
        previous, self.previous = self.previous, {}
        if self.waiter is not None and self.waiter.is_alive():
            try:
                signal.pthread_kill(self.waiter.ident, next(iter(previous)))  # ends its sigwait
            except ProcessLookupError:                                        # it has just ended
                pass
            self.waiter.join(timeout=5)
        if self.waiter is not None:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, previous)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        os.environ.pop(SWEEP_PID, None)


LOCAL_LAUNCHERS = ("BasicLauncher", "JoblibLauncher", "StackedLauncher", "LocalLauncher")   # jobs run here


def listed(file, jobs: list[list[str]]) -> list[list[str]]:
    """The jobs of a listed sweep (``hydra/sweeper=listed``, ``normfl_launchers.listed``): each run of ``file`` (a
    YAML list of runs, each a list of overrides) with each of ``jobs`` (the command line's own, as Hydra's basic
    sweeper makes them), run by run."""
    try:
        runs = OmegaConf.to_container(OmegaConf.load(str(file)))
    except Exception as err:  # noqa: BLE001 (missing, unreadable, not YAML)
        raise ConfigError("hydra.sweeper.file", str(file), f"a readable YAML file ({err})") from None
    if not isinstance(runs, list) or not all(isinstance(r, list) and all(isinstance(o, str) for o in r) for r in runs):
        raise ConfigError("hydra.sweeper.file", str(file), "a YAML list of runs, each a list of overrides")
    return [[*run, *job] for run in runs for job in jobs]


def sweep_jobs(config: DictConfig) -> list[tuple[int, list[str]]]:
    """Each job of a sweep (job number, overrides) as Hydra's basic sweeper, or normfl's listed one, will number
    them; none for other sweepers."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    hc = config.hydra
    target = str(hc.sweeper.get("_target_", ""))
    if not target.endswith((".BasicSweeper", ".ListedSweeper")):
        return []
    loader = GlobalHydra.instance().config_loader()
    params = [f"{k}={v}" for k, v in (hc.sweeper.get("params") or {}).items()]
    jobs = basic_sweep(OverridesParser.create(config_loader=loader).parse_overrides([*params, *hc.overrides.task]))
    return list(enumerate(listed(hc.sweeper.file, jobs) if target.endswith(".ListedSweeper") else jobs))


def other_sweep(config: DictConfig, jobs: list[tuple[int, list[str]]]) -> ConfigError | None:
    """A sweep directory whose numbered job folders hold another sweep's jobs (another job's overrides under the
    same number): its jobs would each be refused, and this sweep's table would replace that sweep's. The same
    overrides continue a sweep, and added values add jobs; anything else is refused before the sweep starts."""
    hc = config.hydra
    if OmegaConf.to_container(hc.sweep, resolve=False).get("subdir") != "${hydra.job.num}":
        return None                                          # folders not by number (a run store's keys)
    sweep_dir = Path(str(hc.sweep.dir))
    for num, overrides in jobs:
        saved = sweep_dir / str(num) / ".hydra" / "overrides.yaml"
        there = list(OmegaConf.load(saved)) if saved.is_file() else overrides
        if set(there) != set(overrides):
            ran = " ".join(o for o in there if o not in overrides) or "-"
            would = " ".join(o for o in overrides if o not in there) or "-"
            return ConfigError("hydra.sweep.dir", str(sweep_dir), f"a new directory, or this one's own sweep again: "
                               f"it holds another sweep (its job {num} ran {ran}; here: {would})")
    return None


def refusals(config: DictConfig, jobs: list[tuple[int, list[str]]]) -> list[tuple[int, list[str], ConfigError]]:
    """The jobs of a sweep that their validation will refuse, each (job number, overrides, error), found before any
    job starts, as Hydra's basic sweeper will number them; none for other sweepers, and none for launchers whose
    jobs run elsewhere (SLURM: another machine's cores and devices). A job whose config composes or validates
    only where it runs (its data's client count, say) is left to the job."""
    from hydra.core.global_hydra import GlobalHydra

    from normfl.config import validate

    if not str(config.hydra.launcher.get("_target_", "")).endswith(LOCAL_LAUNCHERS):
        return []
    loader = GlobalHydra.instance().config_loader()
    found = []
    for num, overrides in jobs:
        try:
            cfg = loader.load_sweep_config(config, list(overrides))
            with open_dict(cfg):
                del cfg["hydra"]
            validate(cfg)
        except ConfigError as err:
            found.append((num, list(overrides), err))
        except Exception:  # noqa: BLE001 (not refused here; the job says what it is)
            continue
    return found


def early_warning(launcher: DictConfig) -> ConfigError | None:
    """A scheduler's warning (submitit's ``signal_delay_s``) set to come before the job's time limit
    (``timeout_min``) even begins: the job would save a checkpoint and be requeued as soon as it started, again and
    again."""
    delay, limit = launcher.get("signal_delay_s"), launcher.get("timeout_min")
    if delay is None or limit is None or delay < limit * 60:
        return None
    return ConfigError("hydra.launcher.signal_delay_s", delay, f"fewer seconds than the time limit "
                       f"hydra.launcher.timeout_min={limit} ({limit * 60} s), which it comes before: the warning to "
                       "save a checkpoint and be requeued")


def refuse_a_file(key: str, path) -> None:
    if Path(str(path)).exists() and not Path(str(path)).is_dir():
        sys.exit(f"normfl: {ConfigError(key, str(path), 'a directory (this path is a file)')}")


class SweepReport(Callback):
    """After a sweep (``conf/config.yaml``'s ``hydra.callbacks``): its directory, a table of the swept values
    against each job's outcome (also in ``jobs.md``), a line per job refused, failed or stopped with its reason, and
    exit status 1 if there was one; where a job was stopped (a scheduler's time limit or ``scancel``), the command
    that continues it; a sweep stopped by a signal prints that command and exits 128 + the signal.
    Under the joblib launcher, the sweep's process takes Ctrl-C and SIGTERM while the sweep runs (``SweepStop``)."""

    stop: SweepStop | None = None

    def __getstate__(self) -> dict:             # pickled to joblib's workers with Hydra's context: the stop is ours
        return {k: v for k, v in self.__dict__.items() if k != "stop"}

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        """A run directory that is a file is refused in one line before Hydra makes it (its mkdir raised)."""
        refuse_a_file("hydra.run.dir", config.hydra.run.dir)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        refuse_a_file("hydra.sweep.dir", config.hydra.sweep.dir)
        try:
            jobs = sweep_jobs(config)
        except ConfigError as err:
            sys.exit(f"normfl: {err}")
        if clash := other_sweep(config, jobs) or early_warning(config.hydra.launcher):
            sys.exit(f"normfl: {clash}")
        sweep_dir = Path(str(config.hydra.sweep.dir))
        (sweep_dir / OUTCOMES / STOP).unlink(missing_ok=True)           # asked of an earlier sweep here
        os.environ.pop(SWEPT, None)
        if len(jobs) > 1:                       # the keys its jobs' W&B names show (wandb_names)
            values = swept([{"job": num, "overrides": overrides} for num, overrides in jobs])
            os.environ[SWEPT] = json.dumps(list(values[jobs[0][0]]))
        for num, overrides, err in refusals(config, jobs):
            print(f"normfl sweep: job {num} will be refused ({' '.join(overrides)}): {err}", file=sys.stderr)
        if "joblib" in str(config.hydra.launcher.get("_target_", "")):
            self.stop = SweepStop(sweep_dir)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        from normfl.table import sweep_table  # here: it loads pandas and matplotlib, which a run does without

        if self.stop is not None:
            self.stop.restore()
        os.environ.pop(SWEPT, None)
        sweep_dir = Path(str(config.hydra.sweep.dir))
        if not (sweep_dir / OUTCOMES).is_dir():
            return
        signum, jobs = stop_asked(sweep_dir), outcomes(sweep_dir)
        shutil.rmtree(sweep_dir / OUTCOMES, ignore_errors=True)
        if not jobs:
            return
        write_jobs(sweep_dir, jobs)
        counts = {s: sum(o["status"] == s for o in jobs) for s in dict.fromkeys(o["status"] for o in jobs)}
        print(f"normfl sweep: {', '.join(f'{n} {s}' for s, n in counts.items())} in {shown(sweep_dir)}",
              file=sys.stderr)
        ran = [Path(o["dir"]) for o in jobs if o.get("dir") and (Path(o["dir"]) / "summary.json").is_file()]
        if ran:
            text = sweep_table(ran, list(next(iter(swept(jobs).values()))))
            write_atomic(sweep_dir / f"{JOBS}.md", text + "\n")
            print(text, file=sys.stderr)
        values = swept(jobs)
        unfinished = [o for o in jobs if o["status"] not in FINISHED]       # diverged: a result
        for o in unfinished:
            if o["status"] != "not started" or o.get("why"):
                label = " ".join(f"{k}={v}" for k, v in values[o["job"]].items() if v != "")   # "": not its key
                print(f"  job {o['job']} {o['status']} ({label}){': ' + o['why'] if o.get('why') else ''}",
                      file=sys.stderr)
        stopped = any(o["status"] in ("stopped", "not started") for o in unfinished)
        failed = any(o["status"] == "failed" for o in unfinished)     # killed, out of memory, crashed: run again
        if signum is not None or stopped or failed:
            what = (f"stopped by {signal.Signals(signum).name}; continue it" if signum is not None else
                    " and ".join(["continue its stopped jobs"] * stopped + ["retry its failed jobs"] * failed))
            print(f"normfl sweep: {what} with:\n  {resume_command(sweep_dir)}", file=sys.stderr)
        if signum is not None:
            sys.exit(128 + signum)
        if unfinished:
            sys.exit(1)
