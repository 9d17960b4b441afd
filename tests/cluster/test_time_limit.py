"""A job at its SLURM time limit: warned by submitit (SIGUSR2, ``hydra.launcher.signal_delay_s`` before the limit),
it saves a checkpoint where it stands, is requeued, resumes, and ends with the numbers of a run never stopped."""

from __future__ import annotations

import json
import subprocess
import threading

import numpy as np
import pandas as pd
import pytest

from tests.helpers import REPO, train_command

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_a_job_at_its_time_limit_saves_a_checkpoint_is_requeued_and_ends_as_a_run_never_stopped(slurm, tmp_path):
    # SLURM's shortest limit is a minute, and it sends the warning at the last of its checks (every 30 s) before it
    # is due: with 25 s, between 5 s and 35 s into the job. The run trains for longer on an idle CPU (60,000 rounds
    # at 1,300 a second, this machine's best in December 2026: 46 s; earlier sessions measured 400), and once requeued
    # it is given the time to end: one requeue is the point, and each costs a job's start.
    long = [*slurm.RUN, "rounds=60000", "eval_every=12000", "checkpoint_every=0"]     # checkpoints: the warning's only
    whole = subprocess.Popen(train_command(f"data_root={slurm.data_root}", "threads=1", "progress=false", *long,
                                           f"hydra.run.dir={tmp_path / 'whole'}"), cwd=REPO, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)                             # never stopped, on the other CPU
    stop = threading.Event()
    slurm.hurry_requeued(stop, limit="10")
    try:
        code, err = slurm.finished(slurm.sweep(tmp_path, *long, "hydra.launcher.timeout_min=1",
                                               "hydra.launcher.signal_delay_s=25"))
    finally:
        stop.set()
    assert whole.wait(timeout=600) == 0
    assert code == 0 and "normfl sweep: 1 completed in" in err, err[-3000:]
    array = slurm.array(tmp_path)
    log = "".join(p.read_text() for p in (tmp_path / ".submitit").glob("*/*_log.err"))
    assert "checkpoint saved at step" in log and "takes over (submitit: requeue)" in log, log[-3000:]
    attempts = slurm.run("sacct", "-n", "-P", "-X", "-D", "-j", array, "-o", "State").split()
    assert "REQUEUED" in attempts and attempts[-1] == "COMPLETED", attempts
    assert "resuming from" in (tmp_path / "0" / "train.log").read_text()
    assert json.loads((tmp_path / "0" / "summary.json").read_text())["status"] == "completed"
    resumed, never = (pd.read_csv(tmp_path / d / "metrics.csv").drop(columns="wall_time") for d in ("0", "whole"))
    pd.testing.assert_frame_equal(resumed, never)
    assert np.array_equal(np.load(tmp_path / "0" / "params.npy"), np.load(tmp_path / "whole" / "params.npy"))
