"""The client backends agree (float64: to rounding), in either memory format; the stacked pass pads uneven batches
and refuses what it cannot group; the analytic backward is autograd's; auto times what applies; BatchNorm running
statistics follow the documented rule, folded layer by layer or all at once; bf16 autocast stays close and fp32.
The clients' batch streams are tests/test_client_batches.py's, DP-SGD's per-sample clipping
tests/test_dpsgd_clipping.py's."""

import json

import pytest
import torch

from normfl import models
from normfl.engine import ClientEngine, FlatModel, choose_backend, fold_running_stats
from tests.helpers import CPU, flat_model


@pytest.fixture
def float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def batches(n, b, in_shape=(3, 32, 32), seed=0):
    g = torch.Generator().manual_seed(seed)
    return [[(torch.randn(b, *in_shape, generator=g), torch.randint(0, 10, (b,), generator=g), 1.0)]
            for _ in range(n)]


MODELS = [(models.resnet20, {}, (3, 32, 32)), (models.resnet20, {"norm": "group"}, (3, 32, 32)),
          (models.cnn, {}, (1, 28, 28)), (models.mlp, {"hidden": [32, 16]}, (1, 28, 28)),
          (models.logreg, {}, (1, 28, 28))]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["vmap", "stacked"])
@pytest.mark.parametrize("builder, kw, in_shape", MODELS)
def test_side_by_side_backends_agree_with_sequential(backend, builder, kw, in_shape, float64):
    """Same gradients, losses and running statistics, in float64 so that only real differences show
    (in float32 a near-constant BatchNorm channel can amplify summation-order noise to ~1e-3)."""
    data = batches(3, 8, in_shape)
    ref, vec = flat_model(builder, in_shape, **kw), flat_model(builder, in_shape, **kw)
    x = ref.vector()
    G1, l1 = ClientEngine(ref, "sequential").grads(x, data)
    G2, l2 = ClientEngine(vec, backend).grads(x, data)
    torch.testing.assert_close(G1, G2, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(l1, l2, rtol=1e-9, atol=1e-11)
    for (name, a), b in zip(ref.module.named_buffers(), vec.module.buffers(), strict=True):   # running stats
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=name)
    # per-client points [n, d] (local steps): still the same
    X = x + 0.01 * torch.randn(3, x.numel(), generator=torch.Generator().manual_seed(1))
    G1, _ = ClientEngine(ref, "sequential").grads(X, data)
    G2, _ = ClientEngine(vec, backend).grads(X, data)
    torch.testing.assert_close(G1, G2, rtol=1e-9, atol=1e-11)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sequential", "vmap", "stacked"])
@pytest.mark.parametrize("builder, kw, in_shape", MODELS[:3])
def test_channels_last_lays_out_the_activations_and_keeps_the_gradients(backend, builder, kw, in_shape, float64):
    """memory_format=channels_last: every activation a convolution made is stored channels-last (what the
    normalisation and pooling layers get; vmap stays plain, which it cannot relayout), and the gradients,
    losses and running statistics are those of the plain layout."""
    data = batches(3, 8, in_shape)
    plain, nhwc = flat_model(builder, in_shape, **kw), flat_model(builder, in_shape, layout="channels_last", **kw)
    assert (plain.layout.name, nhwc.layout.name) == ("contiguous", "channels_last")
    x = plain.vector()
    seen = {}

    def note(m, args):                          # a layer that follows a convolution: how its input is stored
        if type(m).__name__.lstrip("_") in ("BatchNorm2d", "GroupNorm", "MaxPool2d") and backend != "vmap":
            seen.setdefault(id(m.layout_of), []).append(args[0].is_contiguous(memory_format=torch.channels_last))

    got = {}
    handle = torch.nn.modules.module.register_module_forward_pre_hook(note)
    try:
        for flat in (plain, nhwc):
            for m in flat.module.modules():
                m.layout_of = flat.layout
            engine = ClientEngine(flat, backend)
            for m in engine.stacked.module.modules() if backend == "stacked" else ():
                m.layout_of = flat.layout
            got[flat.layout.name] = engine.grads(x, data)
    finally:
        handle.remove()
    torch.testing.assert_close(got["channels_last"], got["contiguous"], rtol=1e-9, atol=1e-11)
    for a, b in zip(plain.module.buffers(), nhwc.module.buffers(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    if backend != "vmap":
        assert set(seen[id(plain.layout)]) == {False} and set(seen[id(nhwc.layout)]) == {True}


@pytest.mark.parametrize("builder, kw, in_shape", [m for m in MODELS if m[1] != {}] + MODELS[2:])
def test_stacked_pads_uneven_batches_exactly(builder, kw, in_shape, float64):
    """Batches of different sizes (DP-SGD's Poisson batches, uneven shards, an empty one) go in one pass,
    padded and masked, with every client's gradient and loss as on its own; models without BatchNorm."""
    g = torch.Generator().manual_seed(3)
    piece = [(torch.randn(b, *in_shape, generator=g), torch.randint(0, 10, (b,), generator=g), 1.0)
             for b in (8, 3, 5)]
    flat = flat_model(builder, in_shape, **kw)
    X = flat.vector() + 0.01 * torch.randn(3, flat.dim, generator=g)
    engine = ClientEngine(flat, "stacked")
    assert engine.stacked.takes(piece)
    G1, l1 = ClientEngine(flat, "sequential").grads(X, [[p] for p in piece])
    G2, l2 = engine.grads(X, [[p] for p in piece])
    torch.testing.assert_close(G2, G1, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(l2, l1, rtol=1e-9, atol=1e-11)
    assert not ClientEngine(flat_model(models.resnet20), "stacked").stacked.takes(piece)     # BatchNorm: not padded


def test_stacked_refuses_what_it_cannot_group():
    """A layer it has no grouped form for, or a Linear layer on more than two axes, leaves stacked out."""
    odd = FlatModel(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3), torch.nn.Softmax(dim=1)), CPU)
    assert "stacked" not in ClientEngine(odd).backends()
    with pytest.raises(ValueError, match="Softmax"):
        ClientEngine(odd, "stacked")
    three_axes = FlatModel(torch.nn.Sequential(torch.nn.Linear(5, 3)), CPU)
    with pytest.raises(ValueError, match="more than two axes"):
        ClientEngine(three_axes, "stacked", in_shape=(4, 5))


@pytest.mark.parametrize("builder, kw, in_shape", [(models.mlp, {"hidden": [32, 16]}, (1, 28, 28)),
                                                   (models.logreg, {}, (1, 28, 28)),
                                                   (models.mlp, {"hidden": []}, (5,))])
def test_analytic_backward_matches_autograd(builder, kw, in_shape, float64):
    """The hand-written backward of a Linear/ReLU stack gives autograd's gradients and losses, at one
    point and at one point per client; models of other shapes are not offered it."""
    flat = flat_model(builder, in_shape, **kw)
    data = batches(3, 8, in_shape)
    x = flat.vector()
    X = x + 0.01 * torch.randn(3, x.numel(), generator=torch.Generator().manual_seed(1))
    engine = ClientEngine(flat, "analytic")
    assert engine.backends() == ("sequential", "vmap", "analytic", "stacked")
    for point in (x, X):
        G1, l1 = ClientEngine(flat, "sequential").grads(point, data)
        G2, l2 = engine.grads(point, data)
        torch.testing.assert_close(G2, G1, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(l2, l1, rtol=1e-12, atol=0)
    assert ClientEngine(flat_model(models.cnn, (1, 28, 28))).backends() == ("sequential", "vmap", "stacked")
    no_flatten = FlatModel(torch.nn.Sequential(torch.nn.Linear(5, 3)), CPU)     # Linear on 3-D inputs differs
    assert ClientEngine(no_flatten, in_shape=(4, 5)).backends() == ("sequential", "vmap")
    with pytest.raises(ValueError, match="analytic"):
        ClientEngine(flat_model(models.resnet20), "analytic")


def test_auto_times_only_the_backends_that_apply(tmp_path, monkeypatch):
    """auto times the backends that apply to the model and batches (vmap needs equal batches, and so does
    stacked with BatchNorm; analytic a Linear/ReLU stack) and remembers the winner under a key that names
    the candidates."""
    monkeypatch.setenv("NORMFL_CACHE", str(tmp_path))
    shape = (1, 28, 28)
    uneven = batches(1, 8, shape) + batches(1, 5, shape, seed=1)
    mlp = ClientEngine(flat_model(models.mlp, shape, hidden=[16]))
    assert choose_backend(mlp, mlp.flat.vector(), uneven, "k") in ("sequential", "analytic", "stacked")
    assert list(json.loads((tmp_path / "backend.json").read_text())) == ["k|sequential,analytic,stacked"]
    resnet = ClientEngine(flat_model(models.resnet20, shape))
    assert choose_backend(resnet, resnet.flat.vector(), uneven, "r") == "sequential"          # nothing to time
    assert "r|sequential" not in json.loads((tmp_path / "backend.json").read_text())


def test_batchnorm_running_stats_are_client_ordered_ema():
    """After one round the running mean equals the EMA over the clients' batch means, in order."""
    flat = flat_model(models.resnet20)
    data = batches(4, 16)
    ClientEngine(flat, "vmap").grads(flat.vector(), data)
    r = torch.zeros(16)
    for (xb, _, _) in (d[0] for d in data):          # first BN sees conv1(x) batch statistics
        with torch.no_grad():
            mu = flat.module.conv1(xb).mean((0, 2, 3))
        r = 0.9 * r + 0.1 * mu
    torch.testing.assert_close(flat.module.bn1.running_mean, r, rtol=1e-4, atol=1e-6)
    assert flat.module.bn1.num_batches_tracked.item() == 4


def test_fold_running_stats_identity_for_one_client():
    flat = flat_model(models.resnet20)
    start = flat.buffers()
    copies = {k: (v + 1).unsqueeze(0) for k, v in start.items()}
    fold_running_stats(flat.module, copies, 1)
    torch.testing.assert_close(flat.module.bn1.running_mean, start["bn1.running_mean"] + 1)
    assert flat.module.bn1.num_batches_tracked.item() == start["bn1.num_batches_tracked"].item() + 1


@pytest.mark.parametrize("runs", [1, 3])
def test_client_stats_fold_every_layer_at_once_as_the_rule_does_layer_by_layer(runs):
    """``ClientStats`` packs a module's running statistics by width (the module's buffers become views of the
    packed rows, once per module) and folds all layers, of one module or of R side by side, in a few tensor
    operations: bit for bit what ``fold_running_stats`` gives layer by layer, each module its own clients."""
    from normfl.engine.batchnorm import ClientStats, packed

    n = 4
    flats = [flat_model(models.resnet20) for _ in range(runs)]
    gen = torch.Generator().manual_seed(0)
    for flat in flats:                                   # distinct statistics per module
        for b in flat.module.buffers():
            if b.is_floating_point():
                b.copy_(torch.rand(b.shape, generator=gen) + 0.5)
    refs = [flat_model(models.resnet20) for _ in range(runs)]
    for ref, flat in zip(refs, flats, strict=True):
        ref.set_buffers(flat.buffers())
    stats = ClientStats([f.module for f in flats], n)
    assert packed(flats[0].module) is stats.packs[0]     # one packing per module, its buffers views of it
    assert flats[0].module.bn1.running_mean.data_ptr() == stats.packs[0].rows[16][0].data_ptr()
    copies = stats.fill()
    for r, ref in enumerate(refs):
        for key, c in copies.items():
            assert torch.equal(c[r * n:(r + 1) * n], ref.buffers()[key].expand(n, -1))
    for c in copies.values():                            # each client's update of its copies
        c.mul_(0.9).add_(torch.rand(c.shape, generator=gen), alpha=0.1)
    stats.fold()
    for r, (ref, flat) in enumerate(zip(refs, flats, strict=True)):
        fold_running_stats(ref.module, {k: v[r * n:(r + 1) * n] for k, v in copies.items()}, n)
        for key, want in ref.buffers().items():
            assert torch.equal(flat.buffers()[key], want), key
    flats[0].module.bn1.running_mean = torch.zeros(16)   # a buffer set anew: packed again
    assert packed(flats[0].module) is not stats.packs[0]


def test_flat_vector_roundtrip():
    flat = flat_model(models.cnn, in_shape=(1, 28, 28))
    x = torch.randn(flat.dim)
    flat.load(x)
    torch.testing.assert_close(flat.vector(), x)
    assert flat.dim == 582_026
    params = flat.as_params(torch.stack([x, 2 * x]))
    assert params["0.weight"].shape == (2, 32, 1, 5, 5)


@pytest.mark.parametrize("builder, in_shape", [(models.cnn, (1, 28, 28)), (models.resnet20, (3, 32, 32))])
def test_bf16_autocast_gradients_are_close_and_stay_fp32(builder, in_shape):
    """precision=bf16 runs the forward/backward under bf16 autocast; what comes out is fp32 and close to
    the fp32 gradients (bf16 keeps 8 mantissa bits, 0.4% per value; layers compound it to a few %)."""
    xb = torch.randn(16, *in_shape, generator=torch.Generator().manual_seed(0))
    yb = torch.randint(0, 10, (16,), generator=torch.Generator().manual_seed(1))
    grads = {}
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        flat = FlatModel(builder(in_shape, 10), CPU, precision)
        G, loss = ClientEngine(flat, "sequential").grads(flat.vector(), [[(xb, yb, 1.0)]])
        assert G.dtype == torch.float32 and loss.dtype == torch.float32
        grads[precision] = G[0]
    rel = torch.linalg.vector_norm(grads["bf16"] - grads["fp32"]) / torch.linalg.vector_norm(grads["fp32"])
    assert 0 < rel.item() < 0.15
