"""The clients' batch streams (``ClientData``): seeded, reshuffled each pass, made on first use, shared by runs
that draw alike; the full oracle's exact gradient over a shard; Poisson batches at their rate, drawn through the one
sampling rule and padded to one capacity a run; a step's batches gathered and augmented on the device as each
client's alone."""

import math

import numpy as np
import pytest
import torch

from normfl import models
from normfl.data import ClientData, Preprocess
from normfl.data.clients import Batches
from normfl.engine import ClientEngine
from tests.helpers import CPU, flat_model


def test_full_oracle_is_exact_mean_gradient_over_shard():
    torch.manual_seed(0)
    x_all = torch.randint(0, 256, (50, 1, 4, 4), dtype=torch.uint8)
    y_all = torch.randint(0, 10, (50,))
    parts = [np.arange(0, 23), np.arange(23, 50)]
    prep = Preprocess((0.5,), (0.25,), CPU)
    data = ClientData(x_all, y_all, parts, batch_size=8, seed=0, prep=prep, augment=False,
                      oracle="full", chunk=10)
    flat = flat_model(models.logreg, in_shape=(1, 4, 4))
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


def test_full_oracle_with_unequal_shards():
    """Clients whose shards split into different numbers of chunks still get their exact gradient."""
    torch.manual_seed(1)
    x_all = torch.randint(0, 256, (40, 1, 4, 4), dtype=torch.uint8)
    y_all = torch.randint(0, 10, (40,))
    parts = [np.arange(0, 7), np.arange(7, 40)]              # 1 chunk vs 4 chunks of 10
    prep = Preprocess((0.5,), (0.25,), CPU)
    data = ClientData(x_all, y_all, parts, 8, 0, prep, augment=False, oracle="full", chunk=10)
    flat = flat_model(models.logreg, in_shape=(1, 4, 4))
    G, _ = ClientEngine(flat, "sequential").grads(flat.vector(), data.next_batches())
    for i, p in enumerate(parts):
        flat.module.zero_grad()
        torch.nn.functional.cross_entropy(flat.module(prep(x_all[p])), y_all[p]).backward()
        torch.testing.assert_close(G[i], torch.cat([q.grad.reshape(-1) for q in flat.module.parameters()]))


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


@pytest.mark.slow
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
    engine = ClientEngine(flat_model(models.cnn, (1, 28, 28)), "stacked")
    X = engine.flat.vector().expand(2, -1)
    pieces = d.poisson_batches(0.01)
    padded, loss_p = engine.clipped_sums(X, pieces, 0.5, cap)
    tight, loss_t = engine.clipped_sums(X, pieces, 0.5)
    torch.testing.assert_close(padded, tight, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(loss_p, loss_t, rtol=1e-6, atol=0)
