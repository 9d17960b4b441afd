"""Partitions of a training set across clients.

Each partitioner returns one int64 array of train indices per client; every index is in exactly one
client, except with ``sampled_shards``, whose clients may share samples. Randomness comes only from
``numpy.random.default_rng(seed)``.
"""

from __future__ import annotations

import numpy as np


def _check_clients(num_clients: int, n: int) -> None:
    if not 1 <= num_clients <= n:
        raise ValueError(f"num_clients={num_clients} must be between 1 and the number of samples ({n})")


def iid(labels: np.ndarray, num_clients: int, seed: int) -> list[np.ndarray]:
    """Shuffle all indices, then cut into `num_clients` contiguous pieces (sizes differ by at most 1)."""
    n = len(labels)
    _check_clients(num_clients, n)
    perm = np.random.default_rng(seed).permutation(n).astype(np.int64)
    return list(np.array_split(perm, num_clients))


def shards(
    labels: np.ndarray, num_clients: int, seed: int, shards_per_client: int, num_shards: int | None = None
) -> list[np.ndarray]:
    """McMahan et al.: sort by label (stable), cut into equal shards, deal a random permutation of them.

    With n % num_shards = r, the last r shards take one extra sample each, so nothing is dropped.
    """
    labels = np.asarray(labels)
    n = len(labels)
    _check_clients(num_clients, n)
    if shards_per_client < 1:
        raise ValueError(f"shards_per_client={shards_per_client} must be >= 1")
    total = num_clients * shards_per_client
    num_shards = total if num_shards is None else num_shards
    if num_shards != total:
        raise ValueError(f"num_shards={num_shards} must equal num_clients * shards_per_client = {total}")
    if num_shards > n:
        raise ValueError(f"num_shards={num_shards} (num_clients * shards_per_client) exceeds the {n} samples")
    order = np.argsort(labels, kind="stable").astype(np.int64)
    base, extra = divmod(n, num_shards)
    sizes = np.full(num_shards, base)
    sizes[num_shards - extra :] += 1
    pieces = np.split(order, np.cumsum(sizes)[:-1])
    perm = np.random.default_rng(seed).permutation(num_shards)
    return [
        np.concatenate([pieces[s] for s in perm[k * shards_per_client : (k + 1) * shards_per_client]])
        for k in range(num_clients)
    ]


def dirichlet(
    labels: np.ndarray, num_clients: int, seed: int, alpha: float, min_size: int = 1, max_tries: int = 100,
    capped: bool = False,
) -> list[np.ndarray]:
    """Per class, split its shuffled indices by proportions ~ Dir(alpha).

    Redraws (up to `max_tries` times) until every client has at least `min_size` samples. With
    ``capped``, a client that already holds N/num_clients samples gets none of the later classes (the
    rule of the ALI-DPFL authors' split, XinpengLing/ALI-DPFL dataset/utils/dataset_utils.py line 108,
    which redraws until every client holds at least num_classes samples, lines 101-112).
    """
    labels = np.asarray(labels)
    n = len(labels)
    _check_clients(num_clients, n)
    if not alpha > 0:
        raise ValueError(f"alpha={alpha} must be > 0")
    if min_size * num_clients > n:
        raise ValueError(f"min_size={min_size} times num_clients={num_clients} exceeds the {n} samples")
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            share = rng.dirichlet(np.full(num_clients, alpha))
            if capped:
                share = share * (np.array([sum(map(len, part)) for part in parts]) < n / num_clients)
                share = share / share.sum()
            cuts = (np.cumsum(share) * len(idx)).astype(np.int64)[:-1]
            for k, piece in enumerate(np.split(idx, cuts)):
                parts[k].append(piece)
        out = [np.concatenate(p).astype(np.int64) for p in parts]
        if min(len(p) for p in out) >= min_size:
            return out
    raise ValueError(
        f"max_tries={max_tries} draws with alpha={alpha} never gave every client min_size={min_size} samples"
    )


def sampled_shards(labels: np.ndarray, num_clients: int, seed: int, shards_per_client: int = 2,
                   shard_size: int = 30) -> list[np.ndarray]:
    """For populations larger than the data (10^4-10^5 simulated clients): each client takes
    ``shards_per_client`` runs of ``shard_size`` consecutive samples of the label-sorted order, each
    starting at a uniformly random place (wrapping around). Clients are label-skewed as with
    ``shards``, but drawn independently, so they may share samples and their number is unbounded."""
    labels = np.asarray(labels)
    n = len(labels)
    if num_clients < 1 or shards_per_client < 1 or not 1 <= shard_size <= n:
        raise ValueError(f"num_clients={num_clients} and shards_per_client={shards_per_client} must be >= 1, "
                         f"shard_size={shard_size} in [1, {n}]")
    order = np.argsort(labels, kind="stable").astype(np.int64)
    starts = np.random.default_rng(seed).integers(0, n, size=(num_clients, shards_per_client))
    idx = order[(starts[:, :, None] + np.arange(shard_size)) % n]          # [clients, shards, shard_size]
    return list(idx.reshape(num_clients, -1))


def natural(client_ids: np.ndarray, num_clients: int | None = None) -> list[np.ndarray]:
    """One client per distinct id (in sorted id order), holding the indices with that id."""
    client_ids = np.asarray(client_ids)
    ids, counts = np.unique(client_ids, return_counts=True)
    if num_clients is not None and num_clients != len(ids):
        raise ValueError(f"num_clients={num_clients} but the data has {len(ids)} distinct client ids")
    order = np.argsort(client_ids, kind="stable").astype(np.int64)
    return list(np.split(order, np.cumsum(counts)[:-1]))


def label_histogram(parts: list[np.ndarray], labels: np.ndarray, num_classes: int):
    """DataFrame of per-client class counts (index "client", columns 0..C-1 and "total")."""
    import pandas as pd

    counts = _class_counts(parts, labels, num_classes)
    df = pd.DataFrame(counts, columns=list(range(num_classes)))
    df["total"] = [len(p) for p in parts]
    df.index.name = "client"
    return df


def label_histogram_csv(parts: list[np.ndarray], labels: np.ndarray, num_classes: int) -> str:
    """``label_histogram`` as CSV text (a run's partition.csv), without pandas: it takes 0.4 s to import, at
    the start of every run."""
    counts = _class_counts(parts, labels, num_classes)
    rows = [",".join(["client", *map(str, range(num_classes)), "total"])]
    sizes = [len(p) for p in parts]
    rows += [",".join(map(str, [i, *row.tolist(), n])) for i, (row, n) in enumerate(zip(counts, sizes, strict=True))]
    return "\n".join(rows) + "\n"


def _class_counts(parts: list[np.ndarray], labels: np.ndarray, num_classes: int) -> np.ndarray:
    labels = np.asarray(labels)
    if len(labels) and labels.max() >= num_classes:
        raise ValueError(f"num_classes={num_classes} but labels go up to {labels.max()}")
    return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts])
