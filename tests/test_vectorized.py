"""Runs that differ only in scalars step as one (``normfl.run.vectorized``): x as ``[R, d]``, the scalars as
``[R, 1(, 1)]`` tensors, one EF21 round for all; each run still ends as it does alone, with its own metrics,
checkpoint and divergence."""

import os

import pytest
import torch

from normfl.run import run, train_together, vectorized
from tests.helpers import CIFAR_RESNET20, SCALAR_GRIDS, assert_same_run, config


@pytest.mark.slow
@pytest.mark.parametrize("grid", SCALAR_GRIDS)
def test_runs_that_differ_in_scalars_step_as_one_and_equal_the_runs_alone(grid, tmp_path, data_root, monkeypatch):
    """Runs that differ only in scalars step as one group, made once, and each ends as it does alone; sharing one
    seed, they draw each round's batches once for all of them (the host's draws: one ``next_batches`` a group
    round)."""
    from normfl.data.clients import ClientData

    made, draws, per_round = [], [], []

    def group_round(self, real=vectorized.Group.round):
        before = len(draws)
        real(self)
        per_round.append(len(draws) - before)

    monkeypatch.setattr(vectorized.Group, "__init__", lambda self, members, real=vectorized.Group.__init__:
                        (made.append(len(members)), real(self, members))[1])
    monkeypatch.setattr(vectorized.Group, "round", group_round)
    monkeypatch.setattr(ClientData, "next_batches", lambda self, ids=None, real=ClientData.next_batches:
                        (draws.append(id(self.streams)), real(self, ids))[1])
    extra = CIFAR_RESNET20 if grid == "resnet20" else ["rounds=6", "eval_every=3"] if "fed" in grid else []
    jobs = []
    for i, overrides in enumerate(SCALAR_GRIDS[grid]):
        (tmp_path / "together" / str(i)).mkdir(parents=True)
        jobs.append((config(data_root, "backend=stacked", *extra, *overrides), tmp_path / "together" / str(i)))
    assert [s["status"] for s in train_together(jobs)] == ["completed"] * len(jobs)
    private = {i for i, o in enumerate(SCALAR_GRIDS[grid]) if "algo=dp_clip21" in o}   # Clip21 and DP-Clip21: apart
    assert made == [len(jobs) - len(private)]                                  # one group, made once
    assert per_round and set(per_round) == {1}                                 # one draw a round for the group
    for i, overrides in enumerate(SCALAR_GRIDS[grid]):
        (tmp_path / "alone" / str(i)).mkdir(parents=True)
        run(config(data_root, "backend=stacked", *extra, *overrides), tmp_path / "alone" / str(i))
        assert_same_run(tmp_path / "alone" / str(i), tmp_path / "together" / str(i),
                        rtol=1e-3 if grid == "resnet20" else 1e-4)


@pytest.mark.parametrize("case", [["algo=fed_normec", "algo.memory_update=participants_only"],
                                  ["algo=fed_normec", "algo.local_steps=2"],
                                  ["algo=fedavg", "algo.local_operator=ig", "algo.ig_batch_size=50"]])
def test_runs_a_group_cannot_step_train_apart_and_equal_the_runs_alone(case, tmp_path, data_root, monkeypatch):
    """Runs whose round the group's does not take (only participants updating their memories, more than one local
    step, an incremental-gradient operator) declare no scalars: given together they train apart, each as alone."""
    made = []
    monkeypatch.setattr(vectorized.Group, "__init__", lambda self, members, real=vectorized.Group.__init__:
                        (made.append(len(members)), real(self, members))[1])
    grid = [[*case, "p=0.5", "algo.beta=0.1", "rounds=4"], [*case, "p=0.5", "algo.beta=0.5", "rounds=4"]]
    jobs = [(config(data_root, "backend=stacked", *o), tmp_path / "together" / str(i)) for i, o in enumerate(grid)]
    for _, d in jobs:
        d.mkdir(parents=True)
    assert [s["status"] for s in train_together(jobs)] == ["completed"] * 2 and made == []
    for i, overrides in enumerate(grid):
        run(config(data_root, "backend=stacked", *overrides), tmp_path / "alone" / str(i))
        assert_same_run(tmp_path / "alone" / str(i), tmp_path / "together" / str(i), rtol=1e-6)


def test_a_run_that_diverges_leaves_the_group_and_the_others_go_on(tmp_path, data_root):
    grid = [["algo=normec", "algo.beta=0.1"], ["algo=normec", "algo.gamma=1e38", "algo.server_norm=false"],
            ["algo=normec", "algo.beta=1.0", "algo.gamma=0.01"]]
    jobs = []
    for i, overrides in enumerate(grid):
        (tmp_path / "together" / str(i)).mkdir(parents=True)
        jobs.append((config(data_root, "backend=stacked", "rounds=5", "eval_every=1", *overrides),
                     tmp_path / "together" / str(i)))
    assert [s["status"] for s in train_together(jobs)] == ["completed", "diverged", "completed"]
    for i in (0, 2):
        (tmp_path / "alone" / str(i)).mkdir(parents=True)
        run(config(data_root, "backend=stacked", "rounds=5", "eval_every=1", *grid[i]), tmp_path / "alone" / str(i))
        assert_same_run(tmp_path / "alone" / str(i), tmp_path / "together" / str(i))


def test_a_grouped_run_checkpoints_its_own_state(tmp_path, data_root):
    """A run's memories and x are views of its group's; its checkpoint holds copies of its own rows only."""
    from normfl.run import start

    ts = [start(config(data_root, "backend=stacked", "algo=normec", f"algo.beta={b}"), tmp_path / str(b))
          for b in (0.1, 1.0)]
    try:
        group = vectorized.Group(ts)
        group.round()
        assert ts[1].algo.g.data_ptr() == group.box.g[1].data_ptr()
        state = ts[1].algo.state_dict()
        assert state["g"].shape == ts[1].algo.g.shape and state["g"].untyped_storage().nbytes() == \
            state["g"].numel() * state["g"].element_size()
        assert torch.equal(state["ghat"], group.box.ghat[1])
        from normfl import checkpoint

        x = checkpoint.snapshot(ts[1], 0.0)["x"]                 # x too: a copy, not a view of the group's [R, d]
        assert x.untyped_storage().nbytes() == x.numel() * x.element_size()
    finally:
        for t in ts:
            t.rundir.release()


def test_a_grouped_federated_run_checkpoints_its_own_memories(tmp_path, data_root):
    """Fed-α-NormEC's client memories (a ``ClientMemory``) are rows of the group's ``[R, n, d]``; a checkpoint of
    one run holds a copy of its own rows, not the group's."""
    import pickle

    from normfl.run import start

    ts = [start(config(data_root, "backend=stacked", "algo=fed_normec", f"algo.beta={b}"), tmp_path / str(b))
          for b in (0.1, 1.0)]
    try:
        group = vectorized.Group(ts)
        group.round()
        assert ts[1].algo.v.rows.data_ptr() == group.box.v.rows[1].data_ptr()
        rows = pickle.loads(pickle.dumps(ts[1].algo.state_dict()))["v"].rows
        assert torch.equal(rows, group.box.v.rows[1])
        assert rows.untyped_storage().nbytes() == rows.numel() * rows.element_size()
    finally:
        for t in ts:
            t.rundir.release()


@pytest.mark.slow
def test_a_groups_pass_on_static_buffers_equals_the_plain_pass(tmp_path, data_root):
    """With ``capture=auto`` a group's R·n clients go through one pass on static buffers (eager here), each run's
    BatchNorm copies starting from and folding into its own model: the runs end as with the plain pass
    (``capture=off``), bit for bit on the CPU, and their summaries say how they ran. On CUDA
    (``NORMFL_TEST_DEVICE=cuda``) to 1e-4, cuDNN's convolution gradients not being bitwise reproducible (the third
    round's training loss moved 3.4e-6 on an H200), and these three rounds end before the pass is recorded
    (tests/test_gpu.py replays it)."""
    import json

    import numpy as np
    import pandas as pd

    cuda = os.environ["NORMFL_DEVICE"] == "cuda"

    for capture in ("auto", "off"):
        jobs = []
        for i, overrides in enumerate(SCALAR_GRIDS["resnet20"]):
            (tmp_path / capture / str(i)).mkdir(parents=True)
            jobs.append((config(data_root, "backend=stacked", *CIFAR_RESNET20, *overrides, f"capture={capture}"),
                         tmp_path / capture / str(i)))
        assert [s["status"] for s in train_together(jobs)] == ["completed"] * len(jobs)
    for i in range(len(SCALAR_GRIDS["resnet20"])):
        a, b = (tmp_path / c / str(i) for c in ("auto", "off"))
        pd.testing.assert_frame_equal(*(pd.read_csv(d / "metrics.csv").drop(columns="wall_time") for d in (a, b)),
                                      check_exact=not cuda, rtol=1e-4)
        pa, pb = (np.load(d / "params.npy") for d in (a, b))
        assert np.linalg.norm(pa - pb) <= 1e-4 * np.linalg.norm(pb) if cuda else np.array_equal(pa, pb)
        how = {c: json.loads((tmp_path / c / str(i) / "summary.json").read_text())["capture"] for c in ("auto", "off")}
        assert how["auto"] == ("2 runs side by side, one vectorized round, their pass " +
                               ("eager on static buffers (not yet past its warm-up)" if cuda else
                                "eager on static buffers (CUDA graphs need a CUDA device; this run computes on cpu)"))
        assert how["off"] == "2 runs side by side, one vectorized round, the plain pass (off)"


@pytest.mark.parametrize("grid", ["normec", "fed_normec"])
def test_grouped_runs_stopped_by_a_signal_resume_to_the_runs_made_alone(grid, tmp_path, data_root, monkeypatch,
                                                                        caplog):
    """A campaign stopped while its runs step as one (a scheduler's SIGTERM, a device call's time limit): each run
    saves its own checkpoint; trained again, they group again from there and end as the runs made alone."""
    import itertools
    import signal

    from normfl.run import together
    from normfl.run.signals import Interrupts, Stopped

    polls = itertools.count()

    class StopAtStep3(Interrupts):                       # SIGTERM, as read after the group's third round
        POLL_S = 0.0

        def __init__(self):
            super().__init__(lambda: signal.SIGTERM if next(polls) == 2 else None)

    extra = ["rounds=6", "eval_every=3"]
    jobs = []
    for i, overrides in enumerate(SCALAR_GRIDS[grid]):
        (tmp_path / "together" / str(i)).mkdir(parents=True)
        jobs.append((config(data_root, "backend=stacked", *extra, *overrides), tmp_path / "together" / str(i)))
    with monkeypatch.context() as m:
        m.setattr(together, "Interrupts", StopAtStep3)
        with pytest.raises(Stopped):
            train_together(jobs)
    from normfl import checkpoint

    for _, run_dir in jobs:                              # stopped after round 3 of 6, each with its own checkpoint
        assert checkpoint.peek(run_dir)["rows"][-1]["round"] == 3 and not (run_dir / "summary.json").exists()
    made = []
    monkeypatch.setattr(vectorized.Group, "__init__", lambda self, members, real=vectorized.Group.__init__:
                        (made.append(len(members)), real(self, members))[1])
    with caplog.at_level("INFO", logger="normfl"):
        assert [s["status"] for s in train_together(jobs)] == ["completed"] * len(jobs)
    assert made == [len(jobs)]                           # grouped again, from their checkpoints
    assert caplog.text.count("resuming from round 3") == len(jobs)
    for i, overrides in enumerate(SCALAR_GRIDS[grid]):
        (tmp_path / "alone" / str(i)).mkdir(parents=True)
        run(config(data_root, "backend=stacked", *extra, *overrides), tmp_path / "alone" / str(i))
        assert_same_run(tmp_path / "alone" / str(i), tmp_path / "together" / str(i))
