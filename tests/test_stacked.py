"""The stacked backend and runs trained side by side give the results of the sequential reference and of
the runs made alone, for every algorithm, up to float rounding."""

import json
import threading
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from normfl.engine.capture import StaticPass
from normfl.engine.lockstep import Lockstep
from normfl.engine.stacked import StackedPass
from normfl.run import run, train_together
from tests.helpers import ALGOS, EXTRA, MODELS, assert_same_run, config, outputs


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [[f"algo={a}", *EXTRA.get(a, [])] for a in ALGOS] + list(MODELS.values()),
                         ids=[*ALGOS, *MODELS])
def test_stacked_equals_sequential(overrides, tmp_path, data_root):
    """Float32 runs: grouped and dense convolutions round differently, and ResNet20's twenty layers and its
    BatchNorm statistics carry that to about 1e-4 of the test loss in three rounds. ResNet20 runs in the plain
    memory format: its BatchNorm statistics in channels-last differ from the plain ones by 5e-6 (relative), ten
    times what the stacked pass moves them, and the eval-mode test loss of a three-round model magnifies that
    to 3e-3; tests/test_engine.py holds each backend's channels-last gradients and statistics to the plain
    ones in float64."""
    layout = ["memory_format=contiguous"] if "model=resnet20" in overrides else []
    for backend in ("sequential", "stacked"):
        (tmp_path / backend).mkdir()
        summary = run(config(data_root, f"backend={backend}", *overrides, *layout), tmp_path / backend)
        assert summary["status"] == "completed" and summary["backend"] == backend
    rtol = 1e-3 if "model=resnet20" in overrides else 1e-4
    assert_same_run(tmp_path / "sequential", tmp_path / "stacked", rtol=rtol)


@pytest.mark.slow
def test_runs_side_by_side_equal_the_runs_made_alone(tmp_path, data_root, monkeypatch):
    """Four runs of different algorithms and settings share one process; each ends as it does alone. The two
    α-NormEC runs step as one vectorized group (one pass), the others in lockstep (one pass). A diverging run
    is recorded as diverged, a crashing one as failed with its error, and
    the others go on; a refused run leaves no directory; a finished run is not trained again."""
    passes = []
    grads, static = StackedPass.grads, StaticPass._pass           # the lockstep pass; the group's, on static buffers
    monkeypatch.setattr(StackedPass, "grads", lambda self, x, piece, stats=None: (passes.append(len(piece)),
                                                                                  grads(self, x, piece, stats))[1])
    monkeypatch.setattr(StaticPass, "_pass", lambda self, buf: (passes.append(buf.n), static(self, buf))[1])
    grid = {"normec-a": ["algo=normec", "algo.beta=0.1", "algo.gamma=0.1"],
            "normec-b": ["algo=normec", "algo.beta=1.0", "algo.gamma=0.01", "algo.server_norm=false"],
            "dp_fed_normec": ["algo=dp_fed_normec", "p=0.5", "algo.local_steps=2", "rounds=4"],
            "clip21": ["algo=clip21", "algo.gamma=1e38"],            # diverges
            "crasher": ["algo=normec", "algo._target_=tests.helpers.Crasher"],     # raises in round 1
            "refused": ["algo=normec", "algo.gamma=-1"]}
    jobs = []
    for name, overrides in grid.items():
        (tmp_path / "together" / name).mkdir(parents=True)
        jobs.append((config(data_root, "backend=stacked", *overrides), tmp_path / "together" / name))
    summaries = train_together(jobs)
    assert [s["status"] for s in summaries] == ["completed", "completed", "completed", "diverged", "failed", "refused"]
    assert passes[:2] == [8, 12]            # the first round: normec-a and -b's pass, then the other three runs' pass
    crashed = json.loads((tmp_path / "together" / "crasher" / "summary.json").read_text())
    assert crashed["status"] == "failed" and "crashed on purpose in round 1" in crashed["error"]
    assert not (tmp_path / "together" / "refused").exists()
    for name in ("normec-a", "normec-b", "dp_fed_normec"):
        (tmp_path / "alone" / name).mkdir(parents=True)
        run(config(data_root, "backend=stacked", *grid[name]), tmp_path / "alone" / name)
        assert_same_run(tmp_path / "alone" / name, tmp_path / "together" / name)
    diverged = pd.read_csv(tmp_path / "together" / "clip21" / "metrics.csv")
    assert len(diverged) < 4 and np.isnan(diverged["test_acc"].iloc[-1])          # stopped when it diverged
    before = (tmp_path / "together" / "normec-a" / "summary.json").read_text()
    again = train_together(jobs[:1])                          # finished: left as it is
    assert again[0]["status"] == "completed" and (tmp_path / "together" / "normec-a" / "summary.json").read_text() \
        == before


@pytest.mark.parametrize("algo", ["dp_normec", "dp_normfedavg"])
def test_runs_that_differ_in_algo_seed_step_together_each_with_its_own_draws(algo, tmp_path, data_root):
    """Runs of one seed and several ``algo_seed`` share data and start (the noise study of reading C-N8): side
    by side (α-NormEC's vectorized group, NormFedAvg's lockstep) each draws its own noise and cohorts."""
    jobs = []
    for s in (1, 2):
        (tmp_path / "together" / str(s)).mkdir(parents=True)
        jobs.append((config(data_root, "backend=stacked", f"algo={algo}", *EXTRA.get(algo, []), f"algo_seed={s}"),
                     tmp_path / "together" / str(s)))
    assert [r["status"] for r in train_together(jobs)] == ["completed"] * 2
    for cfg, d in jobs:
        (tmp_path / "alone" / d.name).mkdir(parents=True)
        run(cfg, tmp_path / "alone" / d.name)
        assert_same_run(tmp_path / "alone" / d.name, d)
    assert not np.allclose(*(outputs(d)[1] for _, d in jobs))


class Echo:
    """Clients of a backend that takes them one by one: requests are served alone."""

    def __init__(self):
        self.engine, self.data = SimpleNamespace(backend="sequential"), None


def test_lockstep_closes_cleanly_when_the_coordinator_fails(monkeypatch):
    """A pass that raises reaches every run waiting on it; if serving itself fails, the round raises and
    close() still ends every thread (none is left waiting on an answer)."""
    lockstep = Lockstep()
    monkeypatch.setattr("normfl.engine.lockstep._alone", lambda request: RuntimeError("pass failed"))
    rounds = [(lambda clients: clients.grads(torch.zeros(3), batches=[[None]]), Echo()) for _ in range(2)]
    assert all(isinstance(r, RuntimeError) for r in lockstep.round(rounds))
    monkeypatch.setattr(Lockstep, "_serve", lambda self, requests: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        lockstep.round(rounds)
    threads = [s.thread for s in lockstep.slots]
    closer = threading.Thread(target=lockstep.close, daemon=True)      # a hang fails here, not the suite
    closer.start()
    closer.join(30)
    assert not closer.is_alive() and not any(t.is_alive() for t in threads)
