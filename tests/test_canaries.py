"""Canary audits beside a private run (``audit.canaries``, ``normfl.privacy.audit.canaries``), one family of
mechanisms at a time: the run's parameters do not change, a correct privatizer stays within its
certificate, canaries never inserted show nothing, and each deliberately broken privatizer is caught with a
bound above the ε its run certifies."""

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from normfl import ops
from normfl.algorithms import alidpfl
from normfl.engine import clipping
from normfl.errors import ConfigError, PrivacyError
from normfl.privacy import mechanisms
from normfl.privacy.audit import canaries
from normfl.run import run
from tests.helpers import composed

SMALL = ["dataset=fashion_mnist", "model=logreg", "dataset.train_limit=400", "dataset.test_limit=100", "clients=4",
         "progress=false", "save_params=true", "privacy.delta=1e-5"]
# each family at a claim a few hundred canaries a side can refute if its privatizer is broken (ε = 1, certified
# by dp-accounting; DP-SGD: 20 steps at q = 0.5, σ = 1.5, ε = 8.4)
FAMILIES = {
    "client": ["algo=dp_normec", "batch_size=8", "rounds=20", "eval_every=10", "privacy.epsilon=1",
               "privacy.calibration=accountant", "accountant=pld"],
    "central": ["algo=dp_fedavg", "algo.noise_by=server", "algo.local_steps=1", "rounds=20", "eval_every=10",
                "privacy.epsilon=1", "privacy.calibration=accountant", "accountant=pld"],
    "dpsgd": ["algo=dpfl", "algo.sample_rate=0.5", "algo.sigma=1.5", "algo.clip=0.1", "algo.tau=2", "rounds=10",
              "eval_every=10", "algo.rc_override=20", "privacy.epsilon=1"],
}


def config(data_root, family, *overrides):
    return composed(*SMALL, *FAMILIES[family], f"data_root={data_root}", *overrides)


def audited(data_root, tmp_path, family, canaries_, *overrides) -> dict:
    return run(config(data_root, family, f"audit.canaries={canaries_}", *overrides), tmp_path / "run")["audit"]


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_an_audited_run_has_the_parameters_of_the_run_without_it(family, tmp_path, data_root):
    for n in (0, 200):
        run(config(data_root, family, f"audit.canaries={n}"), tmp_path / str(n))
    a, b = (pd.read_csv(tmp_path / c / "metrics.csv").drop(columns="wall_time") for c in ("0", "200"))
    pd.testing.assert_frame_equal(a, b)
    assert np.load(tmp_path / "0" / "params.npy").tobytes() == np.load(tmp_path / "200" / "params.npy").tobytes()
    audit = json.loads((tmp_path / "200" / "summary.json").read_text())["audit"]
    assert audit["canaries"] == 200 and audit["in"] == 100 and audit["steps_observed"] > 0
    assert json.loads((tmp_path / "0" / "summary.json").read_text())["audit"] is None


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_a_correct_privatizer_is_consistent_and_canaries_never_inserted_show_nothing(family, tmp_path, data_root,
                                                                                  monkeypatch):
    correct = audited(data_root, tmp_path / "correct", family, 2000)
    assert correct["verdict"] == "consistent with the certificate", correct
    assert correct["eps_lower"] < correct["eps_certified"]
    assert 0 < correct["eps_lower_curve"] < correct["eps_certified"], correct     # the curve route has power
    monkeypatch.setattr(canaries, "OVERSIZE", 0.0)          # every canary releases nothing: "in" and "out" alike
    null = audited(data_root, tmp_path / "null", family, 600)
    assert null["eps_lower"] == 0 and null["eps_lower_curve"] < 0.2, null


def tenth_of_the_noise(monkeypatch):
    real = mechanisms._gaussian
    monkeypatch.setattr(mechanisms, "_gaussian", lambda v, std, gen: real(v, std / 10, gen))


def bounding_skipped(monkeypatch):
    """The uploads left unbounded, and the privatizer's own check of them off, as on a GPU (``within``)."""
    monkeypatch.setattr(ops.Bounding, "__call__", lambda self, v: v)
    monkeypatch.setattr(mechanisms, "within", lambda *a: None)


def clipping_skipped(monkeypatch):
    monkeypatch.setattr(clipping, "clip_factors", lambda sq, clip: torch.ones_like(sq))


def one_draw_for_all_rows(monkeypatch):
    """Every row of a call (every client) gets the same noise vector."""
    def shared(v, std, gen):
        z = torch.randn(v.shape[-1], generator=gen, device=v.device, dtype=v.dtype)
        return v + std * z
    monkeypatch.setattr(mechanisms, "_gaussian", shared)


def same_noise_every_round(monkeypatch):
    """The noise drawn afresh from one fixed seed: the same draws every round."""
    def reused(v, std, gen):
        fixed = torch.Generator(device=v.device).manual_seed(7)
        return v + std * torch.randn(v.shape, generator=fixed, device=v.device, dtype=v.dtype)
    monkeypatch.setattr(mechanisms, "_gaussian", reused)


def rate_accounted_a_quarter(monkeypatch):
    """The accountant is told q/4 while the sampler draws at q."""
    real = alidpfl.ClientAccountant
    monkeypatch.setattr(alidpfl, "ClientAccountant", lambda q, *args: real(q / 4, *args))


def sampler_ignores_its_rate(monkeypatch):
    """The Poisson sampler takes every sample (a full batch) while the accountant claims sampling at q."""
    monkeypatch.setattr(ops, "poisson_sample", lambda rng, n, rate: rng.random(n) < 1.0)


BROKEN = [
    ("client", tenth_of_the_noise, []), ("client", bounding_skipped, []), ("client", one_draw_for_all_rows, []),
    ("client", same_noise_every_round, []),
    ("central", tenth_of_the_noise, []), ("central", bounding_skipped, []), ("central", same_noise_every_round, []),
    ("dpsgd", tenth_of_the_noise, []), ("dpsgd", clipping_skipped, []), ("dpsgd", one_draw_for_all_rows, []),
    ("dpsgd", same_noise_every_round, []), ("dpsgd", rate_accounted_a_quarter, []),
    ("dpsgd", sampler_ignores_its_rate, []),
]


@pytest.mark.slow
@pytest.mark.parametrize("family, bug, overrides", BROKEN, ids=[f"{f}-{b.__name__}" for f, b, _ in BROKEN])
def test_a_broken_privatizer_is_refuted(family, bug, overrides, tmp_path, data_root, monkeypatch):
    bug(monkeypatch)
    audit = audited(data_root, tmp_path, family, 600, *overrides)
    assert audit["verdict"] == "refutes the certificate", audit
    assert max(audit["eps_lower"], audit["eps_lower_curve"]) > audit["eps_certified"]


CLIENT_NOISE = [["algo=dp_normec"], ["algo=dp_clip21"], ["algo=dp_fed_normec", "p=0.5"],
                ["algo=dp_fedavg", "algo.noise_by=client", "algo.local_steps=2"]]


@pytest.mark.parametrize("algo", CLIENT_NOISE, ids=[a[0][5:] for a in CLIENT_NOISE])
def test_an_upload_beyond_its_bound_stops_the_run_before_its_release(algo, tmp_path, data_root, monkeypatch):
    """Every algorithm whose clients add their own noise: with its bounding skipped (a clip or normalization
    forgotten, as in one's own algorithm) the privatizer finds the upload above its sensitivity on the CPU and the
    run stops in its first round, instead of reporting an ε its releases do not have."""
    monkeypatch.setattr(ops.Bounding, "__call__", lambda self, v: 50 * v)
    cfg = composed(*SMALL, *algo, "batch_size=8", "rounds=2", "eval_every=1", f"data_root={data_root}")
    said = (r"privacy: an upload handed to the gaussian privatizer has l2 norm [\d.]+ \(row \d+\), above the "
            r"sensitivity [\d.]+ its noise is calibrated to")
    with pytest.raises(PrivacyError, match=said):
        run(cfg, tmp_path / "run")


def test_the_check_is_of_each_upload_at_its_bound_and_only_the_clients():
    within, s = mechanisms.within, 0.5
    rows = torch.nn.functional.normalize(torch.randn(4, 1000), dim=1) * s            # every row at the bound
    within(rows, s, "gaussian")
    mechanisms.Gaussian(s, 1.0, "client")(rows, torch.Generator().manual_seed(0))
    over = rows.clone()
    over[2] *= 1.001                                                                   # one row 0.1% above
    with pytest.raises(PrivacyError, match=r"l2 norm 0.5005 \(row 2\), above the sensitivity 0.5"):
        mechanisms.Gaussian(s, 1.0, "client")(over, torch.Generator().manual_seed(0))
    with pytest.raises(PrivacyError):
        within(torch.full((3,), float("nan")), s, "gaussian")
    mechanisms.Gaussian(s, 1.0, "server")(over.sum(0), torch.Generator().manual_seed(0))      # a sum: not rows
    within(over[:0], s, "gaussian")                                                    # no client this round
    within(over, math.inf, "gaussian")                                                 # no bound to hold


@pytest.mark.slow
def test_amplification_claimed_while_the_server_sees_who_uploads_is_refuted(tmp_path, data_root):
    """Client noise with participation p = 0.1 and amplification claimed (ε = 2 over 100 rounds): the
    certificate assumes the server does not know who took part, but each client's upload shows it (about 10
    releases a client, worth ε ≈ 6.5 as Gaussian DP). The per-upload observer refutes the claim."""
    audit = audited(data_root, tmp_path, "client", 600, "algo=dp_fed_normec", "p=0.1", "privacy.epsilon=2",
                    "privacy.amplification=true", "rounds=100", "eval_every=50")
    assert audit["curve"] == "PLD" and audit["verdict"] == "refutes the certificate", audit


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_inband_canaries_share_the_runs_own_privatizer_call(family, tmp_path, data_root):
    """In-band, the canaries' block joins the run's own privatizer call: a correct run stays consistent, its
    draws (so its parameters) change, and so does its key in a run store."""
    from normfl.config import config_key

    audit = audited(data_root, tmp_path, family, 600, "audit.mode=inband")
    assert audit["verdict"] == "consistent with the certificate" and audit["steps_observed"] > 0, audit
    run(config(data_root, family), tmp_path / "plain")
    assert np.load(tmp_path / "run" / "params.npy").tobytes() != np.load(tmp_path / "plain" / "params.npy").tobytes()
    keys = {config_key(config(data_root, family, *o)) for o in ([], ["audit.canaries=600"],
                                                                 ["audit.canaries=600", "audit.mode=inband"])}
    assert len(keys) == 2


@pytest.mark.slow
def test_only_inband_sees_the_noise_of_the_runs_own_call(tmp_path, data_root, monkeypatch):
    """A bug in how the algorithm calls its privatizer (round 0's noise draws every round) is invisible beside
    the run, where the canaries draw their own noise, and refuted in-band, where they share the run's call."""
    from normfl.algorithms.base import Algorithm

    monkeypatch.setattr(Algorithm, "privatize", lambda self, v, k: self.mech(v, self.generator(ops.NOISE, 0, v.device)))
    beside = audited(data_root, tmp_path / "beside", "client", 600)
    inband = audited(data_root, tmp_path / "inband", "client", 600, "audit.mode=inband")
    assert beside["verdict"] == "consistent with the certificate", beside
    assert inband["verdict"] == "refutes the certificate", inband


@pytest.mark.parametrize("overrides, says", [
    (["algo=normec", "audit.canaries=100"], "audit.canaries=100.*without privacy"),
    (["algo=dp_normfedavg", "audit.canaries=100"], "audit.canaries=100.*per message"),
    (["audit.canaries=101"], "audit.canaries=101.*an even integer"),
    (["audit.canaries=100", "audit.mode=both"], "audit.mode=both.*sidecar | inband"),
])
def test_an_audit_that_cannot_be_made_is_refused(overrides, says, data_root):
    from normfl.config import validate

    with pytest.raises(ConfigError, match=says):
        validate(config(data_root, "client", *overrides))


@pytest.mark.slow
def test_an_audit_resumes_with_its_run(tmp_path, data_root):
    """A checkpoint carries the canaries' scores: an audited run stopped and resumed ends with the audit of
    the run made in one go."""
    from normfl.run import start

    alone = run(config(data_root, "client", "audit.canaries=200"), tmp_path / "alone")["audit"]
    t = start(config(data_root, "client", "audit.canaries=200"), tmp_path / "resumed")
    for _ in range(7):
        t.record(*t.round(t.step, t.x, t.clients))
    t.save()
    t.rundir.release()
    assert run(config(data_root, "client", "audit.canaries=200"), tmp_path / "resumed")["audit"] == alone


class _Box:
    """The parts of an algorithm an audit reads: Ψ, the privatizer, participation, releases."""

    def __init__(self, mech, p=1.0):
        self.bounding, self.mech, self.p = ops.Bounding("scaled_norm", 1.0, 0.0), mech, p

    def releases(self, steps):
        return steps


@pytest.mark.slow
@pytest.mark.parametrize("who, p, seeds", [("client", 1.0, 100), ("server", 0.5, 20)])
def test_a_correct_privatizer_is_refuted_no_more_often_than_the_confidence_allows(who, p, seeds):
    """Many seeds of a correct Gaussian at ε = 2, without training: client noise (the Gaussian-DP route) and
    central noise with amplification claimed (the PLD route). A verdict may be wrong with probability 0.05;
    over these seeds more than 10% false refutations would have probability below 3% if it were so."""
    from normfl.privacy import Privacy

    privacy = Privacy(epsilon=2, delta=1e-5, calibration="accountant", accountant="pld", amplification=p < 1)
    mech = privacy.gaussian(1.0, 1.0, 20, p, who)
    eps = mech.release().epsilon(20, 1e-5, "pld")
    refuted = 0
    for seed in range(seeds):
        box = _Box(mech, p)
        audit = (canaries.ClientCanaries(box, 400, 16, seed, torch.device("cpu"), torch.float64) if who == "client"
                 else canaries.CentralCanaries(box, 400, seed, torch.device("cpu"), torch.float64))
        for step in range(1, 21):
            audit.observe(step)
        refuted += audit.result(eps, 1e-5)["verdict"] == "refutes the certificate"
    assert refuted <= 0.1 * seeds


@pytest.mark.parametrize("who, p", [("client", 1.0), ("server", 0.5)])
def test_each_score_kept_and_each_route_holds_at_its_share_of_alpha(who, p, monkeypatch):
    """The verdict takes the largest of two routes (ε_LB and the curve's) for each score kept: each holds with
    probability 1 - ALPHA / (2·scores kept), so the verdict holds with probability 1 - ALPHA. Client canaries
    keep two scores and take the Gaussian-DP route, central ones with amplification one score and the PLD route."""
    from normfl.privacy import Privacy

    box = _Box(Privacy(epsilon=2, delta=1e-5, amplification=p < 1).gaussian(1.0, 1.0, 2, p, who), p)
    audit = (canaries.ClientCanaries(box, 40, 16, 0, torch.device("cpu"), torch.float64) if who == "client"
             else canaries.CentralCanaries(box, 40, 0, torch.device("cpu"), torch.float64))
    for step in (1, 2):
        audit.observe(step)
    seen = []
    def spy(route, result=None):
        def call(*args):
            seen.append((route.__name__, args[-1]))
            return route(*args) if result is None else result
        return call
    monkeypatch.setattr(canaries, "eps_lower", spy(canaries.eps_lower))
    monkeypatch.setattr(canaries, "mu_lower", spy(canaries.mu_lower))
    monkeypatch.setattr(canaries, "curve_eps_lower", spy(canaries.curve_eps_lower, {"eps_lower_curve": 0.0}))
    got = audit.result(2.0, 1e-5)
    kept, curve = (("own", "paired"), "mu_lower") if who == "client" else (("own",), "curve_eps_lower")
    assert audit.scores_kept == kept and got["confidence"] == 1 - canaries.ALPHA
    assert sorted(seen) == sorted([("eps_lower", canaries.ALPHA / (2 * len(kept))),
                                   (curve, canaries.ALPHA / (2 * len(kept)))] * len(kept))


@pytest.mark.slow
def test_a_users_subclass_is_audited_as_its_family_declares(tmp_path, data_root):
    """Which algorithms a canary audit takes was an exact list of built-in targets, so a user's subclass of a
    Gaussian algorithm (tests.helpers.Momentum: α-NormEC with server momentum, outside normfl) was refused; its
    class's declaration (``canaries``, inherited) decides now, and NormFedAvg's discrete mechanisms stay refused."""
    summary = run(config(data_root, "client", "algo._target_=tests.helpers.Momentum", "audit.canaries=100"),
                  tmp_path / "run")
    assert summary["audit"]["canaries"] == 100 and summary["audit"]["steps_observed"] == 20
    with pytest.raises(ConfigError, match="audit.canaries=100; allowed: 0 here"):
        run(config(data_root, "client", "algo=dp_normfedavg", "audit.canaries=100"), tmp_path / "nfa")
