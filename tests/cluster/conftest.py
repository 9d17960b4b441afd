"""The cluster tests: normfl driven through a real one-node SLURM (``scripts/slurm.sh``), as a cluster user drives it.

The fixture ``slurm`` uses the cluster that answers at ``$NORMFL_SLURM`` (default /tmp/normfl-slurm), or starts one
there, and the last test process done with it stops it, by the PIDs it started; where none can start (not root, no
packages), the tests are skipped with the script's reason. The tests own the cluster rather than ``.ci/run``: ``make
test`` is the same command on a developer's machine and in CI, and nothing is left running when it ends.

``make test``'s two xdist workers may both run cluster tests (``xdist_group`` no longer keeps them on one: under
pytest 9.2 and pytest-xdist 3.8 with ``--dist loadgroup``, one group's six tests ran on both workers), so the cluster
and each sweep several tests read are made once, under a lock, by the first worker that asks (``Cluster.once``), and
read by the other."""

from __future__ import annotations

import contextlib
import fcntl
import json
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

    def __init__(self, data_root: Path, shared: Path):
        self.data_root, self.shared = data_root, shared

    def once(self, name: str, make) -> dict:
        """``make()`` (a dict, JSON), made by the first of the session's test processes to ask, read by the others
        (where it failed, they fail with its error rather than make it again)."""
        made = self.shared / f"{name}.json"
        with locked(self.shared / f"{name}.lock"):
            if not made.exists():
                try:
                    made.write_text(json.dumps(make()))
                except BaseException as err:
                    made.write_text(json.dumps({"failed": f"{type(err).__name__}: {err}"}))
                    raise
        if "failed" in (value := json.loads(made.read_text())):
            pytest.fail(f"{name}, made by another test process, failed: {value['failed']}")
        return value

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
    def finished(proc: subprocess.Popen, timeout: float = 600) -> tuple[int, str]:
        """A sweep's exit status and its stderr, once it ends (killed, if it has not within ``timeout`` seconds)."""
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        return proc.returncode, err

    @staticmethod
    def until(check, timeout: float = 300, every: float = 0.5):
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


@contextlib.contextmanager
def locked(path: Path):
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def slurm(data_root, tmp_path_factory):
    """The cluster, for every test process of the session: started by the first that finds none (its failure to
    start read by the others), stopped by the last one done with it if the tests started it."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    os.environ["SLURM_CONF"] = str(SLURM / "slurm.conf")     # the tests' sweeps and their jobs inherit it
    users, started, refused = (shared / f"slurm.{name}" for name in ("users", "started", "refused"))
    me = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with locked(shared / "slurm.lock"):
        if not refused.exists() and not answers():
            out = subprocess.run([str(SCRIPT), "start"], capture_output=True, text=True, timeout=180)
            (started if out.returncode == 0 else refused).write_text(out.stderr.strip()[-400:])
        if refused.exists():
            pytest.skip(f"no SLURM here: scripts/slurm.sh start: {refused.read_text()}")
        users.write_text((users.read_text() if users.exists() else "") + f"{me}\n")
    try:
        yield Cluster(data_root, shared)
    finally:
        with locked(shared / "slurm.lock"):
            left = [u for u in users.read_text().splitlines() if u != me]
            users.write_text("".join(f"{u}\n" for u in left))
            if not left and started.exists():
                subprocess.run([str(SCRIPT), "stop"], capture_output=True, timeout=120)
                started.unlink()
