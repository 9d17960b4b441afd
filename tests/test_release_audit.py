"""The release audit (``audit.mode=release``, ``normfl.privacy.audit.release``): canary clients through the
algorithm's own round, scored from the models it broadcasts. Six one-line leaks, each applied to the source of the
page's example (docs/own-algorithm/fedavgm.py) and of a built-in (normfl/algorithms/ef21.py, α-NormEC), are refuted
by it and missed by the side-car and in-band audits, which observe the privatizer's output; every correct algorithm
of the client-level path, built-in or a user's, stays consistent over five audit seeds."""

import difflib
import importlib
import sys

import pytest

from normfl.config import ConfigError, config_key, validate
from normfl.privacy import mechanisms
from normfl.run import run
from tests.helpers import OFFLINE, REPO, composed

EXAMPLE, OUTSIDE = REPO / "docs" / "own-algorithm", REPO / "tests" / "outside"
SMALL = ["dataset=fashion_mnist", "model=logreg", "dataset.train_limit=400", "dataset.test_limit=100", "clients=4",
         "batch_size=8", "rounds=20", "eval_every=10", "progress=false", "privacy.delta=1e-5", "privacy.epsilon=2",
         "privacy.calibration=accountant", "accountant=pld", f"offline_data={OFFLINE}"]
CANARIES = 400              # about 200 in: every guess right bounds ε at 3.8 (certified: 2)
CACHE: dict = {}            # the data, loaded once for the module's runs


def audited(data_root, tmp_path, *overrides, mode="release", canaries=CANARIES, seed=42) -> dict:
    cfg = composed(*SMALL, f"data_root={data_root}", f"audit.canaries={canaries}", f"audit.mode={mode}",
                   f"seed={seed}", *overrides)
    return run(cfg, tmp_path / f"{mode}-{seed}", cache=CACHE)["audit"]


# -- the leaks: one line of a correct algorithm's source changed -------------------------------------------------

# (file, the correct line, the leaky line): each a change a new algorithm is likely to have
EXAMPLE_SEND = "        sent = self.privatize(self.bounding(G), k)               # Clip_β(∇f_i(x^k)) + z_i"
EF21_SEND = "        sent = self.privatize(delta, k)                      # 7/8: Δ̂_i = Δ_i (+ z_i if private)"
EF21_SERVER = "        self.ghat += (self.weight * sent).mean(-2)           # 10: ĝ^{k+1} = ĝ^k + (1/n) Σ β Δ̂_i"
LEAKS = {
    "server uses un-noised values": {
        "fedavgm": ("        self.m = self.mu * self.m + weighted_mean(draw.q, sent, draw.ids)",
                    "        self.m = self.mu * self.m + weighted_mean(draw.q, self.bounding(G), draw.ids)"),
        "ef21": (EF21_SERVER, "        self.ghat += (self.weight * delta).mean(-2)")},
    "client memory the server reads built from un-noised values": {   # the example keeps no client memory
        "ef21": (EF21_SERVER, "        self.ghat = self.g.mean(-2)")},
    "noise on half the coordinates": {
        "fedavgm": (EXAMPLE_SEND, "        sent = (b := self.bounding(G)) + (self.privatize(b, k) - b) * "
                                  "(torch.arange(b.shape[-1]) % 2 == 0)"),
        "ef21": (EF21_SEND, "        sent = delta + (self.privatize(delta, k) - delta) * "
                            "(torch.arange(delta.shape[-1]) % 2 == 0)")},
    "a tenth of the noise": {
        "fedavgm": (EXAMPLE_SEND, "        sent = (b := self.bounding(G)) + 0.1 * (self.privatize(b, k) - b)"),
        "ef21": (EF21_SEND, "        sent = delta + 0.1 * (self.privatize(delta, k) - delta)")},
    "the clip removed (and the CPU upload check off)": {
        "fedavgm": (EXAMPLE_SEND, "        sent = self.privatize(G, k)"),
        "ef21": ("        delta = self.bounding(G - self.g)                    # 5: Δ_i = Ψ(∇f_i(x^k) - g_i^k)",
                 "        delta = G - self.g")},
    "an extra release per round the accountant does not count": {
        "fedavgm": (EXAMPLE_SEND, "        sent = (self.privatize(b := self.bounding(G), k) + "
                                  "self.privatize(b, k + 10**6)) / 2"),
        "ef21": (EF21_SEND, "        sent = (self.privatize(delta, k) + self.privatize(delta, k + 10**6)) / 2")},
}
SOURCES = {"fedavgm": (EXAMPLE / "fedavgm.py", "FedAvgM", ["algo=dp_fedavgm", "p=0.5"]),
           "ef21": (REPO / "normfl" / "algorithms" / "ef21.py", "NormEC", ["algo=dp_normec"])}
CASES = [(leak, where) for leak, places in LEAKS.items() for where in places]


def leaky(tmp_path, monkeypatch, leak: str, where: str) -> list[str]:
    """The overrides of a run of ``where``'s algorithm with ``leak``'s one line changed, its module written beside
    the test; the CPU's upload check is switched off as on a GPU (else it stops the run without the clip)."""
    path, cls, overrides = SOURCES[where]
    old, new = LEAKS[leak][where]
    source = path.read_text()
    assert source.count(old + "\n") == 1, f"{path.name} no longer has the line {old.strip()!r}"
    changed = source.replace(old + "\n", new + "\n")
    diff = [d for d in difflib.unified_diff(source.splitlines(), changed.splitlines(), lineterm="", n=0)
            if d[:1] in "+-" and not d.startswith(("+++", "---"))]
    assert len(diff) == 2, diff                               # one line out, one line in
    name = f"leaky_{where}_{abs(hash(leak)) % 10**8}"
    (tmp_path / f"{name}.py").write_text(changed)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    sys.modules.pop(name, None)
    monkeypatch.setattr(mechanisms, "within", lambda *a: None)
    return [*overrides, f"hydra.searchpath=[file://{EXAMPLE / 'conf'}]", f"algo._target_={name}.{cls}"]


@pytest.mark.slow
@pytest.mark.parametrize("leak, where", CASES, ids=[f"{w}: {leak}" for leak, w in CASES])
def test_a_one_line_leak_is_refuted_by_the_release_audit_and_missed_by_the_others(leak, where, tmp_path, data_root,
                                                                                  monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    overrides = leaky(tmp_path, monkeypatch, leak, where)
    release = audited(data_root, tmp_path, *overrides)
    assert release["verdict"] == "refutes the certificate", release
    for mode in ("sidecar", "inband"):                      # they observe the privatizer's output: all is well there
        other = audited(data_root, tmp_path, *overrides, mode=mode)
        assert other["verdict"] == "consistent with the certificate", (mode, other)


@pytest.mark.slow
def test_each_leak_is_refuted_for_its_own_reason(tmp_path, data_root, monkeypatch):
    """Values used before their noise are seen as such in every step, exactly; an unbounded canary shows in the
    bounds; an uncounted release in the count. On the example: which reason refutes each."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    seen = {}
    for leak, places in LEAKS.items():
        if "fedavgm" in places:
            audit = audited(data_root, tmp_path / str(len(seen)), *leaky(tmp_path, monkeypatch, leak, "fedavgm"))
            seen[leak] = (audit["leaks"], audit["releases_over"], max(audit["eps_lower"], audit["eps_lower_curve"]))
            certified = audit["eps_certified"]
    assert seen["server uses un-noised values"][:2] == (20, 0) and seen["server uses un-noised values"][2] > certified
    assert seen["noise on half the coordinates"][:2] == (20, 0)
    assert seen["a tenth of the noise"][:2] == (20, 0)
    assert seen["the clip removed (and the CPU upload check off)"][:2] == (0, 0)
    assert seen["the clip removed (and the CPU upload check off)"][2] > certified
    assert seen["an extra release per round the accountant does not count"][:2] == (0, 20)


# -- the correct algorithms -----------------------------------------------------------------------------------------

CORRECT = {
    "dp_normec": ["algo=dp_normec"],
    "dp_clip21": ["algo=dp_clip21"],
    "dp_fed_normec": ["algo=dp_fed_normec", "p=0.5"],
    "dp_fedavg client noise": ["algo=dp_fedavg", "algo.local_steps=2"],
    "dp_fedavg server noise": ["algo=dp_fedavg", "algo.noise_by=server", "p=0.5", "algo.local_steps=1"],
    "dpsgd_norm": ["algo=dpsgd_norm", "algo.private=true"],
    "the example dp_fedavgm": ["algo=dp_fedavgm", "p=0.5", f"hydra.searchpath=[file://{EXAMPLE / 'conf'}]"],
    "held-out dp_fedadam": ["algo=dp_fedadam", f"hydra.searchpath=[file://{OUTSIDE / 'conf'}]"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", CORRECT)
def test_a_correct_algorithm_is_consistent_over_five_audit_seeds(name, tmp_path, data_root, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.syspath_prepend(str(OUTSIDE))
    for seed in range(5):
        audit = audited(data_root, tmp_path, *CORRECT[name], seed=seed)
        assert audit["verdict"] == "consistent with the certificate" and audit["leaks"] == 0, audit
        assert audit["steps_observed"] == 20 and audit["clients_audited"] == 4 + CANARIES, audit
        assert audit["eps_lower"] <= audit["eps_certified"] and audit["eps_lower_curve"] <= audit["eps_certified"]


@pytest.mark.slow
def test_a_noise_cut_the_aggregate_does_not_hide_is_refuted_by_the_bounds(tmp_path, data_root, monkeypatch):
    """Central noise (one draw on the aggregate): the broadcast models show a canary as its certificate assumes, so
    a tenth of the noise (in the privatizer itself, where no mark can see it) is refuted by the bounds alone."""
    real = mechanisms._gaussian
    monkeypatch.setattr(mechanisms, "_gaussian", lambda v, std, gen: real(v, std / 10, gen))
    audit = audited(data_root, tmp_path, *CORRECT["dp_fedavg server noise"])
    assert audit["leaks"] == 0 and audit["releases_over"] == 0
    assert max(audit["eps_lower"], audit["eps_lower_curve"]) > audit["eps_certified"], audit
    assert audit["verdict"] == "refutes the certificate"


# -- what the audit is run on, and what it refuses --------------------------------------------------------------


@pytest.mark.slow
def test_the_run_audited_has_the_canaries_as_clients_and_says_so(tmp_path, data_root):
    """n + N clients: the certificate is this run's (its noise sized for them), the model is not the production
    run's, and the key differs from both the plain and the side-car audited run's."""
    audit = audited(data_root, tmp_path, "algo=dp_normec")
    assert audit["mode"] == "release" and audit["clients_audited"] == 404 and 150 < audit["in"] < 250, audit
    assert "not the run's without them" in audit["audited"]
    keys = {config_key(composed(*SMALL, "algo=dp_normec", *o)) for o in (
        [], ["audit.canaries=400"], ["audit.canaries=400", "audit.mode=release"])}
    assert len(keys) == 2


@pytest.mark.slow
def test_a_release_audit_resumes_with_its_run(tmp_path, data_root):
    from normfl.run import start
    from tests.helpers import trained

    cfg = composed(*SMALL, f"data_root={data_root}", "algo=dp_fed_normec", "p=0.5", "audit.canaries=200",
                   "audit.mode=release")
    alone = run(cfg, tmp_path / "alone")["audit"]
    t = trained(start(cfg, tmp_path / "resumed"), until_step=7)
    t.save()
    t.rundir.release()
    assert run(cfg, tmp_path / "resumed")["audit"] == alone


PAPER = ["privacy.calibration=paper", "accountant=paper"]   # what an algorithm that sizes its own noise takes


@pytest.mark.parametrize("overrides, says", [
    (["algo=ali_dpfl", *PAPER], r"audit.mode='release'.*sidecar or inband with algo=ali_dpfl"),
    (["algo=dp_normfedavg", *PAPER], r"audit.mode='release'.*sidecar or inband with algo=dp_normfedavg"),
    (["algo=normec"], r"audit.canaries=400.*without privacy"),
])
def test_a_release_audit_that_cannot_be_made_is_refused_before_any_work(overrides, says, data_root):
    with pytest.raises(ConfigError, match=says):
        validate(composed(*SMALL, f"data_root={data_root}", "audit.canaries=400", "audit.mode=release", *overrides))


def test_more_canaries_than_coordinates_are_refused(tmp_path, data_root):
    with pytest.raises(ConfigError, match=r"audit.canaries=8000; allowed: an even integer <= 7850"):
        audited(data_root, tmp_path, "algo=dp_normec", canaries=8000)
    assert not (tmp_path / "release-42").exists()


# -- the parts ----------------------------------------------------------------------------------------------------


def test_the_privatizer_cuts_the_mark_from_its_input_and_a_memory_keeps_it_without_its_history():
    """The data flow the release audit traces: the privatizer's output carries no mark of its input (noise covers
    it), anything computed from a marked value without it does, and a round's state keeps its mark from step to
    step (a memory the server reads later) while its graph is dropped (no history growing over a run)."""
    import torch

    from normfl.algorithms.memory import ClientMemory
    from normfl.privacy.audit.release import Tape, _carried, _Cut

    class Audit:
        calls = marked = 0
        tape = Tape()
    audit, mech = Audit(), mechanisms.Gaussian(1.0, 0.5, "client")
    cut = _Cut(mech, audit)
    marked = torch.tensor([[0.6, 0.8]], requires_grad=True) * 1.0
    out = cut(marked, torch.Generator().manual_seed(0))
    assert not out.requires_grad and audit.calls == audit.marked == 1 and cut.std == 0.5
    assert cut.release() == mech.release()
    cut(marked[:0], torch.Generator())                     # no client this step: no release
    assert audit.calls == 1
    def fresh_mark(t):                                     # marked, one step from a leaf: no history behind it
        return t.requires_grad and t.grad_fn.next_functions[0][0].variable.is_leaf

    memory = torch.zeros(2) + 2 * marked[0]                # built from the un-noised value
    kept = _carried(memory)
    assert fresh_mark(kept) and torch.equal(kept, memory)
    kept += 1.0                                             # still updated in place, as a round does
    plain = torch.zeros(3)
    assert _carried(plain) is plain
    rows = ClientMemory(2, 2, "cpu", torch.float32)
    rows[None] = marked.expand(2, 2)
    assert _carried(rows) is rows and fresh_mark(rows.rows)


@pytest.mark.slow
def test_each_score_route_and_guess_holds_at_its_share_of_alpha(tmp_path, data_root, monkeypatch):
    """Two scores (all iterates, final model), two routes each (the (ε, δ) bound, the curve test), and each of the
    guessing rules k in FRACTIONS of N: each test refutes at ALPHA / (2·2·len(k)), so the verdict holds with
    probability 1 - ALPHA."""
    from normfl.privacy.audit import release
    from normfl.privacy.audit.canaries import ALPHA

    seen, lower, curve = [], release.one_run_eps_lower, release.one_run_curve_lower

    def spy_lower(m, guess, delta, fail):
        seen.append(("lower", guess.k, fail))
        return lower(m, guess, delta, fail)

    def spy_curve(m, tests, family, fail, eps_of):
        seen.append(("curve", tuple(g.k for g in tests), fail))
        return curve(m, tests, family, fail, eps_of)

    monkeypatch.setattr(release, "one_run_eps_lower", spy_lower)
    monkeypatch.setattr(release, "one_run_curve_lower", spy_curve)
    audited(data_root, tmp_path, "algo=dp_normec", "rounds=2")
    ks = (8, 32, 80, 140)                                  # 2%, 8%, 20%, 35% of the 400 canaries
    share = ALPHA / (2 * 2 * len(ks))
    assert sorted(seen) == sorted([("lower", k, share) for k in ks] * 2 + [("curve", ks, share)] * 2)


@pytest.mark.slow
def test_a_round_with_autograd_off_or_a_choice_from_un_noised_values_is_refuted_by_its_replays(tmp_path, data_root,
                                                                                               monkeypatch):
    """The marks follow values through autograd: a round that turns it off leaves none, and a number taken out of
    torch (a step size from the clients' largest un-noised gradient norm) carries none. The replayed steps, every
    canary out and every privatizer output as it was, see both; a correct round with autograd off is consistent,
    and says its data flow was not traced."""
    correct = audited(data_root, tmp_path / "correct", "algo=dp_normec", "algo._target_=tests.helpers.WithoutAutograd")
    assert correct["verdict"] == "consistent with the certificate", correct
    assert correct["data_flow_traced"].startswith("0 of 20 steps: not traced") and correct["replays_changed"] == 0
    overrides = leaky(tmp_path, monkeypatch, "server uses un-noised values", "ef21")
    name = overrides[-1].split("=")[1].split(".")[0]
    (tmp_path / f"{name}.py").write_text((tmp_path / f"{name}.py").read_text() + (
        "\n\nclass WithoutAutograd(NormEC):\n    def round(self, k, x, clients):\n        with torch.no_grad():\n"
        "            return super().round(k, x, clients)\n"))
    off = audited(data_root, tmp_path / "off", *overrides[:-1], f"algo._target_={name}.WithoutAutograd")
    assert off["verdict"] == "refutes the certificate" and off["leaks"] == 0, off
    assert off["replays_changed"] == 4                               # steps 1, 2, 10 and 20, all replayed
    step = ("        x = server_step(x, self.ghat, self.gamma, self.server_norm)   # 11: x^{k+1} = x^k - γ ĝ(/||ĝ||)",
            "        x = server_step(x, self.ghat, self.gamma / max(1.0, G.norm(dim=-1).max().item()), "
            "self.server_norm)")
    monkeypatch.setitem(LEAKS, "a step size from un-noised values", {"ef21": step})
    chosen = audited(data_root, tmp_path / "chosen", *leaky(tmp_path, monkeypatch, "a step size from un-noised values",
                                                            "ef21"))
    assert chosen["verdict"] == "refutes the certificate" and chosen["leaks"] == 0, chosen
    assert chosen["replays_changed"] == 4 and "taken again with every canary out" in chosen["why"][0]


@pytest.mark.slow
@pytest.mark.parametrize("algo", [["algo=dp_fed_normec", "p=0.5"], ["algo=dp_normec"]], ids=["memories", "ef21"])
def test_replaying_a_step_leaves_the_run_as_it_was(algo, tmp_path, data_root, monkeypatch):
    """A replayed step is taken from a copy of the state it started in, and the run goes on from the step as it was
    taken: the same parameters, metrics and scores as with no step replayed (client memories, error feedback)."""
    import numpy as np
    import pandas as pd

    from normfl.privacy.audit import release

    runs = {}
    for name, replayed, every in (("replayed", release.REPLAYED, release.REPLAY_EVERY), ("not", (), 10**9)):
        monkeypatch.setattr(release, "REPLAYED", replayed)
        monkeypatch.setattr(release, "REPLAY_EVERY", every)
        audit = audited(data_root, tmp_path / name, *algo, "save_params=true")
        runs[name] = (audit, pd.read_csv(tmp_path / name / "release-42" / "metrics.csv").drop(columns="wall_time"),
                      np.load(tmp_path / name / "release-42" / "params.npy"))
    (a, ma, pa), (b, mb, pb) = runs["replayed"], runs["not"]
    pd.testing.assert_frame_equal(ma, mb)
    assert pa.tobytes() == pb.tobytes() and a["scores"] == b["scores"] and a["replays_changed"] == 0
    from normfl.run import start
    from tests.helpers import trained

    monkeypatch.undo()                                                # steps replayed again
    t = trained(start(composed(*SMALL, f"data_root={data_root}", *algo, "audit.canaries=400", "audit.mode=release"),
                      tmp_path / "marks"), until_step=2)             # steps 1 and 2 replayed
    memory = t.algo.v.rows if hasattr(t.algo, "v") else t.algo.g
    assert memory.requires_grad                                       # the client memories keep their marks
    t.rundir.release()


def test_an_audited_runs_closing_line_carries_its_verdict_and_bounds(tmp_path):
    """Only summary.json had the audit's verdict; the line that ends the run says it now, and a release audit's first
    reason."""
    from normfl.results import closing_line

    run_ = {"status": "completed", "wall_time_s": 3.0, "final_test_acc": 0.5, "best_test_acc": 0.5, "best_round": 9,
            "privacy": {"target_epsilon": 2.0, "epsilon_pld": 2.0}}
    block = {"canaries": 400, "eps_lower": 0.37, "eps_lower_curve": 1.62, "eps_certified": 2.0}
    said = {"consistent": {**block, "verdict": "consistent with the certificate"},
            "sidecar refutes": {**block, "eps_lower": 2.5, "verdict": "refutes the certificate"},
            "release refutes": {**block, "mode": "release", "verdict": "refutes the certificate",
                                "why": ["un-noised values reached the released model in 20 of 20 steps", "more"]}}
    lines = {k: closing_line({**run_, "audit": a}, tmp_path) for k, a in said.items()}
    assert "| audit (sidecar, 400 canaries): consistent, ε ≥ 0.37 (curve 1.62) |" in lines["consistent"]
    assert ("audit (sidecar, 400 canaries): REFUTES the certificate: ε ≥ 2.50 (curve 1.62) above the certified 2.00"
            in lines["sidecar refutes"])
    assert ("audit (release, 400 canaries): REFUTES the certificate: un-noised values reached the released model in "
            "20 of 20 steps |" in lines["release refutes"])
    assert "| audit (" not in closing_line(run_, tmp_path)


@pytest.mark.slow
def test_a_release_audited_run_in_a_sweep_trained_side_by_side_is_audited_as_alone(tmp_path, data_root):
    """Runs sharing data train side by side in one process (``hydra/launcher=stacked``): a release-audited one steps
    alone, through its audit's round, beside a plain run, and its audit and model are those of the run alone."""
    import numpy as np

    from normfl.run.together import train_together

    audited_ = composed(*SMALL, f"data_root={data_root}", "algo=dp_normec", "audit.canaries=200", "audit.mode=release",
                        "save_params=true", "backend=sequential")
    plain = composed(*SMALL, f"data_root={data_root}", "algo=dp_normec", "save_params=true", "backend=sequential")
    together = train_together([(audited_, tmp_path / "a"), (plain, tmp_path / "b")])
    alone = run(audited_, tmp_path / "alone")
    assert together[0]["audit"]["leaks"] == 0 and together[0]["audit"]["steps_observed"] == 20
    assert together[0]["audit"]["scores"] == alone["audit"]["scores"]
    assert np.load(tmp_path / "a" / "params.npy").tobytes() == np.load(tmp_path / "alone" / "params.npy").tobytes()


def test_make_audits_power_cells_each_cut_the_noise_once(tmp_path, data_root):
    """``make audit``'s power table (scripts/audit.py): a cell keeps a fraction of the noise by patching
    ``Algorithm.privatize``, and a worker process runs several cells, one after another. Each must put the
    privatizer back, or the next cell's cut multiplies with it: the table had shown every cell refuted, all 280
    guesses right at 0.9 of the server noise, where that cell alone gets 51 of 64 (a bound of 0.52)."""
    from normfl.algorithms.base import Algorithm
    from tests.helpers import script

    audit, real = script("audit"), Algorithm.privatize
    name, overrides, _ = audit.POWER[1]                              # server noise: the bounds see the cut
    cell = (name, CANARIES, 0.9, [*overrides, f"data_root={data_root}"])
    first, second = (audit.power_cell((*cell, tmp_path / str(i)))["audit"] for i in range(2))
    assert Algorithm.privatize is real
    assert first["scores"] == second["scores"] and first["eps_lower"] < 1, first       # the same cut, twice
    assert [(s["correct"], s["guesses"]) for s in second["scores"]] == [(51, 64), (51, 64)]   # as the cell alone
