"""ALI-DPFL and fixed-τ DPFL: budgets, rounds, aggregation and the τ* loop, on stand-in clients; and what a run
of each says of its ε and of the rounds that admit no τ."""

import json
import logging

import pandas as pd
import pytest
import torch

from normfl.algorithms import DPFL
from normfl.collect import collect
from normfl.config import ConfigError, validate
from normfl.ops import round_generator
from normfl.privacy import Privacy
from normfl.privacy.sgm import paper_epsilon
from tests.helpers import DPSGDClients, composed, rows, run_dpfl, train


@pytest.mark.parametrize("tau", [1, 3, 5])
def test_fixed_tau_runs_min_of_rs_and_rc_over_tau_rounds(tau):
    # ε = 1.55 supports R_c = 79 steps (reading C-A9); R_s = 200 > 79 / τ
    _, infos, clients = run_dpfl(DPFL(tau=tau, sigma=1.1), 200, 1.55)
    assert len(infos) == min(200, 79 // tau) and all(i["tau"] == tau for i in infos)
    assert infos[-1]["steps_total"] == tau * (79 // tau) and clients.steps == tau * (79 // tau) * 1
    _, infos, _ = run_dpfl(DPFL(tau=tau, sigma=1.1), 10, 1.55)                               # R_s binds
    assert len(infos) == 10 and not infos[-1]["done"]


def test_adaptive_never_overspends_and_uses_the_whole_budget():
    """With rc_method=exact the paper's ε stays within the budget after every round; τ_k fills the rest."""
    algo = DPFL(adaptive=True, rc_method="exact", sigma=1.1)
    _, infos, _ = run_dpfl(algo, 60, 1.75)                                                   # R_c = 174 steps
    steps = [i["steps_total"] for i in infos]
    assert all(paper_epsilon(s, 0.015, 1.1, 1e-5) <= 1.75 for s in steps)
    assert steps[-1] == algo.R_c == 174 or len(infos) == 60
    assert all(b - a == i["tau"] for a, b, i in zip([0] + steps, steps, infos, strict=False))
    assert algo.spent(0)["eps_paper"] == pytest.approx(paper_epsilon(algo.used, 0.015, 1.1, 1e-5))


def test_condition_one_keeps_tau_at_one_and_estimates_nothing(monkeypatch):
    """R_s >= R_c: T(τ) = R_c for every τ, so G is smallest at τ = 1 (ALI Sec. VI-B; reading C-A2). No round
    then estimates ρ, β, ξ: on CIFAR-10 those two gradient passes a round were 40% of a round's time. Under
    Condition II (R_s = 40 < 79) every round does, with two passes."""
    calls, grads = [], DPSGDClients.grads
    monkeypatch.setattr(DPSGDClients, "grads", lambda self, X, b: calls.append(1) or grads(self, X, b))
    algo = DPFL(adaptive=True, sigma=1.1)
    _, infos, _ = run_dpfl(algo, 200, 1.55)
    assert {i["tau"] for i in infos} == {1} and len(infos) == 79 and calls == []
    _, infos, _ = run_dpfl(DPFL(adaptive=True, sigma=1.1), 40, 1.55)
    assert len(calls) == 2 * len(infos) == 80


def test_one_dpsgd_step_and_size_weighted_average_by_hand():
    algo = DPFL(tau=1, lr=0.5, sigma=1.1, clip=100.0, sample_rate=0.5, rc_override=10)
    x1, _, _ = run_dpfl(algo, 1, 1.55, n=2, sizes=[100, 300])
    # client i: w_i = 0 - η (clip(0 - b_i) + σ C z_i) / B_i, B_i = 0.5 |D_i|; server: weights 1/4, 3/4
    b = torch.tensor([[0.0, 1.0], [2.0, 3.0]], dtype=torch.float64)
    z = torch.randn(2, 2, generator=round_generator(0, 2, 0, None), dtype=torch.float64)
    w = -0.5 * (-b + 1.1 * 100.0 * z) / torch.tensor([[50.0], [150.0]], dtype=torch.float64)
    assert torch.allclose(x1, 0.25 * w[0] + 0.75 * w[1])


def test_budget_smaller_than_tau_is_refused():
    with pytest.raises(ConfigError, match="privacy.epsilon"):
        DPFL(tau=5).setup(torch.zeros(2), 3, 10, Privacy(epsilon=1.0, delta=1e-5), 0)     # R_c < 5


@pytest.mark.parametrize("overrides, key", [
    (["algo.tau=0"], "algo.tau"),
    (["algo.rc_method=paper"], "algo.rc_method"),
    (["algo.tau_rule=h"], "algo.tau_rule"),
    (["algo.sample_rate=1.5"], "algo.sample_rate"),
    (["model=resnet20"], "model.norm"),
])
def test_bad_dpfl_settings_are_refused(overrides, key):
    with pytest.raises(ConfigError) as err:
        validate(composed("experiment=alidpfl_fmnist", *overrides))
    assert err.value.key == key


def test_closed_form_takes_the_codes_estimates(monkeypatch):
    """The authors' code: μ̂ from the last local step's length ||w_after − w_before|| (its ``grad_diff`` subtracts
    parameters), Γ̂ from the loss before and after that step, B̂ = ⌊q·min|D_i|⌋ even with a divisor (reading C-A1)."""
    import normfl.algorithms.alidpfl as ali

    seen, steps = [], []
    estimates = ali.code_estimates
    monkeypatch.setattr(ali, "code_estimates", lambda *args: seen.append(args) or estimates(*args))
    local = ali.local_dpsgd
    monkeypatch.setattr(ali, "local_dpsgd", lambda *args: steps.append(local(*args)) or steps[-1])
    centers = torch.arange(6, dtype=torch.float64).reshape(3, 2)
    loss = lambda X: 1.5 * ((X - centers) ** 2).sum(-1)                      # noqa: E731 F_i, ∇F_i = 3(X − b_i):
    monkeypatch.setattr(DPSGDClients, "grads", lambda self, X, batches: (3 * (X - centers), loss(X)))  # Δ∇F = 3Δw
    algo = DPFL(adaptive=True, tau_rule="closed_form_code", divisor=64, sigma=1.1, rc_override=50)
    run_dpfl(algo, 3, 1.55, sizes=[100, 70, 90])
    assert algo.selector.batch_hat == 1 and len(seen) == 3                   # ⌊0.015·70⌋, not the divisor 64
    for (_, step_norms, _, loss_diffs), (W, _, _, before) in zip(seen, steps, strict=True):
        assert step_norms == pytest.approx(torch.linalg.vector_norm(W - before, dim=1).tolist())
        assert loss_diffs == pytest.approx((loss(W) - loss(before)).tolist())


def test_a_fixed_tau_run_accepts_the_tau_rule_unread_and_its_key_leaves_it_out():
    """experiment=alidpfl_authors_code sets the code's τ rule for its ALI-DPFL runs and hosts fixed-τ runs too."""
    from normfl.config import config_key

    def key(*overrides):
        cfg = composed("experiment=alidpfl_fmnist", *overrides)
        validate(cfg)
        return config_key(cfg)

    assert key("algo=dpfl", "algo.tau_rule=closed_form_code", "algo.tau_cap=7") == key("algo=dpfl")
    assert key("algo=ali_dpfl", "algo.tau_rule=closed_form_code") != key("algo=ali_dpfl")
    assert key("algo=dpfl", "algo.tau=3") != key("algo=dpfl")
    for algo in ("algo=dpfl", "algo=ali_dpfl"):
        cfg = composed("experiment=alidpfl_authors_code", algo)
        validate(cfg)
        assert cfg.algo.tau_rule == "closed_form_code"


def test_an_adaptive_tau_makes_the_epsilon_a_claim_and_fixed_tau_a_certificate():
    """ALI-DPFL under Condition II (R_s < R_c) picks τ from un-noised estimates: its ε is a claim. Fixed τ, and
    Condition I (τ* ≡ 1, nothing estimated), release the DP-SGD steps only."""
    for algo, rounds in ((DPFL(tau=2, sigma=1.1), 40), (DPFL(adaptive=True, sigma=1.1), 200)):      # R_c = 79
        run_dpfl(algo, rounds, 1.55)
        assert algo.not_certified() == []
    algo = DPFL(adaptive=True, sigma=1.1)
    run_dpfl(algo, 40, 1.55)
    assert len(algo.not_certified()) == 1 and "without noise" in algo.not_certified()[0]


def test_a_tau_that_cannot_be_chosen_is_one_warning_at_the_end_and_its_rounds_only_at_debug(caplog):
    """η·β̂ = 3 (the stand-in clients' β̂ is 1) puts φ < 0, so no τ is feasible after any round: one warning
    when the run ends, with the count; the estimates, computed without noise, only at DEBUG."""
    caplog.set_level(logging.INFO)
    algo = DPFL(adaptive=True, sigma=1.1, lr=3.0)
    _, infos, _ = run_dpfl(algo, 40, 1.55)
    said = [r for r in caplog.records if r.name == "normfl.algorithms.alidpfl"]
    assert len(infos) == 40 and {i["tau"] for i in infos} == {1}
    assert algo.privacy_extra(40)["tau_infeasible_rounds"] == 40
    assert len(said) == 1 and said[0].levelno == logging.WARNING and "in 40 of the 40 rounds" in said[0].message
    assert "When τ* cannot be chosen" in said[0].message and "rho=" not in caplog.text
    caplog.clear()
    caplog.set_level(logging.DEBUG, logger="normfl.algorithms.alidpfl")
    run_dpfl(DPFL(adaptive=True, sigma=1.1, lr=3.0), 40, 1.55)
    assert [r.levelno for r in caplog.records].count(logging.DEBUG) == 40 and "rho=" in caplog.text


@pytest.mark.slow
def test_an_ali_dpfl_run_says_claimed_everywhere_and_a_fixed_tau_run_certified(tmp_path, data_root):
    """The closing line, the sweep's table and ``collect``: ALI-DPFL's ε is claimed, fixed-τ DPFL's certified; the
    τ warning comes once, and no estimate reaches the console."""
    out = train(data_root, "experiment=alidpfl_fmnist", "model=logreg", "dataset.train_limit=2000",
                "dataset.test_limit=200", "rounds=4", "algo.rc_override=30", "algo.lr=2", "eval_every=4",
                "progress=false", "device=cpu", "threads=1", "algo=dpfl,ali_dpfl", f"hydra.sweep.dir={tmp_path}",
                multirun=True, code=None, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    said = out.stdout + out.stderr
    job = {s["algo"]: (d, s["privacy"]) for d in tmp_path.iterdir() if (d / "summary.json").is_file()
           for s in [json.loads((d / "summary.json").read_text())]}
    why = job["ali_dpfl"][1]["not_certified"]
    assert len(why) == 1 and "ALI-DPFL chooses each round's τ from estimates" in why[0]
    assert "not_certified" not in job["dpfl"][1] and job["ali_dpfl"][1]["tau_infeasible_rounds"] == 4
    assert f"claimed (pld); not a certificate: {why[0]} | {job['ali_dpfl'][0]}" in out.stdout
    assert f"certified (pld) | {job['dpfl'][0]}" in out.stdout
    assert said.count("no τ could be chosen") == 1 and "in 4 of the 4 rounds that chose τ*" in said
    assert "rho=" not in said and "Estimates(" not in said
    table = {r["algo.name"]: r for r in rows((tmp_path / "jobs.md").read_text())}
    assert table["ali_dpfl"]["ε (certified)"] == "–" and float(table["dpfl"]["ε (certified)"]) > 0
    eps = collect(tmp_path, keys=("algo.name",)).set_index("algo.name").epsilon
    assert pd.isna(eps["ali_dpfl"]) and eps["dpfl"] > 0


def test_wandb_names_the_epsilon_a_claim_or_a_certificate(tmp_path):
    """W&B's run summary takes a summary's scalars only, so the privacy block (with ``not_certified``) never
    reached it: a claimed ε is ``epsilon_claimed`` beside the reason, a certified one ``epsilon_certified``."""
    from normfl.results import Recorder

    class Run:                                              # what the Recorder uses of a wandb run
        def __init__(self):
            self.summary = {}

        def log(self, *a, **k):
            pass

        def finish(self, exit_code=0):
            self.exit_code = exit_code

    block = {"epsilon_pld": 1.005, "epsilon_rdp": 1.2, "target_epsilon": 2}
    why = ["ALI-DPFL chooses each round's τ from estimates computed on the clients' data without noise"]
    claimed = {"epsilon_claimed": 1.005, "epsilon_not_certified": why[0]}
    for privacy, want in ((block, {"epsilon_certified": 1.005}), ({**block, "not_certified": why}, claimed),
                          (None, {})):
        rec = Recorder(tmp_path)
        run = rec.wandb = Run()
        rec.add({"round": 0, "test_acc": 0.5, "test_loss": 1.0})
        rec.summary({"status": "completed", "privacy": privacy})
        got = {k: v for k, v in run.summary.items() if k.startswith("epsilon")}
        assert got == want and run.exit_code == 0


@pytest.mark.parametrize("algo, shown", [("ali_dpfl", False), ("dp_normec", False), ("normec", True)])
def test_the_progress_bar_shows_no_train_loss_of_a_private_run(algo, shown, tmp_path, data_root, capfd):
    """The train loss is the clients' loss on their own data, without noise: a private run's progress bar shows
    the test accuracy alone (the loss stays in metrics.csv, privacy.md says so); a run without privacy, both."""
    from normfl.run import run

    cfg = composed(f"algo={algo}", "dataset=fashion_mnist", "model=logreg", "dataset.train_limit=400", "clients=4",
                   "dataset.test_limit=100", "rounds=3", "progress=true", f"data_root={data_root}",
                   *(["algo.rc_override=6", "algo.sample_rate=0.1"] if algo == "ali_dpfl" else []))
    run(cfg, tmp_path / "run")
    bar = capfd.readouterr().err
    assert "acc=" in bar and ("loss=" in bar) is shown
