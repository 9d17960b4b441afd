"""Bad input through `train.py`: a clear message naming what is wrong, exit status != 0, no run dir."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
FMNIST = ["dataset=fashion_mnist", "model=logreg", "clients=4", "rounds=2", "dataset.train_limit=2000",
          "progress=false"]


def refused(run_dir: Path, *overrides) -> str:
    out = subprocess.run([sys.executable, str(REPO / "train.py"), *overrides, f"hydra.run.dir={run_dir}"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert not run_dir.exists()                              # nothing written
    return out.stdout + out.stderr


@pytest.mark.parametrize("overrides, needles", [
    (["algo=dp_fedavg", "algo.bounding=none"], ["algo.bounding", "norm or clip"]),
    (["privacy.delta=null"], ["privacy.delta", "(0, 1)"]),                              # ε without δ
    (["algo=fedavg", "algo.participation=cohort", "algo.cohort_size=20"], ["algo.cohort_size", "clients=4"]),
    (["clients=5000"], ["clients", "2000 training samples"]),
    (["algo=clip21", "+algo.server_norm=true"], ["algo='clip21'", "server_norm"]),     # Clip21 has no SN
    (["resume=maybe"], ["resume", "True | False"]),
    (["algo=fed_normec", "algo.local_operator=ig", "partition=dirichlet"], ["algo.local_operator", "equal shard"]),
    (["precision=bf16", "backend=vmap"], ["precision", "backend=sequential"]),
    (["model=cnn", "backend=analytic"], ["backend='analytic'", "model=cnn", "mlp, logreg"]),
])
def test_bad_config_is_refused(overrides, needles, tmp_path, data_root):
    text = refused(tmp_path / "run", *FMNIST, f"data_root={data_root}", *overrides)
    assert all(n in text for n in needles), text[-2000:]


def test_corrupted_archive_is_named_by_its_checksum(tmp_path):
    offline = tmp_path / "offline"
    offline.mkdir()
    archive = (SHARED / "cifar10-jpeg.tar.xz").read_bytes()
    (offline / "cifar10-jpeg.tar.xz").write_bytes(archive[: len(archive) // 2])      # truncated
    shutil.copy(SHARED / "cifar10-canonical-labels.npz", offline)
    text = refused(tmp_path / "run", "rounds=1", f"data_root={tmp_path / 'root'}", f"offline_data={offline}")
    assert "cifar10-jpeg.tar.xz: sha256" in text and "corrupted or truncated" in text


def test_missing_data_and_unwritable_output_dir(tmp_path):
    text = refused(tmp_path / "run", *FMNIST, f"data_root={tmp_path / 'root'}", f"offline_data={tmp_path / 'none'}",
                   "dataset.download=false")
    assert "Fashion-MNIST not found" in text and "To provide Fashion-MNIST" in text
    text = refused(Path("/proc/normfl-run"), *FMNIST)
    assert "/proc/normfl-run" in text
