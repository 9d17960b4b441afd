"""A whole dataset in memory (``ArrayDataset``) and the splits of it into training and test sets."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import numpy as np
import torch

log = logging.getLogger(__name__)

SPLITS = ("standard", "holdout", "pooled", "per_client")


@dataclass(repr=False)
class ArrayDataset:
    """A whole dataset in memory. Image x is uint8 NCHW; labels are int64."""

    name: str
    label: str
    source: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    client_ids: torch.Tensor | None = None
    split: str = "standard"

    def head(self, train: int | None = None, test: int | None = None) -> ArrayDataset:
        """The first ``train`` training and ``test`` test samples (None keeps all): a slice of real data."""
        cut = slice(None, train)
        return replace(self, x_train=self.x_train[cut], y_train=self.y_train[cut],
                       x_test=self.x_test[:test], y_test=self.y_test[:test],
                       client_ids=None if self.client_ids is None else self.client_ids[cut])

    def size_line(self, train: int, test: int, pooled: int | None = None) -> str:
        """The log line of the data a run uses: this dataset's sizes, against the ``train`` and ``test`` sizes
        it was cut from (``head``, ``client_test_split``); ``pooled``: split=per_client's samples before
        the cut, of ``train`` pooled ones."""
        def of(n: int, full: int) -> str:
            return f"{n}" if n == full else f"{n} of {full}"
        if self.split == "per_client":
            return (f"{self.label}: {len(self.y_train)} train / {of(len(self.y_test), test)} test (per_client split of "
                    f"{of(pooled, train)} pooled samples) from {self.source}")
        return (f"{self.label}: {of(len(self.y_train), train)} train / {of(len(self.y_test), test)} test "
                f"({self.split} split) from {self.source}")

    def __repr__(self) -> str:
        return (
            f"ArrayDataset(label={self.label!r}, split={self.split!r}, "
            f"train={tuple(self.x_train.shape)} {self.x_train.dtype}, test={tuple(self.x_test.shape)}, "
            f"num_classes={self.num_classes}, source={self.source!r})"
        )


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not one of {SPLITS}")


def holdout_indices(n: int, holdout_fraction: float, split_seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Permute range(n) with default_rng(split_seed); the last `holdout_fraction` part is the test set."""
    if not 0.0 < holdout_fraction < 1.0:
        raise ValueError(f"holdout_fraction={holdout_fraction} must be strictly between 0 and 1")
    n_test = int(round(n * holdout_fraction))
    if not 0 < n_test < n:
        raise ValueError(
            f"holdout_fraction={holdout_fraction} of {n} samples leaves an empty train or test set"
        )
    perm = np.random.default_rng(split_seed).permutation(n)
    return perm[: n - n_test], perm[n - n_test :]


def apply_split(split, x_train, y_train, x_test, y_test, holdout_fraction, split_seed, client_ids=None):
    """Return (x_train, y_train, x_test, y_test, client_ids) for `split`.

    standard: the given train/test sets. holdout: NORMEC's split of the TRAIN set only.
    pooled: train+test pooled, then the same holdout split (NORMEC's `split_source=pooled`).
    per_client: train+test pooled into the training set, the test set empty until the partition is
    made; then ``client_test_split`` cuts each client's test piece from its share.
    """
    check_split(split)
    if split != "holdout" and x_test is None:
        raise ValueError(f"split={split!r} needs a test set, but there is none; use split='holdout'")
    if split == "standard":
        return x_train, y_train, x_test, y_test, client_ids
    if split in ("pooled", "per_client"):
        if client_ids is not None:
            raise ValueError(
                f"split={split!r} cannot be used with per-sample client ids (test samples have none)"
            )
        x_train, y_train = torch.cat([x_train, x_test]), torch.cat([y_train, y_test])
    if split == "per_client":
        return x_train, y_train, x_train[:0], y_train[:0], None
    tr, te = (torch.from_numpy(i) for i in holdout_indices(len(y_train), holdout_fraction, split_seed))
    clients = None if client_ids is None else client_ids[tr]
    return x_train[tr], y_train[tr], x_train[te], y_train[te], clients


def client_test_split(ds: ArrayDataset, parts, holdout_fraction: float, split_seed: int):
    """``split=per_client``: each client's samples, shuffled, keep ⌊(1 - f)·n_i⌋ for training and give
    the rest to the test set, which is the clients' test pieces together. Returns the dataset with those
    training and test sets and each client's indices into the new training set.

    This is the ALI-DPFL authors' data pipeline (XinpengLing/ALI-DPFL, dataset/utils/dataset_utils.py:
    train_size = 0.75 at line 8, split_data at lines 142-154, sklearn's train_test_split per client;
    the server's test set joins the clients' pieces, dataset/generate_server_testset.py lines 10-22)."""
    rng = np.random.default_rng(split_seed)
    train, test = [], []
    for p in parts:
        p = rng.permutation(np.asarray(p))
        keep = int(np.floor((1.0 - holdout_fraction) * len(p)))
        train.append(p[:keep])
        test.append(p[keep:])
    if min(map(len, train)) == 0:
        raise ValueError(f"holdout_fraction={holdout_fraction} leaves a client no training samples")
    tr, te = (torch.from_numpy(np.concatenate(a).astype(np.int64)) for a in (train, test))
    starts = np.cumsum([0] + [len(t) for t in train])
    new_parts = [np.arange(a, b, dtype=np.int64) for a, b in zip(starts[:-1], starts[1:], strict=True)]
    return replace(ds, x_train=ds.x_train[tr], y_train=ds.y_train[tr], x_test=ds.x_train[te],
                   y_test=ds.y_train[te]), new_parts


def make(name, label, source, arrays, split, holdout_fraction, split_seed, mean, std, client_ids=None):
    x_tr, y_tr, x_te, y_te = arrays
    num_classes = int(max(int(y.max()) for y in (y_tr, y_te) if y is not None and len(y))) + 1
    x_tr, y_tr, x_te, y_te, client_ids = apply_split(
        split, x_tr, y_tr, x_te, y_te, holdout_fraction, split_seed, client_ids
    )
    log.debug("%s: %d train / %d test (%s split) from %s", label, len(y_tr), len(y_te), split, source)
    return ArrayDataset(
        name, label, source, x_tr, y_tr, x_te, y_te, num_classes, tuple(mean), tuple(std), client_ids, split
    )
