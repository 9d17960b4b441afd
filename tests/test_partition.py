"""Partitioners: exact cover, seeding, heterogeneity and errors."""

from __future__ import annotations

import numpy as np
import pytest

from normfl.data import dirichlet, iid, label_histogram, natural, sampled_shards, shards


def labels_for(n: int, classes: int = 10, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, classes, n)


def assert_cover(parts: list[np.ndarray], n: int) -> None:
    assert all(p.dtype == np.int64 for p in parts)
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(n))


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


PARTITIONERS = {
    "iid": lambda y, k, s: iid(y, k, s),
    "shards": lambda y, k, s: shards(y, k, s, shards_per_client=3),
    "dirichlet": lambda y, k, s: dirichlet(y, k, s, alpha=0.5),
}


@pytest.mark.parametrize("name", PARTITIONERS)
@pytest.mark.parametrize("n", [600, 997])
def test_exact_cover_and_seeding(name, n):
    part = PARTITIONERS[name]
    y = labels_for(n)
    for seed in (0, 1, 42):
        assert_cover(part(y, 7, seed), n)
    assert same(part(y, 7, 3), part(y, 7, 3))
    assert not same(part(y, 7, 3), part(y, 7, 4))


def test_iid_sizes_and_normec_layout():
    parts = iid(np.zeros(45000, int), 10, 42)
    assert [len(p) for p in parts] == [4500] * 10
    perm = np.random.default_rng(42).permutation(45000)
    assert np.array_equal(np.concatenate(parts), perm)  # contiguous pieces of one seeded shuffle
    sizes = [len(p) for p in iid(np.zeros(103, int), 10, 0)]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 103


def test_shards_are_single_class():
    y = np.repeat(np.arange(10), 60)  # 600 samples: 40 shards of 15, each within one class
    parts = shards(y, 20, seed=5, shards_per_client=2)
    assert_cover(parts, 600)
    assert all(len(p) == 30 for p in parts)
    assert all(len(np.unique(y[p])) <= 2 for p in parts)
    for p in parts:  # each client holds exactly 2 single-class runs of 15 samples
        runs = [y[p[:15]], y[p[15:]]]
        assert all(len(np.unique(r)) == 1 for r in runs)


def test_shards_uneven_remainder_goes_to_last_shards():
    y = labels_for(1003)
    parts = shards(y, 10, seed=0, shards_per_client=4, num_shards=40)
    assert_cover(parts, 1003)
    assert sorted(len(p) for p in parts)[-1] - sorted(len(p) for p in parts)[0] <= 4
    assert sum(len(p) for p in parts) == 1003


def test_shards_paper_configs():
    y = np.repeat(np.arange(10), 6000)  # FMNIST-sized: ALI (400 shards of 150), NFA (250 of 240)
    for k, spc, size in ((10, 40, 6000), (50, 5, 1200)):
        parts = shards(y, k, 0, shards_per_client=spc)
        assert [len(p) for p in parts] == [size] * k
        if spc == 5:
            assert max(len(np.unique(y[p])) for p in parts) <= 5


def test_dirichlet_skew_and_min_size():
    y = np.repeat(np.arange(10), 100)
    parts = dirichlet(y, 10, seed=0, alpha=0.05, min_size=5)
    assert_cover(parts, 1000)
    assert min(len(p) for p in parts) >= 5
    hist = label_histogram(parts, y, 10)
    dominant = hist.drop(columns="total").max(axis=1) / hist["total"]
    assert dominant.mean() > 0.6  # tiny alpha: most of each client is one class
    flat = label_histogram(dirichlet(y, 10, seed=0, alpha=1000.0), y, 10)
    assert (flat.drop(columns="total").max(axis=1) / flat["total"]).mean() < 0.25


def test_natural():
    ids = np.array([7, 3, 3, 7, 9, 3])
    parts = natural(ids)
    assert [p.tolist() for p in parts] == [[1, 2, 5], [0, 3], [4]]
    assert_cover(natural(ids, num_clients=3), 6)
    with pytest.raises(ValueError, match="num_clients"):
        natural(ids, num_clients=4)


def test_label_histogram():
    y = labels_for(500, classes=4)
    parts = iid(y, 6, 0)
    hist = label_histogram(parts, y, 4)
    assert hist.index.name == "client" and list(hist.index) == list(range(6))
    assert list(hist.columns) == [0, 1, 2, 3, "total"]
    assert hist["total"].tolist() == [len(p) for p in parts]
    assert hist.drop(columns="total").to_numpy().sum() == 500
    assert (hist.drop(columns="total").sum(axis=1) == hist["total"]).all()


@pytest.mark.parametrize(
    "call, param",
    [
        (lambda y: iid(y, 11, 0), "num_clients"),
        (lambda y: iid(y, 0, 0), "num_clients"),
        (lambda y: shards(y, 11, 0, shards_per_client=1), "num_clients"),
        (lambda y: shards(y, 5, 0, shards_per_client=0), "shards_per_client"),
        (lambda y: shards(y, 5, 0, shards_per_client=2, num_shards=12), "num_shards"),
        (lambda y: shards(y, 5, 0, shards_per_client=3), "num_shards"),
        (lambda y: dirichlet(y, 11, 0, alpha=1.0), "num_clients"),
        (lambda y: dirichlet(y, 5, 0, alpha=0.0), "alpha"),
        (lambda y: dirichlet(y, 5, 0, alpha=1.0, min_size=3), "min_size"),
        (lambda y: dirichlet(y, 5, 0, alpha=0.01, min_size=2, max_tries=1), "max_tries"),
        (lambda y: label_histogram([np.arange(10)], y, 2), "num_classes"),
    ],
)
def test_impossible_requests_name_the_parameter(call, param):
    y = np.arange(10) % 3
    with pytest.raises(ValueError, match=param):
        call(y)


def test_sampled_shards_allow_more_clients_than_samples():
    y = np.sort(labels_for(600))
    parts = sampled_shards(y, 5000, seed=3, shards_per_client=2, shard_size=30)
    assert len(parts) == 5000 and all(len(p) == 60 and p.dtype == np.int64 for p in parts)
    assert all(p.min() >= 0 and p.max() < 600 for p in parts)
    assert same(parts, sampled_shards(y, 5000, seed=3, shards_per_client=2, shard_size=30))
    assert np.mean([len(np.unique(y[p])) for p in parts]) <= 4     # two runs of a sorted order: few labels
    with pytest.raises(ValueError, match="shard_size"):
        sampled_shards(y, 10, seed=0, shard_size=601)
