"""The README's "A first hour" block runs as written: every CPU command of it, in order, in a fresh working
directory, at a small scale (a few rounds on slices of the data, appended as the last overrides); the GPU
command composes into a valid config and the SLURM one reaches the driver with its launcher."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from tests.helpers import CONF, OFFLINE, REPO

SMALL = ["rounds=2", "eval_every=1", "dataset.train_limit=600", "dataset.test_limit=100"]


def first_hour() -> list[tuple[str, str]]:
    """(command, marker) for each command of the README's first-hour block; marker: '', 'GPU' or 'SLURM'."""
    text = (REPO / "README.md").read_text()
    block = re.search(r"## A first hour\n.*?```bash\n(.*?)```", text, re.S)[1]
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        command, _, comment = line.partition("#")
        if command.strip():
            out.append((" ".join(command.split()), comment.strip()))
    return out


def test_the_block_holds_the_six_tasks():
    commands = first_hour()
    assert [m for _, m in commands if m] == ["GPU", "SLURM"]
    assert sum(c.startswith("python train.py") for c, _ in commands) >= 5
    assert sum(c.startswith("python -m normfl.collect") for c, _ in commands) == 2


@pytest.mark.slow
def test_the_first_hour_runs_as_written(tmp_path, data_root):
    from normfl.data import load_fashion_mnist

    ds = load_fashion_mnist(str(data_root), str(OFFLINE)).head(1000, 200)     # example 4's own data
    np.savez(tmp_path / "my.npz", x=ds.x_train.numpy(), y=ds.y_train.numpy(), x_test=ds.x_test.numpy(),
             y_test=ds.y_test.numpy())
    for command, marker in first_hour():
        words = shlex.split(command)
        if marker == "GPU":                             # no GPU here: the overrides compose into a valid config
            with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
                assert compose(config_name="config", overrides=words[2:]).device.name == "cuda"
            continue
        if marker == "SLURM":                           # no cluster here: make hands the launcher to the driver
            out = subprocess.run([*words[:1], "-n", *words[1:]], cwd=REPO, capture_output=True, text=True, timeout=60)
            assert out.returncode == 0 and "--launcher slurm" in out.stdout, out.stderr
            continue
        if words[:2] == ["python", "train.py"]:
            words = [sys.executable, str(REPO / "train.py"), *words[2:], *SMALL, f"data_root={data_root}",
                     f"offline_data={OFFLINE}", "progress=false"]
        else:
            assert words[:3] == ["python", "-m", "normfl.collect"], command
            words = [sys.executable, *words[1:]]
        out = subprocess.run(words, cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, f"{command}\n{out.stderr[-3000:]}"
        if "normfl.collect" not in command:
            assert "normfl: completed in " in out.stdout, command
    for made in ("outputs/runs/dp-fedavg/summary.json", "outputs/multirun/normec-grid/jobs.csv", "grid.md",
                 "grid.png", "same-eps.png"):
        assert (tmp_path / made).is_file(), made


@pytest.mark.parametrize("path", ["README.md", "docs/configuration.md", "docs/algorithms.md", "docs/privacy.md",
                                  "docs/engine.md", "docs/reproduction.md", "docs/measurements.md"])
def test_no_example_names_a_grid_file_that_does_not_exist(path):
    text = (REPO / path).read_text()
    for name in re.findall(r"grids/(\w+)\.yaml", text):
        assert (REPO / "normfl" / "reproduce" / "grids" / f"{name}.yaml").is_file(), name
