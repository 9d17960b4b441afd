"""Partitioners: exact cover, seeding, heterogeneity and errors."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from normfl.data import dirichlet, iid, label_histogram, natural, sampled_shards, shards
from normfl.run import build_data
from tests.helpers import composed


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
    "dirichlet_capped": lambda y, k, s: dirichlet(y, k, s, alpha=0.5, capped=True),
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


# ------------------------------------------------------------------------------------- pinned partitions
# The committed records (outputs/records) were made with these partitions: a change to a partitioner's draws,
# their order, its cuts or its sort changes which samples each client holds, and every record with it.

def digest(parts: list[np.ndarray]) -> str:
    """sha256 of a partition exactly: the number of clients, then each client's size and indices, in order."""
    h = hashlib.sha256(np.int64(len(parts)).tobytes())
    for p in parts:
        h.update(np.int64(len(p)).tobytes())
        h.update(np.asarray(p, dtype="<i8").tobytes())
    return h.hexdigest()


Y = np.random.default_rng(2024).permutation(np.arange(603) % 10)       # 60 or 61 of each class, shuffled
Y100 = np.random.default_rng(5).permutation(np.repeat(np.arange(10), 10))   # capped: N/n = 20 samples, whole
IDS = np.random.default_rng(7).integers(0, 9, 603)                       # natural: 9 client ids, unsorted
PINNED = {  # name: (partition, sha256 of it, its sizes, client 0's first 4 indices, the last client's last 3)
    "iid": (lambda: iid(Y, 7, seed=3), "f108842aa1dd54378b3a385da38619a9e02a0dc5f4bcb706e5875b6cc32e4595",
            [87] + [86] * 6, [238, 125, 58, 488], [569, 54, 261]),
    "shards": (lambda: shards(Y, 10, seed=3, shards_per_client=3),      # 30 shards of 20, the last 3 of 21
               "05bfdcf4f48f9b048334c43477228cb8b7449dc5f079d7bd33ccb0c4edf06338",
               [60, 61, 61, 60, 60, 60, 61, 60, 60, 60], [371, 378, 381, 385], [100, 123, 128]),
    "dirichlet": (lambda: dirichlet(Y, 7, seed=3, alpha=0.5),
                  "9d331b47fadbb9240571e8bb9b4f456d0e14261a1ee7893a47da27a30c802a85",
                  [52, 105, 60, 134, 49, 118, 85], [193, 15, 49, 502], [203, 252, 147]),
    "dirichlet_redrawn": (lambda: dirichlet(Y, 7, seed=3, alpha=0.1, min_size=30),   # the first draw is refused
                          "5077a61b36f453076712290cb18f7eb4514f99882b1b6f766ff2d2e5d5f1569f",
                          [54, 44, 62, 49, 64, 191, 139], [592, 112, 581, 193], [333, 123, 280]),
    "dirichlet_capped": (lambda: dirichlet(Y, 7, seed=3, alpha=0.5, capped=True),
                         "1709480a285befc6a0b1dfb24de7b12634a4d58e042ce9b752fb6e1cdc466f58",
                         [53, 111, 76, 103, 63, 95, 102], [193, 15, 49, 502], [203, 252, 147]),
    "dirichlet_capped_full": (lambda: dirichlet(Y100, 5, seed=1, alpha=0.1, capped=True),   # client 0 fills up
                              "4f528b08a30a5a86450ac1a50dd457ae26920c9581b0ecc8add5b7bc7ccb1f2c",
                              [20, 26, 19, 15, 20], [85, 47, 82, 3], [2, 84, 21]),
    "sampled_shards": (lambda: sampled_shards(Y, 40, seed=3, shards_per_client=2, shard_size=30),
                       "7a1b5fa0f78d44e1345c2ee302ee501d4e357a5633b5de181482fd24f2f76eca",
                       [60] * 40, [42, 47, 48, 52], [363, 374, 389]),
    "natural": (lambda: natural(IDS), "3d3919e5a3ba8344f2163a2a98a01b2eac13b32b8b60b6b18f972fa27316138e",
                [60, 71, 62, 58, 62, 79, 66, 77, 68], [8, 13, 47, 49], [579, 591, 593]),
}


@pytest.mark.parametrize("name", PINNED)
def test_each_partitioner_gives_the_partition_the_records_were_made_with(name):
    """A partitioner that draws differently (another seed, another order of its rng calls, a class split without
    its shuffle), cuts differently (rounding of the cut points, where a shard's remainder goes) or sorts
    differently (shards without the stable sort) gives other clients than the committed records had: the exact
    output for fixed labels and seed, client order and each client's order included, is pinned by its sha256."""
    make, sha, sizes, first, last = PINNED[name]
    parts = make()
    assert all(p.dtype == np.int64 for p in parts)
    assert [len(p) for p in parts] == sizes
    assert parts[0][:4].tolist() == first and parts[-1][-3:].tolist() == last
    assert digest(parts) == sha


def test_capped_dirichlet_gives_a_full_client_none_of_the_later_classes():
    """The ALI-DPFL authors' cap: a client already holding N/num_clients samples when a class is dealt gets none
    of it (classes dealt in ascending order), but for one sample when the cut points' cumulative sum of shares
    rounds below 1 (as in the authors' code). A cap compared with <= (a full client keeps taking), or not
    applied, gives a full client more; the seeds include splits where a client holds exactly N/num_clients."""
    reached = 0
    for y, k, alpha in ((Y100, 5, 0.1), (Y, 7, 0.5)):
        for seed in range(8):
            counts = np.stack([np.bincount(y[p], minlength=10) for p in dirichlet(y, k, seed, alpha, capped=True)])
            before = np.cumsum(counts, axis=1) - counts                 # what each client held as each class came
            assert not ((counts > 1) & (before >= len(y) / k)).any(), (seed, counts)
            reached += int((before == len(y) / k).any())
    assert reached >= 1


def test_dirichlet_redraws_from_the_same_stream():
    """The pinned redrawn split is a redraw: its first draw leaves a client under min_size, and the next draws
    continue the seed's stream (a redraw that reseeds would repeat the refused draw forever)."""
    with pytest.raises(ValueError, match="max_tries"):
        dirichlet(Y, 7, seed=3, alpha=0.1, min_size=30, max_tries=1)
    assert_cover(PINNED["dirichlet_redrawn"][0](), len(Y))


REAL = {  # partition: (sha256, sizes, client 0's first 4 indices) of the run's partition of the real data
    "dirichlet": ("3ee53d8777183b5b5d33d7c1587b25d7285003e2548e420fcfc8e229245b177a",
                  [184, 212, 218, 209, 150, 157, 233, 201, 167, 269], [1525, 182, 202, 1815]),
    "iid": ("922cd6e91edda8153cb10463d81fda3c138a9028f4483c0154f21e596e4fce2b", [200] * 10, [1631, 285, 1268, 747]),
}


@pytest.mark.parametrize("partition", REAL)
def test_a_run_partitions_the_real_data_as_the_records_were_partitioned(partition, data_root, offline_dir):
    """The partition a run builds (config, data builder) on the first 2,000 Fashion-MNIST training samples, ten
    clients, seed 42: pinned, so a run that hands the partitioner other labels (the test set's, the unlimited
    set's), another seed (algo_seed, a derived one) or another number of clients gets caught, not only a change
    inside the partitioner. It is the partitioner called on the run's training labels with the run's seed."""
    cfg = composed("dataset=fashion_mnist", "dataset.train_limit=2000", "dataset.download=false",
                   f"partition={partition}", f"data_root={data_root}", f"offline_data={offline_dir}")
    assert (cfg.seed, cfg.clients) == (42, 10)
    sha, sizes, first = REAL[partition]
    ds, parts = build_data(cfg)
    y = ds.y_train.numpy()
    assert len(y) == 2000 and y[:10].tolist() == [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]
    assert [len(p) for p in parts] == sizes and parts[0][:4].tolist() == first
    assert digest(parts) == sha
    direct = dirichlet(y, 10, 42, alpha=0.5) if partition == "dirichlet" else iid(y, 10, 42)
    assert same(parts, direct)


# ----------------------------------------------------------------------------------- shuffled class splits
def ordered_blocks(parts: list[np.ndarray], labels: np.ndarray) -> tuple[float, float, int]:
    """Over the (client, class) cells holding at least 4 samples: the fraction whose indices come out in
    ascending order, and, of those holding at most half of their class, the fraction whose indices are
    consecutive in the class's index order (a contiguous block of it), with the number of cells.

    A shuffled split puts a cell of m samples in ascending order with probability 1/m! <= 1/24, and makes a
    block of consecutive class positions with probability (N - m + 1)/C(N, m) (under 1e-4 here); an unshuffled
    split (a class's ``flatnonzero`` cut into pieces, or pieces sorted) makes every cell sorted and a block."""
    sorted_, blocks, cells = [], [], 0
    for p in parts:
        for c in np.unique(labels[p]):
            mine = p[labels[p] == c]
            if len(mine) < 4:
                continue
            cells += 1
            sorted_.append(bool(np.all(np.diff(mine) > 0)))
            rank = np.searchsorted(np.flatnonzero(labels == c), np.sort(mine))
            if len(mine) <= (labels == c).sum() / 2:
                blocks.append(bool(rank[-1] - rank[0] == len(mine) - 1))
    return float(np.mean(sorted_)), float(np.mean(blocks)), cells


@pytest.mark.parametrize("name", ["iid", "dirichlet", "dirichlet_capped"])
def test_clients_hold_shuffled_samples_of_each_class_not_ordered_blocks(name):
    """A split that forgets to shuffle (iid cutting arange, dirichlet cutting each class's indices in index
    order, or any that sorts the pieces) gives every client runs of each class in index order: contiguous
    in the data and ascending. Over five seeds at most 15% of the cells may come out ascending (a shuffle
    gives at most 1/24 on average) and at most 5% as contiguous blocks of their class."""
    y = np.random.default_rng(11).permutation(np.arange(1000) % 10)
    call = {"iid": lambda s: iid(y, 8, s), "dirichlet": lambda s: dirichlet(y, 8, s, alpha=0.5),
            "dirichlet_capped": lambda s: dirichlet(y, 8, s, alpha=0.5, capped=True)}[name]
    sorted_frac, block_frac, cells = ordered_blocks([p for seed in range(5) for p in call(seed)], y)
    assert cells >= 100
    assert sorted_frac <= 0.15 and block_frac <= 0.05, (sorted_frac, block_frac)
    assert ordered_blocks([np.sort(p) for p in call(0)], y)[0] == 1.0      # the statistic sees sorted pieces


def test_sampled_shards_seed_gives_its_own_clients():
    """sampled_shards ignoring its seed (or reading a fixed one) would give every seed the same clients."""
    def call(seed):
        return sampled_shards(Y, 40, seed, shards_per_client=2, shard_size=30)
    assert same(call(3), call(3)) and not same(call(3), call(4))
    assert all(p.min() >= 0 and p.max() < len(Y) for p in call(4))
