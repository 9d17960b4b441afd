"""scripts/noise_readings.py: each reading of the papers' noise gives the multiplier its formula says, the runs
carry exactly the noise its table reports, the PLD reading certifies ε = 8 over the whole paper run, and the text
profile screens each reading's whole 300-round run once."""

from __future__ import annotations

import json
import math

import pytest

from tests.helpers import composed, script

pytestmark = pytest.mark.slow            # every test here trains or times whole runs

nr = script("noise_readings")

LN = math.log(1e5)


@pytest.mark.parametrize("steps", [140, 70])
def test_each_reading_gives_its_formula(steps):
    k, beta = 300, 0.1
    want = {
        "none": 0.0,
        "standard deviation": math.sqrt(k * LN) / 8,
        "on Δ_i": math.sqrt(k * LN) / 8,                    # and β once more in the run (noise_on=raw_delta)
        "log10": math.sqrt(k * 5) / 8,
        "log outside root": math.sqrt(k) * LN / 8,
        "variance": math.sqrt(beta * math.sqrt(k * LN) / 8) / beta,
        "K = releases": math.sqrt(k * steps * LN) / 8,
    }
    for reading, z in want.items():
        assert nr.multiplier(reading, beta, steps) == pytest.approx(z, rel=1e-12), reading
    assert nr.effective("on Δ_i", beta, steps) == pytest.approx(beta * want["on Δ_i"])
    z = nr.multiplier("PLD ε = 8", beta, steps)
    assert 7.99 < nr.eps_whole_run(z, steps) <= 8.0
    assert nr.eps_whole_run(z / 1.01, steps) > 8.0


def test_the_runs_carry_the_noise_the_table_reports(data_root, tmp_path, monkeypatch, capsys):
    setup, _, steps, paper = nr.ALGORITHMS["DP-α-NormEC (SN)"]
    monkeypatch.setattr(nr, "ALGORITHMS", {"DP-α-NormEC (SN)": (setup, [(0.1, 0.1)], steps, paper)})
    extra = ["dataset=fashion_mnist", "model=logreg", "dataset.train_limit=640", "dataset.test_limit=100",
             f"data_root={data_root}"]
    nr.main(["run", "--rounds", "2", "--stack", "8", "--store", str(tmp_path), "--extra", *extra])
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| DP")]
    assert len(rows) == len(nr.READINGS)
    for _, reading, beta, _, job in nr.grid("paper", 2, extra):
        s = json.loads((tmp_path / job.key / "summary.json").read_text())
        assert s["status"] == "completed" and s["steps"] == 2 * 2           # 640 samples: 2 steps a pass
        z = s["privacy"]["std_in_update"] / beta                           # the weighted term's std / its bound
        assert z == pytest.approx(nr.effective(reading, beta, steps), rel=1e-5), reading
        assert any(r.startswith(f"| DP-α-NormEC (SN) | {reading} |") and f"| {z:.4g} |" in r for r in rows)


def test_the_text_profile_trains_each_distinct_noise_once():
    runs = nr.grid("text", 300, [])
    assert len(runs) == len(nr.ALGORITHMS) * len(nr.READINGS)            # a row for every reading
    for algo, (_, cells, _, _) in nr.ALGORITHMS.items():
        rows = {reading: job for a, reading, beta, gamma, job in runs if a == algo}
        assert {(beta, gamma) for a, _, beta, gamma, _ in runs if a == algo} == {cells[0]}
        for job in rows.values():
            assert "reading=pass" not in job.overrides and "rounds=300" in job.overrides
            assert job.cfg.reading == "text" and job.cfg.eval_every == 10
        # one upload a round: K counting uploads is K counting rounds, so the two readings share a run
        assert rows["K = releases"] is rows["standard deviation"]
        assert len({job.key for job in rows.values()}) == len(nr.READINGS) - 1
        z = next(float(o.split("=")[1]) for o in rows["standard deviation"].overrides if "multiplier" in o)
        assert z == pytest.approx(math.sqrt(300 * LN) / 8, rel=1e-5)     # 7.3462: the text runs' own σ_mult


def test_only_trains_the_algorithms_it_names_and_the_table_keeps_every_row(tmp_path, capsys, monkeypatch):
    trained = []
    monkeypatch.setattr(nr.store, "run_missing", lambda jobs, *a, **k: trained.extend(jobs))
    nr.main(["run", "--profile", "text", "--only", "DP-Fed", "--store", str(tmp_path)])
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| DP")]
    assert len(rows) == len(nr.ALGORITHMS) * len(nr.READINGS)
    fed = {job.key for algo, *_, job in nr.grid("text", 300, []) if algo.startswith("DP-Fed")}
    assert {job.key for job in trained} == fed and len(trained) == len(fed) == len(nr.READINGS) - 1


@pytest.mark.parametrize("algo", list(nr.ALGORITHMS))
def test_the_steps_a_pass_the_table_charges_are_the_runs_own(algo, data_root):
    """The table's multipliers and ε count a pass as ALGORITHMS' steps (140, 70), not from a run: they must be
    the steps the paper profile's run of that setup makes on the real data, or the table certifies another run."""
    import torch

    from normfl.run.setup import _prepared_data

    cfg = composed(*nr.ALGORITHMS[algo][0].split(), "reading=pass", f"data_root={data_root}", "device=cpu")
    parts = _prepared_data(cfg, torch.device("cpu"))[1]
    assert min(len(p) // cfg.batch_size for p in parts) == nr.ALGORITHMS[algo][2]
