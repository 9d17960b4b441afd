"""``hydra/sweeper=listed hydra.sweeper.file=RUNS.yaml``: a sweep over a list of runs rather than a product of lists.
Each job is one run of the file (a YAML list of runs, each a list of overrides) with the command line's overrides,
whose sweeps, if any, multiply the list (``normfl.run.sweep.sweep_jobs``, which the sweep's checks read too).
``python -m normfl.reproduce run ID --launcher NAME`` trains an ID's missing runs so: all of them in one launch (on
SLURM, one job array), whichever blocks of the grid they come from, and no job for a run already finished."""

from __future__ import annotations

from pathlib import Path

from hydra.plugins.sweeper import Sweeper
from omegaconf import OmegaConf


class ListedSweeper(Sweeper):
    def __init__(self, file: str, params: dict | None = None) -> None:
        self.file, self.params = file, params

    def setup(self, *, hydra_context, task_function, config) -> None:
        from hydra.core.plugins import Plugins

        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context,
                                                                task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> list:
        """Launch every job at once; a job that raised raises here, as under Hydra's basic sweeper."""
        from normfl.run.sweep import sweep_jobs

        jobs = [overrides for _, overrides in sweep_jobs(self.config)]
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        self.validate_batch_is_legal(jobs)
        results = self.launcher.launch(jobs, initial_job_idx=0)
        for job in results:
            _ = job.return_value
        return [results]
