"""The last-five statistic behind NormFedAvg's tables (a summary's ``last5_mean_test_acc``, which the report
reads back): the mean test accuracy of a run's last five evaluations, checked against the per-round metrics
it comes from, in a fresh run and in every committed record."""

from __future__ import annotations

import csv
import io
import json
import lzma
import math
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from normfl.results import Recorder, last5_mean_test_acc
from normfl.run import run
from tests.helpers import REPO, composed

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
