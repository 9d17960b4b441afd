"""``hydra/launcher=stacked``: the jobs of a sweep that share model, data and seed train in one process,
side by side (``normfl.run.train_together``), every job in its own run directory as Hydra would make it.

Hydra finds launchers only in the ``hydra_plugins`` namespace package; ``train.py`` puts the folder
holding this one on the import path.
"""

from __future__ import annotations

import copy
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from omegaconf import open_dict

log = logging.getLogger(__name__)


def _output_dir(cfg) -> tuple[Path, object]:
    """The task each job runs under Hydra: nothing but noting where Hydra put its run directory (and
    Hydra's config of the job, which the run records once it is accepted)."""
    return Path(HydraConfig.get().runtime.output_dir), copy.deepcopy(HydraConfig.instance().cfg)


def _closing_line(summary: dict, run_dir: Path) -> None:
    """A finished run's closing line, plain on stdout as a job of any other launcher ends (a failed run's error and
    traceback were logged where it failed: these runs keep no log file of their own)."""
    from normfl.results import FINISHED, closing_line
    from normfl.run.terminal import fresh

    if summary.get("status") in FINISHED:
        print(fresh(sys.stdout) + closing_line(summary, run_dir), flush=True)


class StackedLauncher(Launcher):
    def __init__(self, max_runs: int = 32) -> None:
        self.max_runs = int(max_runs)
        self.config = self.hydra_context = self.task_function = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from normfl.run import train_together
        from normfl.run.sweep import note
        from normfl.run.terminal import fresh_lines

        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        log.info(f"Preparing {len(job_overrides)} jobs to train side by side (at most {self.max_runs} at once)")
        jobs: list[JobReturn] = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = idx
                sweep_config.hydra.job.num = idx
            jobs.append(run_job(hydra_context=self.hydra_context, task_function=_output_dir, config=sweep_config,
                                job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir"))
            configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        fresh_lines(logging.getLogger())                 # no log line continues a bar on a terminal
        summaries = train_together([(job.cfg, job.return_value[0], list(job.overrides), job.return_value[1])
                                    for job in jobs], self.max_runs,
                                   ended=lambda i, summary: _closing_line(summary, jobs[i].return_value[0]))
        for idx, (job, summary) in enumerate(zip(jobs, summaries, strict=True), start=initial_job_idx):
            run_dir, job.return_value = job.return_value[0], summary      # the run's folder: for jobs.md's table
            note(self.config.hydra.sweep.dir, idx, list(job.overrides), summary["status"], run_dir)
        return jobs
