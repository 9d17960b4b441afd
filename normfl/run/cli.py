"""The Hydra entry of ``train.py``: one run into Hydra's output directory; bad input refused in one line,
leaving nothing behind (``rundir``); a failing run recorded as failed (a sweep goes on); every run ends
with one line saying how it went, and every sweep with a table of its jobs, its exit status non-zero,
with a line per job, when any job was refused or failed. Ctrl-C (or SIGTERM) saves a checkpoint and prints
the command that continues the run; in a sweep whose jobs run in worker processes (joblib), the running jobs
save theirs, none starts after, and the sweep prints the command that continues it."""

from __future__ import annotations

import _thread
import contextlib
import functools
import json
import logging
import os
import re
import shlex
import shutil
import signal
import sys
import threading
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from normfl import checkpoint
from normfl.config import config_key
from normfl.errors import ConfigError
from normfl.results import FINISHED, closing_line, record_failure, shown, write_atomic
from normfl.run.training import INPUT_ERRORS, Stopped, run, signal_name

log = logging.getLogger("normfl")
report = logging.getLogger("normfl.report")      # plain lines on the console, and in the log (conf/config.yaml)
OUTCOMES = ".normfl-jobs"                      # a sweep's job outcomes, in its directory until it ends
JOBS = "jobs"                                  # the sweep's table of jobs: jobs.csv and jobs.md at its root
STOP = "stop"                                  # in OUTCOMES once a sweep is asked to stop: the signal's number
SWEEP_PID = "NORMFL_SWEEP_PID"                 # a joblib sweep's own process, so its workers know they are not it


HOME_PATHS = re.compile(r"([^=\s'\"]+)=((?:[^,=\s'\"\[\]{}()]+,)*~[^=\s'\"\[\]{}()]*)")


def home_paths(argv: list[str]) -> list[str]:
    """The overrides with a plain value that starts with ``~`` (a path under the home directory) made readable to
    Hydra, whose grammar refuses an unquoted ``~``; a shell passes ``dataset.path=~/x.npz`` as it is, quoted or
    not (a dotted key is no shell variable). normfl's keys get the value quoted (``dataset.path='~/x.npz'``:
    normfl expands it where it reads the path, and the recorded config keeps it as typed); Hydra's own
    (``hydra.run.dir``), which Hydra would take literally, get the home directory written out. A sweep's comma
    list is done value by value; anything else is left to Hydra."""
    def readable(arg: str) -> str:
        if not (m := HOME_PATHS.fullmatch(arg)):
            return arg
        hydras = m[1].lstrip("+~").startswith("hydra.")

        def value(v: str) -> str:
            if not v.startswith("~"):
                return v
            return os.path.expanduser(v) if hydras else f"'{v}'"
        return f"{m[1]}=" + ",".join(map(value, m[2].split(",")))
    return [readable(a) for a in argv]


@contextlib.contextmanager
def hydra_errors(argv: list[str]):
    """Hydra's errors as Hydra prints them, save one: a key that exists nowhere (``rouns=3``), which Hydra answers
    by suggesting ``+rouns=3``, a key the run's validation then refuses. That one is refused at once, in the
    validation's words (the keys read there)."""
    from hydra.errors import CompactHydraException
    from omegaconf.errors import OmegaConfBaseException

    before = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"          # Hydra raises instead of printing; printed here instead
    try:
        yield
    except CompactHydraException as err:
        key = re.match(r"Could not override '([^']+)'", str(err))
        if key and (why := unknown_key(key[1], argv)):
            sys.exit(f"normfl: {why}")
        cause = f"{err.__cause__}\n" if isinstance(err.__cause__, OmegaConfBaseException) else ""
        sys.exit(f"{err}\n{cause}".rstrip())
    finally:
        if before is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = before


def unknown_key(key: str, argv: list[str]) -> str | None:
    """The refusal of the run's validation for ``key``, composed as if added (``+key=...``; a sweep by its first
    value, shown as typed); None where the command composes no other way (a config of the user's own:
    --config-dir, -cn, ...) or validation finds nothing to refuse."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from normfl.config import validate_keys
    from normfl.reproduce.jobs import compose

    if any(a.startswith(("--config", "-c")) for a in argv):
        return None
    typed = None
    try:
        overrides = []
        for o in OverridesParser.create().parse_overrides([a for a in argv if not a.startswith("-")]):
            value = next(o.sweep_string_iterator()) if o.is_sweep_override() else o.get_value_element_as_str()
            overrides.append(f"{'+' * (o.key_or_group == key)}{o.get_key_element()}={value}")
            if o.key_or_group == key:
                typed = o.input_line
        validate_keys(compose(tuple(overrides)))
    except ConfigError as err:
        return str(err).replace(f"{key}={err.value!r}", typed, 1) if typed and err.key == key else str(err)
    except Exception:                                # not composable this way: Hydra's own message stands
        return None
    return None


def main(cfg: DictConfig) -> dict | None:
    """Hydra entry: run into Hydra's output dir."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    out_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    overrides = list(hc.overrides.task)
    if multirun and in_worker() and stop_asked(hc.sweep.dir) is not None:
        return not_started(hc.sweep.dir, hc.job.num, overrides, out_dir)
    try:
        summary = run(cfg, out_dir, log_name=f"{hc.job.name}.log", overrides=overrides,
                      hydra_cfg=HydraConfig.instance().cfg,
                      stop_asked=functools.partial(stop_asked, hc.sweep.dir) if multirun and in_worker() else None)
    except INPUT_ERRORS as err:  # refused before training: nothing of this invocation is left
        if not multirun:
            sys.exit(f"normfl: {err}")
        print(f"normfl: job {hc.job.num} refused: {err}", file=sys.stderr)    # no log file: nothing left
        forget_log(out_dir)
        note(hc.sweep.dir, hc.job.num, overrides, "refused", out_dir)
        return {"status": "refused", "error": str(err)}
    except KeyboardInterrupt as err:            # Ctrl-C, or SIGTERM (``training.Stopped``): exit 128 + the signal
        signum = getattr(err, "signum", signal.SIGINT)
        if multirun and in_worker():            # the sweep's own process prints how to continue it (SweepStop)
            ask_stop(hc.sweep.dir, signum)
            print(f"\nnormfl: job {hc.job.num} stopped: {saved(out_dir)}", file=sys.stderr)
            note(hc.sweep.dir, hc.job.num, overrides, "stopped", out_dir)
            return {"status": "stopped"}
        print(f"\nnormfl: interrupted; {resume_hint(out_dir, hc.sweep.dir if multirun else None)}", file=sys.stderr)
        sys.exit(128 + signum)
    except Exception as err:  # a failed run is recorded, with its traceback in the log; a sweep carries on
        record_failure(out_dir, hc.job.num if multirun else out_dir.name, err, config_key(cfg))
        report.info(closing_line({"status": "failed", "error": repr(err)}, out_dir, f"{hc.job.name}.log"))
        if not multirun:
            raise
        note(hc.sweep.dir, hc.job.num, overrides, "failed", out_dir)
        return {"status": "failed", "error": repr(err)}
    report.info(closing_line(summary, out_dir))
    if multirun:
        note(hc.sweep.dir, hc.job.num, overrides, summary["status"], out_dir)
    return summary


def store_key(root: DictConfig) -> str:
    """The config key of the job whose config ``root`` is (its Hydra node aside): the folder of its run in a
    run store."""
    return config_key(OmegaConf.masked_copy(root, [k for k in root if k != "hydra"]))


def ended(out_dir: Path) -> bool:
    """Ctrl-C came as the run was ending: its summary is written and its checkpoint gone."""
    return (Path(out_dir) / "summary.json").is_file() and not (Path(out_dir) / checkpoint.NAME).exists()


def saved(out_dir: Path) -> str:
    """What a run stopped by Ctrl-C left in ``out_dir``."""
    if ended(out_dir):
        return f"the run had ended before Ctrl-C came; its results are in {shown(out_dir)}"
    state = checkpoint.peek(out_dir)
    if not state:
        return f"it had saved no checkpoint in {shown(out_dir)}"
    step, k = state.get("step", state["rows"][-1].get("steps")), state["rows"][-1]["round"]
    return f"checkpoint saved at step {step} (round {k} done) in {shown(out_dir)}"


def resume_hint(out_dir: Path, sweep_dir=None) -> str:
    """What Ctrl-C left, and the exact command that continues it (the run's directory, or the sweep's, named)."""
    what, done = saved(out_dir), ended(out_dir)
    if done and sweep_dir is None:
        return what
    verb = ("the sweep's other jobs go on" if done else
            "continue it" if (Path(out_dir) / checkpoint.NAME).exists() else "start it over")
    return f"{what}; {verb} with:\n  {resume_command(sweep_dir)}"


def resume_command(sweep_dir=None) -> str:
    """This process's command line with the run directory (a sweep's: its directory) fixed and resume on."""
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


def in_worker() -> bool:
    """Whether this process runs jobs for a sweep's own process (joblib's workers), not the sweep itself."""
    return os.environ.get(SWEEP_PID, str(os.getpid())) != str(os.getpid())


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


def note(sweep_dir, num, overrides: list[str], status: str, out_dir=None) -> None:
    """Record a sweep job's outcome beside the sweep's jobs, where ``SweepReport`` finds it after the
    sweep, whichever process or machine ran the job (Hydra's launchers: basic, joblib, SLURM, stacked),
    and rewrite the sweep's table of jobs (``jobs.csv``: job, folder, status and swept values)."""
    d = Path(sweep_dir) / OUTCOMES
    d.mkdir(parents=True, exist_ok=True)
    write_atomic(d / f"{num}.json", json.dumps({"job": int(num), "overrides": list(overrides), "status": status,
                                                "dir": str(out_dir) if out_dir is not None else None}))
    write_jobs(Path(sweep_dir), outcomes(Path(sweep_dir)))


def outcomes(sweep_dir: Path) -> list[dict]:
    return sorted((json.loads(p.read_text()) for p in (sweep_dir / OUTCOMES).glob("*.json")), key=lambda o: o["job"])


def swept(jobs: list[dict]) -> dict[int, dict[str, str]]:
    """Each job's values of the keys that differ between the jobs (all its overrides if there is one job)."""
    values = {o["job"]: dict(a.split("=", 1) for a in o["overrides"] if "=" in a) for o in jobs}
    keys = list(dict.fromkeys(k for v in values.values() for k in v))
    if len(values) > 1:
        keys = [k for k in keys if len({v.get(k) for v in values.values()}) > 1]
    return {job: {k: v.get(k, "") for k in keys} for job, v in values.items()}


def write_jobs(sweep_dir: Path, jobs: list[dict]) -> None:
    """``jobs.csv`` at the sweep's root: which folder holds which swept values, and how each job ended."""
    import pandas as pd

    values = swept(jobs)
    rows = [{"job": o["job"], "folder": Path(o["dir"]).name if o.get("dir") else str(o["job"]), "status": o["status"],
             **values[o["job"]]} for o in jobs]
    write_atomic(sweep_dir / f"{JOBS}.csv", pd.DataFrame(rows).to_csv(index=False))


class SweepStop:
    """A joblib sweep's own process while its jobs run in worker processes. Without it, joblib meets the first
    Ctrl-C by killing its workers, mid-checkpoint. With it, the first Ctrl-C or SIGTERM asks the sweep to stop:
    no job starts after it, and each running job saves a checkpoint after its step and returns ``stopped``; a
    second signal stops everything at once. A job hears of it by the signal itself (Ctrl-C in a terminal reaches
    the whole process group) or, when only this process got it (``kill <pid>``, a container's stop), from the
    stop this process writes in the sweep's directory, which a running job reads after a step (at most once a
    second: ``training.Interrupts``). The signal is not passed on: a job in the group would get it twice.

    A worker must not die of the signal while it waits for a job or starts (joblib would then stop the sweep
    at once): the signals are blocked in this process, so the workers it starts inherit them blocked, and a
    worker's run unblocks them while it trains (``training.Interrupts``). Here a thread takes them with
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


def sweep_jobs(config: DictConfig) -> list[tuple[int, list[str]]]:
    """Each job of a sweep (job number, overrides) as Hydra's basic sweeper will number them; none for other
    sweepers."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    hc = config.hydra
    if not str(hc.sweeper.get("_target_", "")).endswith(".BasicSweeper"):
        return []
    loader = GlobalHydra.instance().config_loader()
    params = [f"{k}={v}" for k, v in (hc.sweeper.get("params") or {}).items()]
    parsed = OverridesParser.create(config_loader=loader).parse_overrides([*params, *hc.overrides.task])
    return list(enumerate(list(o) for batch in BasicSweeper.split_arguments(parsed, None) for o in batch))


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


def refuse_a_file(key: str, path) -> None:
    if Path(str(path)).exists() and not Path(str(path)).is_dir():
        sys.exit(f"normfl: {ConfigError(key, str(path), 'a directory (this path is a file)')}")


class SweepReport(Callback):
    """After a sweep (``conf/config.yaml``'s ``hydra.callbacks``): its directory, a table of the swept values
    against each job's outcome (also in ``jobs.md``), a line per job refused or failed, and exit status 1 if
    there was one; a sweep stopped by a signal prints the command that continues it and exits 128 + the signal.
    Under the joblib launcher, the sweep's process takes Ctrl-C and SIGTERM while the sweep runs (``SweepStop``)."""

    stop: SweepStop | None = None

    def __getstate__(self) -> dict:             # pickled to joblib's workers with Hydra's context: the stop is ours
        return {k: v for k, v in self.__dict__.items() if k != "stop"}

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        """A run directory that is a file is refused in one line before Hydra makes it (its mkdir raised)."""
        refuse_a_file("hydra.run.dir", config.hydra.run.dir)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        refuse_a_file("hydra.sweep.dir", config.hydra.sweep.dir)
        jobs = sweep_jobs(config)
        if clash := other_sweep(config, jobs):
            sys.exit(f"normfl: {clash}")
        sweep_dir = Path(str(config.hydra.sweep.dir))
        (sweep_dir / OUTCOMES / STOP).unlink(missing_ok=True)           # asked of an earlier sweep here
        for num, overrides, err in refusals(config, jobs):
            print(f"normfl sweep: job {num} will be refused ({' '.join(overrides)}): {err}", file=sys.stderr)
        if "joblib" in str(config.hydra.launcher.get("_target_", "")):
            self.stop = SweepStop(sweep_dir)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        from normfl.collect import sweep_table

        if self.stop is not None:
            self.stop.restore()
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
        bad = [o for o in jobs if o["status"] not in (*FINISHED, "stopped", "not started")]   # diverged: a result
        for o in bad:
            print(f"  job {o['job']} {o['status']}: {' '.join(o['overrides'])}", file=sys.stderr)
        if signum is not None:
            print(f"normfl sweep: stopped by {signal.Signals(signum).name}; continue it with:\n  "
                  f"{resume_command(sweep_dir)}", file=sys.stderr)
            sys.exit(128 + signum)
        if bad:
            sys.exit(1)
