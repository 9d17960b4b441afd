"""Fashion-MNIST: torchvision's copy, the offline idx files (copied into the root), or a download."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from normfl.data.sources.dataset import ArrayDataset, check_split, make
from normfl.data.sources.places import OFFLINE_ENV, no_offline_dir, not_found, offline_path, root_lock, try_download


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
    from torchvision.datasets import FashionMNIST
    from torchvision.datasets.utils import check_integrity

    check_split(split)
    root, offline, looked = Path(root).expanduser(), offline_path(offline_dir), []
    raw = root / "FashionMNIST" / "raw"
    with root_lock(root, "fashion_mnist"):
        arrays = _fmnist_torchvision(root, False, looked)
        source = f"torchvision:{root}"
        if arrays is None and offline is None:
            looked.append(no_offline_dir())
        elif arrays is None:
            src = offline / "FashionMNIST" / "raw"
            bad = [f for f, md5 in FashionMNIST.resources if not check_integrity(str(src / f), md5)]
            if bad:
                looked.append(f"{src}: missing or wrong md5: {', '.join(bad)} (offline copy)")
            else:
                raw.mkdir(parents=True, exist_ok=True)
                for f, md5 in FashionMNIST.resources:
                    if not check_integrity(str(raw / f), md5):
                        shutil.copyfile(src / f, raw / f".{f}.tmp")
                        os.replace(raw / f".{f}.tmp", raw / f)
                # torchvision's download step finds md5-verified archives and only extracts them
                arrays = _fmnist_torchvision(root, True, looked)
                source = f"torchvision:{root} (copied from {src})"
        if arrays is None and try_download(
            FashionMNIST.mirrors[0] + FashionMNIST.resources[0][0],
            download,
            lambda: FashionMNIST(str(root), train=True, download=True),
            looked,
        ):
            arrays, source = _fmnist_torchvision(root, False, looked), f"torchvision:{root}"
    if arrays is None:
        raise not_found(
            "Fashion-MNIST",
            looked,
            [
                f"put torchvision's Fashion-MNIST ({raw}) under root, e.g. by running "
                "torchvision.datasets.FashionMNIST(root, download=True) on a machine with internet access",
                f"pass offline_dir (or set ${OFFLINE_ENV}) to a folder holding FashionMNIST/raw/*.gz "
                "(the four original idx files)",
                "pass download=True on a machine with internet access",
            ],
        )
    return make(
        "fashion_mnist", "Fashion-MNIST", source, arrays, split, holdout_fraction, split_seed, mean, std
    )


def _fmnist_torchvision(root: Path, download: bool, looked: list[str]):
    from torchvision.datasets import FashionMNIST

    try:
        tr, te = (FashionMNIST(str(root), train=t, download=download) for t in (True, False))
    except RuntimeError as e:
        looked.append(f"{root / 'FashionMNIST' / 'raw'}: no usable torchvision FashionMNIST ({e})")
        return None
    return tr.data[:, None].contiguous(), tr.targets.long(), te.data[:, None].contiguous(), te.targets.long()
