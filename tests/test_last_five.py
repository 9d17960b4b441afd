"""The last-five statistic behind NormFedAvg's tables (a summary's ``last5_mean_test_acc``, which the report
reads back): the mean test accuracy of a run's last five evaluations, checked against the per-round metrics
it comes from, in a fresh run and in every committed record; and the run's last row, which is the model after
its last round evaluated, whether or not ``eval_every`` divides the rounds."""

from __future__ import annotations

import csv
import io
import json
import lzma
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from normfl.results import Recorder, closing_line, last5_mean_test_acc
from normfl.run import run, train_together
from normfl.run.setup import build
from tests.helpers import REPO, composed
from tests.helpers import config as base_config

COMMITTED = REPO / "outputs" / "records"


def config(data_root, *overrides):
    return composed("dataset=fashion_mnist", "model=logreg", "dataset.train_limit=400", "dataset.test_limit=200",
                    "clients=4", "backend=sequential", "progress=false", "checkpoint_every=0", f"data_root={data_root}",
                    *overrides)


def test_a_runs_summary_holds_the_mean_of_its_last_five_evaluations(tmp_path, data_root):
    """NFA's tables read ``last5_mean_test_acc`` from summaries: a summary that averages four or six evaluations,
    counts the rounds that were not evaluated, or takes the best or the last of them is caught against the
    mean the run's own metrics.csv gives (12 rounds evaluated every 2nd: 7 evaluations, round 0 among them)."""
    summary = run(config(data_root, "algo=normfedavg", "algo.local_steps=2", "rounds=12", "eval_every=2"),
                  tmp_path / "run")
    m = pd.read_csv(tmp_path / "run" / "metrics.csv")
    acc = m["test_acc"].dropna().tolist()
    assert len(m) == 13 and m["round"][m["test_acc"].notna()].tolist() == [0, 2, 4, 6, 8, 10, 12]
    mean = sum(acc[-5:]) / 5
    assert summary["last5_mean_test_acc"] == mean
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["last5_mean_test_acc"] == mean
    # the run tells the statistic apart from its neighbours, so each of them would fail above
    assert mean not in {sum(acc[-4:]) / 4, sum(acc[-6:]) / 6, sum(acc[-5:]) / 6, max(acc[-5:]), acc[-1]}


def test_fewer_than_five_evaluations_average_all_of_them_and_none_gives_none(tmp_path):
    """A run evaluated fewer than five times averages the evaluations it has (not a sum divided by five), the
    rounds in between (test_acc None) and a diverged round's NaN are no evaluations, and a run without any
    finite evaluation has no number, not NaN or zero."""
    rows = [{"round": 0, "test_acc": 0.1, "test_loss": 2.3}, {"round": 1, "test_acc": None},
            {"round": 2, "test_acc": 0.4, "test_loss": 1.9}, {"round": 3, "test_acc": None},
            {"round": 4, "test_acc": 0.6, "test_loss": 1.5}]
    assert last5_mean_test_acc(rows) == (0.1 + 0.4 + 0.6) / 3
    assert last5_mean_test_acc(rows[:1]) == 0.1
    assert last5_mean_test_acc([{"round": 0, "test_acc": None}]) is None
    assert last5_mean_test_acc([]) is None
    diverged = [*rows, {"round": 5, "test_acc": float("nan"), "test_loss": float("nan")}]
    assert last5_mean_test_acc(diverged) == (0.1 + 0.4 + 0.6) / 3
    assert last5_mean_test_acc([{"round": 0, "test_acc": float("nan")}]) is None
    rec = Recorder(tmp_path)
    for r in diverged:
        rec.add(r)
    summary = rec.summary({"status": "diverged"})
    assert summary["last5_mean_test_acc"] == (0.1 + 0.4 + 0.6) / 3 and summary["final_test_acc"] is None
    assert json.loads((tmp_path / "summary.json").read_text())["last5_mean_test_acc"] == (0.1 + 0.4 + 0.6) / 3


def test_a_diverged_run_keeps_the_mean_of_its_finite_evaluations(tmp_path, data_root):
    """γ = 1e38 leaves the model finite but its test loss NaN at the first evaluation after round 0: the run is
    recorded as diverged, its NaN evaluation is not averaged in, so its summary holds round 0's accuracy as its
    last-five mean (strict JSON, no NaN); figures.runs gives a diverged run no number for any table
    (tests/test_reproduce.py)."""
    summary = run(config(data_root, "algo=normec", "algo.gamma=1e38", "rounds=12", "eval_every=2"), tmp_path / "r")
    m = pd.read_csv(tmp_path / "r" / "metrics.csv")
    assert summary["status"] == "diverged" and m["test_acc"].isna().iloc[-1] and m["round"].iloc[-1] < 12
    finite = m["test_acc"].dropna().tolist()
    assert len(finite) < 5
    assert summary["last5_mean_test_acc"] == sum(finite) / len(finite)
    json.loads((tmp_path / "r" / "summary.json").read_text(), parse_constant=lambda c: pytest.fail(c))


def recorded_rows(rec: Path) -> list[dict]:
    """A record's metrics rows with each test accuracy exact: the table keeps 9 significant digits, so
    k/3501 (ALI-DPFL's fresh 20% of a 17,505-sample test split) is read back as the nearest k/n, n the
    number of samples an evaluation scored (normfl.run.training.eval_subset: ⌊f·|test|⌋, at least 1)."""
    summary = json.loads((rec / "summary.json").read_text())
    line = re.search(r"^eval_subset:(.*)$", (rec / "config.yaml").read_text(), re.M)     # a top-level key
    fraction = yaml.safe_load(line[1])
    n = summary["test_size"] if fraction is None else max(1, int(fraction * summary["test_size"]))
    rows = []
    for row in csv.DictReader(io.StringIO(lzma.decompress((rec / "metrics.csv.xz").read_bytes()).decode())):
        acc = float(row["test_acc"]) if row["test_acc"] else None
        if acc is not None and math.isfinite(acc):
            assert abs(acc * n - round(acc * n)) < 1e-4, (rec.name, acc, n)      # a whole number of samples
            acc = round(acc * n) / n
        rows.append({**row, "test_acc": acc})
    return rows


def test_every_committed_records_last_five_mean_is_what_its_metrics_give():
    """The NFA tables and the report read ``last5_mean_test_acc`` from the committed summaries: each is
    recomputed from its record's metrics through the statistic a summary is made with, and must be equal to
    the last bit (four evaluations instead of five, rows that were not evaluated, or the best one, would
    change it; so would a record whose summary and metrics disagree)."""
    recs = sorted(p.parent for p in COMMITTED.glob("*/summary.json"))
    checked = 0
    for rec in recs:
        summary = json.loads((rec / "summary.json").read_text())
        if summary.get("last5_mean_test_acc") is None:
            continue
        assert last5_mean_test_acc(recorded_rows(rec)) == summary["last5_mean_test_acc"], rec.name
        checked += 1
    assert checked >= 400 or not recs, checked


def by_hand(cfg, x: np.ndarray) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) on the run's test split of logistic regression with parameters ``x`` (the
    weight's rows, then the bias), computed here in float64 from the test data alone, not by the model's
    ``evaluate``."""
    s = build(cfg)
    d, k = s.x_test[0].numel(), s.ds.num_classes
    W, b = torch.from_numpy(x[:d * k].reshape(k, d)).double(), torch.from_numpy(x[d * k:]).double()
    logits = s.x_test.flatten(1).double() @ W.T + b
    y = s.y_test
    loss = (torch.logsumexp(logits, 1) - logits[torch.arange(len(y)), y]).mean().item()
    return loss, (logits.argmax(1) == y).double().mean().item()


def assert_last_row_is_the_final_model(cfg, run_dir: Path, summary: dict, rounds: int) -> None:
    """The run's last row is round ``rounds``, evaluated on the model the run ends with (its params.npy, checked
    against a hand evaluation), and its summary's final accuracy and loss, last-five mean and closing line are
    that row's."""
    m = pd.read_csv(run_dir / "metrics.csv")
    last = m.iloc[-1]
    assert summary["status"] == "completed" and last["round"] == summary["final_round"] == rounds
    loss, acc = by_hand(cfg, np.load(run_dir / "params.npy"))
    assert last["test_loss"] == pytest.approx(loss, rel=1e-5)          # an earlier model's loss is far from it
    assert abs(last["test_acc"] - acc) <= 1 / 200                       # a near tie may fall either way in fp32
    assert summary["final_test_acc"] == last["test_acc"] and summary["final_test_loss"] == last["test_loss"]
    evaluated = m[m["test_acc"].notna()]
    assert evaluated["round"].iloc[-1] == rounds
    assert summary["last5_mean_test_acc"] == pytest.approx(evaluated["test_acc"].tail(5).mean(), rel=1e-12)
    assert f"test accuracy {100 * last['test_acc']:.2f}% final" in closing_line(summary, run_dir)


# The suite's base run (3 rounds, evaluated every 2nd) ends between two evaluations; each family, and an algorithm
# that its budget stops early (fixed-τ DPFL: R_c = 3 DP-SGD steps, 3 rounds of 5)
LAST_ROUND = {
    "normec": (["algo=normec"], 3),
    "normec every 5th": (["algo=normec", "eval_every=5"], 3),
    "normec, a round a pass": (["algo=normec", "reading=pass", "rounds=2", "eval_every=3"], 2),
    "dp_fed_normec": (["algo=dp_fed_normec", "p=0.5"], 3),
    "dpsgd_norm": (["algo=dpsgd_norm"], 3),
    "normfedavg": (["algo=normfedavg", "algo.local_steps=2"], 3),
    "dpfl stopped by its budget": (["algo=dpfl", "algo.rc_override=3", "rounds=5"], 3),
}


@pytest.mark.parametrize("case", LAST_ROUND)
def test_the_last_round_is_evaluated_when_eval_every_does_not_divide_the_rounds(case, tmp_path, data_root):
    """A run whose rounds are no multiple of ``eval_every`` (or whose budget stops it between evaluations) still
    evaluates its last round: a change that skips it makes the final accuracy, the last-five mean and the closing
    line describe an earlier model, which a test comparing two runs that both lose it never sees."""
    overrides, rounds = LAST_ROUND[case]
    cfg = base_config(data_root, *overrides)
    summary = run(cfg, tmp_path / "run")
    assert_last_row_is_the_final_model(cfg, tmp_path / "run", summary, rounds)


def test_runs_side_by_side_each_evaluate_their_last_round(tmp_path, data_root):
    """Runs trained side by side (one vectorized group here) record their rows through the same path: each run's
    last round, between two evaluations, is evaluated on that run's own final model."""
    cfgs = [base_config(data_root, "backend=stacked", "algo=normec", f"algo.beta={b}") for b in (0.1, 1.0)]
    for i in range(2):
        (tmp_path / str(i)).mkdir()
    summaries = train_together([(c, tmp_path / str(i)) for i, c in enumerate(cfgs)])
    for i, (c, s) in enumerate(zip(cfgs, summaries, strict=True)):
        assert_last_row_is_the_final_model(c, tmp_path / str(i), s, 3)
    assert summaries[0]["final_test_loss"] != summaries[1]["final_test_loss"]
