"""A grid on SLURM (``python train.py -m ... hydra/launcher=slurm``): one job array, its table; a job refused, jobs
cancelled as they train and before they start, and one whose process is killed, each named with its reason; and the
same command continuing them."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from tests.helpers import REPO

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
REFUSAL = "invalid config: checkpoint_every=-1; allowed: an integer >= 0 (0: no checkpoints)"


@pytest.fixture(scope="module")
def grid(slurm):
    """The grid's sweep, run once for the session (``slurm.once``): what it printed and left, read when it ended."""
    grid = SimpleNamespace(**slurm.once("grid", lambda: sweep(slurm)))
    grid.dir = Path(grid.dir)
    return grid


def sweep(slurm) -> dict:
    """Five jobs that train the same numbers: job 0 to its end; job 1, which saves no checkpoint of its own
    (``checkpoint_every=0``), cancelled (``scancel``) as it prepares its run; job 2 refused; job 3 cancelled before
    it starts (the node's two CPUs run jobs 0 and 1 first): it leaves no output at all, which had crashed the sweep;
    job 4's Python killed (SIGKILL, as the kernel's OOM killer does) once its run is under way."""
    sweep_dir = slurm.shared / "grid"
    proc = slurm.sweep(sweep_dir, *slurm.RUN, "checkpoint_every=50,0,-1,25,10")
    array = slurm.until(lambda: slurm.array(sweep_dir))
    slurm.run("scancel", f"{array}_3")
    slurm.until(lambda: (sweep_dir / "1").is_dir(), every=0.1)   # begun (Hydra made its folder), not yet training:
    slurm.run("scancel", f"{array}_1")                            # its SIGTERM is held for the run's first step
    slurm.until(lambda: (sweep_dir / "4" / ".hydra" / "config.yaml").is_file(), every=0.1)
    job = slurm.run("scontrol", "-o", "show", "job", f"{array}_4").split()[0].removeprefix("JobId=")   # its own id
    pids = slurm.run("scontrol", "listpids", job).splitlines()[1:]
    os.kill(next(int(line.split()[0]) for line in pids if line.split()[2] == "0"), signal.SIGKILL)   # its step 0
    code, err = slurm.finished(proc)
    return {"dir": str(sweep_dir), "code": code, "err": err, "array": array, "states": slurm.states(array),
            "jobs": pd.read_csv(sweep_dir / "jobs.csv", keep_default_na=False).to_dict("list"),
            "md": (sweep_dir / "jobs.md").read_text(),
            "tasks": sorted(p.parent.name for p in (sweep_dir / ".submitit").glob("*_*/*_submitted.pkl")),
            "files": {str(i): sorted(p.name for p in (sweep_dir / str(i)).glob("*")) for i in range(5)}}


def test_a_grid_is_one_job_array_and_ends_with_its_table(grid):
    assert grid.tasks == [f"{grid.array}_{i}" for i in range(5)]              # one array, a task per job
    counts = f"normfl sweep: 1 completed, 2 stopped, 1 refused, 1 failed in {grid.dir}"
    assert "Traceback" not in grid.err and counts in grid.err, grid.err[-3000:]
    assert "| 50 | completed |" in grid.err and "| 50 | completed |" in grid.md
    assert list(grid.jobs["status"]) == ["completed", "stopped", "refused", "stopped", "failed"]
    assert list(grid.jobs["checkpoint_every"]) == [50, 0, -1, 25, 10]


def test_a_refused_job_says_why_and_slurm_records_it_failed(grid):
    assert f"job 2 refused (checkpoint_every=-1): {REFUSAL}" in grid.err, grid.err
    assert grid.jobs["reason"][2] == REFUSAL
    assert grid.states[f"{grid.array}_2"] == "FAILED" and grid.states[f"{grid.array}_0"] == "COMPLETED"


def test_a_cancelled_job_saves_a_checkpoint_and_the_sweep_names_it_stopped(grid):
    assert grid.states[f"{grid.array}_1"] == "CANCELLED by 0"
    assert "checkpoint.pt" in grid.files["1"] and "summary.json" not in grid.files["1"]
    why = grid.jobs["reason"][1]            # sacct's state where it has it, else the queue's (sacct lags under load)
    assert why in ("SIGTERM (SLURM: CANCELLED by 0)", "SIGTERM (SLURM: CANCELLED)")  # the job's own note: it took it
    assert f"job 1 stopped (checkpoint_every=0): {why}\n" in grid.err
    assert grid.code == 1
    assert "normfl sweep: continue its stopped jobs and retry its failed jobs with:\n" in grid.err


def test_a_job_whose_process_is_killed_is_named_failed_by_its_slurm_state_and_log(grid):
    assert grid.states[f"{grid.array}_4"] == "FAILED" and "summary.json" not in grid.files["4"]
    why = f"SLURM: FAILED; its log: {grid.dir}/.submitit/{grid.array}_4/{grid.array}_4_0_log.err"
    assert f"job 4 failed (checkpoint_every=10): {why}" in grid.err and grid.jobs["reason"][4] == why


def test_a_job_cancelled_before_it_starts_is_named_stopped_by_its_slurm_state(grid):
    assert f"{grid.array}_3" not in grid.states and not grid.files["3"]          # sacct keeps no record of it
    why = "SLURM: CANCELLED before it started (sacct keeps no record of it)"
    assert f"job 3 stopped (checkpoint_every=25): {why}" in grid.err and grid.jobs["reason"][3] == why


def test_the_same_command_continues_it_to_the_numbers_of_a_run_never_stopped(grid):
    command = grid.err.split("retry its failed jobs with:\n")[1].splitlines()[0]
    again = subprocess.run(shlex.split(command), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 1 and "normfl sweep: 4 completed, 1 refused in" in again.stderr, again.stderr[-3000:]
    assert "resuming from" in (grid.dir / "1" / "train.log").read_text()
    whole = pd.read_csv(grid.dir / "0" / "metrics.csv").drop(columns="wall_time")
    for job in ("1", "3", "4"):
        assert json.loads((grid.dir / job / "summary.json").read_text())["status"] == "completed"
        pd.testing.assert_frame_equal(pd.read_csv(grid.dir / job / "metrics.csv").drop(columns="wall_time"), whole)
        assert np.array_equal(np.load(grid.dir / job / "params.npy"), np.load(grid.dir / "0" / "params.npy"))
