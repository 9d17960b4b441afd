"""``python -m normfl.collect``'s table shows a key only where the runs that read it differ (issue 67.2). On run
folders made here (config, summary, metrics), so without training."""

import copy
import functools
import json
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from normfl.collect import main
from tests.helpers import composed, rows


@functools.cache
def _base(algo: str):
    return composed(f"algo={algo}", "dataset=fashion_mnist", "model=mlp")


def fabricate(d: Path, algo: str, keys: dict | None = None, accuracy: float = 0.6, drop: tuple = ()) -> Path:
    """A finished run of ``algo`` with ``keys`` set and the ``algo`` keys ``drop`` left out of its config: three
    evaluations ending at ``accuracy``."""
    cfg = copy.deepcopy(_base(algo))
    for k, v in (keys or {}).items():
        OmegaConf.update(cfg, k, v, force_add=True, merge=False)
    data = OmegaConf.to_container(cfg)
    for k in drop:
        del data["algo"][k]
    (d / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(data), d / ".hydra" / "config.yaml")
    (d / "summary.json").write_text(json.dumps({
        "status": "completed", "final_round": 4, "final_test_acc": accuracy, "best_test_acc": accuracy,
        "last5_mean_test_acc": accuracy, "best_round": 4, "wall_time_s": 1.0}))
    pd.DataFrame({"round": [0, 2, 4], "train_loss": [None, 1.0, accuracy], "test_acc": [0.1, accuracy / 2, accuracy]}
                 ).to_csv(d / "metrics.csv", index=False)
    return d


@pytest.fixture(scope="module")
def comparison(tmp_path_factory) -> Path:
    """α-NormEC (γ = 0.1) and Clip21 (γ = 1), three seeds each: the issue's comparison."""
    root = tmp_path_factory.mktemp("comparison")
    for algo, gamma in (("normec", 0.1), ("clip21", 1.0)):
        for seed in (1, 2, 3):
            fabricate(root / f"{algo}-{seed}", algo, {"algo.gamma": gamma, "seed": seed}, accuracy=0.5 + seed / 20)
    return root


def test_the_table_shows_a_key_only_where_the_runs_that_read_it_differ(comparison, tmp_path, capsys):
    """α and server_norm are α-NormEC's keys alone: one algorithm's setting is no difference from another that has
    no such key; α differs once two α-NormEC runs differ in it (empty for Clip21); and a key a config lacks that its
    algorithm takes is still read (at its KEY_DEFAULTS value), so such a run is not folded with one that sets it."""
    main([str(comparison)])
    table = rows(capsys.readouterr().out)
    assert [(r["algo.name"], r["algo.gamma"], r["n"]) for r in table] == [("clip21", "1", "3"), ("normec", "0.1", "3")]
    assert not {"algo.alpha", "algo.server_norm"} & set(table[0])
    other = fabricate(tmp_path / "alpha", "normec", {"algo.gamma": 0.1, "algo.alpha": 0.1, "seed": 1})
    main([str(comparison), str(other)])
    table = rows(capsys.readouterr().out)
    assert [(r["algo.name"], r["algo.alpha"], r["n"]) for r in table] == [
        ("clip21", "–", "3"), ("normec", "0.01", "3"), ("normec", "0.1", "1")]
    fabricate(tmp_path / "sn/off", "normec", {"algo.server_norm": False, "seed": 1})
    fabricate(tmp_path / "sn/absent", "normec", {"seed": 2}, drop=("server_norm",))
    main([str(tmp_path / "sn")])
    assert [r["n"] for r in rows(capsys.readouterr().out)] == ["1", "1"]
