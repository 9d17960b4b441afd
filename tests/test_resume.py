"""Checkpoint and resume: a run killed by a signal continues from its last checkpoint and ends with
the same metrics and parameters as a run never interrupted; finished runs are not rerun."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.test_end_to_end import train as train_py

REPO = Path(__file__).resolve().parents[1]
BASE = ["dataset=fashion_mnist", "model=logreg", "dataset.train_limit=2000", "dataset.test_limit=500",
        "rounds=300", "eval_every=50", "checkpoint_every=20", "progress=false", "backend=sequential",
        "save_params=true", "threads=1"]
ALGOS = {
    "normec": ["algo=normec", "clients=4", "algo.beta=0.1", "algo.gamma=0.1"],
    "dp_fed_normec": ["algo=dp_fed_normec", "clients=6", "p=0.5", "algo.beta=0.1", "algo.gamma=0.1",
                      "algo.local_steps=2"],
    "dp_normfedavg": ["algo=dp_normfedavg", "clients=6", "algo.cohort_size=3", "algo.local_steps=2",
                      "batch_size=16"],
}


def command(data_root, run_dir, *overrides):
    return [sys.executable, str(REPO / "train.py"), f"data_root={data_root}", *BASE, *overrides,
            f"hydra.run.dir={run_dir}"]


def train(data_root, run_dir, *overrides):
    return train_py(data_root, *BASE, *overrides, f"hydra.run.dir={run_dir}")


def kill_after_checkpoint(data_root, run_dir, *overrides):
    """Start the run, SIGKILL it once it has written a checkpoint and some metrics."""
    proc = subprocess.Popen(command(data_root, run_dir, *overrides), cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    while proc.poll() is None and not ((run_dir / "checkpoint.pt").exists() and (run_dir / "metrics.csv").exists()):
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


@pytest.mark.parametrize("algo", list(ALGOS))
def test_killed_run_resumes_to_identical_outputs(algo, tmp_path, data_root):
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    kill_after_checkpoint(data_root, killed, *ALGOS[algo])
    assert (killed / "checkpoint.pt").exists() and not (killed / "summary.json").exists()   # killed part-way
    assert not list(killed.glob(".*.tmp"))                                   # no half-written file left
    rows_at_kill = len(pd.read_csv(killed / "metrics.csv"))
    assert 1 <= rows_at_kill < 301
    if algo == "normec":                 # resume=false refused at its data (after the config) keeps the checkpoint
        nowhere = tmp_path / "no-data"
        out = subprocess.run([*command(nowhere, killed, *ALGOS[algo]), "resume=false", f"offline_data={nowhere}"],
                             cwd=REPO, capture_output=True, text=True)
        assert out.returncode == 1 and "not found" in out.stderr and (killed / "checkpoint.pt").exists()
    (killed / ".metrics.csv.1.2.tmp").write_text("")                        # as a kill mid-write leaves it
    out = train(data_root, killed, *ALGOS[algo])
    assert "resuming from round" in out.stdout + out.stderr
    assert not list(killed.glob(".*.tmp"))                                   # the resumed run cleared it
    train(data_root, whole, *ALGOS[algo])
    a, b = (pd.read_csv(d / "metrics.csv").drop(columns="wall_time") for d in (whole, killed))
    pd.testing.assert_frame_equal(a, b)
    assert np.array_equal(np.load(whole / "params.npy"), np.load(killed / "params.npy"))
    assert not (killed / "checkpoint.pt").exists()                           # removed once the run ended


def test_finished_run_is_not_rerun_and_another_config_is_refused(tmp_path, data_root):
    train(data_root, tmp_path, *ALGOS["normec"], "rounds=30")
    before = (tmp_path / "summary.json").read_text()
    out = train(data_root, tmp_path, *ALGOS["normec"], "rounds=30", "threads=2")     # threads: same run
    assert "already holds this config's finished run" in out.stdout + out.stderr
    assert (tmp_path / "summary.json").read_text() == before
    kill_after_checkpoint(data_root, tmp_path / "k", *ALGOS["normec"])     # leaves a lock of a dead process
    on_disk = {p.name: p.read_bytes() for p in (tmp_path / "k").rglob("*") if p.is_file() and p.name != ".lock"}
    for extra in ((), ("resume=false",)):     # another config's checkpoint is never taken over or removed
        refused = subprocess.run(command(data_root, tmp_path / "k", *ALGOS["normec"], "seed=7", *extra), cwd=REPO,
                                 capture_output=True, text=True)
        assert refused.returncode == 1 and "it holds a run of config normec-" in refused.stderr, refused.stderr
        assert {p.name: p.read_bytes() for p in (tmp_path / "k").rglob("*") if p.is_file()} == on_disk
    out = train(data_root, tmp_path / "k", *ALGOS["normec"])                 # its own config continues it
    assert "resuming from round" in out.stdout + out.stderr


def test_sweep_rerun_skips_finished_jobs_and_records_a_crash(tmp_path, data_root):
    """A job that crashes is recorded as failed with its error while the others finish; running the
    same sweep again in the same sweep dir leaves the finished jobs alone, and another sweep there is refused
    before it starts."""
    cmd = [sys.executable, str(REPO / "train.py"), "-m", f"data_root={data_root}", *BASE, "rounds=4",
           f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]", "algo=normec,crasher", "clients=4",
           f"hydra.sweep.dir={tmp_path}"]
    first = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert first.returncode == 1 and f"normfl sweep: 1 completed, 1 failed in {tmp_path}\n" in first.stderr, \
        first.stderr[-3000:]
    assert "\n  job 1 failed: " in first.stderr
    jobs = {d.name: d for d in tmp_path.iterdir() if d.is_dir() and d.name[0].isdigit()}
    done, crashed = (json.loads((jobs[j] / "summary.json").read_text()) for j in ("0", "1"))
    assert done["status"] == "completed"
    assert crashed["status"] == "failed" and "crashed on purpose in round 1" in crashed["error"]
    before = (jobs["0"] / "summary.json").read_text()
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert "already holds this config's finished run" in again.stdout + again.stderr
    assert (jobs["0"] / "summary.json").read_text() == before
    table = (tmp_path / "jobs.csv").read_text()                # another grid here would have replaced it
    other = subprocess.run([*cmd[:-3], "algo=crasher,normec", *cmd[-2:]], cwd=REPO, capture_output=True, text=True)
    assert other.returncode == 1 and other.stderr.startswith(f"normfl: invalid config: hydra.sweep.dir='{tmp_path}'")
    assert "(its job 0 ran algo=normec; here: algo=crasher)" in other.stderr
    assert (tmp_path / "jobs.csv").read_text() == table and (jobs["0"] / "summary.json").read_text() == before


def test_killed_stacked_sweep_resumes_to_identical_outputs(tmp_path, data_root):
    """hydra/launcher=stacked: the user's sweep command is unchanged and every job gets its run directory with
    its config; runs trained side by side keep a checkpoint each, so a sweep killed part-way and run again
    ends with the metrics and parameters of the sweep never interrupted."""
    def cmd(sweep_dir):
        return [sys.executable, str(REPO / "train.py"), "-m", f"data_root={data_root}", *BASE, "rounds=120",
                "hydra/launcher=stacked", "backend=stacked", "algo=normec", "clients=4", "algo.beta=0.1,1.0",
                f"hydra.sweep.dir={sweep_dir}"]

    killed, whole = tmp_path / "killed", tmp_path / "whole"
    proc = subprocess.Popen(cmd(killed), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while proc.poll() is None and len(list(killed.glob("*/checkpoint.pt"))) < 2:
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not list(killed.glob("*/summary.json"))                           # killed part-way
    again = subprocess.run(cmd(killed), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and (again.stdout + again.stderr).count("resuming from round") == 2, again.stderr
    first = subprocess.run(cmd(whole), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    jobs = sorted(d.name for d in whole.iterdir() if d.is_dir())
    assert [j.split("_", 1)[0] for j in jobs] == ["0", "1"]
    for job in jobs:
        assert (killed / job / ".hydra" / "config.yaml").is_file()
        assert json.loads((killed / job / "summary.json").read_text())["backend"] == "stacked"
        a, b = (pd.read_csv(d / job / "metrics.csv").drop(columns="wall_time") for d in (whole, killed))
        pd.testing.assert_frame_equal(a, b)
        assert np.array_equal(np.load(whole / job / "params.npy"), np.load(killed / job / "params.npy"))
