"""The benchmark suite runs on small versions of its settings (what it measures is not tested here)."""


import pytest

from tests.helpers import script

pytestmark = pytest.mark.slow            # every test here trains or times whole runs

bench = script("bench")


@pytest.mark.parametrize("setting, overrides", [
    ("B", ["algo.local_steps=2", "batch_size=16", "clients=8", "algo.cohort_size=4", "dataset.train_limit=4000",
           "dataset.test_limit=200"]),
    ("D", ["algo.sample_rate=0.01", "clients=4", "dataset.train_limit=4000", "dataset.test_limit=200"]),
])
def test_bench_times_every_variant_of_a_setting(setting, overrides, data_root):
    reps = 2 if setting == "D" else 1                # D: the paper-style variant timed on fewer rounds than the rest
    rows = bench.bench(setting, [f"data_root={data_root}", *overrides], reps=reps, paper_reps=1)
    got = {r["variant"]: r for r in rows}
    assert {r["reps"] for r in rows if r["variant"] != "paper-style"} == {reps} and got["paper-style"]["reps"] == 1
    backends = (["normfl/layer norms", "normfl/vmap", "normfl/stacked", "normfl/layer norms+contiguous",
                 "normfl/stacked+channels_last"] if setting == "D" else   # the CNN in the other memory format too
                ["normfl/sequential", "normfl/vmap", "normfl/analytic", "normfl/stacked", "normfl/sequential+bf16",
                 "normfl/stacked+bf16", "floor+bf16", "dense floor+bf16"])
    assert sorted(got) == sorted([*backends, "floor", "dense floor", "paper-style", "eval",
                                  *(["eval+contiguous"] if setting == "D" else [])])
    floor, dense = got["floor"]["seconds"], got["dense floor"]["seconds"]
    assert all(r["seconds"] > 0 and r["vs_floor"] == r["seconds"] / floor and r["vs_dense"] == r["seconds"] / dense
               for r in rows)
    assert all(r["cpu_isa"] and r["cpu_bf16"] for r in rows)      # what the CPU's bf16 speed depends on
    for name in (b for b in backends if b.startswith("normfl/")):
        row = got[name]                             # every backend on the first round's inputs, from one state
        tol = 5e-2 if "+bf16" in name else 1e-4
        assert row["grad_rel_diff"] < tol and row["update_rel_diff"] < tol, (name, row)
        assert 0 < row["pass_s"] <= row["seconds"] and row["data_s"] >= 0       # phases of the round's time
        assert 0 < row["data_host_s"] and 0 < row["pass_host_s"]                 # and the host's part of them
        assert abs(row["data_s"] + row["pass_s"] + row["update_s"] + row["other_s"] - row["seconds"]) < 1e-9
    if setting == "B":
        assert got["normfl/stacked+bf16"]["vs_dense_same_precision"] == (got["normfl/stacked+bf16"]["seconds"]
                                                                       / got["dense floor+bf16"]["seconds"])


def test_bench_times_runs_side_by_side(data_root, monkeypatch):
    """The runs step as the stacked launcher steps such a grid: one vectorized group of all of them."""
    from normfl.run import vectorized

    made, real = [], vectorized.Group
    monkeypatch.setattr(vectorized, "Group", lambda trainings: (made.append(len(trainings)), real(trainings))[1])
    rows = bench.together([f"data_root={data_root}", "dataset.train_limit=200", "dataset.test_limit=50", "clients=2",
                           "batch_size=4"], reps=1, runs=3)
    got = {r["variant"]: r for r in rows}
    assert sorted(got) == ["dense floor (fp32)", "normfl (fp32)", "normfl in a row (fp32)"]
    assert got["dense floor (fp32)"]["vs_dense"] == 1.0 and got["normfl (fp32)"]["per_run"] > 0
    assert got["normfl in a row (fp32)"]["per_run"] > 0
    assert made == [3]


def test_bench_times_a_runs_rounds_in_a_row(data_root):
    """The rounds a run takes (α-NormEC's whole round on static buffers, a CUDA graph on a GPU), back to back."""
    rows = bench.in_a_row("A", [f"data_root={data_root}", "dataset.train_limit=200", "dataset.test_limit=50",
                                "clients=2", "batch_size=4"], reps=2)
    assert [r["variant"] for r in rows] == ["normfl/in a row (fp32)"] and rows[0]["seconds"] > 0
    assert rows[0]["capture"].startswith("whole round eager on static buffers")


def test_gpu_check_report_reads_the_bench_and_the_pass(tmp_path, data_root):
    """``make gpu-check``'s report, written from the bench CSVs (setting A's part, B-D's) and a finished pass (its
    GPU half runs on a GPU)."""
    import json

    import pandas as pd

    gpu_check = script("gpu_check")
    rows = bench.bench("D", [f"data_root={data_root}", "algo.sample_rate=0.01", "clients=4",
                             "dataset.train_limit=4000", "dataset.test_limit=200"], reps=1)
    pd.DataFrame(rows).to_csv(tmp_path / "bench-bcd.csv", index=False)
    pd.DataFrame(rows).assign(setting="A").to_csv(tmp_path / "bench.csv", index=False)
    (tmp_path / "normec-pass").mkdir()
    (tmp_path / "normec-pass" / "summary.json").write_text(json.dumps(
        {"final_round": 3, "final_test_acc": 0.41, "precision": "bf16", "capture": "replayed from a CUDA graph"}))
    pd.DataFrame({"round": [0, 1, 2, 3], "steps": [0, 140, 280, 420],            # the first pass holds the warm-up
                  "wall_time": [0.0, 5.4, 7.2, 9.0]}).to_csv(tmp_path / "normec-pass" / "metrics.csv", index=False)
    kernels = {"setting": "A", "what": "NORMEC", "backend": "stacked", "ops_per_round": 547, "kernels": 1210,
               "kernel_ms": 4.1, "slowest": "sm90_xmma_fprop 1.20 ms"}
    pd.DataFrame([kernels]).to_csv(tmp_path / "launches.csv", index=False)
    parts = {name: {"status": "passed", "seconds": 1.0, "tail": f"{i + 3} passed"}
             for i, name in enumerate(("tests", "suite", "bench", "launches", "pass"))}
    gpu_check.write_report(tmp_path, parts)
    report = (tmp_path / "report.md").read_text()
    assert "| D | normfl/stacked |" in report and "| A | normfl/stacked |" in report
    assert "12.86 ms a step" in report and "9.0 min" in report
    assert "## GPU tests\n\n```\n3 passed" in report and "on CUDA\n\n```\n4 passed" in report
    assert "| A | stacked | 547 | 1210 | 4.10 | sm90_xmma_fprop 1.20 ms |" in report
    assert set(gpu_check.DEFAULT) == set(parts) and sum(gpu_check.LIMITS[p] for p in parts) <= 9 * 60
    assert gpu_check.LIMITS["tests"] + gpu_check.LIMITS["suite"] + gpu_check.LIMITS["bench-bcd"] <= 9 * 60


def test_launches_counts_a_rounds_operations(data_root):
    """``scripts/launches.py`` on the CPU: the operations one round launches (its GPU columns need CUDA)."""
    launches = script("launches")
    row = launches.launches("D", [f"data_root={data_root}", "algo.sample_rate=0.01", "clients=4",
                                  "dataset.train_limit=4000", "dataset.test_limit=200"])
    assert row["setting"] == "D" and row["ops_per_round"] > 0 and "kernels" not in row
