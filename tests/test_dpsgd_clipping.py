"""DP-SGD's per-sample clipping: its clip factors survive float32 overflow, its clipped sums (from layer norms,
vmap over samples, or one stacked pass, in either memory format) match a per-sample loop, and bf16 leaves it in
fp32."""

import numpy as np
import pytest
import torch

from normfl import models
from normfl.data import ClientData, Preprocess
from normfl.engine import ClientEngine, FlatModel, clipping
from normfl.engine import clients as clients_module
from tests.helpers import CPU, flat_model


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
    flat = flat_model(models.cnn, in_shape=(1, 28, 28), layout=layout)
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
