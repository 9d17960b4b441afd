"""The stacked pass on static buffers (``normfl.engine.capture``): the step a CUDA graph replays is the step
eager mode runs on the CPU, and it gives the plain pass's numbers bit for bit. The capture itself is
checked in tests/test_gpu.py."""

import pytest
import torch

from normfl import models
from normfl.engine import ClientEngine, FlatModel
from normfl.engine.capture import StaticPass, capturable
from normfl.errors import ConfigError
from tests.helpers import composed

CPU = torch.device("cpu")


def _engine(builder, in_shape, capture):
    torch.manual_seed(0)
    return ClientEngine(FlatModel(builder(in_shape, 10), CPU), "stacked", in_shape, capture=capture)


@pytest.mark.parametrize("builder, in_shape", [(models.resnet20, (3, 32, 32)), (models.mlp, (1, 28, 28))])
def test_static_pass_equals_the_plain_pass_step_after_step(builder, in_shape):
    """Four steps of 3 clients at their own points: gradients, losses and (ResNet20) the folded BatchNorm
    running statistics equal the plain stacked pass's, bit for bit; what a step returns is the caller's own,
    so changing it in place (local steps do) leaves the next step alone."""
    static, plain = _engine(builder, in_shape, "auto"), _engine(builder, in_shape, "off")
    assert isinstance(static._backend([(torch.zeros(1), torch.zeros(1), 1.0)] * 2), StaticPass)
    gen = torch.Generator().manual_seed(1)
    x = static.flat.vector()
    for step in range(4):
        X = x + 0.01 * torch.randn(3, x.numel(), generator=gen)
        batches = [[(torch.randn(4, *in_shape, generator=gen), torch.randint(0, 10, (4,), generator=gen), 1.0)]
                   for _ in range(3)]
        G, loss = static.grads(X if step % 2 else x, batches)
        G0, loss0 = plain.grads(X if step % 2 else x, batches)
        assert torch.equal(G, G0) and torch.equal(loss, loss0)
        G.mul_(0), loss.mul_(0)
    for a, b in zip(static.flat.module.buffers(), plain.flat.module.buffers(), strict=True):
        assert torch.equal(a, b)
    assert len(static.static.buffers) == 1 and static.captured().startswith("eager on static buffers")


def test_unequal_batches_take_the_plain_pass():
    engine = _engine(models.mlp, (1, 28, 28), "auto")
    batches = [[(torch.randn(n, 1, 28, 28), torch.zeros(n, dtype=torch.long), 1.0)] for n in (3, 5)]
    G, _ = engine.grads(engine.flat.vector(), batches)
    assert G.shape == (2, engine.flat.dim) and not engine.static.buffers


def test_capture_needs_cuda_and_refuses_on_where_it_cannot():
    assert "CUDA" in capturable(CPU, False)
    assert "deterministic" in capturable(torch.device("cuda"), True)
    assert capturable(torch.device("cuda"), False) is None

    from normfl.config import validate

    cfg = composed("device=cpu", "capture=on")
    with pytest.raises(ConfigError, match="capture='on'.*auto or off.*CUDA"):
        validate(cfg)


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [["algo=normec", "model=resnet20", "dataset=cifar10"],
                                       ["algo=dp_normec", "model=mlp", "dataset=fashion_mnist"],
                                       ["algo=dp_clip21", "model=mlp", "dataset=fashion_mnist", "reading=pass",
                                        "rounds=1"]])
def test_a_whole_round_on_static_buffers_equals_the_algorithms_round(overrides, tmp_path, data_root):
    """The round a CUDA graph replays (the pass, the fold, Ψ, the memories, the noise from a generator seeded
    outside it, the server step) run eagerly on its buffers ends where the algorithm's own round ends, bit for
    bit, step after step; the run's summary says how its rounds ran. On CUDA (``NORMFL_TEST_DEVICE=cuda``) the
    fourth round is replayed from the graph, and ResNet20's rounds agree to 1e-4, not to the bit: cuDNN's
    convolution gradients are not bitwise reproducible (the MLP's rounds were, on an H200)."""
    from normfl.engine.capture import CapturedRound
    from normfl.run import start

    cfgs = [composed(*overrides, "backend=stacked", f"capture={c}", "dataset.train_limit=400", "dataset.test_limit=50",
                     "clients=4", "batch_size=8", "rounds=5", f"data_root={data_root}", "progress=false",
                     "checkpoint_every=0") for c in ("auto", "off")]
    whole, plain = (start(cfg, tmp_path / name) for cfg, name in zip(cfgs, ("whole", "plain"), strict=True))
    cpu = whole.setup.device.type == "cpu"

    def same(a, b):
        return torch.equal(a, b) if cpu else torch.allclose(a, b, rtol=1e-4, atol=1e-6)

    try:
        assert isinstance(whole.round, CapturedRound) and not isinstance(plain.round, CapturedRound)
        for _ in range(4):
            xs = [t.round(t.step, t.x, t.clients) for t in (whole, plain)]
            assert same(xs[0][0], xs[1][0]) and same(xs[0][1]["loss"], xs[1][1]["loss"])
            for t, (x, info) in zip((whole, plain), xs, strict=True):
                t.record(x, info)
        for a, b in zip(whole.setup.flat.module.buffers(), plain.setup.flat.module.buffers(), strict=True):
            assert same(a, b) if a.is_floating_point() else torch.equal(a, b)
        assert whole.round.captured().startswith("whole round eager on static buffers (CUDA graphs need" if cpu
                                                 else "whole round replayed from a CUDA graph")
    finally:
        for t in (whole, plain):
            t.rundir.release()


def test_capture_on_refuses_a_backend_it_cannot_capture(data_root, monkeypatch):
    """capture=on names what stands in the way: here the backend (the device check passes, as on a GPU)."""
    from normfl import config

    monkeypatch.setattr(config.values, "capturable", lambda device, deterministic: None)
    cfg = composed("device=cpu", "capture=on", "backend=sequential")
    with pytest.raises(ConfigError, match="only the stacked pass is captured"):
        config.validate(cfg)
