"""Canary audits beside a private run (``audit.canaries``, ``normfl.privacy.audit.canaries``): the run's parameters
do not change, a correct privatizer stays within its certificate, a broken one is caught."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from normfl.errors import ConfigError
from normfl.privacy import mechanisms
from normfl.run import run

REPO = Path(__file__).resolve().parents[1]
# ε = 1 certified by the PLD accountant over 20 rounds: a claim 1,000 canaries a side can refute
PRIVATE = ["algo=dp_normec", "dataset=fashion_mnist", "model=logreg", "dataset.train_limit=400",
           "dataset.test_limit=100", "clients=4", "batch_size=8", "rounds=20", "eval_every=10", "progress=false",
           "save_params=true", "privacy.epsilon=1", "privacy.calibration=accountant", "accountant=pld"]


def config(data_root, *overrides):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("config", overrides=[*PRIVATE, f"data_root={data_root}", *overrides])


def test_an_audited_run_has_the_parameters_of_the_run_without_it(tmp_path, data_root):
    for canaries in (0, 200):
        run(config(data_root, f"audit.canaries={canaries}"), tmp_path / str(canaries))
    a, b = (pd.read_csv(tmp_path / c / "metrics.csv").drop(columns="wall_time") for c in ("0", "200"))
    pd.testing.assert_frame_equal(a, b)
    assert np.load(tmp_path / "0" / "params.npy").tobytes() == np.load(tmp_path / "200" / "params.npy").tobytes()
    audit = json.loads((tmp_path / "200" / "summary.json").read_text())["audit"]
    assert audit["canaries"] == 200 and audit["in"] == 100 and audit["releases_each"] == 20
    assert json.loads((tmp_path / "0" / "summary.json").read_text())["audit"] is None


def test_a_correct_privatizer_is_consistent_and_a_broken_one_is_refuted(tmp_path, data_root, monkeypatch):
    """The run's own Gaussian: the bound stays under the certified ε = 1. The same Gaussian adding a tenth of
    its noise (a sensitivity off by 10, as published DP bugs were): the bound exceeds the certificate."""
    correct = run(config(data_root, "audit.canaries=2000"), tmp_path / "correct")["audit"]
    assert correct["verdict"] == "consistent with the certificate"
    assert correct["eps_certified"] == pytest.approx(1.0, abs=0.01) and 0 <= correct["eps_lower"] < 1.0
    real = mechanisms._gaussian
    monkeypatch.setattr(mechanisms, "_gaussian", lambda v, std, gen: real(v, std / 10, gen))
    broken = run(config(data_root, "audit.canaries=2000"), tmp_path / "broken")["audit"]
    assert broken["verdict"] == "refutes the certificate" and broken["eps_lower"] > 2.0


@pytest.mark.parametrize("overrides, says", [
    (["algo=normec", "audit.canaries=100"], "without privacy"),
    (["algo=dp_fedavg", "algo.noise_by=server", "audit.canaries=100"], "added by each client"),
    (["audit.canaries=101"], "an even integer"),
])
def test_an_audit_that_cannot_be_made_is_refused(overrides, says, data_root):
    from normfl.config import validate

    with pytest.raises(ConfigError, match=f"audit.canaries.*{says}"):
        validate(config(data_root, *overrides))


def test_an_audit_resumes_with_its_run(tmp_path, data_root):
    """A checkpoint carries the canaries' scores: an audited run stopped and resumed ends with the audit of
    the run made in one go."""
    from normfl.run import start

    alone = run(config(data_root, "audit.canaries=200"), tmp_path / "alone")["audit"]
    t = start(config(data_root, "audit.canaries=200"), tmp_path / "resumed")
    for _ in range(7):
        t.record(*t.round(t.step, t.x, t.clients))
    t.save()
    t.rundir.release()
    assert run(config(data_root, "audit.canaries=200"), tmp_path / "resumed")["audit"] == alone
