"""The ALI-DPFL authors' code settings as options (issue 19): the divisor, raw pixels, the split over
merged data with per-client test pieces, the capped Dirichlet and the per-evaluation test subset."""

import json
import logging

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from normfl.algorithms import DPFL
from normfl.config import ConfigError, config_key, validate
from normfl.data import ArrayDataset, client_test_split, dirichlet, label_histogram, normalize
from normfl.run.training import eval_subset
from tests.helpers import composed, run_dpfl, script


def test_divisor_scales_one_step_by_expected_batch_over_divisor():
    """x⁰ = 0, one step: w_i = -η (S_i + σC z_i) / B_i, so dividing by 64 instead of q|D_i| scales w_i by q|D_i|/64."""
    kw = dict(tau=1, lr=0.5, sigma=1.1, clip=100.0, sample_rate=0.5, rc_override=10)
    text, _, _ = run_dpfl(DPFL(**kw), 1, 1.55, n=1, sizes=[300])
    code, _, _ = run_dpfl(DPFL(divisor=64, **kw), 1, 1.55, n=1, sizes=[300])
    assert torch.allclose(code, text * 150 / 64)
    algo = DPFL(divisor=64, **kw)
    run_dpfl(algo, 1, 1.55, n=2, sizes=[100, 300])
    assert algo.batch.tolist() == [64.0, 64.0] and algo.weights.tolist() == [0.25, 0.75]


def test_raw_scale_keeps_pixels_and_ignores_mean_and_std():
    x = torch.arange(0, 256, dtype=torch.uint8).reshape(4, 1, 8, 8)
    assert torch.equal(normalize(x, (0.5,), (0.5,), "raw"), x.float())
    assert normalize(x, (0.5,), (0.5,)).max() == 1.0                     # unit: (1 - 0.5) / 0.5
    with pytest.raises(ValueError, match="scale='gray'"):
        normalize(x, scale="gray")


def toy(n=400, classes=10, seed=0):
    y = torch.from_numpy(np.random.default_rng(seed).integers(0, classes, n))
    x = torch.arange(n, dtype=torch.uint8).reshape(n, 1, 1, 1)           # a sample's pixel names it (mod 256)
    return ArrayDataset("toy", "toy", "test", x, y, x[:0], y[:0], classes, (), (), None, "per_client")


def test_client_test_split_keeps_each_clients_label_histogram():
    ds = toy()
    parts = dirichlet(ds.y_train.numpy(), 5, seed=3, alpha=1.0)
    new, train = client_test_split(ds, parts, 0.25, split_seed=7)
    start = 0
    test_hist = []
    for p, t in zip(parts, train, strict=True):
        n_test = len(p) - int(np.floor(0.75 * len(p)))
        assert len(t) == len(p) - n_test                                  # sklearn's train_size = 0.75
        test_hist.append(np.bincount(new.y_test[start:start + n_test].numpy(), minlength=10))
        start += n_test
        both = np.bincount(new.y_train[t].numpy(), minlength=10) + test_hist[-1]
        assert both.tolist() == np.bincount(ds.y_train[p].numpy(), minlength=10).tolist()
    assert start == len(new.y_test) and len(new.y_train) + len(new.y_test) == len(ds.y_train)
    seen = torch.cat([new.x_train, new.x_test]).flatten().tolist()
    assert sorted(seen) == sorted(ds.x_train.flatten().tolist())          # every sample once, train or test
    again, _ = client_test_split(ds, parts, 0.25, split_seed=7)
    other, _ = client_test_split(ds, parts, 0.25, split_seed=8)
    assert torch.equal(again.x_test, new.x_test) and not torch.equal(other.x_test, new.x_test)


def test_capped_dirichlet_stops_filling_a_full_client():
    """A client holding N/n samples takes nothing of the later classes, so none exceeds N/n plus one class."""
    y = np.repeat(np.arange(10), 100)
    bound = len(y) / 5 + 100
    uncapped = [max(map(len, dirichlet(y, 5, seed=seed, alpha=0.1))) for seed in range(5)]
    assert max(uncapped) > bound                                          # the cap is what keeps the bound
    for seed in range(5):
        parts = dirichlet(y, 5, seed=seed, alpha=0.1, capped=True)
        assert max(map(len, parts)) <= bound and sorted(np.concatenate(parts).tolist()) == list(range(1000))
    hist = label_histogram(dirichlet(y, 10, seed=0, alpha=1.0, capped=True), y, 10)
    assert hist["total"].sum() == 1000 and (hist[list(range(10))] > 0).sum(axis=1).min() >= 4


def test_eval_subset_size_and_reseeding():
    x, y = torch.arange(1000).reshape(1000, 1), torch.arange(1000)
    xs, ys = eval_subset(x, y, 0.2, seed=0, round_=5)
    assert len(ys) == 200 and len(set(ys.tolist())) == 200 and torch.equal(xs[:, 0], ys)
    assert torch.equal(eval_subset(x, y, 0.2, 0, 5)[1], ys)              # the same (seed, round): the same part
    assert not torch.equal(eval_subset(x, y, 0.2, 0, 6)[1], ys)          # a fresh part each round
    assert not torch.equal(eval_subset(x, y, 0.2, 1, 5)[1], ys)


def test_authors_code_setup_validates_and_older_keys_stand():
    code = composed("experiment=alidpfl_authors_code")
    validate(code)
    assert (code.dataset.split, code.algo.divisor, code.eval_subset, code.partition.capped) == (
        "per_client", 64, 0.2, True)
    text = composed("experiment=alidpfl_fmnist")
    legacy = composed("experiment=alidpfl_fmnist")
    OmegaConf.set_struct(legacy, False)
    del legacy["eval_subset"], legacy.algo["divisor"], legacy.dataset["scale"]   # before the keys existed
    assert config_key(legacy) == config_key(text)
    assert config_key(composed("experiment=alidpfl_fmnist", "algo.divisor=64")) != config_key(text)
    assert config_key(composed("experiment=alidpfl_fmnist", "dataset.scale=raw")) != config_key(text)


@pytest.mark.parametrize("experiment", ["alidpfl_fmnist", "alidpfl_authors_code", "alidpfl_cifar10"])
def test_raw_pixels_accept_the_experiments_mean_and_std_unread_and_the_key_leaves_them_out(experiment):
    """The MindSpore port's input, as the experiment files and docs/measurements.md run it:
    ``experiment=alidpfl_authors_code dataset.scale=raw``; the experiment's mean and std are not read then."""
    raw = composed(f"experiment={experiment}", "dataset.scale=raw")
    validate(raw)
    other = composed(f"experiment={experiment}", "dataset.scale=raw", "dataset.mean=[0.1]", "dataset.std=[0.3]")
    assert config_key(other) == config_key(raw)                          # what the run does not read
    assert config_key(composed(f"experiment={experiment}", "dataset.mean=[0.1]")) != config_key(
        composed(f"experiment={experiment}"))                            # what a normalised run reads


def test_a_raw_pixel_run_says_that_it_reads_no_mean_or_std(data_root, caplog):
    from normfl.run.setup import _prepared_data
    for scale, said in (("raw", True), ("unit", False)):
        cfg = composed("experiment=alidpfl_fmnist", f"dataset.scale={scale}", "dataset.train_limit=1000",
                       "dataset.test_limit=10", f"data_root={data_root}")
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="normfl.run.setup"):
            _prepared_data(cfg, torch.device("cpu"))
        assert ("dataset.mean and dataset.std are not read" in caplog.text) == said


@pytest.mark.parametrize("override, key", [
    ("algo.divisor=0", "algo.divisor"), ("eval_subset=0", "eval_subset"), ("eval_subset=1.5", "eval_subset"),
    ("dataset.scale=gray", "dataset.scale"), ("partition.capped=2", "partition.capped"),
    ("dataset.holdout_fraction=1", "dataset.holdout_fraction"),
])
def test_bad_authors_code_settings_are_refused(override, key):
    with pytest.raises(ConfigError) as err:
        validate(composed("experiment=alidpfl_authors_code", override))
    assert err.value.key == key


@pytest.mark.slow
def test_authors_code_run_trains_on_client_splits(tmp_path, data_root):
    from normfl.run import run as train
    cfg = composed("experiment=alidpfl_authors_code", "budget=e175_r177", "algo=dpfl", "rounds=2",
                   "dataset.train_limit=2000", "progress=false", "device=cpu", f"data_root={data_root}")
    summary = train(cfg, tmp_path)
    assert summary["status"] == "completed" and summary["split"] == "per_client"
    assert summary["train_size"] + summary["test_size"] == 2000 and 480 <= summary["test_size"] <= 510
    hist = json.loads((tmp_path / "summary.json").read_text())            # strict JSON, as written
    assert hist["best_test_acc"] is not None and hist["final_round"] == 2


@pytest.mark.slow
def test_every_run_of_make_alidpfl_readings_is_a_valid_config():
    """``scripts/ali_readings.py`` (make alidpfl-readings) runs its settings as override strings: each one
    composes and validates (raw pixels on the experiments' normalised setups were refused once)."""
    import shlex

    readings = script("ali_readings")
    for name, overrides in readings.RUNS.items():
        cfg = composed(*shlex.split(overrides), "budget=e175_r177")
        validate(cfg)
        assert cfg.rounds == 177, name
