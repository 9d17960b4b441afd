"""Dataset loaders: whole datasets as tensors, from torchvision, an offline copy or an .npz file.

Every loader tries its sources in a fixed order and raises :class:`DataNotFoundError` listing each
place it looked. There is never a fallback to synthetic data.

    dataset.py        ArrayDataset and the splits (standard, holdout, pooled, per_client)
    places.py         where loaders look: the offline folder, downloads, the not-found error, the root's lock
    cifar10.py        CIFAR-10, with the offline JPEG copy's checks, decoding and cache
    fashion_mnist.py  Fashion-MNIST
    npz.py            a dataset of one's own in an .npz, every array checked
"""

from normfl.data.sources.cifar10 import (
    CIFAR10_CACHE,
    CIFAR10_CLASSES,
    CIFAR10_JPEG_ARCHIVE,
    CIFAR10_LABELS,
    decode_cifar10_jpeg,
    load_cifar10,
)
from normfl.data.sources.dataset import SPLITS, ArrayDataset, apply_split, client_test_split, holdout_indices
from normfl.data.sources.fashion_mnist import load_fashion_mnist
from normfl.data.sources.npz import load_npz, npz_client_ids
from normfl.data.sources.places import OFFLINE_ENV, DataNotFoundError

__all__ = [
    "CIFAR10_CACHE",
    "CIFAR10_CLASSES",
    "CIFAR10_JPEG_ARCHIVE",
    "CIFAR10_LABELS",
    "OFFLINE_ENV",
    "SPLITS",
    "ArrayDataset",
    "DataNotFoundError",
    "apply_split",
    "client_test_split",
    "decode_cifar10_jpeg",
    "holdout_indices",
    "load_cifar10",
    "load_fashion_mnist",
    "load_npz",
    "npz_client_ids",
]
