"""The Hydra entry of ``train.py``: one run into Hydra's output directory; bad input refused without
leaving a run directory; a failing job of a sweep recorded as failed while the sweep goes on."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from omegaconf import DictConfig

from normfl.run.training import INPUT_ERRORS, discard, record_failure, run

log = logging.getLogger("normfl")


def main(cfg: DictConfig) -> dict | None:
    """Hydra entry: run into Hydra's output dir; refuse bad configs without leaving a run dir."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    out_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    try:
        return run(cfg, out_dir)
    except INPUT_ERRORS as err:  # refused before training: no run directory is left behind
        discard(out_dir, f"{hc.job.name}.log")
        if multirun:
            log.error("job %s skipped: %s", hc.job.num, err)
            return None
        sys.exit(f"normfl: {err}")
    except Exception as err:  # a failed job is recorded, and a sweep carries on
        if not multirun:
            raise
        record_failure(out_dir, hc.job.num, err)
        return None
