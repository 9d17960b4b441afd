"""No host synchronisation inside a round: the calls that would make the host wait for a GPU (``item``,
``tolist``, ``bool``/``float``/``int`` of a tensor, ``nonzero``, copies to the host, tensors made from host
values on a device), counted on the CPU across rounds between two evaluations, for every algorithm family
(``normfl.syncs``)."""

import pytest
import torch

from normfl.run.training import start
from normfl.syncs import Counter, host_side, reading
from tests.helpers import CIFAR_RESNET20, SCALAR_GRIDS, composed, config

SMALL = ["dataset=fashion_mnist", "model=mlp", "dataset.train_limit=400", "dataset.test_limit=100", "clients=4",
         "batch_size=8", "device=cpu", "progress=false", "checkpoint_every=0", "rounds=8", "eval_every=100"]
FAMILIES = {
    "normec (stacked)": ["algo=normec", "backend=stacked"],
    "normec, CIFAR-10 crop and flip on the device": ["algo=normec", "backend=stacked", "dataset=cifar10"],
    "dp_normec (vmap)": ["algo=dp_normec", "backend=vmap"],
    "dp_clip21 (sequential)": ["algo=dp_clip21", "backend=sequential"],
    "dp_clip21 (full oracle, analytic)": ["algo=dp_clip21", "oracle=full", "backend=analytic"],
    "dpsgd_norm": ["algo=dpsgd_norm", "algo.private=true"],
    "dp_fed_normec, p = 0.5, local GD": ["algo=dp_fed_normec", "p=0.5", "algo.local_steps=2"],
    "dp_fed_normec, participants only": ["algo=dp_fed_normec", "p=0.5", "algo.memory_update=participants_only"],
    "dp_fed_normec, incremental gradient": ["algo=dp_fed_normec", "algo.local_operator=ig", "algo.ig_batch_size=50"],
    "dp_fedavg, central noise, p = 0.5": ["algo=dp_fedavg", "p=0.5", "algo.noise_by=server"],
    "dpfl (DP-SGD clients, fixed τ)": ["algo=dpfl", "algo.tau=2", "backend=stacked"],
    "dp_normfedavg (QTDL)": ["experiment=nfa_t4_qtdl", "algo.cohort_size=2"],
    "nfa_binomial": ["experiment=nfa_t4_bin", "algo.cohort_size=2"],
    "reading=pass": ["algo=normec", "reading=pass", "rounds=1"],
}


def counted(overrides, tmp_path, data_root, rounds=3):
    small = [o for o in SMALL if not (o.startswith("batch_size=") and "oracle=full" in overrides)]      # unread
    cfg = composed(*small, *overrides, f"data_root={data_root}")
    t = start(cfg, tmp_path / "run")
    try:
        t.record(*t.algo.round(t.step, t.x, t.clients))     # a first round: what is made on first use
        with Counter() as syncs:
            for _ in range(rounds):
                if t.active:
                    t.record(*t.algo.round(t.step, t.x, t.clients))
        return syncs
    finally:
        t.rundir.release()


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_no_host_sync_between_evaluations(family, tmp_path, data_root):
    syncs = counted(FAMILIES[family], tmp_path, data_root)
    assert syncs.count == 0, dict(syncs.where)


def test_ali_dpfl_reads_only_its_estimates(tmp_path, data_root):
    """ALI-DPFL chooses τ* (how many local steps the next round takes) on the host from the round's
    estimates (ALI Alg. 2 lines 17-19): those reads, in its selector, are its only ones, once a round."""
    syncs = counted(["algo=ali_dpfl"], tmp_path, data_root)
    assert syncs.count > 0
    assert all(" at algorithms/alidpfl.py:" in w or " at algorithms/tau.py:" in w for w in syncs.where), syncs.where


def test_counter_sees_reads_and_leaves_host_work_and_readings_alone():
    x = torch.arange(4.0)
    with Counter() as c:
        x.sum().item()
        bool(x.any())
        float(x[0])
        x.nonzero()
        x[x > 1]
        x.cpu()
        x.to("cpu")
        x.to(x.device)                    # the run's own device: not a copy to the host
        with host_side():
            x.tolist()
        with reading():
            x.numpy()
    assert sorted(w.split(" at ")[0] for w in c.where) == ["__bool__", "__float__", "__getitem__", "cpu", "item",
                                                           "nonzero", "to"]


def test_an_algorithm_that_reads_its_loss_is_caught(tmp_path, data_root, monkeypatch):
    """The counter is not blind to a round: a loss read with ``.item()`` (what every algorithm did) shows."""
    from normfl.algorithms import ef21

    real = ef21.EF21.round

    def reads(self, k, x, clients):
        x, info = real(self, k, x, clients)
        return x, {**info, "loss": info["loss"].item()}

    monkeypatch.setattr(ef21.EF21, "round", reads)
    syncs = counted(["algo=normec"], tmp_path, data_root)
    assert syncs.count == 3 and all(w.startswith("item at ") for w in syncs.where)


def test_batchnorm_copies_made_each_pass_wait_for_nothing():
    """The thread path makes a ``ClientStats`` for every pass (``engine.lockstep.combined_pass``): after the first
    of a module and size, making, filling and folding one copies nothing from the host (its factors are made
    once per module), for one module and for runs side by side."""
    from normfl import models
    from normfl.engine import FlatModel
    from normfl.engine.batchnorm import ClientStats

    modules = [FlatModel(models.resnet20((3, 32, 32), 10), torch.device("cpu")).module for _ in range(2)]
    for group in ([modules[0]], modules):
        ClientStats(group, 3)
        with Counter() as syncs:
            stats = ClientStats(group, 3)
            stats.fill()
            stats.fold()
        assert syncs.count == 0, dict(syncs.where)


GROUPS = ["normec", "dp", "dp_dpsgd", "fed_normec", "dp_fed_normec", "dp_fedavg", "dp_fedavg_server", "resnet20"]


@pytest.mark.slow
@pytest.mark.parametrize("grid", GROUPS)
def test_runs_side_by_side_step_as_one_without_a_host_sync(grid, tmp_path, data_root):
    """A vectorized group's round (``run.vectorized``: each run's noise from its own privatizer, one participation
    draw for the group, each run's metrics and divergence kept apart, ResNet20's BatchNorm statistics folded per
    run) reads nothing from the device between evaluations either: on a GPU, 16 runs side by side would otherwise
    wait for it once a run or more every round."""
    from normfl.run import vectorized
    extra = CIFAR_RESNET20 if grid == "resnet20" else ["rounds=6"] if "fed" in grid else []
    cache, trainings = {}, []
    for i, overrides in enumerate(SCALAR_GRIDS[grid]):
        cfg = config(data_root, "backend=stacked", "device=cpu", "eval_every=100", "checkpoint_every=0", *extra,
                     *overrides)
        trainings.append(start(cfg, tmp_path / str(i), cache, progress=False))
    try:
        (members,), rest = vectorized.groups(trainings)
        assert len(members) == len(trainings) and not rest
        group = vectorized.Group(members)
        group.round()                                    # a first round: what is made on first use
        with Counter() as syncs:
            for _ in range(3):
                group.round()
        assert syncs.count == 0, dict(syncs.where)
        assert all(t.step == 4 and t.active for t in trainings)
    finally:
        for t in trainings:
            t.rundir.release()
