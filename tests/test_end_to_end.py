"""Whole runs through `python train.py` on slices of the real datasets."""

import json
import math
import os

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from tests.helpers import CONF, REPO, train

pytestmark = pytest.mark.slow            # every test here trains or times whole runs

FMNIST = ["dataset=fashion_mnist", "model=logreg", "clients=4", "rounds=6", "eval_every=2",
          "dataset.train_limit=2000", "dataset.test_limit=500", "progress=false"]


def test_fashion_mnist_run_is_complete_and_deterministic(tmp_path, data_root):
    for name in ("a", "b"):
        train(data_root, *FMNIST, "backend=sequential", f"hydra.run.dir={tmp_path / name}")
    a, b = (pd.read_csv(tmp_path / n / "metrics.csv") for n in ("a", "b"))
    assert list(a["round"]) == list(range(7))
    pd.testing.assert_frame_equal(a.drop(columns="wall_time"), b.drop(columns="wall_time"))
    assert a["test_acc"].notna().sum() == 4                  # rounds 0, 2, 4, 6
    assert a["train_loss"].iloc[-1] < a["train_loss"].iloc[1]
    assert (a["transmissions"].iloc[1:] == 4).all() and a["bytes_uploaded"].iloc[1] == 4 * 7850 * 4
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["data"] == "Fashion-MNIST"
    assert summary["final_test_acc"] == a["test_acc"].iloc[-1]
    hist = pd.read_csv(tmp_path / "a" / "partition.csv", index_col=0)
    assert len(hist) == 4 and hist["total"].sum() == 2000


def test_cifar10_private_run_on_jpeg_copy(tmp_path, data_root):
    train(data_root, "algo=dp_normec", "clients=3", "rounds=2", "dataset.train_limit=300",
          "dataset.test_limit=100", "save_params=true", "backend=vmap", "progress=false",
          f"hydra.run.dir={tmp_path}")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["data"] == "CIFAR-10 (JPEG copy)" and summary["status"] == "completed"
    sigma = math.sqrt(2 * math.log(1e5)) / 8                  # paper rule with K = 2 rounds
    assert summary["noise_std"] == pytest.approx(sigma) and summary["backend"] == "vmap"
    assert np.load(tmp_path / "params.npy").shape == (269_722,)


def test_divergence_is_recorded_and_sweep_carries_on(tmp_path, data_root):
    out = train(data_root, *FMNIST, "algo=dpsgd_norm", "algo.gamma=1e38,0.1,-1", f"hydra.sweep.dir={tmp_path}",
                "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", multirun=True, code=1)
    # the jobs ran in joblib's worker processes; the sweep still counts them and names the refused one
    assert "normfl sweep: 1 diverged, 1 completed, 1 refused" in out.stderr
    assert "job 2 refused: invalid config: algo.gamma=-1; allowed: a number > 0" in out.stderr
    said = "algo=dpsgd_norm algo.gamma=-1): invalid config: algo.gamma=-1"   # said before any job started
    assert out.stderr.index("normfl sweep: job 2 will be refused (") < out.stderr.index(said) < \
        out.stderr.index("normfl: job 2 refused"), out.stderr
    jobs = {d.name.split("_", 1)[0]: d for d in tmp_path.iterdir() if d.is_dir()}
    assert sorted(jobs) == ["0", "1"]                      # job 2 (gamma=-1) refused, no directory left
    status = [json.loads((jobs[j] / "summary.json").read_text())["status"] for j in ("0", "1")]
    assert status == ["diverged", "completed"]
    diverged = pd.read_csv(jobs["0"] / "metrics.csv")
    assert diverged["round"].iloc[-1] < 6


def test_wandb_offline_logger_needs_no_network(tmp_path, data_root, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    train(data_root, *FMNIST, "logger=wandb", "logger.mode=offline", f"hydra.run.dir={tmp_path}")
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1 and runs[0].stat().st_size > 0
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "completed"


def test_fed_normec_full_participation_reproduces_normec_run(tmp_path, data_root):
    common = [*FMNIST, "backend=sequential", "algo.beta=0.1", "algo.gamma=0.1", "algo.alpha=0.01"]
    train(data_root, *common, "algo=normec", "algo.server_norm=false", f"hydra.run.dir={tmp_path / 'ec'}")
    train(data_root, *common, "algo=fed_normec", "p=1", f"hydra.run.dir={tmp_path / 'fed'}")
    a, b = (pd.read_csv(tmp_path / n / "metrics.csv") for n in ("ec", "fed"))
    cols = ["round", "train_loss", "test_loss", "test_acc", "transmissions_total"]
    pd.testing.assert_frame_equal(a[cols], b[cols])


def test_private_partial_participation_run_reports_its_privacy(tmp_path, data_root):
    train(data_root, *FMNIST, "algo=dp_fed_normec", "p=0.5", f"hydra.run.dir={tmp_path}")
    m = pd.read_csv(tmp_path / "metrics.csv")
    sent = m["transmissions"].iloc[1:]
    assert sent.min() >= 0 and sent.max() <= 4 and m["transmissions_total"].iloc[-1] == sent.sum()
    assert m["bytes_total"].iloc[-1] == sent.sum() * 7850 * 4
    evals = m.dropna(subset=["test_acc"])
    assert evals["eps_pld"].is_monotonic_increasing and evals["eps_rdp"].iloc[0] == 0
    priv = json.loads((tmp_path / "summary.json").read_text())["privacy"]
    sigma = 0.5 * math.sqrt(6 * math.log(1e5)) / 8          # p σ_mult with K = 6 rounds
    assert priv["noise_multiplier"] == pytest.approx(sigma)
    assert priv["amplification_claimed"] is False and "no amplification" in priv["assumptions"]
    assert priv["epsilon_pld"] == pytest.approx(evals["eps_pld"].iloc[-1])


@pytest.mark.parametrize("overrides, uploads", [
    (["algo=fed_normec", "algo.local_operator=ig", "algo.ig_batch_size=125"], 4),
    (["algo=fed_normec", "algo.local_steps=3", "backend=vmap"], 4),
    (["algo=dp_fedavg", "algo.participation=cohort", "algo.cohort_size=2", "algo.noise_by=server"], 2),
])
def test_federated_variants_run(tmp_path, data_root, overrides, uploads):
    train(data_root, *FMNIST, "rounds=2", *overrides, f"hydra.run.dir={tmp_path}")
    m = pd.read_csv(tmp_path / "metrics.csv")
    assert (m["transmissions"].iloc[1:] == uploads).all()
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "completed"


def test_dp_normfedavg_run_logs_bits_full_train_loss_and_privacy(tmp_path, data_root):
    train(data_root, "experiment=nfa_t4_qtdl", "clients=10", "algo.cohort_size=5", "algo.local_steps=2",
          "rounds=3", "dataset.train_limit=2400", "dataset.test_limit=500", "progress=false",
          f"hydra.run.dir={tmp_path}")
    m = pd.read_csv(tmp_path / "metrics.csv")
    assert (m["bits_per_coord"] == 14).all() and m["full_train_loss"].notna().all()    # s = 2^12, d = 328,810
    assert m["bytes_uploaded"].iloc[1] == 5 * 328_810 * 14 / 8
    assert list(m["eps_composed"]) == [0.0, 10.0, 20.0, 30.0]                          # (10, ·) per message
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["privacy"]["m"] == 413 and summary["privacy"]["per_message"]["delta_exact"] > 0.4
    assert summary["last5_mean_test_acc"] == pytest.approx(m["test_acc"].tail(4).mean())


def test_ali_dpfl_run_logs_tau_and_stops_at_the_privacy_budget(tmp_path, data_root):
    train(data_root, "experiment=alidpfl_fmnist", "dataset.train_limit=4000", "dataset.test_limit=300",
          "algo.rc_override=6", "rounds=5", "progress=false", f"hydra.run.dir={tmp_path}")
    m = pd.read_csv(tmp_path / "metrics.csv")
    assert m["steps_total"].iloc[-1] == 6 and len(m) - 1 < 5                 # R_c = 6 steps end it before R_s = 5
    assert list(m["tau"].iloc[1:].cumsum()) == list(m["steps_total"].iloc[1:]) and m["tau"].iloc[1] == 1
    assert (m["eps_paper"].diff().iloc[1:] > 0).all() and (m["eps_pld"] <= m["eps_paper"]).all()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["privacy"]["R_c"] == 6


def test_paths_typed_with_a_tilde_are_read_from_home(tmp_path):
    """``~`` in dataset.path and in data_root is the home directory, for the checks as for the loaders, typed as a
    shell passes it (``dataset.path='~/x.npz'`` or unquoted: ``dataset.path`` is no shell variable, so the shell
    leaves the ``~``, which Hydra's grammar refuses unquoted) or quoted for Hydra; the recorded config keeps the
    path as typed (hydra.run.dir, which Hydra would take literally, is expanded before Hydra reads it)."""
    home = tmp_path / "home"
    home.mkdir()
    r = np.random.default_rng(0)
    x, y = r.random((120, 1, 8, 8)).astype(np.float32), r.integers(0, 3, 120)
    np.savez(home / "x.npz", x=x, y=y, x_test=x[:30], y_test=y[:30], client=np.arange(120) % 3)

    def train_at_home(*overrides):
        train(None, "model=logreg", "rounds=1", "progress=false", *overrides, env={**os.environ, "HOME": str(home)})

    train_at_home("dataset=npz", "dataset.path=~/x.npz", "partition=natural", "hydra.run.dir=~/npz")   # Hydra's key too
    recorded = OmegaConf.load(home / "npz" / ".hydra" / "config.yaml")
    assert recorded.dataset.path == "~/x.npz" and recorded.clients == 3        # partition=natural read the file
    train_at_home("dataset=fashion_mnist", "dataset.train_limit=500", "dataset.test_limit=100", "clients=2",
                  "data_root='~/data'", f"hydra.run.dir={tmp_path / 'fmnist'}")
    assert (home / "data" / "FashionMNIST" / "raw").is_dir() and not (REPO / "~").exists()


def test_collect_gathers_a_sweep_into_one_table(tmp_path, data_root):
    from normfl.collect import collect

    train(data_root, *FMNIST, "rounds=2", "algo.beta=0.1,0.2", f"hydra.sweep.dir={tmp_path}", multirun=True)
    table = collect(tmp_path, keys=("algo.beta", "rounds"))
    assert sorted(table["algo.beta"]) == [0.1, 0.2] and (table["rounds"] == 2).all()
    assert (table["status"] == "completed").all() and table["final_test_acc"].between(0, 1).all()


def test_sweep_through_submitit_launcher(tmp_path, data_root):
    """hydra/launcher=slurm is hydra-submitit-launcher's SLURM launcher with our defaults; the same
    sweep runs through submitit's local executor, and a refused job does not stop the others. A refused job's
    log handler, left pointing into its removed folder, failed the sweep when submitit logged the job's end:
    a traceback, no report, and the jobs' own outcomes left behind."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        hc = compose("config", overrides=["hydra/launcher=slurm", "hydra.launcher.partition=gpu"],
                     return_hydra_config=True).hydra.launcher
    assert hc._target_.endswith("SlurmLauncher") and hc.partition == "gpu"
    assert (hc.cpus_per_task, hc.mem_gb, hc.timeout_min) == (4, 16, 360)
    assert hc.max_num_timeout == 3                        # a job at its time limit is requeued and resumes (issue 27.8)

    out = train(data_root, *FMNIST, "rounds=2", "threads=1", "algo.gamma=0.1,-1", "hydra/launcher=submitit_local",
                f"hydra.sweep.dir={tmp_path}", multirun=True, code=1)
    assert "normfl sweep: 1 completed, 1 refused in " in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not (tmp_path / ".normfl-jobs").exists()        # the sweep's report gathered the outcomes
    jobs = sorted(d.name for d in tmp_path.iterdir() if d.is_dir() and d.name[0].isdigit())
    assert jobs == ["0"]                                   # job 1 (gamma=-1) refused, no directory left
    assert json.loads((tmp_path / "0" / "summary.json").read_text())["status"] == "completed"
    table = pd.read_csv(tmp_path / "jobs.csv")              # which job ran which γ, and how it ended
    assert list(table["status"]) == ["completed", "refused"] and list(table["algo.gamma"]) == [0.1, -1]


def test_more_clients_than_samples_with_sampled_shards(tmp_path, data_root):
    """5,000 clients on 2,000 samples: only the cohort of 10 computes each round."""
    train(data_root, *FMNIST, "clients=5000", "partition=sampled_shards", "algo=fed_normec",
          "algo.memory_update=participants_only", "algo.participation=cohort", "algo.cohort_size=10",
          "rounds=3", f"hydra.run.dir={tmp_path}")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["clients"] == 5000 and summary["peak_rss_mb"] > 0
    assert (pd.read_csv(tmp_path / "metrics.csv")["transmissions"].iloc[1:] == 10).all()
    assert len(pd.read_csv(tmp_path / "partition.csv", index_col=0)) == 5000
