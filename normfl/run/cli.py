"""The Hydra entry of ``train.py``: one run into Hydra's output directory; bad input refused in one line,
leaving nothing behind (``rundir``); a failing run recorded as failed (a sweep goes on); every run ends
with one line saying how it went, and every sweep with a table of its jobs, its exit status non-zero,
with a line per job, when any job was refused or failed. Ctrl-C (or SIGTERM) saves a checkpoint and prints
the command that continues the run."""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import signal
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from normfl import checkpoint
from normfl.config import config_key
from normfl.results import FINISHED, closing_line, record_failure, shown, write_atomic
from normfl.run.training import INPUT_ERRORS, run

log = logging.getLogger("normfl")
report = logging.getLogger("normfl.report")      # plain lines on the console, and in the log (conf/config.yaml)
OUTCOMES = ".normfl-jobs"                      # a sweep's job outcomes, in its directory until it ends
JOBS = "jobs"                                  # the sweep's table of jobs: jobs.csv and jobs.md at its root


def main(cfg: DictConfig) -> dict | None:
    """Hydra entry: run into Hydra's output dir."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    out_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    overrides = list(hc.overrides.task)
    try:
        summary = run(cfg, out_dir, log_name=f"{hc.job.name}.log", overrides=overrides,
                      hydra_cfg=HydraConfig.instance().cfg)
    except INPUT_ERRORS as err:  # refused before training: nothing of this invocation is left
        if not multirun:
            sys.exit(f"normfl: {err}")
        print(f"normfl: job {hc.job.num} refused: {err}", file=sys.stderr)    # no log file: nothing left
        note(hc.sweep.dir, hc.job.num, overrides, "refused", out_dir)
        return {"status": "refused", "error": str(err)}
    except KeyboardInterrupt as err:            # Ctrl-C, or SIGTERM (``training.Stopped``): exit 128 + the signal
        print(f"\nnormfl: interrupted; {resume_hint(out_dir, hc.sweep.dir if multirun else None)}", file=sys.stderr)
        sys.exit(128 + getattr(err, "signum", signal.SIGINT))
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


def resume_hint(out_dir: Path, sweep_dir=None) -> str:
    """What Ctrl-C left, and the exact command that continues it (the run's directory, or the sweep's, named)."""
    state = checkpoint.peek(out_dir)
    if not state and (Path(out_dir) / "summary.json").is_file():    # Ctrl-C came as the run was ending
        ended = f"the run had ended before Ctrl-C came; its results are in {shown(out_dir)}"
        if sweep_dir is None:
            return ended
        return f"{ended}; the sweep's other jobs go on with:\n  {resume_command(sweep_dir)}"
    command = resume_command(sweep_dir)
    if not state:
        return f"it had saved no checkpoint, so this command starts it over in {shown(out_dir)}:\n  {command}"
    step, k = state.get("step", state["rows"][-1].get("steps")), state["rows"][-1]["round"]
    return f"checkpoint saved at step {step} (round {k} done) in {shown(out_dir)}; continue it with:\n  {command}"


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


class SweepReport(Callback):
    """After a sweep (``conf/config.yaml``'s ``hydra.callbacks``): its directory, a table of the swept values
    against each job's outcome (also in ``jobs.md``), a line per job refused or failed, and exit status 1 if
    there was one."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        from normfl.collect import sweep_table

        sweep_dir = Path(str(config.hydra.sweep.dir))
        if not (sweep_dir / OUTCOMES).is_dir():
            return
        jobs = outcomes(sweep_dir)
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
        bad = [o for o in jobs if o["status"] not in FINISHED]     # a diverged run is a result
        for o in bad:
            print(f"  job {o['job']} {o['status']}: {' '.join(o['overrides'])}", file=sys.stderr)
        if bad:
            sys.exit(1)
