"""The benchmark suite runs on small versions of its settings (what it measures is not tested here)."""

import importlib.util
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("bench", Path(__file__).resolve().parents[1] / "scripts" / "bench.py")
bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench)


@pytest.mark.parametrize("setting, overrides", [
    ("B", ["algo.local_steps=2", "batch_size=16", "clients=8", "algo.cohort_size=4", "dataset.train_limit=4000",
           "dataset.test_limit=200"]),
    ("D", ["algo.sample_rate=0.01", "clients=4", "dataset.train_limit=4000", "dataset.test_limit=200"]),
])
def test_bench_times_every_variant_of_a_setting(setting, overrides, data_root):
    rows = bench.bench(setting, [f"data_root={data_root}", *overrides], reps=1)
    got = {r["variant"]: r for r in rows}
    backends = (["normfl/layer norms", "normfl/vmap", "normfl/stacked"] if setting == "D" else
                ["normfl/sequential", "normfl/vmap", "normfl/analytic", "normfl/stacked", "normfl/sequential+bf16",
                 "normfl/stacked+bf16", "floor+bf16", "dense floor+bf16"])
    assert sorted(got) == sorted([*backends, "floor", "dense floor", "paper-style", "eval"])
    assert got["floor"]["vs_floor"] == 1.0 and got["dense floor"]["vs_dense"] == 1.0
    assert all(r["seconds"] > 0 for r in rows)


def test_bench_times_runs_side_by_side(data_root):
    rows = bench.together([f"data_root={data_root}", "dataset.train_limit=200", "dataset.test_limit=50", "clients=2",
                           "batch_size=4"], reps=1, runs=3)
    got = {r["variant"]: r for r in rows}
    assert sorted(got) == ["dense floor (fp32)", "normfl (fp32)"]
    assert got["dense floor (fp32)"]["vs_dense"] == 1.0 and got["normfl (fp32)"]["per_run"] > 0
