"""Fashion-MNIST: torchvision's copy, the offline idx files (copied into the root), or a download.

The extracted idx files in torchvision's layout are read here, without importing torchvision (its import costs
about 2 s at every start of a run); torchvision is imported only to check the offline copy against its
checksums the first time and to download."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import torch

from normfl.data.sources.dataset import ArrayDataset, check_split, make
from normfl.data.sources.places import (
    OFFLINE_ENV,
    no_offline_dir,
    not_found,
    offline_path,
    root_lock,
    save_atomic,
    try_download,
)

# torchvision's extracted files (in <root>/FashionMNIST/raw): (images, labels) of the train and the test split
IDX_FILES = (("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
             ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"))


def load_fashion_mnist(
    root,
    offline_dir,
    download: bool = True,
    split: str = "standard",
    holdout_fraction: float = 0.1,
    split_seed: int = 42,
    mean=(0.2860,),
    std=(0.3530,),
) -> ArrayDataset:
    """Fashion-MNIST: torchvision under `root`, else the offline idx files (copied there), else a download."""
    check_split(split)
    root, offline, looked = Path(root).expanduser(), offline_path(offline_dir), []
    raw = root / "FashionMNIST" / "raw"
    with root_lock(root, "fashion_mnist"):
        arrays = _fmnist_torchvision(root, looked)
        source = f"torchvision:{root}"
        if arrays is None and offline is None:
            looked.append(no_offline_dir())
        elif arrays is None:
            from torchvision.datasets.utils import check_integrity

            src, resources = offline / "FashionMNIST" / "raw", _torchvision_fmnist().resources
            missing = [f for f, _ in resources if not (src / f).is_file()]
            bad = [f for f, md5 in resources if f not in missing and not check_integrity(str(src / f), md5)]
            if missing or bad:
                why = [f"{what}: {', '.join(fs)}" for what, fs in (("missing", missing), ("wrong md5", bad)) if fs]
                looked.append(f"{src}: {'; '.join(why)} (offline copy)")
            else:
                for f, md5 in resources:
                    if not check_integrity(str(raw / f), md5):
                        archive = (src / f).read_bytes()
                        save_atomic(raw / f, lambda out, b=archive: out.write(b))
                    # the archives are verified; what was extracted before was not (missing or damaged)
                    idx = gzip.decompress((raw / f).read_bytes())
                    save_atomic(raw / f.removesuffix(".gz"), lambda out, b=idx: out.write(b))
                arrays = _fmnist_torchvision(root, looked)
                source = f"torchvision:{root} (copied from {src})"
        if arrays is None and try_download(
            _torchvision_fmnist().mirrors[0] + IDX_FILES[0][0] + ".gz",
            download,
            lambda: _torchvision_fmnist()(str(root), train=True, download=True),
            looked,
        ):
            arrays, source = _fmnist_torchvision(root, looked), f"torchvision:{root}"
    if arrays is None:
        raise not_found(
            "Fashion-MNIST",
            looked,
            [
                f"put torchvision's Fashion-MNIST ({raw}) under the root (train.py: data_root=), e.g. by running "
                "torchvision.datasets.FashionMNIST(root, download=True) on a machine with internet access",
                f"point offline_data= (offline_dir in Python, or ${OFFLINE_ENV}) at a folder holding "
                "FashionMNIST/raw/*.gz (the four original idx files)",
                "set dataset.download=true (download=True in Python) on a machine with internet access",
            ],
            (root, offline),
        )
    return make(
        "fashion_mnist", "Fashion-MNIST", source, arrays, split, holdout_fraction, split_seed, mean, std
    )


def _torchvision_fmnist():
    from torchvision.datasets import FashionMNIST

    return FashionMNIST


def _fmnist_torchvision(root: Path, looked: list[str]):
    """torchvision's Fashion-MNIST under ``root``: (x_train, y_train, x_test, y_test), or None (why in ``looked``)."""
    raw = root / "FashionMNIST" / "raw"
    if all((raw / f).is_file() for pair in IDX_FILES for f in pair):
        try:
            return tuple(a for pair in IDX_FILES for a in _read_idx_pair(raw, *pair))
        except ValueError as e:
            looked.append(f"{raw}: unusable ({e})")
            return None
    try:                                 # torchvision's own reader knows its older layouts (processed/*.pt)
        tr, te = (_torchvision_fmnist()(str(root), train=t, download=False) for t in (True, False))
    except RuntimeError as e:
        looked.append(f"{raw}: no usable torchvision FashionMNIST ({e})")
        return None
    return tr.data[:, None].contiguous(), tr.targets.long(), te.data[:, None].contiguous(), te.targets.long()


def _read_idx_pair(raw: Path, images: str, labels: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(images uint8 [N,1,H,W], labels int64 [N]) from two idx files in ``raw``, or ValueError."""
    x, y = _read_idx(raw / images), _read_idx(raw / labels)
    if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
        raise ValueError(f"{images} {x.shape} and {labels} {y.shape} are not N images and their N labels")
    return torch.from_numpy(x[:, None].copy()), torch.from_numpy(y.astype(np.int64))


def _read_idx(path: Path) -> np.ndarray:
    """An idx file of unsigned bytes, the MNIST family's format: bytes 0, 0, 0x08 (uint8), the number of
    dimensions, then each size as a big-endian uint32, then the data."""
    data = path.read_bytes()
    nd = data[3] if len(data) >= 4 and data[:3] == b"\0\0\x08" else 0
    if not 1 <= nd <= 3 or len(data) < 4 + 4 * nd:
        raise ValueError(f"{path.name} is not an idx file of unsigned bytes (it begins {data[:8]!r})")
    shape = tuple(int(s) for s in np.frombuffer(data, ">u4", nd, 4))
    body = np.frombuffer(data, np.uint8, offset=4 + 4 * nd)
    if body.size != np.prod(shape):
        raise ValueError(f"{path.name} holds {body.size} bytes of data, not the {shape} its header gives")
    return body.reshape(shape)
