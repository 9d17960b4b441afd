"""A figure's grid through a Hydra launcher (``python -m normfl.reproduce run ID --launcher NAME``,
``make <id> launcher=slurm``): one listed ``train.py -m`` sweep of the grid's runs not finished, each job writing
into its run store folder, finished runs given no job; and the launcher's settings refused before any job."""

from __future__ import annotations

import json
import subprocess
from argparse import Namespace

import pytest

from normfl.config import config_key
from normfl.reproduce import __main__ as driver
from normfl.reproduce import jobs, targets
from tests.helpers import REPO, train_command


def tiny(data_root, *values: str) -> list[jobs.Job]:
    """Runs of a grid, small: Fashion-MNIST logreg for 2 rounds, one per value (``algo.beta=0.01``, ...)."""
    base = ["algo=normec", "dataset=fashion_mnist", "dataset.train_limit=600", "dataset.test_limit=100",
            "model=logreg", "clients=3", "rounds=2", f"data_root={data_root}"]
    return [jobs.Job({}, [*base, v], jobs.key((*base, v))) for v in values]


@pytest.mark.slow
def test_a_launch_writes_each_job_into_its_store_folder_and_skips_finished_ones(tmp_path, data_root):
    args = Namespace(profile="paper", store=tmp_path / "store", threads=1, launcher="basic", overrides=["seed=3"],
                     retry_failed=False)
    grid = tiny(data_root, "algo.beta=0.01", "algo.beta=0.1")
    assert driver.launch([targets.get("normec-t2")], grid, args) == 0
    folders = sorted((tmp_path / "store").iterdir())
    assert len(folders) == 2
    from omegaconf import OmegaConf

    for d in folders:
        assert d.name == config_key(OmegaConf.load(d / ".hydra" / "config.yaml"))
        assert json.loads((d / "summary.json").read_text())["status"] == "completed"
    before = {d: (d / "summary.json").read_text() for d in folders}
    driver.launch([targets.get("normec-t2")], grid, args)                  # nothing is trained again
    assert {d: (d / "summary.json").read_text() for d in folders} == before
    assert len(list((tmp_path / "launches" / "normec-t2").iterdir())) == 1   # no sweep the second time
    table = next((tmp_path / "launches" / "normec-t2").glob("*/jobs.csv")).read_text()
    assert folders[0].name in table and "algo.beta" in table


def test_make_passes_a_launcher_and_its_settings_to_the_driver():
    out = subprocess.run(["make", "-n", "normec-t2", "launcher=slurm", "ARGS=hydra.launcher.partition=gpu"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert "--launcher slurm" in out.stdout and "hydra.launcher.partition=gpu" in out.stdout, out.stdout


def test_a_slurm_warning_set_to_come_before_the_time_limit_begins_is_refused_before_any_job(tmp_path):
    """submitit's warning (``signal_delay_s``) comes that long before the limit (``timeout_min``): at or above it, a
    job would save a checkpoint and be requeued as soon as it started, again and again. Refused before SLURM is
    asked anything (this machine needs none)."""
    out = subprocess.run(train_command("hydra/launcher=slurm", "hydra.launcher.timeout_min=2", "algo.beta=0.1,1",
                                       f"hydra.sweep.dir={tmp_path / 'sweep'}", multirun=True),
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and not (tmp_path / "sweep").exists()
    assert out.stderr.strip() == ("normfl: invalid config: hydra.launcher.signal_delay_s=120; allowed: fewer seconds "
                                  "than the time limit hydra.launcher.timeout_min=2 (120 s), which it comes before: "
                                  "the warning to save a checkpoint and be requeued")
