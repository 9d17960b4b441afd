"""Issue 27, item 7: the names and messages a new user trips on.

1. ``partition=natural`` takes the number of clients from the data's `client` array (``clients: null``), and
   refuses an explicit count that differs, naming ``clients`` (not the partition function's ``num_clients``);
2. an unknown ``+algo.<key>`` lists the keys the algorithm takes, not a Python TypeError;
3. the data line of the log gives the sizes the run uses (``dataset.train_limit``), once;
4. ``summary.json``'s privacy block says what its ``std`` is measured on (``std_on``) and gives a number
   comparable across algorithms (``std_in_update``): DP-α-NormEC's noise is on Δ_i (norm ≤ 1, weighted by β
   at the server), DP-Clip21's on the clipped message (norm ≤ β, weight 1).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from omegaconf import OmegaConf

from normfl.algorithms import Algorithm
from normfl.config import ConfigError, accepted_keys, config_key, resolve_clients, validate
from normfl.config.keys import algorithm
from tests.helpers import CONF, composed, npz, refused, train

TINY = ["dataset=fashion_mnist", "dataset.train_limit=500", "dataset.test_limit=100", "model=logreg", "rounds=2",
        "clients=3", "progress=false", "device=cpu", "threads=1"]


# -- 1. partition=natural: the number of clients is the data's ------------------------------------------------


@pytest.mark.slow
def test_natural_partition_takes_the_number_of_clients_from_the_data(tmp_path, data_root):
    path = npz(tmp_path / "f.npz", client=np.arange(200) % 5)            # 5 distinct client ids
    d = tmp_path / "run"
    out = train(data_root, "dataset=npz", f"dataset.path={path}", "partition=natural", "model=logreg", "rounds=2",
                "progress=false", "device=cpu", "threads=1", f"hydra.run.dir={d}", code=None)
    assert out.returncode == 0, out.stderr
    recorded = OmegaConf.load(d / ".hydra" / "config.yaml")
    summary = json.loads((d / "summary.json").read_text())
    assert recorded.clients == 5 and summary["clients"] == 5
    assert summary["config_key"] == config_key(recorded)               # the key is that of the real count


def test_natural_partition_refuses_another_count(tmp_path, data_root):
    path = npz(tmp_path / "f.npz", client=np.arange(200) % 5)
    refused(tmp_path, data_root, ["dataset=npz", f"dataset.path={path}", "partition=natural"],   # with clients=4
            f"normfl: invalid config: clients=4; allowed: 5 (the distinct client ids of {path}'s client array) "
            "with partition=natural, or null\n")


def test_composing_natural_keeps_its_node_and_an_explicit_count_wins():
    node = {"_target_": "normfl.data.partition.natural", "_partial_": True}
    cfg = composed("partition=natural")
    assert OmegaConf.to_container(cfg.partition) == node and cfg.clients is None
    for overrides in (("partition=natural", "clients=5"), ("clients=5", "partition=natural")):
        cfg = composed(*overrides)
        assert OmegaConf.to_container(cfg.partition) == node and cfg.clients == 5
    assert composed("partition=iid").clients == 10


def test_resolve_counts_the_clients_of_the_samples_the_run_uses(tmp_path):
    path = npz(tmp_path / "f.npz", client=np.repeat(np.arange(5), 40))    # ids 0, 0, ..., 4
    base = ("dataset=npz", f"dataset.path={path}", "partition=natural")
    cfg = composed(*base)
    resolve_clients(cfg)
    assert cfg.clients == 5
    cfg = composed(*base, "dataset.train_limit=50")                       # the first 50 samples: ids 0 and 1
    resolve_clients(cfg)
    assert cfg.clients == 2
    validate(cfg)
    resolve_clients(cfg)                                                  # once resolved, a no-op
    with pytest.raises(ConfigError) as err:
        resolve_clients(composed(*base, "dataset.train_limit=50", "clients=5"))
    assert str(err.value) == (f"invalid config: clients=5; allowed: 2 (the distinct client ids of {path}'s client "
                              "array in the 50 training samples the run uses: dataset.train_limit=50) with "
                              "partition=natural, or null")
    cfg = composed("clients=7")                                           # another partition: left alone
    resolve_clients(cfg)
    assert cfg.clients == 7


def test_null_clients_is_only_for_the_natural_partition():
    with pytest.raises(ConfigError) as err:
        validate(composed("clients=null", "partition=dirichlet"))
    assert str(err.value) == ("invalid config: clients=None; allowed: an integer >= 1 (null only with "
                              "partition=natural: the number of distinct client ids in the data)")


def test_natural_partition_needs_a_client_array(tmp_path, data_root):
    path = npz(tmp_path / "f.npz")
    refused(tmp_path, data_root, ["dataset=npz", f"dataset.path={path}", "partition=natural", "clients=null"],
            f"partition='natural'; allowed: only with an npz carrying a `client` array ({path} has none)")


# -- 2. an unknown algorithm key ------------------------------------------------------------------------------


def test_an_unknown_algorithm_key_lists_the_keys(tmp_path, data_root):
    refused(tmp_path, data_root, ["algo=normec", "+algo.foo=1"],
            "normfl: invalid config: algo.foo=1; allowed: the keys of algo=normec: alpha, beta, gamma, name, "
            "private, server_norm\n")


def test_a_value_the_constructor_raises_on_names_the_algorithm(tmp_path, data_root):
    err = refused(tmp_path, data_root, ["algo=normec", "algo.alpha=null"],
                  "invalid config: algo='normec'; allowed: values algo=normec's constructor takes (it raised "
                  "TypeError: ")
    assert "unexpected keyword" not in err


@pytest.mark.slow
def test_the_keys_listed_are_those_of_the_algorithm_configs():
    for path in sorted((CONF / "algo").glob("*.yaml")):
        node = composed(f"algo={path.stem}").algo
        assert set(node) - {"_target_"} <= set(accepted_keys(node._target_)), path.stem
    assert accepted_keys(composed("algo=fed_normec").algo._target_)[:3] == ["alpha", "beta", "cohort_size"]  # **kw


# -- 3 and 4: the data line, and what the privacy block's std is on ------------------------------------------


@pytest.mark.slow
def test_the_log_line_and_the_privacy_block(tmp_path, data_root):
    """One process runs DP-α-NormEC and DP-Clip21 at the same settings (β = 0.1): their ``std`` differ
    tenfold, their ``std_in_update`` agree."""
    out = train(data_root, *TINY, "algo=dp_normec,dp_clip21", "algo.beta=0.1", f"hydra.sweep.dir={tmp_path}",
                "hydra.sweep.subdir=${algo.name}", multirun=True, code=None)
    assert out.returncode == 0, out.stderr
    for name in ("dp_normec", "dp_clip21"):
        lines = [line for line in (tmp_path / name / "train.log").read_text().splitlines() if " train / " in line]
        assert len(lines) == 1 and ("Fashion-MNIST: 500 of 60000 train / 100 of 10000 test (standard split) from "
                                    f"torchvision:{data_root}") in lines[0], lines
    normec, clip21 = (json.loads((tmp_path / n / "summary.json").read_text())["privacy"]
                      for n in ("dp_normec", "dp_clip21"))
    assert normec["std_on"] == "Δ_i = Norm_α(∇f_i(x^k) - g_i^k), norm ≤ 1, weighted by β = 0.1 at the server"
    assert clip21["std_on"] == "Δ_i = Clip_β(∇f_i(x^k) - g_i^k), norm ≤ β = 0.1, weighted by 1 at the server"
    assert normec["noise_multiplier"] == pytest.approx(clip21["noise_multiplier"])
    assert normec["std"] == pytest.approx(10 * clip21["std"])
    assert normec["std_in_update"] == pytest.approx(0.1 * normec["std"])
    assert clip21["std_in_update"] == pytest.approx(clip21["std"])
    assert normec["std_in_update"] == pytest.approx(clip21["std_in_update"])
    for block in (normec, clip21):                                       # the fields there were, unchanged
        assert {"mechanism", "noise_by", "sensitivity", "std", "noise_multiplier", "sampling_rate", "assumptions",
                "target_epsilon", "delta", "epsilon_rdp", "epsilon_pld", "calibration"} <= set(block)


@pytest.mark.slow
def test_every_private_algorithm_says_what_its_noise_is_on():
    classes = {algorithm(composed(f"algo={path.stem}")) for path in (CONF / "algo").glob("*.yaml")}
    assert len(classes) == 7                         # each of them runs private with its private key set
    for cls in classes:
        assert cls.noise_target is not Algorithm.noise_target, cls.__name__


@pytest.mark.slow
@pytest.mark.parametrize("norm, private", [("batch", True), ("group", True), ("batch", False)])
def test_a_private_run_with_batchnorm_says_what_its_certificate_does_not_cover(norm, private, tmp_path, data_root,
                                                                             caplog):
    """Issue 30.4: BatchNorm's running statistics reach the global model without noise. A private ResNet20 run
    with BatchNorm says so before its first round and in its summary; GroupNorm, or no privacy, says nothing."""
    import logging

    from normfl.run import run

    cfg = composed("algo=dp_normec" if private else "algo=normec", "model=resnet20", f"model.norm={norm}",
                   "dataset=cifar10", "dataset.train_limit=64", "dataset.test_limit=20", "clients=2", "batch_size=8",
                   "rounds=1", "progress=false", f"data_root={data_root}")
    with caplog.at_level(logging.WARNING, logger="normfl"):
        summary = run(cfg, tmp_path / "run")
    said = [r.getMessage() for r in caplog.records if "BatchNorm running statistics" in r.getMessage()]
    if norm == "batch" and private:
        assert "no certificate covers them" in summary["privacy"]["not_covered"] and len(said) == 1
        assert "model.norm=group" in said[0]
    else:
        assert not said and (summary["privacy"] is None or summary["privacy"]["not_covered"] is None)


@pytest.mark.parametrize("delta, warned", [(0.5, True), (0.3, False)])
def test_a_delta_not_small_against_the_units_protected_is_said(delta, warned, tmp_path, data_root, caplog):
    """δ ≥ 1/N for the N units a certificate protects (here 3 clients) lets it publish a unit whole: the run says
    so before its first round and in its summary; δ < 1/N says nothing."""
    import logging

    from normfl.run import run

    cfg = composed(*TINY, "algo=dp_normec", f"privacy.delta={delta}", f"data_root={data_root}")
    with caplog.at_level(logging.WARNING, logger="normfl"):
        summary = run(cfg, tmp_path / "run")
    said = [r.getMessage() for r in caplog.records if "is at least 1/N" in r.getMessage()]
    assert len(said) == warned and ("weak_delta" in summary["privacy"]) == warned
    if warned:
        assert f"privacy.delta={delta:g} is at least 1/N for the N = 3 clients it protects" in said[0]
        assert summary["privacy"]["weak_delta"] in said[0]


def test_for_sample_level_privacy_the_units_are_the_smallest_clients_samples():
    from normfl.run.privacy_report import weak_delta

    parts = [np.arange(40), np.arange(25), np.arange(100)]
    assert weak_delta("sample", 0.03, parts) is None
    assert "N = 25 samples of the smallest client's data" in weak_delta("sample", 0.04, parts)
    assert weak_delta("client", 0.3, parts) is None and "N = 3 clients" in weak_delta("client", 1 / 3, parts)
