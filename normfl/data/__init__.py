"""Datasets as in-memory tensors, batched transforms, client partitions and the clients' batch streams."""

from normfl.data.clients import ClientData, Preprocess
from normfl.data.partition import dirichlet, iid, label_histogram, label_histogram_csv, natural, sampled_shards, shards
from normfl.data.sources import (
    SPLITS,
    ArrayDataset,
    DataNotFoundError,
    apply_split,
    client_test_split,
    decode_cifar10_jpeg,
    holdout_indices,
    load_cifar10,
    load_fashion_mnist,
    load_npz,
    npz_client_ids,
)
from normfl.data.transforms import augment_crop_flip, normalize

__all__ = [
    "SPLITS",
    "ArrayDataset",
    "ClientData",
    "DataNotFoundError",
    "apply_split",
    "augment_crop_flip",
    "client_test_split",
    "decode_cifar10_jpeg",
    "dirichlet",
    "holdout_indices",
    "iid",
    "label_histogram",
    "label_histogram_csv",
    "load_cifar10",
    "load_fashion_mnist",
    "load_npz",
    "natural",
    "normalize",
    "npz_client_ids",
    "Preprocess",
    "sampled_shards",
    "shards",
]
