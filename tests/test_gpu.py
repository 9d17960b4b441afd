"""The GPU subset (``pytest -m gpu``): the stacked backend and runs side by side on CUDA. Skipped where CUDA
is absent; on a GPU machine run ``source .gpu/on-device.sh && python3 -m pytest -m gpu``."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from normfl import models
from normfl.engine import ClientEngine, FlatModel
from normfl.engine.flat import set_numerics
from tests.helpers import config

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
CUDA = torch.device("cuda")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return (torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b)).item()


def same_metrics(a: pd.DataFrame, b: pd.DataFrame):
    """The metrics of captured rounds against plain ones (200 test images): the training loss of the first three
    rounds to 1e-5 and of every round to 1e-3, the test accuracy to two images, the rest to 1e-2. cuDNN's
    convolution gradients are not bitwise reproducible and the models' difference compounds round over round: on
    an H200 (2026-11-27) the third round's training loss moved 1.4e-6, the seventh's 2.6e-4, and one test image
    of 200 turned after 8 rounds (the bounds had been 1e-4 for every training loss and 1e-2 for the accuracy)."""
    pd.testing.assert_series_equal(a["train_loss"].iloc[:4], b["train_loss"].iloc[:4], rtol=1e-5, check_exact=False)
    pd.testing.assert_series_equal(a["train_loss"], b["train_loss"], rtol=1e-3, check_exact=False)
    assert (a["test_acc"] - b["test_acc"]).abs().max() <= 2 / 200 + 1e-9
    pd.testing.assert_frame_equal(a.drop(columns="test_acc"), b.drop(columns="test_acc"), rtol=1e-2,
                                  check_exact=False)


def batches(n, b, in_shape, sizes=None):
    g = torch.Generator().manual_seed(0)
    sizes = sizes or [b] * n
    return [[(torch.randn(s, *in_shape, generator=g).to(CUDA), torch.randint(0, 10, (s,), generator=g).to(CUDA), 1.0)]
            for s in sizes]


@pytest.mark.parametrize("builder, kw, in_shape", [(models.resnet20, {}, (3, 32, 32)),
                                                   (models.resnet20, {"norm": "group"}, (3, 32, 32)),
                                                   (models.cnn, {}, (1, 28, 28)), (models.mlp, {}, (1, 28, 28))])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_stacked_matches_sequential_on_cuda(builder, kw, in_shape, precision, layout):
    """The stacked pass computes the sequential one's gradients, losses and BatchNorm statistics, held to the
    fp32 reference (sequential, contiguous, TF32 off): no farther from it than twice the sequential pass in the
    same precision and memory format, plus 3e-4. In fp32 and the plain format that is about 1e-4 (summation order);
    channels_last and bf16 run other cuDNN kernels (grouped against per-client convolutions) that round
    differently: on an H200, ResNet20's gradients moved 3.0e-4 (sequential) and 4.5e-4 (stacked) in
    channels_last fp32, 0.11 in bf16 for both. The autotuner may pick another algorithm for the grouped
    convolution in the plain format too: the CNN's stacked gradients moved 1.2e-4 on an H200 (2026-11-27), its
    sequential ones not at all."""
    set_numerics(precision, deterministic=False)
    data = batches(10, 32, in_shape)
    runs = {}
    for name, fmt, backend, prec in (("reference", "contiguous", "sequential", "fp32"),
                                     ("sequential", layout, "sequential", precision),
                                     ("stacked", layout, "stacked", precision)):
        torch.manual_seed(0)                             # the same parameters in each
        flat = FlatModel(builder(in_shape, 10, **kw), CUDA, prec, fmt)
        G, loss = ClientEngine(flat, backend).grads(flat.vector(), data)
        runs[name] = {"gradients": [G], "losses": [loss],
                      "buffers": [b for b in flat.module.buffers() if b.is_floating_point()]}
    for what, refs in runs["reference"].items():
        for r, q, s in zip(refs, runs["sequential"][what], runs["stacked"][what], strict=True):
            bound = 2 * rel(q, r) + 3e-4
            assert rel(s, r) < bound, (what, rel(s, r), rel(q, r))


def test_stacked_clipped_sums_on_cuda():
    torch.manual_seed(0)
    flat = FlatModel(models.cnn((1, 28, 28), 10), CUDA)
    pieces = [b[0] for b in batches(4, 0, (1, 28, 28), sizes=[30, 0, 17, 25])]
    X = flat.vector().expand(4, -1)
    s1, l1 = ClientEngine(flat, "sequential").clipped_sums(X, pieces, 0.1)
    s2, l2 = ClientEngine(flat, "stacked").clipped_sums(X, pieces, 0.1)
    assert rel(s2, s1) < 1e-2 and rel(l2, l1) < 1e-2 and not s2[1].any()


def test_deterministic_run_on_cuda_is_bit_identical(tmp_path, data_root):
    """deterministic=true: torch's deterministic algorithms, so a rerun on the same GPU repeats every bit."""
    from normfl.run import run

    outs = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        run(config(data_root, "algo=normec", "model=resnet20", "dataset=cifar10", "dataset.train_limit=320",
                   "dataset.test_limit=100", "clients=2", "batch_size=16", "device=cuda", "backend=stacked",
                   "deterministic=true"), tmp_path / name)
        outs.append((pd.read_csv(tmp_path / name / "metrics.csv").drop(columns="wall_time"),
                     np.load(tmp_path / name / "params.npy")))
    pd.testing.assert_frame_equal(outs[0][0], outs[1][0])
    assert outs[0][1].tobytes() == outs[1][1].tobytes()


def _partial_then_resume(data_root, run_dir, first_device, then_device, *overrides, steps=3):
    """A run started on ``first_device``, stopped after ``steps`` steps with a checkpoint, resumed on
    ``then_device`` (the same config key: the device is not part of it)."""
    from normfl.run import run, start

    t = start(config(data_root, *overrides, f"device={first_device}"), run_dir)
    for _ in range(steps):
        t.record(*t.algo.round(t.step, t.x, t.clients))
    t.save()
    t.rundir.release()
    run(config(data_root, *overrides, f"device={then_device}"), run_dir)
    return pd.read_csv(run_dir / "metrics.csv").drop(columns="wall_time"), np.load(run_dir / "params.npy")


# Non-private: a CUDA generator's noise is not the CPU's, while who takes part is drawn on the host alike.
FED = ("algo=fed_normec", "model=cnn", "dataset=fashion_mnist", "dataset.train_limit=600", "dataset.test_limit=200",
       "clients=4", "p=0.5", "rounds=8", "backend=stacked", "precision=fp32")


@pytest.mark.parametrize("first", ["cuda", "cpu"])
def test_a_run_resumes_on_cuda_from_a_checkpoint_written_on_either_device(first, tmp_path, data_root):
    """Issue 29.7: the algorithm's state (client memories) read from a checkpoint goes to the run's device;
    resumed on CUDA it ends as the run made on CUDA alone (bit for bit from a CUDA checkpoint with
    deterministic algorithms; to float tolerance from a CPU one)."""
    from normfl.run import run

    run(config(data_root, *FED, "device=cuda", "deterministic=true"), tmp_path / "alone")
    alone = pd.read_csv(tmp_path / "alone" / "metrics.csv").drop(columns="wall_time")
    m, p = _partial_then_resume(data_root, tmp_path / "resumed", first, "cuda", *FED, "deterministic=true")
    if first == "cuda":
        pd.testing.assert_frame_equal(m, alone)
        assert p.tobytes() == np.load(tmp_path / "alone" / "params.npy").tobytes()
    else:
        pd.testing.assert_frame_equal(m, alone, rtol=1e-4, check_exact=False)


def test_a_paper_profile_run_stopped_on_cuda_resumes_to_the_same_bits(tmp_path, data_root):
    """The paper profile's kind of run (NORMEC: ResNet20 with BatchNorm on CIFAR-10, a round one pass, bf16, the
    clients stacked, capture=auto) stopped after two passes with a checkpoint, as a device call's budget
    stops it, and resumed on CUDA (as the next call continues it) ends as the run made whole: every metric and
    parameter bit, with deterministic algorithms."""
    from normfl.run import run

    paper = ("algo=normec", "model=resnet20", "dataset=cifar10", "dataset.train_limit=320", "dataset.test_limit=100",
             "clients=2", "batch_size=16", "reading=pass", "rounds=4", "eval_every=1", "precision=bf16",
             "backend=stacked", "deterministic=true", "save_params=true")
    run(config(data_root, *paper, "device=cuda"), tmp_path / "whole")
    m, p = _partial_then_resume(data_root, tmp_path / "resumed", "cuda", "cuda", *paper, steps=2)
    pd.testing.assert_frame_equal(m, pd.read_csv(tmp_path / "whole" / "metrics.csv").drop(columns="wall_time"))
    assert p.tobytes() == np.load(tmp_path / "whole" / "params.npy").tobytes()


def test_a_short_run_on_cuda_matches_the_cpu_with_tf32_off(tmp_path, data_root):
    """Issue 29.6 and 31.1: precision=fp32 is full fp32 on CUDA (TF32 off), so a short run ends where the CPU
    run ends, to 1e-4 (both in one memory format: auto differs between the devices)."""
    from normfl.run import run

    for device in ("cpu", "cuda"):
        run(config(data_root, *FED, f"device={device}", "memory_format=contiguous"), tmp_path / device)
    a, b = (pd.read_csv(tmp_path / d / "metrics.csv").drop(columns="wall_time") for d in ("cpu", "cuda"))
    pd.testing.assert_frame_equal(a, b, rtol=1e-4, check_exact=False)
    assert json.loads((tmp_path / "cuda" / "summary.json").read_text())["numerics"]["tf32"] is False


def _pass_inputs(n=6, b=16, in_shape=(3, 32, 32), steps=6):
    g = torch.Generator().manual_seed(2)
    return [[[(torch.randn(b, *in_shape, generator=g).to(CUDA), torch.randint(0, 10, (b,), generator=g).to(CUDA),
               1.0)] for _ in range(n)] for _ in range(steps)]


def test_a_captured_pass_replays_what_eager_computes():
    """Issue 29.5 / 31.3: the stacked pass recorded in a CUDA graph after its warm-up and replayed gives the
    eager static pass's gradients, losses and BatchNorm statistics (the same kernels: to the last bit when
    cuDNN picks the same algorithms, else to 1e-5), and no step makes the host wait once captured."""
    from normfl.engine.capture import WARMUP

    engines = []
    for capture in ("auto", "off"):
        torch.manual_seed(0)
        engines.append(ClientEngine(FlatModel(models.resnet20((3, 32, 32), 10), CUDA), "stacked", (3, 32, 32),
                                    capture=capture))
    captured, eager = engines
    x = captured.flat.vector()
    steps = _pass_inputs()
    for i, data in enumerate(steps):
        if i > WARMUP:
            torch.cuda.set_sync_debug_mode("error")
        try:
            G, loss = captured.grads(x, data)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        G0, loss0 = eager.grads(x, data)
        assert rel(G, G0) < 1e-5 and rel(loss, loss0) < 1e-5
    assert captured.captured() == "replayed from a CUDA graph"
    for a, b in zip(captured.flat.module.buffers(), eager.flat.module.buffers(), strict=True):
        if a.is_floating_point():
            assert rel(a, b) < 1e-5


@pytest.mark.parametrize("overrides", [("algo=normec", "model=resnet20", "dataset=cifar10", "backend=stacked"),
                                       ("algo=dp_fedavg", "p=0.5", "algo.noise_by=server", "model=cnn",
                                        "dataset=fashion_mnist"),
                                       ("experiment=nfa_t4_qtdl", "algo.cohort_size=2", "model=mlp"),
                                       # who takes part is drawn on the host (ops.Participation.draw): its nonzero
                                       # reads a host tensor, never the device (issue 57.3)
                                       ("algo=fed_normec", "p=0.5", "model=mlp", "dataset=fashion_mnist",
                                        "backend=stacked")])
def test_rounds_on_cuda_never_wait_for_the_device(overrides, tmp_path, data_root):
    """Issue 29.1-2: the training data lives on the GPU, and rounds between two evaluations (and checkpoints:
    none here) run with CUDA's sync debug mode set to error: no read, no data-dependent shape, no blocking copy
    either way between host and device."""
    from normfl.run import start

    t = start(config(data_root, *overrides, "dataset.train_limit=640", "dataset.test_limit=100", "clients=4",
                     "batch_size=16", "device=cuda", "rounds=10", "eval_every=100", "checkpoint_every=0"),
              tmp_path / "run")
    try:
        assert t.clients.data.x.device.type == "cuda" and t.setup.x_test.device.type == "cuda"
        for _ in range(4):                              # first uses (cuDNN's autotuner, caches)
            t.record(*t.algo.round(t.step, t.x, t.clients))
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(4):
                t.record(*t.algo.round(t.step, t.x, t.clients))
        finally:
            torch.cuda.set_sync_debug_mode(0)
    finally:
        t.rundir.release()


def test_squared_norms_on_cuda_accumulate_in_float64_without_a_read():
    """DP-SGD's per-sample norms on a GPU: one float64-accumulating pass, exact where float32 squares overflow,
    with no read that makes the host wait."""
    from normfl.engine import clipping

    t = torch.tensor([[3.0, 4.0, 0.0], [1e30, -1e30, 2.0]], device=CUDA)
    torch.cuda.set_sync_debug_mode("error")
    try:
        sq = clipping.sq_norms(t)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.testing.assert_close(sq.cpu(), t.cpu().double().pow(2).sum(1), rtol=1e-6, atol=0)


@pytest.mark.parametrize("algo", ["normec", "dp_normec", "dp_clip21"])
def test_a_whole_round_replayed_from_a_cuda_graph_equals_eager(algo, tmp_path, data_root):
    """Issue 29.5 / 31.3: α-NormEC's and Clip21's whole round (pass, fold, Ψ, memories, noise seeded outside
    the graph, server step) recorded after its warm-up and replayed: the same metrics as the plain rounds,
    to float tolerance (noise included: the graph replays the generator from the seed set before each
    replay), and no round waits for the host once captured."""
    from normfl.run import run, start

    common = (f"algo={algo}", "model=resnet20", "dataset=cifar10", "dataset.train_limit=640",
              "dataset.test_limit=200", "clients=4", "batch_size=16", "device=cuda", "backend=stacked",
              "rounds=8", "eval_every=4")
    for capture in ("auto", "off"):
        (tmp_path / capture).mkdir()
        summary = run(config(data_root, *common, f"capture={capture}"), tmp_path / capture)
    assert summary["status"] == "completed"
    captured = json.loads((tmp_path / "auto" / "summary.json").read_text())
    assert captured["capture"] == "whole round replayed from a CUDA graph"
    a, b = (pd.read_csv(tmp_path / c / "metrics.csv").drop(columns="wall_time") for c in ("auto", "off"))
    same_metrics(a, b)
    t = start(config(data_root, *common, "rounds=20", "eval_every=100", "checkpoint_every=0"), tmp_path / "sync")
    try:
        for _ in range(5):
            t.record(*t.round(t.step, t.x, t.clients))
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(3):
                t.record(*t.round(t.step, t.x, t.clients))
        finally:
            torch.cuda.set_sync_debug_mode(0)
    finally:
        t.rundir.release()


@pytest.mark.parametrize("grid", [[["algo=normec", "algo.beta=0.1"],
                                   ["algo=normec", "algo.beta=1.0", "algo.gamma=0.01"]],
                                  [["algo=fed_normec", "p=0.5", "algo.beta=0.1"],
                                   ["algo=fed_normec", "p=0.5", "algo.beta=1.0", "algo.gamma=0.01"]]],
                         ids=["normec", "fed_normec"])
def test_runs_side_by_side_replay_their_pass_from_a_cuda_graph(grid, tmp_path, data_root):
    """Issue 29.4-5: a vectorized group's one pass of its runs' clients, recorded after its warm-up and replayed,
    ends the runs as the plain pass does (the metrics as a single run's captured round's:
    ``same_metrics``), and their summaries say that the pass was replayed; for α-NormEC and for
    Fed-α-NormEC under partial participation (every client computes, one draw for the group)."""
    from normfl.run import train_together

    common = ("model=resnet20", "dataset=cifar10", "dataset.train_limit=640", "dataset.test_limit=200", "clients=4",
              "batch_size=16", "device=cuda", "backend=stacked", "rounds=8", "eval_every=4")
    for capture in ("auto", "off"):
        jobs = []
        for i, overrides in enumerate(grid):
            (tmp_path / capture / str(i)).mkdir(parents=True)
            jobs.append((config(data_root, *common, *overrides, f"capture={capture}"), tmp_path / capture / str(i)))
        assert [s["status"] for s in train_together(jobs)] == ["completed"] * len(grid)
    for i in range(len(grid)):
        a, b = (pd.read_csv(tmp_path / c / str(i) / "metrics.csv").drop(columns="wall_time") for c in ("auto", "off"))
        same_metrics(a, b)
        summary = json.loads((tmp_path / "auto" / str(i) / "summary.json").read_text())
        assert summary["capture"] == "2 runs side by side, one vectorized round, their pass replayed from a CUDA graph"
