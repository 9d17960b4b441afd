"""What one round is (reading A2): ``reading=text`` (one communication step) or ``reading=pass`` (one pass over
each client's shard in minibatches). A pass run is the text run of as many steps, recorded once a pass."""

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from normfl.config import ConfigError, config_key, validate
from normfl.data import ClientData, Preprocess
from normfl.run import run, start
from tests.helpers import config

BASE = ["algo=normec", "batch_size=32"]     # with config()'s BASE: 4 clients of 200 samples, 6 steps a pass


def test_a_pass_takes_every_sample_of_every_shard_once_then_reshuffles():
    x = torch.arange(23, dtype=torch.float32).reshape(23, 1)
    parts = [np.arange(0, 9), np.arange(9, 23)]                  # 9 and 14 samples, batch 3
    data = ClientData(x, torch.zeros(23, dtype=torch.long), parts, 3, 0, Preprocess((), (), torch.device("cpu")),
                      augment=False)
    steps = data.steps_per_pass()
    assert steps == 3                                             # the smallest shard's full batches
    passes = [[data.next_batches() for _ in range(steps)] for _ in range(2)]
    for p in passes:
        seen = sorted(v for step in p for v in step[0][0][0].flatten().tolist())
        assert seen == list(range(9))                             # client 0: its whole shard, each sample once
    orders = [[v for step in p for v in step[0][0][0].flatten().tolist()] for p in passes]
    assert orders[0] != orders[1]                                 # a new order for the next pass


def test_pass_run_is_the_text_run_of_as_many_steps_recorded_once_a_pass(tmp_path, data_root):
    (tmp_path / "pass").mkdir(), (tmp_path / "text").mkdir()
    s = run(config(data_root, *BASE, "reading=pass", "rounds=2", "eval_every=1"), tmp_path / "pass")
    assert s["reading"] == "pass" and s["steps_per_round"] == 6 and s["steps"] == 12
    run(config(data_root, *BASE, "rounds=12", "eval_every=6"), tmp_path / "text")
    by_pass, by_step = (pd.read_csv(tmp_path / d / "metrics.csv") for d in ("pass", "text"))
    assert list(by_pass["round"]) == [0, 1, 2] and list(by_pass["steps"]) == [0, 6, 12]
    assert by_pass["test_acc"].notna().all()                      # evaluated once a pass
    assert list(by_pass["transmissions"]) == [0, 24, 24]          # 6 steps x 4 clients
    at_passes = by_step[by_step["round"] % 6 == 0]
    np.testing.assert_array_equal(by_pass["test_acc"], at_passes["test_acc"])
    np.testing.assert_allclose(by_pass["train_loss"][1:], [by_step["train_loss"][1:7].mean(),
                                                           by_step["train_loss"][7:13].mean()], rtol=1e-12)
    assert np.load(tmp_path / "pass" / "params.npy").tobytes() == np.load(tmp_path / "text" / "params.npy").tobytes()


@pytest.mark.slow
@pytest.mark.parametrize("K, same_noise_as_text", [("rounds", False), ("releases", True)])
def test_private_pass_run_counts_every_release(K, same_noise_as_text, tmp_path, data_root):
    """The accountants charge every release (12 here); the papers' formula counts K = rounds (2 passes) or,
    with privacy.K=releases, the 12 releases, which makes the noise of the text run of 12 rounds."""
    (tmp_path / "pass").mkdir(), (tmp_path / "text").mkdir()
    s = run(config(data_root, "algo=dp_normec", "batch_size=32", "reading=pass", "rounds=2", f"privacy.K={K}"),
            tmp_path / "pass")
    t = run(config(data_root, "algo=dp_normec", "rounds=12"), tmp_path / "text")
    assert (s["noise_std"] == t["noise_std"]) is same_noise_as_text
    if same_noise_as_text:
        assert s["privacy"]["epsilon_pld"] == pytest.approx(t["privacy"]["epsilon_pld"])


def test_readings_have_their_own_store_keys_and_older_keys_stand(data_root):
    text, passes = config(data_root, *BASE), config(data_root, *BASE, "reading=pass")
    assert config_key(text) != config_key(passes)
    legacy = config(data_root, *BASE)
    OmegaConf.set_struct(legacy, False)
    del legacy["reading"], legacy.privacy["K"]                    # a config from before the keys existed
    assert config_key(legacy) == config_key(text)
    assert config_key(config(data_root, *BASE, "privacy.K=releases")) != config_key(text)


@pytest.mark.parametrize("overrides, allowed", [(["oracle=full"], "oracle=full"), (["algo=dpfl"], "algo=dpfl"),
                                                (["algo=normfedavg"], "algo=normfedavg")])
def test_pass_reading_is_refused_where_a_round_is_defined_otherwise(overrides, allowed, data_root):
    with pytest.raises(ConfigError, match=f"reading.*pass.*{allowed}"):
        validate(config(data_root, "reading=pass", *overrides))


@pytest.mark.slow
def test_pass_run_resumes_from_a_pass_boundary(tmp_path, data_root):
    cfg = config(data_root, *BASE, "reading=pass", "rounds=3", "eval_every=1", "checkpoint_every=1")
    (tmp_path / "killed").mkdir(), (tmp_path / "whole").mkdir()
    t = start(cfg, tmp_path / "killed")
    while t.k < 2:                                                # two passes, then as if killed
        t.record(*t.algo.round(t.step, t.x, t.clients))
    assert (tmp_path / "killed" / "checkpoint.pt").exists()
    t.rundir.release()                          # a killed process's lock names a dead pid and is taken over
    run(cfg, tmp_path / "killed")
    run(cfg, tmp_path / "whole")
    a, b = (pd.read_csv(tmp_path / d / "metrics.csv").drop(columns="wall_time") for d in ("whole", "killed"))
    pd.testing.assert_frame_equal(a, b)
    assert np.load(tmp_path / "whole" / "params.npy").tobytes() == np.load(tmp_path / "killed" / "params.npy").tobytes()
