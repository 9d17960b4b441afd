"""Run directories, from the user's side: a directory that cannot be written or is a file, a finished run's or
another config's records kept, a live run's lock held against a second run and a stale one taken over by one
claimant only, and Ctrl-C's checkpoint and command. Refusals as in tests/test_bad_input.py (``tests.helpers.refused``);
the signal and concurrency cases use real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import BAD_INPUT_BASE, REPO, refused, train, train_command, train_here


@pytest.mark.slow
def test_unwritable_output_dir(data_root):
    out = train(None, *BAD_INPUT_BASE, "hydra.run.dir=/proc/normfl-run", code=None, timeout=300)
    assert out.returncode != 0 and "/proc/normfl-run" in out.stderr


def test_a_run_directory_that_is_a_file(tmp_path, data_root):
    """Hydra's mkdir raised FileExistsError with a traceback; now one line, and the file is left as it was."""
    (tmp_path / "a-file").write_text("mine")
    refused(tmp_path, data_root, [], f"hydra.run.dir='{tmp_path / 'a-file'}'; allowed: a directory (this path is a "
            "file)", run_dir=tmp_path / "a-file")
    assert (tmp_path / "a-file").read_text() == "mine"


@pytest.mark.slow
def test_run_directory_states(tmp_path, data_root):
    """Defects 1 and 3: a refusal in a directory of a finished run keeps every record of it; a finished run
    (or checkpoint) of another config is refused, naming both configs; the same config is left alone."""
    d = tmp_path / "run"
    assert train_here(data_root, d)[0] == 0
    assert {".hydra", "summary.json", "metrics.csv"} <= set(os.listdir(d))
    refused(tmp_path, data_root, ["rounds=-1"], "rounds=-1", d)                        # defect 1
    key = json.loads((d / "summary.json").read_text())["config_key"]
    for extra in ((), ("resume=false",)):                                              # defect 3
        line = refused(tmp_path, data_root, ["seed=7", *extra], f"it holds a run of config {key}", d)
        assert "normec-" in line.split("allowed:")[1].split(";")[0]                  # and names this config's
    summary = (d / "summary.json").read_bytes()
    assert train_here(data_root, d)[0] == 0 and (d / "summary.json").read_bytes() == summary   # left as it is


@pytest.mark.slow
def test_a_live_run_holds_its_directory(tmp_path, data_root):
    """Defect 2: a second run in a directory a live run holds is refused up front and cleans up nothing;
    the first run goes on untouched, and gives the directory up when it ends."""
    d = tmp_path / "run"
    first = subprocess.Popen(train_command(f"data_root={data_root}", *BAD_INPUT_BASE, "rounds=100000",
                                           f"hydra.run.dir={d}"), cwd=REPO, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        while first.poll() is None and not (d / "metrics.csv").exists():
            time.sleep(0.01)
        assert json.loads((d / ".lock").read_text())["pid"] == first.pid
        line = refused(d / ".hydra", data_root, ["rounds=100000"], f"held by pid {first.pid}", d)
        assert "hydra.run.dir=" in line and first.poll() is None            # still running
        refused(d / ".hydra", data_root, ["rounds=-1"], "rounds=-1", d)      # refused before the lock: touches nothing
        assert {".lock", "metrics.csv", "partition.csv"} <= set(os.listdir(d))
        first.send_signal(signal.SIGINT)
        assert first.wait(120) == 130, first.stderr.read()
    finally:
        first.kill()
    assert {".hydra", "metrics.csv", "train.log"} <= set(os.listdir(d)) and not (d / ".lock").exists()


@pytest.mark.slow
def test_ctrl_c_says_how_to_resume(tmp_path, data_root):
    """Defect 7: Ctrl-C says where the run's checkpoint is and the command that continues it, not a traceback;
    the run directory keeps its checkpoint and gives up its lock (issue 27: the command names the directory)."""
    d = tmp_path / "run"
    proc = subprocess.Popen(train_command(f"data_root={data_root}", *BAD_INPUT_BASE, "rounds=100000",
                                          "checkpoint_every=20", f"hydra.run.dir={d}"), cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    while proc.poll() is None and not (d / "checkpoint.pt").exists():
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    lines = [line for line in err.splitlines() if line.strip() and "[INFO]" not in line]
    assert proc.returncode == 130, err
    assert lines[0] == "normfl: stopping after this step to save a checkpoint (Ctrl-C again stops at once)", err
    assert lines[1].startswith("normfl: interrupted; checkpoint saved at step ") and lines[1].endswith(
        f" done) in {d}; continue it with:"), err
    assert lines[2].endswith(f"hydra.run.dir={d}") and len(lines) == 3, err
    assert (d / "checkpoint.pt").exists() and not (d / ".lock").exists()


def test_a_stale_lock_is_taken_over_by_one_claimant_only(tmp_path):
    """Runs starting at once on a directory whose lock a killed run left: each removed the stale lock and took
    its own, and one could remove the lock another had just taken, so two held the directory (7 of 60 trials
    of four processes). Exactly one holds it now (claimants as threads: the same race, without forking)."""
    import socket
    import threading

    from normfl.errors import ConfigError
    from normfl.run.rundir import RunDir

    def claim(d: Path, barrier, outcomes: list) -> None:
        run_dir = RunDir(d)
        barrier.wait()
        try:
            run_dir.claim("k")
            outcomes.append("held")
        except ConfigError:
            outcomes.append("refused")

    for trial in range(100):
        d = tmp_path / str(trial)
        d.mkdir()
        (d / ".lock").write_text(json.dumps({"pid": 2**22 + 1, "host": socket.gethostname(), "since": "then"}))
        barrier, outcomes = threading.Barrier(4), []
        threads = [threading.Thread(target=claim, args=(d, barrier, outcomes)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(outcomes) == ["held", "refused", "refused", "refused"], trial
