"""Same config and seed, same bits: every algorithm, with each client backend, run twice in-process."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from normfl.ops import bernoulli_weights, cohort
from normfl.run import run
from tests.helpers import ALGOS, EXTRA, config


def outputs(data_root, out: Path, *overrides):
    return run_in(data_root, out, *overrides)[1:]


def run_in(data_root, out: Path, *overrides):
    """The config, metrics (wall times aside), parameters and summary of one run into ``out``."""
    cfg = config(data_root, *overrides)
    out.mkdir()
    summary = run(cfg.copy(), out)
    return cfg, pd.read_csv(out / "metrics.csv").drop(columns="wall_time"), np.load(out / "params.npy"), summary


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sequential", "vmap", "analytic", "stacked"])
@pytest.mark.parametrize("algo", ALGOS)
def test_same_seed_gives_identical_metrics_and_parameters(algo, backend, tmp_path, data_root):
    overrides = [f"algo={algo}", f"backend={backend}", *EXTRA.get(algo, [])]
    m1, p1, s1 = outputs(data_root, tmp_path / "a", *overrides)
    m2, p2, s2 = outputs(data_root, tmp_path / "b", *overrides)
    assert s1["status"] == "completed" and s1["backend"] == backend
    pd.testing.assert_frame_equal(m1, m2)
    assert p1.tobytes() == p2.tobytes()


def test_client_sampling_is_shared_across_algorithms():
    """Participation depends only on (seed, round): algorithms set up with the same seed see the same
    clients each round (FedAvg's cohort and NormFedAvg's r of n; Fed-α-NormEC's and FedAvg's Bernoulli
    draws), another seed other clients, and the draws are the documented ones."""
    from normfl.algorithms import FedAvg, FedNormEC, NormFedAvg
    from normfl.privacy import Privacy

    def made(algo, seed=3, n=50):
        algo.setup(torch.zeros(4), n, 5, Privacy(), seed)
        return algo

    fedavg = made(FedAvg(0.1, 0.1, participation="cohort", cohort_size=25))
    nfa = made(NormFedAvg(0.01, beta=[[0, 0.1]], cohort_size=25))
    bern = [made(FedNormEC(0.1, 0.1, p=0.25), n=20), made(FedAvg(0.1, 0.1, p=0.25), n=20)]
    other = made(FedAvg(0.1, 0.1, participation="cohort", cohort_size=25), seed=4)
    for k in range(5):
        ids = fedavg.sampling.draw(k, "cpu").ids
        assert torch.equal(ids, nfa.sampling.cohort(k)) and torch.equal(ids, cohort(50, 25, 3, k))
        assert not torch.equal(ids, other.sampling.draw(k, "cpu").ids)
        q = [a.sampling.draw(k, "cpu").q for a in bern]
        assert torch.equal(q[0], q[1]) and torch.equal(q[0], bernoulli_weights(20, 0.25, 3, k))


@pytest.mark.slow
def test_algo_seed_moves_the_algorithms_draws_and_nothing_else(tmp_path, data_root):
    """``algo_seed`` seeds the algorithm's noise and cohorts alone: equal to ``seed`` it is the run without it
    (whose key it leaves as it was), another value keeps the model's start and the shards and changes the
    training; the summary names it only when set."""
    from normfl.config import config_key

    overrides = ["algo=dp_fed_normec", "p=0.5", "seed=1"]
    base, m1, p1, s1 = run_in(data_root, tmp_path / "a", *overrides)
    same, m2, p2, _ = run_in(data_root, tmp_path / "b", *overrides, "algo_seed=1")
    pd.testing.assert_frame_equal(m1, m2)
    assert p1.tobytes() == p2.tobytes() and "algo_seed" not in s1
    OmegaConf.set_struct(base, False)
    del base["algo_seed"]                                                  # a config from before the key
    assert config_key(base) == s1["config_key"] != config_key(same)
    _, m3, p3, s3 = run_in(data_root, tmp_path / "c", *overrides, "algo_seed=2")
    assert s3["algo_seed"] == 2 and s3["seed"] == 1
    assert m3["test_loss"].iloc[0] == m1["test_loss"].iloc[0]             # round 0: the same model
    assert (tmp_path / "c" / "partition.csv").read_bytes() == (tmp_path / "a" / "partition.csv").read_bytes()
    assert not np.allclose(p3, p1)


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [["algo=dp_fed_normec"], ["algo=dpfl", "model=cnn", "model.hidden=32"]])
def test_deterministic_algorithms_flag(overrides, tmp_path, data_root):
    """deterministic=true turns torch's deterministic algorithms on for the run (what makes a rerun on a GPU
    repeat every bit): every op a run uses has such a form, and on a CPU the numbers stay as they are."""
    m1, p1, _ = outputs(data_root, tmp_path / "a", *overrides, "backend=stacked", "deterministic=true")
    assert torch.are_deterministic_algorithms_enabled()
    m2, p2, _ = outputs(data_root, tmp_path / "b", *overrides, "backend=stacked")
    assert not torch.are_deterministic_algorithms_enabled()
    pd.testing.assert_frame_equal(m1, m2)
    assert p1.tobytes() == p2.tobytes()
