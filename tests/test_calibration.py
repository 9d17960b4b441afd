"""Noise calibrated to the releases a run really makes, under each reading of a round.

With ``privacy.calibration=accountant`` the noise multiplier is solved so that the whole run certifies
(privacy.epsilon, privacy.delta) over every noisy release it makes: one a round under ``reading=text``, a pass's
minibatch steps a round under ``reading=pass``. Each test here trains tiny real runs (Fashion-MNIST slices, a
logistic regression, four clients) of every Gaussian family that calibrates this way: the per-client noise of
DP-α-NormEC and DP-Clip21, the central noise of DP-SGD with normalization and of DP-FedAvg, and DP-Fed-α-NormEC
with partial participation, charged every round or claiming amplification by sampling; under the PLD and RDP
accountants and both neighbouring relations. The count of releases and the noise multiplier are worked out
here from the data and from dp-accounting directly, not from normfl. A run calibrated for its passes instead of
its releases carries about a third of the noise it needs here (nine releases a pass) and certifies far above
its target; one calibrated for too many releases certifies needlessly far below it. NormFedAvg and DPFL define
their own round and refuse ``reading=pass``; the two tests at the end check, under ``reading=text``, the part of
each that is set by privacy.epsilon: NFA Theorem 2's per-message budget, and DPFL's budget of DP-SGD steps."""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass

import dp_accounting as dpa
import pandas as pd
import pytest
from dp_accounting import pld, rdp

from normfl.config.keys import algorithm
from normfl.privacy import certified
from normfl.run import run
from tests.helpers import REPO, composed

TRAIN, CLIENTS, BATCH = 398, 4, 10         # shards of 100, 100, 99, 99 samples: 9 full batches of 10 in each pass
EPSILON, DELTA = 2.0, 1e-5
PASSES, TEXT_ROUNDS = 2, 6                 # 18 releases under reading=pass, 6 under reading=text
TIGHT = 1e-3                               # the calibrating accountant's ε lies in [(1 - TIGHT) ε, ε]
Z_TOL = 2e-3                               # the run's z lies within this of the smallest z dp-accounting accepts
SMALL = ["dataset=fashion_mnist", "model=logreg", f"dataset.train_limit={TRAIN}", "dataset.test_limit=100",
         f"clients={CLIENTS}", f"batch_size={BATCH}", "progress=false", "eval_every=1", "checkpoint_every=0",
         f"privacy.delta={DELTA}"]


@dataclass(frozen=True)
class Case:
    """A private run calibrated by an accountant, and what dp-accounting needs to account it: the sensitivity of
    the released vector, each client's chance p to take part in a release, whether amplification by sampling at
    p is claimed, and whether neighbouring runs replace a client (the release then moves by twice the
    sensitivity) rather than add or remove one."""

    overrides: tuple[str, ...]
    accountant: str
    sensitivity: float
    p: float = 1.0
    amplified: bool = False
    replace: bool = False


CASES = {
    # per-client noise on a release of norm ≤ 1 (Norm_α), or ≤ β = 0.01 (Clip_β)
    "dp_normec-pld": Case(("algo=dp_normec",), "pld", 1.0),
    "dp_normec-rdp": Case(("algo=dp_normec",), "rdp", 1.0),
    "dp_normec-pld-replace": Case(("algo=dp_normec", "privacy.neighbouring=replace"), "pld", 1.0, replace=True),
    "dp_normec-rdp-replace": Case(("algo=dp_normec", "privacy.neighbouring=replace"), "rdp", 1.0, replace=True),
    "dp_clip21-pld": Case(("algo=dp_clip21",), "pld", 0.01),
    # central noise: on the mean of the n = 4 terms of norm ≤ β = 1 (sensitivity β/n), on the sum of β-bounded terms
    "dpsgd_norm-pld": Case(("algo=dpsgd_norm", "algo.private=true"), "pld", 0.25),
    "dp_fedavg_server-pld": Case(("algo=dp_fedavg", "algo.noise_by=server"), "pld", 0.01),
    "dp_fedavg_server-rdp": Case(("algo=dp_fedavg", "algo.noise_by=server"), "rdp", 0.01),
    "dp_fedavg_server-p0.5-amplified-pld": Case(("algo=dp_fedavg", "algo.noise_by=server", "p=0.5",
                                                 "privacy.amplification=true"), "pld", 0.01, 0.5, True),
    # partial participation: every release charged in full, or amplified by Poisson sampling at p
    "dp_fed_normec-p0.5-pld": Case(("algo=dp_fed_normec", "p=0.5"), "pld", 1.0, 0.5),
    "dp_fed_normec-p0.5-rdp": Case(("algo=dp_fed_normec", "p=0.5"), "rdp", 1.0, 0.5),
    "dp_fed_normec-p0.5-amplified-pld": Case(("algo=dp_fed_normec", "p=0.5", "privacy.amplification=true"), "pld",
                                             1.0, 0.5, True),
    "dp_fed_normec-p0.5-amplified-rdp": Case(("algo=dp_fed_normec", "p=0.5", "privacy.amplification=true"), "rdp",
                                             1.0, 0.5, True),
}
READINGS = ("text", "pass")
RUNS = [pytest.param(name, reading, id=f"{name}-{reading}") for name in CASES for reading in READINGS]


@pytest.mark.slow
def test_every_algorithm_the_privacy_node_calibrates_has_a_case():
    """An algorithm config added to conf/algo whose noise the privacy node sizes (no ``own_noise``) is missed by
    no case here."""
    calibrated = {cls for path in (REPO / "conf" / "algo").glob("*.yaml")
                  for cls in [algorithm(composed(f"algo={path.stem}"))] if not cls.own_noise}
    assert calibrated == {algorithm(composed(*case.overrides)) for case in CASES.values()}


def config(data_root, *overrides):
    return composed(*SMALL, f"data_root={data_root}", *overrides)


def shard_sizes() -> list[int]:
    """partition=iid cuts the training samples into ``CLIENTS`` contiguous pieces whose sizes differ by at most
    one, the larger first."""
    q, r = divmod(TRAIN, CLIENTS)
    return [q + (i < r) for i in range(CLIENTS)]


def steps_per_pass() -> int:
    """The minibatch steps of a pass: the smallest shard's full batches (a shard smaller than a batch is its own
    single batch)."""
    return min(n // min(BATCH, n) for n in shard_sizes())


def releases(reading: str) -> int:
    """The noisy releases each client makes in the run: one a step, ``steps_per_pass`` steps a pass."""
    return PASSES * steps_per_pass() if reading == "pass" else TEXT_ROUNDS


@dataclass
class Outcome:
    summary: dict
    metrics: pd.DataFrame
    partition: pd.DataFrame


@pytest.fixture(scope="module")
def outcome(tmp_path_factory, data_root):
    """Each (case, reading) run once for the module, read back from its summary.json, metrics.csv and
    partition.csv."""
    done = {}

    def get(name: str, reading: str) -> Outcome:
        if (name, reading) not in done:
            case = CASES[name]
            rounds = PASSES if reading == "pass" else TEXT_ROUNDS
            out = tmp_path_factory.mktemp(f"{name}-{reading}") / "run"
            run(config(data_root, *case.overrides, f"reading={reading}", f"rounds={rounds}",
                       f"privacy.epsilon={EPSILON}", "privacy.calibration=accountant",
                       f"accountant={case.accountant}"), out)
            done[name, reading] = Outcome(json.loads((out / "summary.json").read_text()),
                                          pd.read_csv(out / "metrics.csv"), pd.read_csv(out / "partition.csv"))
        return done[name, reading]

    return get


@functools.cache
def independent_epsilon(z: float, count: int, accountant: str, p: float, amplified: bool, replace: bool) -> float:
    """ε at δ = DELTA of ``count`` releases at noise multiplier z, by dp-accounting alone: a Gaussian of
    multiplier z (z / 2 when a client is replaced: the release moves by twice its bound), Poisson-sampled at p
    where amplification is claimed, composed ``count`` times under add/remove-one. PLD on dp-accounting's own
    finer grid (1e-4), RDP on its default orders."""
    event = dpa.GaussianDpEvent(z / 2 if replace else z)
    if amplified and p < 1:
        event = dpa.PoissonSampledDpEvent(p, event)
    acc = rdp.RdpAccountant() if accountant == "rdp" else pld.PLDAccountant()
    return float(acc.compose(dpa.SelfComposedDpEvent(event, count)).get_epsilon(DELTA))


def account(case: Case, z: float, count: int, accountant: str | None = None) -> float:
    return independent_epsilon(z, count, accountant or case.accountant, case.p, case.amplified, case.replace)


@pytest.mark.slow
@pytest.mark.parametrize("name, reading", RUNS)
def test_the_run_certifies_its_target_and_spends_nearly_all_of_it(name, reading, outcome):
    """(a) The run certifies at most privacy.epsilon, and the accountant that calibrated it reports at least
    (1 - TIGHT) of it. Too little noise (σ solved for the passes, for fewer releases than the run makes, under
    add/remove-one for a run whose neighbours replace a client, or by the tighter accountant) certifies above the
    target; too much (σ solved for more releases, without the sampling rate the run claims amplification by, or by
    the looser accountant), or a ledger that charges fewer releases than the run made, leaves the calibrating
    accountant's ε short of it."""
    case, s = CASES[name], outcome(name, reading).summary
    privacy = s["privacy"]
    assert s["status"] == "completed" and s["private"] is True
    assert privacy["target_epsilon"] == EPSILON and privacy["delta"] == DELTA
    assert privacy["calibration"] == f"solved with {case.accountant}"
    eps, by = certified(privacy)
    assert eps is not None and eps <= EPSILON, (eps, by)
    own = privacy[f"epsilon_{case.accountant}"]
    assert (1 - TIGHT) * EPSILON <= own <= EPSILON, (own, privacy)


@pytest.mark.slow
@pytest.mark.parametrize("name, reading", RUNS)
def test_every_release_the_run_makes_is_accounted(name, reading, outcome):
    """(b) The run makes rounds × steps_per_pass releases under reading=pass (the steps counted here from the
    shard sizes: the smallest shard's full batches) and one a round under reading=text; its summary, its
    metrics.csv steps column, and the ε it reports by RDP at every evaluated row are those of that count. Catches
    a pass of the wrong length (a shard's tail counted, the largest shard taken), rows recorded at the wrong
    steps, and a ledger that charges the passes or the rounds rather than the releases."""
    case, o = CASES[name], outcome(name, reading)
    s, m, per_round = o.summary, o.metrics, steps_per_pass() if reading == "pass" else 1
    assert sorted(o.partition["total"], reverse=True) == shard_sizes()
    assert s["reading"] == reading and s["steps_per_round"] == per_round and s["steps"] == releases(reading)
    assert list(m["round"]) == list(range(s["rounds"] + 1))
    assert list(m["steps"]) == [k * per_round for k in m["round"]] and m["steps"].iloc[-1] == releases(reading)
    z = s["privacy"]["noise_multiplier"]
    assert s["privacy"]["epsilon_rdp"] == pytest.approx(account(case, z, releases(reading), "rdp"), rel=1e-9)
    for steps, eps in zip(m["steps"], m["eps_rdp"], strict=True):
        expected = 0.0 if steps == 0 else account(case, z, int(steps), "rdp")
        assert eps == pytest.approx(expected, rel=1e-9, abs=1e-12), (steps, eps, expected)


@pytest.mark.slow
@pytest.mark.parametrize("name, reading", RUNS)
def test_the_noise_is_what_dp_accounting_solves_for_those_releases(name, reading, outcome):
    """(c) The noise multiplier z is the smallest that dp-accounting, asked here directly for the run's count of
    releases, its sampling claim and its relation, certifies at privacy.epsilon: z passes and z·(1 - Z_TOL) does
    not. The std on the release is z times its sensitivity, in the summary and in every row. Catches σ solved
    for another count of releases, without the sampling rate p the run claims amplification by, under the other
    neighbouring relation (in the calibration and the ledger alike), or applied to the wrong sensitivity."""
    case, o = CASES[name], outcome(name, reading)
    privacy = o.summary["privacy"]
    z = privacy["noise_multiplier"]
    assert privacy["sensitivity"] == pytest.approx(case.sensitivity, rel=1e-12)
    assert privacy["std"] == pytest.approx(z * case.sensitivity, rel=1e-12)
    assert (o.metrics["noise_std"] == privacy["std"]).all() and o.summary["noise_std"] == privacy["std"]
    assert privacy["sampling_rate"] == case.p and privacy["amplification_claimed"] is case.amplified
    assert privacy["neighbouring"] == ("replace" if case.replace else "add_remove")
    count = releases(reading)
    assert account(case, z, count) <= EPSILON * (1 + 1e-9), (z, account(case, z, count))
    assert account(case, z * (1 - Z_TOL), count) > EPSILON, (z, account(case, z * (1 - Z_TOL), count))


@pytest.mark.slow
def test_the_pass_reading_calibrates_as_the_text_run_of_as_many_releases(outcome, data_root, tmp_path):
    """A run of 2 passes of 9 steps carries the noise of the text run of 18 rounds: the calibration sees only
    the count of releases, however they are grouped into rounds. Catches an accountant's calibration that reads
    the passes (``releases_per_round``) where it should read the releases alone."""
    case = CASES["dp_normec-pld"]
    s = run(config(data_root, *case.overrides, f"rounds={releases('pass')}", f"privacy.epsilon={EPSILON}",
                   "privacy.calibration=accountant", f"accountant={case.accountant}"), tmp_path / "run")
    passes = outcome("dp_normec-pld", "pass").summary
    assert s["steps"] == passes["steps"] == 18
    assert s["privacy"]["noise_multiplier"] == passes["privacy"]["noise_multiplier"]
    assert s["privacy"]["epsilon_pld"] == pytest.approx(passes["privacy"]["epsilon_pld"], rel=1e-12)


def theorem2_per_message_epsilon(total: float, delta: float, rounds: int, r: int, n: int) -> float:
    """NFA Theorem 2 solved for one message: the ε' with min(1, 2r/n)·(ε'/8 + ε'²/(256 ln(1/δ))) = total (by
    bisection), then ε_0 = ε' / (8 sqrt(2 K ln(1/δ))) for K = rounds messages."""
    log = math.log(1 / delta)

    def f(e):
        return min(1.0, 2 * r / n) * (e / 8 + e * e / (256 * log)) - total

    lo, hi = 0.0, 1.0
    while f(hi) < 0:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return hi / (8 * math.sqrt(2 * rounds * log))


def test_normfedavg_sets_each_message_budget_for_the_rounds_it_runs(data_root, tmp_path):
    """DP-NormFedAvg with algo.scope=all_rounds (text reading only; it refuses reading=pass): each of its K = rounds
    messages gets the ε_0 NFA Theorem 2 gives for K, and the rounds compose, by the better of basic and advanced
    composition, to at most privacy.epsilon. Catches a per-message budget sized for another number of rounds and
    a composition that charges another number of messages. (Theorem 2 is sufficient, not tight: basic composition
    gives less here, so no lower bound is asserted.)"""
    rounds, eps = 5, 0.5
    s = run(config(data_root, "algo=dp_normfedavg", "algo.scope=all_rounds", "algo.local_steps=1",
                   f"rounds={rounds}", f"privacy.epsilon={eps}"), tmp_path / "run")
    m = pd.read_csv(tmp_path / "run" / "metrics.csv")
    privacy = s["privacy"]
    assert s["steps"] == rounds and list(m["steps"]) == list(range(rounds + 1))
    e0 = privacy["per_message"]["epsilon"]
    assert e0 == pytest.approx(theorem2_per_message_epsilon(eps, DELTA, rounds, CLIENTS, CLIENTS), rel=1e-9)
    basic = rounds * e0
    advanced = e0 * math.sqrt(2 * rounds * math.log(1 / DELTA)) + rounds * e0 * math.tanh(e0 / 2)
    assert privacy["epsilon_composed"] == pytest.approx(min(basic, advanced), rel=1e-12)    # r = n: no sampling
    assert certified(privacy) == (privacy["epsilon_composed"], "composed") and privacy["epsilon_composed"] <= eps


def paper_epsilon(steps: int, q: float, sigma: float) -> float:
    """ALI-DPFL's accountant: RDP of the Poisson-sampled Gaussian at the integer orders 2..64 (from
    dp-accounting), ``steps`` steps, Mironov's conversion ε = RDP(α) + ln(1/δ)/(α - 1), minimised over α."""
    orders = list(range(2, 65))
    acc = rdp.RdpAccountant(orders=orders)
    acc.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), steps)
    return min(r + math.log(1 / DELTA) / (a - 1) for a, r in zip(orders, acc._rdp, strict=True))


@pytest.mark.slow
def test_dpfl_takes_the_dp_sgd_steps_its_budget_supports_and_accounts_each(data_root, tmp_path):
    """DPFL (text reading only; it refuses reading=pass) keeps its noise σ and sets its number of DP-SGD steps
    from privacy.epsilon instead: R_c, the most steps the paper's accountant allows (counted here with
    dp-accounting's RDP), of which it takes ⌊R_c/τ⌋ rounds of τ, never more than `rounds`; the ε it reports
    by dp-accounting is that of the steps it took. Catches a budget one step off, rounds that overspend it, and
    a ledger that charges the rounds rather than the DP-SGD steps."""
    q, sigma, tau, eps, rounds_cap = 0.1, 1.5, 3, 2.5, 20
    s = run(config(data_root, "algo=dpfl", f"algo.sample_rate={q}", f"algo.sigma={sigma}", f"algo.tau={tau}",
                   "algo.rc_method=exact", f"rounds={rounds_cap}", f"privacy.epsilon={eps}"), tmp_path / "run")
    m = pd.read_csv(tmp_path / "run" / "metrics.csv")
    privacy = s["privacy"]
    r_c = max(t for t in range(1, 200) if paper_epsilon(t, q, sigma) <= eps)
    assert paper_epsilon(r_c + 1, q, sigma) > eps and r_c % tau != 0        # the floor below matters
    taken = min(rounds_cap, r_c // tau) * tau
    assert privacy["R_c"] == r_c and privacy["steps_taken"] == taken
    assert s["steps"] == m["round"].iloc[-1] == taken // tau
    assert privacy["epsilon_paper"] == pytest.approx(paper_epsilon(taken, q, sigma), rel=1e-9)
    assert privacy["epsilon_paper"] <= eps
    sampled = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), taken)
    assert privacy["epsilon_rdp"] == pytest.approx(rdp.RdpAccountant().compose(sampled).get_epsilon(DELTA), rel=1e-9)
    assert certified(privacy)[0] <= eps
