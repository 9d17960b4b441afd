"""A figure's grid through a Hydra launcher (``python -m normfl.reproduce run ID --launcher NAME``,
``make <id> launcher=slurm``): one ``train.py -m`` sweep per block whose jobs are exactly the grid's runs,
each job writing into its run store folder, finished runs left alone."""

from __future__ import annotations

import itertools
import json
import subprocess
from argparse import Namespace

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from normfl.config import config_key
from normfl.reproduce import __main__ as driver
from normfl.reproduce import jobs, targets
from tests.helpers import REPO


def expand(overrides: list[str]) -> list[tuple[str, ...]]:
    """The jobs of ``train.py -m overrides`` as Hydra's basic sweeper makes them."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    lists = [[f"{o.key_or_group}={v}" for v in (o.sweep_string_iterator() if o.is_sweep_override()
                                                  else [o.get_value_element_as_str()])] for o in parsed]
    return list(itertools.product(*lists))


@pytest.mark.slow
@pytest.mark.parametrize(("name", "profile"), [("normec_t2", "paper"), ("normfedavg_t4", "quick"),
                                               ("alidpfl_t2", "code")])
def test_the_sweeps_of_a_grid_are_its_runs(name, profile):
    keys = {config_key(jobs.compose(job)) for s in jobs.sweeps(name, profile) for job in expand(s)}
    assert keys == {j.key for j in jobs.jobs(name, profile)}


@pytest.mark.slow
def test_a_launch_writes_each_job_into_its_store_folder_and_skips_finished_ones(tmp_path, data_root, monkeypatch):
    sweep = ["algo=normec", "dataset=fashion_mnist", "dataset.train_limit=600", "dataset.test_limit=100",
             "model=logreg", "clients=3", "rounds=2", f"data_root={data_root}", "algo.beta=0.01,0.1"]
    monkeypatch.setattr(jobs, "sweeps", lambda name, profile: [sweep])
    args = Namespace(profile="paper", store=tmp_path / "store", threads=1, launcher="basic", overrides=["seed=3"])
    driver.launch(targets.get("normec-t2"), args)
    folders = sorted((tmp_path / "store").iterdir())
    assert len(folders) == 2
    from omegaconf import OmegaConf

    for d in folders:
        assert d.name == config_key(OmegaConf.load(d / ".hydra" / "config.yaml"))
        assert json.loads((d / "summary.json").read_text())["status"] == "completed"
    before = {d: (d / "summary.json").read_text() for d in folders}
    driver.launch(targets.get("normec-t2"), args)                        # nothing is trained again
    assert {d: (d / "summary.json").read_text() for d in folders} == before
    table = next((tmp_path / "launches" / "normec-t2").glob("*/0/jobs.csv")).read_text()
    assert folders[0].name in table and "algo.beta" in table


def test_make_passes_a_launcher_and_its_settings_to_the_driver():
    out = subprocess.run(["make", "-n", "normec-t2", "launcher=slurm", "ARGS=hydra.launcher.partition=gpu"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert "--launcher slurm" in out.stdout and "hydra.launcher.partition=gpu" in out.stdout, out.stdout
