"""A diverged run is a finished run (``normfl.results.FINISHED``): it becomes a record, is never trained again (by
train.py in its folder, the driver, a campaign) and is drawn and counted by the figures and the report. A change
that refuses it as a record would have campaigns retrain diverged cells forever and figures lose them."""

import json
import shutil
import tarfile

import pandas as pd
import pytest

from normfl.config import config_key
from normfl.reproduce import campaign, figures, jobs, records, report, store, targets
from normfl.reproduce.jobs import Job
from normfl.run import run, start

# γ = 1e38 on the smallest run: the model stays finite, its first evaluation does not (recorded as diverged)
DIVERGES = ["algo=normec", "dataset=fashion_mnist", "dataset.train_limit=200", "dataset.test_limit=100",
            "model=logreg", "clients=2", "rounds=6", "eval_every=2", "checkpoint_every=0", "progress=false",
            "algo.gamma=1e38"]


def job(data_root, *extra) -> Job:
    overrides = [*DIVERGES, f"data_root={data_root}", *extra]
    cfg = jobs.compose(tuple(overrides))
    return Job({}, overrides, config_key(cfg), cfg)


@pytest.fixture
def records_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(records, "RECORDS", tmp_path / "records")
    return tmp_path / "records"


@pytest.mark.slow
def test_a_diverged_run_is_recorded_never_retrained_and_counted(records_dir, tmp_path, data_root):
    """Its store folder and then its record alone stand for it: train.py in its folder returns its summary, the
    driver and a campaign plan nothing; its record is packed (once), and an ID's table counts it as stored and
    diverged, with its rounds and wall time (drawn up to its end) but no number for any table."""
    runs = tmp_path / "store"
    j = job(data_root)
    d = j.dir(runs)
    summary = run(j.cfg, d)
    assert summary["status"] == "diverged" and summary["final_round"] < 6
    assert start(j.cfg, d) == json.loads((d / "summary.json").read_text())      # finished: not trained again
    assert store.pending([j], runs) == []
    assert records.pack(d) == "added" and records.pack(d) == "same"
    assert json.loads((records_dir / j.key / "summary.json").read_text())["status"] == "diverged"
    shutil.rmtree(d)                                                             # another clone: the record alone
    assert store.pending([j], runs) == []
    logs = []
    assert store.run_missing([j], runs, log=logs.append) == {} and "1 already stored, 0 to run" in logs[0]
    logs = []
    assert campaign.run([j], runs, 60, dry_run=True, log=logs.append) == [] and logs[0].startswith(
        "campaign: 0 of 1 runs to train")

    target = targets.get("normfedavg-t6")                  # the record filed under a grid's first run
    first = jobs.jobs(target.grid, "paper")[0].key
    shutil.copytree(records_dir / j.key, records_dir / first)
    df = figures.runs(target, "paper", tmp_path / "empty-store")
    row = df.set_index("key").loc[first]
    assert row.status == "diverged" and row.final_round == summary["final_round"] and row.wall > 0
    assert pd.isna(row.final_acc) and pd.isna(row.last5_err)
    assert f"1 of {len(df)} runs stored; 1 diverged" in figures.caption(df, "paper")
    assert report._runs(df).startswith(f"1/{len(df)} runs stored")


@pytest.mark.slow
def test_the_drivers_record_a_run_that_diverges_and_train_it_once(records_dir, tmp_path, data_root, monkeypatch):
    """A campaign and ``make <id>``'s driver (``store.run_missing``) each train a diverging run once, in its own
    process, and record it; asked again, they train nothing."""
    monkeypatch.setenv("NORMFL_DATA", str(data_root))
    for name, train in (("campaign", lambda js, s, log: campaign.run(js, s, 300, threads=1, log=log,
                                                                     out=tmp_path / "a.tar.gz")),
                        ("driver", lambda js, s, log: store.run_missing(js, s, threads=1, log=log))):
        j, runs, logs = job(data_root, f"seed={len(name)}"), tmp_path / name, []
        train([j], runs, logs.append)
        assert json.loads((records_dir / j.key / "summary.json").read_text())["status"] == "diverged", logs
        assert any("record added" in line for line in logs), logs
        logs = []
        train([j], runs, logs.append)
        assert not any("record" in line for line in logs), logs
    assert any(n.endswith("summary.json") for n in tarfile.open(tmp_path / "a.tar.gz").getnames())
