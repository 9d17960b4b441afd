"""``python -m normfl.collect``: a real sweep tabulated and drawn, a diverged and a failed run beside it,
and every refusal in one line."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from normfl.collect import collect, main
from tests.helpers import REPO, rows, train


def cli(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "normfl.collect", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, data_root) -> Path:
    """Two private runs, β = 0.01 and 0.1, in job folders named by their number."""
    out = tmp_path_factory.mktemp("sweep")
    run = train(data_root, "algo=normec", "dataset=fashion_mnist", "dataset.train_limit=600", "dataset.test_limit=200",
                "model=logreg", "rounds=3", "clients=3", "algo.private=true", "algo.beta=0.01,0.1", "progress=false",
                f"hydra.sweep.dir={out}", "hydra.sweep.subdir=${hydra.job.num}", multirun=True, code=None,
                timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["0", "1"]
    return out


@pytest.fixture(scope="module")
def broken(sweep, tmp_path_factory) -> Path:
    """Old-style job folders: a run that diverged after round 2 (β = 0.5) and one that failed (β = 0.9)."""
    out = tmp_path_factory.mktemp("broken")
    div, failed = out / "2_algo.beta=0.5", out / "3_algo.beta=0.9"
    for d, beta in ((div, 0.5), (failed, 0.9)):
        shutil.copytree(sweep / "0" / ".hydra", d / ".hydra")
        cfg = d / ".hydra" / "config.yaml"
        cfg.write_text(cfg.read_text().replace("beta: 0.01", f"beta: {beta}"))
    shutil.copy(sweep / "0" / "metrics.csv", div / "metrics.csv")
    m = pd.read_csv(div / "metrics.csv")
    m.loc[3, ["train_loss", "test_loss", "test_acc"]] = [float("inf"), float("nan"), float("nan")]
    m.to_csv(div / "metrics.csv", index=False)
    s = json.loads((sweep / "0" / "summary.json").read_text())
    (div / "summary.json").write_text(json.dumps({**s, "status": "diverged", "final_test_acc": None}))
    (failed / "summary.json").write_text(json.dumps({"status": "failed", "error": "RuntimeError('boom')"}))
    return out


@pytest.mark.slow
def test_a_sweep_becomes_a_table_a_file_and_a_plot(sweep, tmp_path):
    out = cli(sweep, "--by", "algo.beta", "--out", tmp_path / "t.md", "--plot", tmp_path / "c.png", "--per-seed")
    assert out.returncode == 0, out.stderr
    table = rows(out.stdout)
    assert [r["algo.beta"] for r in table] == ["0.01", "0.1"]
    assert list(table[0]) == ["algo.beta", "status", "final acc %", "best acc %", "last-5 acc %", "best round",
                              "ε (certified)", "ε (target)", "rounds run", "wall time (s)", "dir"]
    for r, job in zip(table, ("0", "1"), strict=True):
        s = json.loads((sweep / job / "summary.json").read_text())
        p = s["privacy"]
        assert r["status"] == "completed" and r["dir"] == str(sweep / job) and r["rounds run"] == "3"
        assert r["final acc %"] == f"{100 * s['final_test_acc']:.2f}" and r["best round"] == str(s["best_round"])
        assert r["best acc %"] == f"{100 * s['best_test_acc']:.2f}"
        assert r["last-5 acc %"] == f"{100 * s['last5_mean_test_acc']:.2f}"
        assert r["ε (certified)"] == f"{min(p['epsilon_pld'], p['epsilon_rdp']):.2f}" and r["ε (target)"] == "8.00"
    assert (tmp_path / "t.md").read_text() == out.stdout
    assert (tmp_path / "c.png").stat().st_size > 1000 and not list(tmp_path.glob(".*tmp"))


@pytest.mark.slow
def test_default_columns_are_the_swept_keys_and_csv_holds_the_numbers(sweep, tmp_path, capsys):
    main([str(sweep), "--out", str(tmp_path / "t.csv"), "--per-seed"])
    assert list(rows(capsys.readouterr().out)[0])[:2] == ["algo.beta", "status"]
    csv = pd.read_csv(tmp_path / "t.csv")
    assert list(csv["algo.beta"]) == [0.01, 0.1] and list(csv["dir"]) == [str(sweep / "0"), str(sweep / "1")]
    s = json.loads((sweep / "1" / "summary.json").read_text())
    assert csv["final acc %"][1] == pytest.approx(100 * s["final_test_acc"])
    assert csv["wall time (s)"][1] == pytest.approx(s["wall_time_s"])


@pytest.mark.slow
def test_diverged_and_failed_runs_have_a_status_and_no_accuracy(sweep, broken, tmp_path, capsys):
    main([str(sweep), str(broken), "--by", "algo.beta,rounds", "--by", "seed", "--plot", str(tmp_path / "c.pdf"),
          "--per-seed"])
    table = rows(capsys.readouterr().out)
    assert [(r["algo.beta"], r["rounds"], r["seed"], r["status"]) for r in table] == [
        ("0.01", "3", "42", "completed"), ("0.1", "3", "42", "completed"),
        ("0.5", "3", "42", "diverged"), ("0.9", "3", "42", "failed")]
    assert all(r[c] == "–" for r in table[2:] for c in ("final acc %", "best acc %", "best round"))
    assert table[3]["ε (certified)"] == "–" and (tmp_path / "c.pdf").stat().st_size > 1000
    df = collect(broken, keys=("algo.beta", "rounds"))         # the Python API, extended
    assert list(df["algo.beta"]) == [0.5, 0.9] and list(df["status"]) == ["diverged", "failed"]
    assert df["epsilon"][0] < df["target_epsilon"][0] * 2 and df["epsilon"].isna()[1]


@pytest.mark.slow
@pytest.mark.parametrize("args, code, message", [
    (["{missing}"], 2, "invalid path {missing}: no such directory"),
    (["{empty}"], 1, "no run (a folder holding a summary.json) at or below {empty}"),
    (["{sweep}", "--out", "{tmp}/t.txt"], 2, "invalid --out={tmp}/t.txt; allowed: a file path ending in .md or .csv"),
    (["{sweep}", "--out", "{empty}.md"], 2, "invalid --out={empty}.md (a directory); allowed: a file path"),
    (["{sweep}", "--plot", "{tmp}/c.jpg"], 2, "invalid --plot={tmp}/c.jpg; allowed: a file path ending in .png"),
    (["{sweep}", "--by", "algo.bta"], 2, "invalid --by=algo.bta: no run's config has it; allowed: dotted"),
    (["{sweep}", "--plot", "{tmp}/c.png", "--metric", "acc"], 2, "invalid --metric=acc; allowed: test_acc, "
                                                                     "test_error, test_acc_last5, test_error_last5, "
                                                                     "or a column of metrics.csv: round, steps"),
    (["{sweep}", "--metric", "train_loss"], 2, "invalid --metric=train_loss; allowed: test_acc, test_error, "
                                               "test_acc_last5, test_error_last5 (the table's measure; with --plot"),
    (["{sweep}", "--plot", "{tmp}/c.png", "--x", "epoch"], 2, "invalid --x=epoch; allowed: a column of metrics.csv"),
    (["{sweep}", "--x", "wall_time"], 2, "invalid --x=wall_time without --plot; allowed: --plot FILE beside it"),
    (["{sweep}", "--title", "T"], 2, "invalid --title=T without --plot; allowed: --plot FILE beside it"),
])
def test_bad_input_is_refused_in_one_line(sweep, tmp_path, capsys, args, code, message):
    names = {"missing": tmp_path / "nope", "empty": tmp_path / "empty", "sweep": sweep, "tmp": tmp_path}
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty.md").mkdir()
    with pytest.raises(SystemExit) as exit_:
        main([a.format(**names) for a in args])
    err = capsys.readouterr()
    assert exit_.value.code == code and err.out == ""
    assert err.err.startswith("normfl: " + message.format(**names)) and err.err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "empty.md"]     # nothing written


@pytest.mark.slow
def test_a_committed_record_sits_beside_a_run(sweep, tmp_path, monkeypatch):
    """A record (config.yaml and metrics.csv.xz, no .hydra) is a run like any other: keys, row and curve."""
    from normfl.reproduce import records

    monkeypatch.setattr(records, "RECORDS", tmp_path / "records")
    assert records.pack(sweep / "1") == "added"
    rec = next((tmp_path / "records").iterdir())
    assert not (rec / ".hydra").exists() and not (rec / "metrics.csv").exists()
    main([str(sweep / "0"), str(rec), "--by", "algo.beta", "--plot", str(tmp_path / "c.png"),
          "--metric", "train_loss", "--per-seed"])
    table = pd.DataFrame(collect(sweep / "0", rec, keys=("algo.beta",)))
    assert sorted(table["algo.beta"]) == [0.01, 0.1]
    assert (tmp_path / "c.png").stat().st_size > 1000


def test_a_key_is_written_as_typed_whole_floats_as_integers_unless_huge():
    """γ = 1e300 (a divergence test) came out as a 301-digit integer in a sweep's table."""
    from normfl.table import cell

    assert [cell(v) for v in (20.0, 0.001, 1e300, -3.0, None, "sn")] == ["20", "0.001", "1e+300", "-3", "–", "sn"]


@pytest.fixture(scope="module")
def seeds(tmp_path_factory, data_root) -> Path:
    """Two non-private runs differing only in their seed, evaluated every round."""
    out = tmp_path_factory.mktemp("seeds")
    run = train(data_root, "algo=normec", "dataset=fashion_mnist", "dataset.train_limit=600", "dataset.test_limit=200",
                "model=logreg", "rounds=4", "clients=3", "seed=1,2", "progress=false", f"hydra.sweep.dir={out}",
                "hydra.sweep.subdir=${hydra.job.num}", multirun=True, code=None, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return out


def _summaries(root: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(root.glob("*/summary.json"))]


@pytest.mark.slow
def test_seeds_fold_into_one_row_and_one_banded_curve(seeds, tmp_path, capsys, monkeypatch):
    import numpy as np

    import normfl.collect as collect_module
    from normfl.render import fmt

    drawn = []
    monkeypatch.setattr(collect_module, "save", lambda fig, *a, **k: drawn.append(fig) or [])
    main([str(seeds), "--plot", str(tmp_path / "c.png"), "--metric", "test_error", "--out", str(tmp_path / "t.csv")])
    (row,) = rows(capsys.readouterr().out)
    s = _summaries(seeds)
    assert "seed" not in row and row["n"] == "2" and row["status"] == "2 completed"
    for col, key in (("final error %", "final_test_acc"), ("best error %", "best_test_acc"),
                     ("last-5 error %", "last5_mean_test_acc")):
        errs = [100 - 100 * x[key] for x in s]
        assert row[col] == f"{fmt(float(np.mean(errs)))} ± {fmt(float(np.std(errs, ddof=1)))}", col
    csv = pd.read_csv(tmp_path / "t.csv")
    assert csv["final error % n"][0] == 2 and csv["final error %"][0] == pytest.approx(
        np.mean([100 - 100 * x["final_test_acc"] for x in s]))
    ax = drawn[0].axes[0]
    (line,) = ax.lines
    curves = [100 - 100 * pd.read_csv(seeds / j / "metrics.csv").set_index("round").test_acc for j in ("0", "1")]
    assert list(line.get_ydata()) == pytest.approx(list((curves[0] + curves[1]) / 2))
    (band,) = ax.collections
    top = band.get_paths()[0].vertices[:, 1].max()
    assert top == pytest.approx(float(np.max(pd.concat(curves, axis=1).mean(axis=1)
                                             + pd.concat(curves, axis=1).std(axis=1))))
    assert line.get_label() == "α-NormEC" and ax.get_legend().get_title().get_text() == "mean ± std of 2 seeds"


@pytest.mark.slow
def test_per_seed_keeps_them_apart_and_a_key_no_run_reads_is_no_difference(seeds, tmp_path, capsys):
    main([str(seeds), "--per-seed"])
    assert [r["seed"] for r in rows(capsys.readouterr().out)] == ["1", "2"]
    copy = tmp_path / "eps4"                   # the seed-1 run asked for ε = 4: it adds no noise, so reads no ε
    shutil.copytree(seeds / "0", copy)
    cfg = copy / ".hydra" / "config.yaml"
    cfg.write_text(cfg.read_text().replace("epsilon: 8.0", "epsilon: 4.0"))
    assert "epsilon: 4.0" in cfg.read_text()
    main([str(seeds), str(copy)])
    (row,) = rows(capsys.readouterr().out)
    assert row["n"] == "3" and not any(k.startswith("privacy") for k in row)
    df = collect(copy, keys=("privacy.epsilon", "seed"))
    assert df["privacy.epsilon"].isna().all() and list(df["seed"]) == [1]


def test_a_fold_counts_what_each_number_is_over():
    """Three seeds, one diverged: its accuracy is no number, so the mean ± std is over two and says so; a count
    stays whole; the CSV keeps mean, std and n apart."""
    from normfl.table import fold, folded_markdown

    t = pd.DataFrame({"algo.beta": [0.1] * 3, "status": ["completed", "diverged", "completed"],
                      "final acc %": [60.0, float("nan"), 62.0], "rounds run": pd.array([5, 3, 5], dtype="Int64"),
                      "dir": ["a", "b", "c"]})
    f = fold(t, ["algo.beta"])
    assert (f["n"][0], f["final acc %"][0], f["final acc % n"][0]) == (3, 61.0, 2)
    assert f["final acc % std"][0] == pytest.approx(2 ** 0.5) and f["dir"][0] == "a b c"
    (row,) = rows(folded_markdown(f, ["algo.beta"]))
    assert row["final acc %"] == "61.00 ± 1.41 (n = 2)" and row["status"] == "2 completed, 1 diverged"
    assert row["rounds run"] == "4.33 ± 1.15" and row["n"] == "3"
