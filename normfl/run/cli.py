"""The Hydra entry of ``train.py``: one run into Hydra's output directory; bad input refused in one line,
leaving nothing behind (``rundir``); a failing job of a sweep recorded as failed while the sweep goes on,
and the sweep's exit status non-zero, with a line per job, when any job was refused or failed."""

from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from normfl import checkpoint
from normfl.config import config_key
from normfl.results import FINISHED, record_failure, write_atomic
from normfl.run.training import INPUT_ERRORS, run

log = logging.getLogger("normfl")
OUTCOMES = ".normfl-jobs"                      # a sweep's job outcomes, in its directory until it ends


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
        note(hc.sweep.dir, hc.job.num, overrides, "refused")
        return {"status": "refused", "error": str(err)}
    except KeyboardInterrupt:
        print(f"\nnormfl: interrupted; {resume_hint(out_dir)}", file=sys.stderr)
        sys.exit(130)
    except Exception as err:  # a failed job is recorded, and a sweep carries on
        if not multirun:
            raise
        record_failure(out_dir, hc.job.num, err, config_key(cfg))
        note(hc.sweep.dir, hc.job.num, overrides, "failed")
        return {"status": "failed", "error": repr(err)}
    if multirun:
        note(hc.sweep.dir, hc.job.num, overrides, summary["status"])
    return summary


def resume_hint(out_dir: Path) -> str:
    state = checkpoint.peek(out_dir)
    if state:
        return f"the same command continues it from its checkpoint (round {state['rows'][-1]['round']}) in {out_dir}"
    return f"it had saved no checkpoint yet, so the same command starts it over in {out_dir}"


def note(sweep_dir, num, overrides: list[str], status: str) -> None:
    """Record a sweep job's outcome beside the sweep's jobs, where ``SweepReport`` finds it after the
    sweep, whichever process or machine ran the job (Hydra's launchers: basic, joblib, SLURM, stacked)."""
    d = Path(sweep_dir) / OUTCOMES
    d.mkdir(parents=True, exist_ok=True)
    write_atomic(d / f"{num}.json", json.dumps({"job": int(num), "overrides": " ".join(overrides), "status": status}))


class SweepReport(Callback):
    """After a sweep (``conf/config.yaml``'s ``hydra.callbacks``): a count of its jobs' outcomes, a line per
    job refused or failed, and exit status 1 if there was one."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        d = Path(str(config.hydra.sweep.dir)) / OUTCOMES
        jobs = sorted((json.loads(p.read_text()) for p in d.glob("*.json")), key=lambda o: o["job"])
        shutil.rmtree(d, ignore_errors=True)
        if not jobs:
            return
        counts = {s: sum(o["status"] == s for o in jobs) for s in dict.fromkeys(o["status"] for o in jobs)}
        print("normfl sweep: " + ", ".join(f"{n} {s}" for s, n in counts.items()), file=sys.stderr)
        bad = [o for o in jobs if o["status"] not in FINISHED]     # a diverged run is a result
        for o in bad:
            print(f"  job {o['job']} {o['status']}: {o['overrides']}", file=sys.stderr)
        if bad:
            sys.exit(1)
