"""The cluster tests: normfl driven through a real one-node SLURM (``scripts/slurm.sh``), as a cluster user drives it.

The fixture ``slurm`` uses the cluster that answers at ``$NORMFL_SLURM`` (default /tmp/normfl-slurm), or starts one
there and stops it, by the PIDs it started, when the session ends; where none can start (not root, no packages), the
tests are skipped with the script's reason. The tests own the cluster rather than ``.ci/run``: ``make test`` is the
same command on a developer's machine and in CI, and nothing is left running when it ends. They run on one xdist
worker (``xdist_group``, ``make test``'s ``--dist loadgroup``): the node's two CPUs are the machine's, and one session
starts one cluster."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, train_command

SLURM = Path(os.environ.get("NORMFL_SLURM", "/tmp/normfl-slurm"))
SCRIPT = REPO / "scripts" / "slurm.sh"


class Cluster:
    """The one-node SLURM the tests run on, and the few things they ask of it."""

    # the tests' run: Fashion-MNIST logistic regression, 4 clients, about a second of training (``rounds``: longer)
    RUN = ("algo=normec", "dataset=fashion_mnist", "model=logreg", "clients=4", "dataset.train_limit=2000",
           "dataset.test_limit=500", "rounds=300", "eval_every=100", "save_params=true")

    def __init__(self, data_root: Path):
        self.data_root = data_root

    @staticmethod
    def run(*command: str) -> str:
        return subprocess.run(command, capture_output=True, text=True, check=True, timeout=60).stdout

    def sweep(self, sweep_dir: Path, *overrides: str, **popen) -> subprocess.Popen:
        """``python train.py -m OVERRIDES hydra/launcher=slurm`` into ``sweep_dir``, a job a CPU and 1 GB, started."""
        command = train_command(f"data_root={self.data_root}", "threads=1", "progress=false", *overrides,
                                "hydra/launcher=slurm", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1",
                                f"hydra.sweep.dir={sweep_dir}", multirun=True)
        return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)

    def states(self, array: str) -> dict[str, str]:
        """Each task of a job array as ``sacct`` records it: ``{"12_0": "COMPLETED", "12_1": "FAILED", ...}``."""
        lines = self.run("sacct", "-n", "-P", "-X", "-j", array, "-o", "JobID,State").splitlines()
        return dict(line.split("|", 1) for line in lines)

    @staticmethod
    def array(sweep_dir: Path) -> str | None:
        """The SLURM job array of a sweep, from the folders submitit keeps its logs in; None before it is submitted."""
        folders = (sweep_dir / ".submitit").glob("*/*_submission.sh")
        return next((p.parent.name for p in folders if "_" not in p.parent.name), None)

    @staticmethod
    def finished(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
        """A sweep's exit status and its stderr, once it ends (killed, if it has not within ``timeout`` seconds)."""
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        return proc.returncode, err

    @staticmethod
    def until(check, timeout: float = 120, every: float = 0.5):
        """Wait for ``check()`` to hold (at most ``timeout`` seconds); its value."""
        deadline = time.monotonic() + timeout
        while not (value := check()):
            assert time.monotonic() < deadline, f"not within {timeout} s: {check.__doc__ or check}"
            time.sleep(every)
        return value

    def hurry_requeued(self, stop: threading.Event, limit: str | None = None) -> threading.Thread:
        """Until ``stop``: a requeued job is let start at once, with the time limit ``limit`` where given. SLURM holds
        one 120 s before it may start again (its BeginTime; measured here: requeued 08:45:17, eligible 08:47:19); the
        tests spare that wait, as an administrator may (``scontrol update ... StartTime=now``)."""
        def release():
            while not stop.wait(1):
                for line in self.run("squeue", "-h", "-t", "PD", "-o", "%i %r").splitlines():
                    job, reason = line.split()
                    if reason == "BeginTime":
                        subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now",
                                        *([f"TimeLimit={limit}"] if limit else [])], capture_output=True)
        thread = threading.Thread(target=release, daemon=True)
        thread.start()
        return thread


def answers() -> bool:
    """Whether a cluster answers at ``$SLURM_CONF`` already."""
    try:
        return "UP" in Cluster.run("scontrol", "ping")
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.fixture(scope="session")
def slurm(data_root):
    os.environ["SLURM_CONF"] = str(SLURM / "slurm.conf")     # the tests' sweeps and their jobs inherit it
    started = not answers()
    if started:
        out = subprocess.run([str(SCRIPT), "start"], capture_output=True, text=True, timeout=180)
        if out.returncode:
            pytest.skip(f"no SLURM here: scripts/slurm.sh start: {out.stderr.strip()[-400:]}")
    try:
        yield Cluster(data_root)
    finally:
        if started:
            subprocess.run([str(SCRIPT), "stop"], capture_output=True, timeout=120)
