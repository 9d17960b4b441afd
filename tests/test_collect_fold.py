"""``python -m normfl.collect`` folds seeds, and only seeds: runs that differ in a key the user did not name (γ, p, the
model, a key some configs leave at its default) are rows of their own, never one "mean ± std" row whose spread is a
γ effect; each row's numbers are the hand-computed mean and std of its own seeds. On run folders made here (config,
summary, metrics), so the fold is checked without training."""

import copy
import json
import statistics
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from normfl.collect import main
from tests.helpers import composed, rows

# (overrides, final accuracy) of each run; the setting of a run is its overrides but the seed
RUNS = [
    ({"algo.beta": 0.1, "algo.gamma": 0.01, "seed": 1}, 0.50),
    ({"algo.beta": 0.1, "algo.gamma": 0.01, "seed": 2}, 0.54),
    ({"algo.beta": 0.1, "algo.gamma": 0.1, "seed": 1}, 0.70),        # γ, not named: its own row
    ({"algo.beta": 0.1, "algo.gamma": 0.1, "seed": 2}, 0.74),
    ({"algo.beta": 1.0, "algo.gamma": 0.01, "seed": 1}, 0.30),
    ({"algo.beta": 1.0, "algo.gamma": 0.01, "seed": 2}, 0.38),
    ({"algo.beta": 1.0, "algo.gamma": 0.01, "seed": 3}, 0.31),
    ({"algo.beta": 1.0, "algo.gamma": 0.01, "seed": 4, "p": 0.5}, 0.10),         # p
    ({"algo.beta": 1.0, "algo.gamma": 0.01, "seed": 5, "model.hidden": [64]}, 0.90),  # a model's key
    ({"algo.beta": 1.0, "algo.gamma": 0.01, "seed": 6, "precision": "bf16"}, 0.20),   # absent in the others' configs
    ({"algo.beta": 1.0, "algo.gamma": 0.01, "seed": 7, "precision": "fp32"}, 0.34),   # ... at its default: the same
]
ABSENT = "precision"                      # a key older configs lack (normfl.config.KEY_DEFAULTS): dropped from most


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fold")
    base = composed("algo=normec", "dataset=fashion_mnist", "model=mlp")
    for i, (keys, acc) in enumerate(RUNS):
        cfg = copy.deepcopy(base)
        for k, v in keys.items():
            OmegaConf.update(cfg, k, v)
        d = root / str(i)
        (d / ".hydra").mkdir(parents=True)
        data = OmegaConf.to_container(cfg)
        if ABSENT not in keys:
            del data[ABSENT]
        OmegaConf.save(OmegaConf.create(data), d / ".hydra" / "config.yaml")
        (d / "summary.json").write_text(json.dumps({
            "status": "completed", "final_round": 3, "final_test_acc": acc, "best_test_acc": acc + 0.01,
            "last5_mean_test_acc": acc - 0.01, "best_round": 2, "wall_time_s": 10.0 + i}))
        pd.DataFrame({"round": [0, 3], "test_acc": [0.1, acc]}).to_csv(d / "metrics.csv", index=False)
    return root


def setting(keys: dict) -> tuple:
    """A run's setting as the hand groups it: every key but the seed, at its default where a config leaves it out."""
    return tuple(sorted((k, json.dumps(v)) for k, v in {ABSENT: "fp32", **keys}.items() if k != "seed"))


def by_hand() -> dict:
    groups: dict = {}
    for keys, acc in RUNS:
        groups.setdefault(setting(keys), []).append(acc)
    return groups


@pytest.mark.parametrize("named", [[], ["--by", "algo.beta"], ["--by", "algo.gamma"], ["--by", "algo.beta,seed"]])
def test_a_fold_is_the_hand_computed_groups_of_seeds(named, runs, tmp_path, capsys, monkeypatch):
    """Whatever the user names (nothing, β, γ, or the seed too), the folded rows are the settings grouped by hand:
    6 rows, the two γ of β = 0.1 apart, the p, model and precision runs apart, a precision absent from a config equal
    to its default; each row's n, mean and std those of its own seeds; one curve per row."""
    import normfl.collect as collect_module

    drawn = []
    monkeypatch.setattr(collect_module, "save", lambda fig, *a, **k: drawn.append(fig) or [])
    main([str(runs), *named, "--out", str(tmp_path / "t.csv"), "--plot", str(tmp_path / "c.png")])
    table = rows(capsys.readouterr().out)
    csv = pd.read_csv(tmp_path / "t.csv")
    hand = by_hand()
    assert len(table) == len(csv) == len(hand) == 6
    got = {}
    for r in csv.to_dict("records"):
        dirs = r["dir"].split()
        keys = {setting(RUNS[int(Path(d).name)][0]) for d in dirs}
        assert len(keys) == 1, dirs                                      # one setting a row
        got[keys.pop()] = (r["n"], r["final acc %"], r["final acc % std"])
    assert set(got) == set(hand)
    for key, accs in hand.items():
        n, mean, std = got[key]
        assert n == len(accs) and mean == pytest.approx(100 * statistics.mean(accs), rel=1e-12), key
        assert (pd.isna(std) if n == 1 else std == pytest.approx(100 * statistics.stdev(accs), rel=1e-9)), key
    assert "seed" not in table[0] and {"algo.beta", "algo.gamma", "p", "model.hidden", "precision"} <= set(table[0])
    assert len(drawn[0].axes[0].lines) == 6


def test_per_seed_keeps_every_run_apart(runs, capsys):
    main([str(runs), "--by", "algo.beta", "--per-seed"])
    table = rows(capsys.readouterr().out)
    assert len(table) == len(RUNS) and sorted(float(r["final acc %"]) for r in table) == sorted(
        round(100 * a, 2) for _, a in RUNS)


def test_runs_an_in_band_audit_changes_are_not_folded_with_runs_without_it(runs, tmp_path, capsys):
    """Canaries in a run's own noise draws, or among its clients, change its results (its run key holds them): such
    a run is not a seed of the same setting as a run without them; canaries beside the run change nothing and fold
    as seeds."""
    root = tmp_path / "audited"
    for name, source, audit in (("plain", 4, None), ("sidecar", 5, {"canaries": 8, "mode": "sidecar"}),
                                ("inband", 6, {"canaries": 8, "mode": "inband"}),
                                ("release", 10, {"canaries": 8, "mode": "release"})):
        d = root / name
        (d / ".hydra").mkdir(parents=True)
        cfg = OmegaConf.load(runs / str(source) / ".hydra" / "config.yaml")          # β = 1, γ = 0.01, seeds 1-7
        OmegaConf.save(OmegaConf.merge(cfg, {"audit": audit}) if audit else cfg, d / ".hydra" / "config.yaml")
        for f in ("summary.json", "metrics.csv"):
            (d / f).write_bytes((runs / str(source) / f).read_bytes())
    main([str(root)])
    table = rows(capsys.readouterr().out)
    folded = {r["audit.mode"]: r["n"] for r in table}
    assert len(table) == 3 and folded == {"–": "2", "inband": "1", "release": "1"}, table     # "–": none in its key
    main([str(root), "--per-seed"])                                                  # apart: each as configured
    assert sorted((r["audit.canaries"], r["audit.mode"]) for r in rows(capsys.readouterr().out)) == [
        ("0", "sidecar"), ("8", "inband"), ("8", "release"), ("8", "sidecar")]
    main([str(root / "plain"), str(root / "sidecar")])
    (row,) = rows(capsys.readouterr().out)
    assert row["n"] == "2" and not any(k.startswith("audit") for k in row)          # nothing differs but the seed
