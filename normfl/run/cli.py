"""The Hydra entry of ``train.py``: one run into Hydra's output directory; bad input refused in one line,
leaving nothing behind (``rundir``); a failing run recorded as failed (a sweep goes on); every run ends
with one line saying how it went. Ctrl-C (or SIGTERM) saves a checkpoint and prints the command that continues
the run. A run that is a sweep's job notes its outcome for the sweep, which checks its jobs before they start, ends
with a table of them and stops them on Ctrl-C (``sweep``)."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import signal
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from normfl import checkpoint
from normfl.config import config_key
from normfl.errors import ConfigError, RunStopped
from normfl.results import closing_line, record_failure, shown
from normfl.run.signals import signal_name
from normfl.run.sweep import ask_stop, forget_log, in_worker, not_started, note, resume_command, scheduled, stop_asked
from normfl.run.terminal import fresh, fresh_lines
from normfl.run.training import INPUT_ERRORS, run

log = logging.getLogger("normfl")
report = logging.getLogger("normfl.report")      # plain lines on the console, and in the log (conf/config.yaml)


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
    from normfl.config.compose import compose

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
    fresh_lines(logging.getLogger(), report)     # a log or closing line never continues a bar on a terminal
    if multirun and in_worker() and stop_asked(hc.sweep.dir) is not None:
        return not_started(hc.sweep.dir, hc.job.num, overrides, out_dir)
    try:
        summary = run(cfg, out_dir, log_name=f"{hc.job.name}.log", overrides=overrides,
                      hydra_cfg=HydraConfig.instance().cfg,
                      stop_asked=functools.partial(stop_asked, hc.sweep.dir) if multirun and in_worker() else None)
    except INPUT_ERRORS as err:  # refused before training: nothing of this invocation is left
        if not multirun:
            sys.exit(f"normfl: {err}")
        print(f"{fresh(sys.stderr)}normfl: job {hc.job.num} refused: {err}", file=sys.stderr)   # no log: nothing left
        forget_log(out_dir)
        note(hc.sweep.dir, hc.job.num, overrides, "refused", out_dir, why=str(err))
        return {"status": "refused", "error": str(err)}
    except KeyboardInterrupt as err:            # Ctrl-C, or SIGTERM (``signals.Stopped``): exit 128 + the signal
        signum = getattr(err, "signum", signal.SIGINT)
        if multirun and in_worker():            # the sweep's own process prints how to continue it (SweepStop)
            if not scheduled():                 # a joblib worker's signal is its sweep's; a scheduler's job's its own
                ask_stop(hc.sweep.dir, signum)
            why = getattr(err, "why", None) or signal_name(signum)
            print(f"\nnormfl: job {hc.job.num} stopped ({why}): {saved(out_dir)}", file=sys.stderr)
            note(hc.sweep.dir, hc.job.num, overrides, "stopped", out_dir, why=why)
            return {"status": "stopped", "error": why}
        print(f"\nnormfl: interrupted; {resume_hint(out_dir, hc.sweep.dir if multirun else None)}", file=sys.stderr)
        sys.exit(128 + signum)
    except Exception as err:  # a failed run is recorded, with its traceback in the log; a sweep carries on
        quiet = isinstance(err, RunStopped) and not (hc.verbose or os.environ.get("NORMFL_TRACEBACK"))
        record_failure(out_dir, hc.job.num if multirun else out_dir.name, err, config_key(cfg), console=not quiet)
        said = str(err) if isinstance(err, RunStopped) else repr(err)      # a cause the user mends: its own words
        report.info(closing_line({"status": "failed", "error": said}, out_dir, f"{hc.job.name}.log"))
        if not multirun:
            if quiet:
                sys.exit(1)                      # its closing line said it all; the traceback is in the log
            raise
        note(hc.sweep.dir, hc.job.num, overrides, "failed", out_dir, why=said)
        return {"status": "failed", "error": said}
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
