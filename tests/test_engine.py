"""The client backends agree, BatchNorm running statistics follow the documented rule, DP-SGD's clipping
matches a per-sample loop, and the clients' batch streams are seeded."""

import json
import math

import numpy as np
import pytest
import torch

from normfl import models
from normfl.data import ClientData, Preprocess
from normfl.data.clients import Batches
from normfl.engine import ClientEngine, FlatModel, choose_backend, clipping, fold_running_stats
from normfl.engine import clients as clients_module

CPU = torch.device("cpu")


@pytest.fixture
def float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def make(builder, in_shape=(3, 32, 32), layout="contiguous", **kw):
    torch.manual_seed(0)
    return FlatModel(builder(in_shape, 10, **kw), CPU, layout=layout)


def batches(n, b, in_shape=(3, 32, 32), seed=0):
    g = torch.Generator().manual_seed(seed)
    return [[(torch.randn(b, *in_shape, generator=g), torch.randint(0, 10, (b,), generator=g), 1.0)]
            for _ in range(n)]


MODELS = [(models.resnet20, {}, (3, 32, 32)), (models.resnet20, {"norm": "group"}, (3, 32, 32)),
          (models.cnn, {}, (1, 28, 28)), (models.mlp, {"hidden": [32, 16]}, (1, 28, 28)),
          (models.logreg, {}, (1, 28, 28))]


@pytest.mark.parametrize("backend", ["vmap", "stacked"])
@pytest.mark.parametrize("builder, kw, in_shape", MODELS)
def test_side_by_side_backends_agree_with_sequential(backend, builder, kw, in_shape, float64):
    """Same gradients, losses and running statistics, in float64 so that only real differences show
    (in float32 a near-constant BatchNorm channel can amplify summation-order noise to ~1e-3)."""
    data = batches(3, 8, in_shape)
    ref, vec = make(builder, in_shape, **kw), make(builder, in_shape, **kw)
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


@pytest.mark.parametrize("backend", ["sequential", "vmap", "stacked"])
@pytest.mark.parametrize("builder, kw, in_shape", MODELS[:3])
def test_channels_last_lays_out_the_activations_and_keeps_the_gradients(backend, builder, kw, in_shape, float64):
    """memory_format=channels_last: every activation a convolution made is stored channels-last (what the
    normalisation and pooling layers get; vmap stays plain, which it cannot relayout), and the gradients,
    losses and running statistics are those of the plain layout."""
    data = batches(3, 8, in_shape)
    plain, nhwc = make(builder, in_shape, **kw), make(builder, in_shape, layout="channels_last", **kw)
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
    flat = make(builder, in_shape, **kw)
    X = flat.vector() + 0.01 * torch.randn(3, flat.dim, generator=g)
    engine = ClientEngine(flat, "stacked")
    assert engine.stacked.takes(piece)
    G1, l1 = ClientEngine(flat, "sequential").grads(X, [[p] for p in piece])
    G2, l2 = engine.grads(X, [[p] for p in piece])
    torch.testing.assert_close(G2, G1, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(l2, l1, rtol=1e-9, atol=1e-11)
    assert not ClientEngine(make(models.resnet20), "stacked").stacked.takes(piece)     # BatchNorm: not padded


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
    flat = make(builder, in_shape, **kw)
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
    assert ClientEngine(make(models.cnn, (1, 28, 28))).backends() == ("sequential", "vmap", "stacked")
    no_flatten = FlatModel(torch.nn.Sequential(torch.nn.Linear(5, 3)), CPU)     # Linear on 3-D inputs differs
    assert ClientEngine(no_flatten, in_shape=(4, 5)).backends() == ("sequential", "vmap")
    with pytest.raises(ValueError, match="analytic"):
        ClientEngine(make(models.resnet20), "analytic")


def test_auto_times_only_the_backends_that_apply(tmp_path, monkeypatch):
    """auto times the backends that apply to the model and batches (vmap needs equal batches, and so does
    stacked with BatchNorm; analytic a Linear/ReLU stack) and remembers the winner under a key that names
    the candidates."""
    monkeypatch.setenv("NORMFL_CACHE", str(tmp_path))
    shape = (1, 28, 28)
    uneven = batches(1, 8, shape) + batches(1, 5, shape, seed=1)
    mlp = ClientEngine(make(models.mlp, shape, hidden=[16]))
    assert choose_backend(mlp, mlp.flat.vector(), uneven, "k") in ("sequential", "analytic", "stacked")
    assert list(json.loads((tmp_path / "backend.json").read_text())) == ["k|sequential,analytic,stacked"]
    resnet = ClientEngine(make(models.resnet20, shape))
    assert choose_backend(resnet, resnet.flat.vector(), uneven, "r") == "sequential"          # nothing to time
    assert "r|sequential" not in json.loads((tmp_path / "backend.json").read_text())


def test_batchnorm_running_stats_are_client_ordered_ema():
    """After one round the running mean equals the EMA over the clients' batch means, in order."""
    flat = make(models.resnet20)
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
    flat = make(models.resnet20)
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
    flats = [make(models.resnet20) for _ in range(runs)]
    gen = torch.Generator().manual_seed(0)
    for flat in flats:                                   # distinct statistics per module
        for b in flat.module.buffers():
            if b.is_floating_point():
                b.copy_(torch.rand(b.shape, generator=gen) + 0.5)
    refs = [make(models.resnet20) for _ in range(runs)]
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


def test_full_oracle_is_exact_mean_gradient_over_shard():
    torch.manual_seed(0)
    x_all = torch.randint(0, 256, (50, 1, 4, 4), dtype=torch.uint8)
    y_all = torch.randint(0, 10, (50,))
    parts = [np.arange(0, 23), np.arange(23, 50)]
    prep = Preprocess((0.5,), (0.25,), CPU)
    data = ClientData(x_all, y_all, parts, batch_size=8, seed=0, prep=prep, augment=False,
                      oracle="full", chunk=10)
    flat = make(models.logreg, in_shape=(1, 4, 4))
    G, loss = ClientEngine(flat, "sequential").grads(flat.vector(), data.next_batches())
    for i, p in enumerate(parts):
        flat.module.zero_grad()
        ll = torch.nn.functional.cross_entropy(flat.module(prep(x_all[p])), y_all[p])
        ll.backward()
        expect = torch.cat([q.grad.reshape(-1) for q in flat.module.parameters()])
        torch.testing.assert_close(G[i], expect, rtol=1e-5, atol=1e-6)
        assert loss[i].item() == pytest.approx(ll.item(), rel=1e-5)


def test_minibatch_stream_reshuffles_per_pass_and_is_seeded():
    x_all = torch.arange(20, dtype=torch.float32).reshape(20, 1, 1, 1)
    parts = [np.arange(0, 10), np.arange(10, 20)]
    prep = Preprocess((), (), CPU)

    def stream(seed):
        d = ClientData(x_all, torch.zeros(20, dtype=torch.long), parts, 3, seed, prep, augment=False)
        return [[b[0][0].flatten().tolist() for b in d.next_batches()] for _ in range(6)]

    s = stream(0)
    assert s == stream(0) and s != stream(1)
    first_pass = sorted(v for r in s[:3] for v in r[0])
    assert len(set(first_pass)) == 9 and set(first_pass) <= set(range(10))   # no repeats within a pass
    assert all(set(r[1]) <= set(range(10, 20)) for r in s)                 # clients keep to their shards


def test_data_draws_as_another_where_its_next_batches_are_the_others():
    """``draws_as``, which lets runs side by side share their batch streams: yes where the samples, shards,
    batch size, seed and augmentation are the same and the streams stand at the same place, whatever was asked
    of them; no when any of these differs. ``peek`` leaves the streams' dict in place (runs may share it)."""
    x_all = torch.randint(0, 256, (40, 3, 8, 8), dtype=torch.uint8)
    y_all, parts = torch.zeros(40, dtype=torch.long), [np.arange(0, 20), np.arange(20, 40)]
    prep = Preprocess((0.5,) * 3, (0.25,) * 3, CPU)
    shared = Batches(x_all, y_all, prep)

    def data(seed=0, batch=3, augment=True, batches=shared):
        return ClientData(x_all, y_all, parts, batch, seed, prep, augment, batches=batches)

    a, b = data(), data()
    assert b.draws_as(a)
    for ids in (None, [1], [0, 1], [1]):
        a.next_batches(ids)
        assert not b.draws_as(a)
        b.next_batches(ids)
        assert b.draws_as(a) and a.draws_as(b)
    streams = a.streams
    for (xa, ya, _), (xb, yb, _) in zip((p[0] for p in a.peek()), (p[0] for p in b.peek()), strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert a.streams is streams and b.draws_as(a)
    for other in (data(seed=1), data(batch=4), data(augment=False), data(batches=Batches(x_all, y_all, prep))):
        assert not other.draws_as(data())


def test_a_shard_smaller_than_a_batch_is_its_own_batch_and_said():
    x_all = torch.arange(20, dtype=torch.float32).reshape(20, 1, 1, 1)
    parts, prep = [np.arange(0, 4), np.arange(4, 20)], Preprocess((), (), CPU)
    d = ClientData(x_all, torch.zeros(20, dtype=torch.long), parts, 6, 0, prep, augment=False)
    assert [len(b[0][0]) for b in d.next_batches()] == [4, 6]
    assert d.short_shards(6) == ("batch_size=6: 1 of 2 clients hold fewer samples (the smallest 4); each such "
                                 "client's minibatch is its whole shard")
    assert d.short_shards(4) is None
    full = ClientData(x_all, torch.zeros(20, dtype=torch.long), parts, 6, 0, prep, augment=False, oracle="full")
    assert full.short_shards(6) is None                                   # the full oracle reads no batch size


def test_flat_vector_roundtrip():
    flat = make(models.cnn, in_shape=(1, 28, 28))
    x = torch.randn(flat.dim)
    flat.load(x)
    torch.testing.assert_close(flat.vector(), x)
    assert flat.dim == 582_026
    params = flat.as_params(torch.stack([x, 2 * x]))
    assert params["0.weight"].shape == (2, 32, 1, 5, 5)


def test_full_oracle_with_unequal_shards():
    """Clients whose shards split into different numbers of chunks still get their exact gradient."""
    torch.manual_seed(1)
    x_all = torch.randint(0, 256, (40, 1, 4, 4), dtype=torch.uint8)
    y_all = torch.randint(0, 10, (40,))
    parts = [np.arange(0, 7), np.arange(7, 40)]              # 1 chunk vs 4 chunks of 10
    prep = Preprocess((0.5,), (0.25,), CPU)
    data = ClientData(x_all, y_all, parts, 8, 0, prep, augment=False, oracle="full", chunk=10)
    flat = make(models.logreg, in_shape=(1, 4, 4))
    G, _ = ClientEngine(flat, "sequential").grads(flat.vector(), data.next_batches())
    for i, p in enumerate(parts):
        flat.module.zero_grad()
        torch.nn.functional.cross_entropy(flat.module(prep(x_all[p])), y_all[p]).backward()
        torch.testing.assert_close(G[i], torch.cat([q.grad.reshape(-1) for q in flat.module.parameters()]))


def test_clip_factors_survive_float32_overflow():
    """Squared norms come from one float32 pass on the CPU; a row whose sum of squares overflows float32 (here
    1e30²) is redone in float64, so it is clipped, not dropped as an infinite norm would be.
    A norm too small for float32 squares (1e-30) reads as 0: its sample is left unclipped, as the exact norm
    leaves it."""
    t = torch.tensor([[3.0, 4.0, 0.0], [1e30, -1e30, 2.0], [1e-30, 0.0, 0.0]])
    sq = clipping.sq_norms(t)
    exact = t.double().pow(2).sum(1)
    assert sq.dtype == torch.float64
    torch.testing.assert_close(sq[:2], exact[:2], rtol=1e-6, atol=0)
    for clip in (1e-3, 1.0, 10.0):
        got, want = clipping.clip_factors(sq, clip), clipping.clip_factors(exact, clip)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
        assert got[1] > 0


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("path", ["layer norms", "vmap", "stacked"])
def test_clipped_per_sample_sums_match_a_naive_loop(path, layout, monkeypatch):
    """DP-SGD's per-sample clipping (from layer norms, vmap over samples, or every client in one stacked
    pass) against one backward pass per sample, in either memory format."""
    if path == "vmap":
        monkeypatch.setattr(clients_module, "norm_layers", lambda module: None)
    torch.manual_seed(2)
    x_all = torch.randint(0, 256, (60, 1, 28, 28), dtype=torch.uint8)
    y_all = torch.randint(0, 10, (60,))
    parts = [np.arange(0, 30), np.arange(30, 60)]
    prep = Preprocess((0.5,), (0.5,), CPU)
    data = ClientData(x_all, y_all, parts, 8, 0, prep, augment=False)
    flat = make(models.cnn, in_shape=(1, 28, 28), layout=layout)
    engine = ClientEngine(flat, "stacked" if path == "stacked" else "sequential")
    X = torch.stack([flat.vector(), flat.vector() + 0.01 * torch.randn(flat.dim)])   # one point per client
    batches = data.poisson_batches(0.3)
    grads, mean_losses = [], []                       # each sample's own gradient, from its own backward pass
    for i, (xb, yb, _) in enumerate(batches):
        flat.load(X[i])
        gs, ls = [], []
        for s in range(len(yb)):
            flat.module.zero_grad()
            loss = torch.nn.functional.cross_entropy(flat.module(xb[s:s + 1]), yb[s:s + 1])
            loss.backward()
            gs.append(torch.cat([q.grad.reshape(-1) for q in flat.module.parameters()]))
            ls.append(loss.item())
        grads.append(torch.stack(gs))
        mean_losses.append(np.mean(ls))
    norms = torch.cat([g.norm(dim=1) for g in grads])
    clip = norms.median().item()                      # half the samples clipped, half not: both cases checked
    assert (norms > 1.01 * clip).sum() >= 3 and (norms < 0.99 * clip).sum() >= 3
    sums, losses = engine.clipped_sums(X, batches, clip)
    for i, g in enumerate(grads):
        clipped = g / (g.norm(dim=1, keepdim=True) / clip).clamp_min(1.0)
        torch.testing.assert_close(sums[i], clipped.sum(0), rtol=1e-4, atol=1e-6)
        assert losses[i].item() == pytest.approx(mean_losses[i], rel=1e-5)
    assert {len(b[1]) for b in batches} != {30} and all(0 < len(b[1]) < 30 for b in batches)   # Poisson sizes
    empty = (batches[0][0][:0], batches[0][1][:0], 1.0)                   # a client whose Poisson batch is empty
    more, more_losses = engine.clipped_sums(torch.cat([X, X[:1]]), [*batches, empty], clip)
    torch.testing.assert_close(more[:2], sums, rtol=1e-5, atol=1e-7)
    assert not more[2].any() and more_losses[2] == 0


@pytest.mark.parametrize("backend", ["sequential", "stacked"])
def test_clipped_per_sample_sums_ignore_bf16(backend):
    """precision=bf16 leaves DP-SGD's per-sample clipping in fp32 (its norms decide the clip factors): the
    stacked pass ran it under autocast, where the data (fp32) met its first layer's bf16 gradient and failed."""
    torch.manual_seed(2)
    x_all, y_all = torch.randint(0, 256, (40, 1, 28, 28), dtype=torch.uint8), torch.randint(0, 10, (40,))
    data = ClientData(x_all, y_all, [np.arange(0, 20), np.arange(20, 40)], 8, 0,
                      Preprocess((0.5,), (0.5,), CPU), augment=False)
    batches = data.poisson_batches(0.5)
    sums = {}
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        flat = FlatModel(models.cnn((1, 28, 28), 10), CPU, precision)
        sums[precision], _ = ClientEngine(flat, backend).clipped_sums(torch.stack([flat.vector()] * 2), batches, 0.1)
    assert sums["bf16"].dtype == torch.float32 and torch.equal(sums["bf16"], sums["fp32"])


def test_poisson_sampling_rate_and_seeding():
    y = torch.zeros(4000, dtype=torch.long)
    x = torch.zeros(4000, 1, 1, 1, dtype=torch.uint8)
    prep = Preprocess((0.0,), (1.0,), CPU)

    def sizes(seed):
        d = ClientData(x, y, [np.arange(0, 2000), np.arange(2000, 4000)], 8, seed, prep, augment=False)
        return [[len(b[1]) for b in d.poisson_batches(0.015)] for _ in range(200)]

    s = np.array(sizes(0))
    assert sizes(0) == s.tolist() and sizes(1) != s.tolist()
    assert abs(s.mean() - 30) < 4 * math.sqrt(30 * 0.985 / s.size)                      # E = q |D_i| = 30


def test_poisson_batches_draw_through_the_one_sampling_rule(monkeypatch):
    """The shards are sampled by ``ops.poisson_sample``, the rule the audit's sample canaries share."""
    from normfl import ops
    d = ClientData(torch.zeros(40, 1, 1, 1, dtype=torch.uint8), torch.zeros(40, dtype=torch.long),
                   [np.arange(0, 20), np.arange(20, 40)], 8, 0, Preprocess((0.0,), (1.0,), CPU), augment=False)
    monkeypatch.setattr(ops, "poisson_sample", lambda rng, n, rate: np.arange(n) < 3)
    assert [len(b[1]) for b in d.poisson_batches(0.5)] == [3, 3]


def test_client_streams_are_made_on_first_use_and_peek_consumes_nothing():
    """A population of 50,000 clients costs only the clients that compute; the stream a client gets
    does not depend on who computed before it, and peek leaves every stream as it was."""
    x_all = torch.arange(100, dtype=torch.float32).reshape(100, 1, 1, 1)
    parts = [np.arange(i % 90, i % 90 + 10) for i in range(50_000)]
    prep = Preprocess((), (), CPU)
    d = ClientData(x_all, torch.zeros(100, dtype=torch.long), parts, 3, 0, prep, augment=False)
    assert d.streams == {} and d.uniform()
    ahead = d.peek([7, 49_999])
    assert d.streams == {}
    got = d.next_batches([7, 49_999])
    assert sorted(d.streams) == [7, 49_999]
    assert all(torch.equal(a[0][0], b[0][0]) for a, b in zip(ahead, got, strict=True))
    alone = ClientData(x_all, torch.zeros(100, dtype=torch.long), parts, 3, 0, prep, augment=False)
    assert torch.equal(alone.next_batches([49_999])[0][0][0], got[1][0][0])


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


def test_one_device_gather_a_step_equals_each_client_augmented_alone():
    """The batches of a step come from one table of host draws and one gather, crop, flip and normalisation
    of every client at once: the same values as cutting, augmenting (with the client's own generator) and
    normalising each client's batch alone, the way each client's stream defines them."""
    from normfl.data import augment_crop_flip, normalize

    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, 256, (60, 3, 8, 8), generator=g, dtype=torch.uint8)
    y = torch.randint(0, 10, (60,), generator=g)
    parts = [np.arange(0, 20), np.arange(20, 40), np.arange(40, 60)]
    mean, std = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)
    d = ClientData(x, y, parts, 5, 11, Preprocess(mean, std, CPU), augment=True)
    rngs = [np.random.default_rng([11, 1, i]) for i in range(3)]
    orders = [r.permutation(20) for r in rngs]
    gens = [torch.Generator().manual_seed(11 * 7919 + i) for i in range(3)]
    for step in range(5):                                   # past the end of a pass: a reshuffle
        got = d.next_batches()
        for i in range(3):
            if step == 4:
                orders[i] = rngs[i].permutation(20)
            idx = torch.as_tensor(parts[i][orders[i][(step % 4) * 5:(step % 4) * 5 + 5]])
            want = normalize(augment_crop_flip(x[idx], gens[i]), mean, std)
            assert torch.equal(got[i][0][0], want) and torch.equal(got[i][0][1], y[idx])
    assert d.batches.made == 5


def test_runs_that_share_data_and_seed_share_one_batch_a_step():
    """Two runs built on one prepared dataset (one ``Batches``) with one seed draw the same table each step,
    so the second gets the first one's batch instead of gathering and augmenting again; another seed does not."""
    from normfl.data.clients import Batches

    x = torch.randint(0, 256, (40, 3, 8, 8), dtype=torch.uint8)
    y = torch.zeros(40, dtype=torch.long)
    parts = [np.arange(0, 20), np.arange(20, 40)]
    shared = Batches(x, y, Preprocess((0.5,) * 3, (0.5,) * 3, CPU))
    runs = [ClientData(x, y, parts, 4, seed, shared.prep, augment=True, batches=shared) for seed in (0, 0, 1)]
    for _ in range(3):
        a, b, c = (r.next_batches() for r in runs)
        assert a[0][0][0].data_ptr() == b[0][0][0].data_ptr() and not torch.equal(a[0][0][0], c[0][0][0])
    assert shared.made == 6                                  # seed 0 once a step, seed 1 once a step


def test_poisson_batches_pad_to_a_capacity_fixed_for_the_run():
    """DP-SGD's stacked pass pads every client's Poisson batch to one capacity chosen once per rate (a
    Binomial(|D_i|, q) quantile at 1 - 1e-6), so passes keep one shape; a larger draw is padded to its own
    size, so the sampling stays exactly Poisson; padding changes no sum beyond float rounding."""
    from scipy.stats import binom

    from normfl.data.clients import POISSON_TAIL
    from normfl.engine.stacked import stack_inputs

    y = torch.zeros(4000, dtype=torch.long)
    x = torch.randn(4000, 1, 28, 28)
    d = ClientData(x, y, [np.arange(0, 1500), np.arange(1500, 4000)], 8, 0, Preprocess((), (), CPU), augment=False)
    cap = d.poisson_capacity(0.01)
    assert cap == binom.ppf(1 - POISSON_TAIL, 2500, 0.01) and 25 < cap < 60
    shapes = {stack_inputs(d.poisson_batches(0.01), cap)[0].shape for _ in range(20)}
    assert shapes == {(cap, 2, 28, 28)}
    big = [(x[:cap + 5], y[:cap + 5], 1.0), (x[:3], y[:3], 1.0)]
    xb, _, mask = stack_inputs(big, cap)
    assert len(xb) == cap + 5 and mask.sum(0).tolist() == [cap + 5, 3]
    engine = ClientEngine(make(models.cnn, (1, 28, 28)), "stacked")
    X = engine.flat.vector().expand(2, -1)
    pieces = d.poisson_batches(0.01)
    padded, loss_p = engine.clipped_sums(X, pieces, 0.5, cap)
    tight, loss_t = engine.clipped_sums(X, pieces, 0.5)
    torch.testing.assert_close(padded, tight, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(loss_p, loss_t, rtol=1e-6, atol=0)
