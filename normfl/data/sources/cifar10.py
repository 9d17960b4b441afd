"""CIFAR-10: torchvision's copy, a download, or the offline JPEG copy (checked, decoded once, cached)."""

from __future__ import annotations

import hashlib
import io
import logging
import re
import tarfile
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

log = logging.getLogger(__name__)

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CIFAR10_JPEG_ARCHIVE = "cifar10-jpeg.tar.xz"
CIFAR10_LABELS = "cifar10-canonical-labels.npz"
SHA256 = {  # the offline copy's files, as published with it (in the README.md beside them)
    CIFAR10_JPEG_ARCHIVE: "c6a3459d6a507684c4b097fa19f6367762beeb91d82527ac99ff463bcde30208",
    CIFAR10_LABELS: "2adcb621b226054b45ea498e5151b50747ee667e75829c059844e7b78f6b5196",
}
CIFAR10_CACHE = "cifar10-jpeg-cache.npz"
# torchvision's layout and source, named here so that a run on the JPEG copy never imports torchvision (about
# 2 s at every start); tests/test_data.py checks them against torchvision's own
TORCHVISION_FOLDER = "cifar-10-batches-py"
TORCHVISION_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
_CACHE_FORMAT = "normfl-cifar10-jpeg-v1"
_JPEG_MEMBER = re.compile(r"(?:^|/)(train|test)/([a-z]+)/(\d+)\.jpg$")


def load_cifar10(
    root,
    offline_dir,
    download: bool = True,
    split: str = "standard",
    holdout_fraction: float = 0.1,
    split_seed: int = 42,
    mean=(0.485, 0.456, 0.406),
    std=(0.229, 0.224, 0.225),
) -> ArrayDataset:
    """CIFAR-10: torchvision under `root`, else a download, else the offline JPEG copy (cached in root)."""
    check_split(split)
    root, offline, looked = Path(root).expanduser(), offline_path(offline_dir), []
    label, source = "CIFAR-10", f"torchvision:{root}"
    with root_lock(root, "cifar10"):  # one process prepares the data, the others wait
        arrays = _cifar_torchvision(root, looked)
        if arrays is None and try_download(
            TORCHVISION_URL, download, lambda: _torchvision_cifar10(root, True, download=True), looked
        ):
            arrays = _cifar_torchvision(root, looked)
        if arrays is None:
            label = "CIFAR-10 (JPEG copy)"
            arrays, source = _cifar_jpeg(root, offline, looked)
    if arrays is None:
        raise not_found(
            "CIFAR-10",
            looked,
            [
                f"put torchvision's CIFAR-10 ({root / TORCHVISION_FOLDER}) under the root (train.py: data_root=), "
                "e.g. by running torchvision.datasets.CIFAR10(root, download=True) on a machine with internet access",
                "set dataset.download=true (download=True in Python) on a machine that can reach www.cs.toronto.edu",
                f"point offline_data= (offline_dir in Python, or ${OFFLINE_ENV}) at a folder holding "
                f"{CIFAR10_JPEG_ARCHIVE} and {CIFAR10_LABELS} (lossy JPEG copy; results are labelled "
                "'CIFAR-10 (JPEG copy)')",
            ],
            (root, offline),
        )
    return make("cifar10", label, source, arrays, split, holdout_fraction, split_seed, mean, std)


def _torchvision_cifar10(root: Path, train: bool, download: bool = False):
    from torchvision.datasets import CIFAR10

    return CIFAR10(str(root), train=train, download=download)


def _cifar_torchvision(root: Path, looked: list[str]):
    folder = root / TORCHVISION_FOLDER
    if not folder.is_dir():
        looked.append(f"{folder}: not found (torchvision CIFAR-10)")
        return None
    try:
        tr, te = (_torchvision_cifar10(root, t) for t in (True, False))
    except RuntimeError as e:
        looked.append(f"{folder}: unusable ({e})")
        return None
    return tuple(
        v
        for d in (tr, te)
        for v in (torch.from_numpy(d.data).permute(0, 3, 1, 2).contiguous(), torch.tensor(d.targets))
    )


def _cifar_jpeg(root: Path, offline: Path | None, looked: list[str]):
    cache = root / CIFAR10_CACHE
    labels = None if offline is None else offline / CIFAR10_LABELS
    arrays = _read_cifar_cache(cache, labels, looked)
    if arrays is not None:
        return arrays, str(cache)
    if offline is None:
        looked.append(no_offline_dir())
        return None, None
    archive = offline / CIFAR10_JPEG_ARCHIVE
    missing = [str(p) for p in (archive, labels) if not p.is_file()]
    if missing:
        looked.append(f"{' and '.join(missing)}: not found (offline JPEG copy)")
        return None, None
    corrupt = [why for p in (archive, labels) if (why := _checksum_mismatch(p))]
    if corrupt:
        looked += corrupt
        return None, None
    log.info("decoding %s once (about 10 s); cache: %s", archive, cache)
    data = decode_cifar10_jpeg(archive, labels)
    try:
        save_atomic(cache, lambda f: np.savez(f, format=np.array(_CACHE_FORMAT), **data))
    except OSError as e:
        log.warning("could not write the cache %s: %s", cache, e)
    return _cifar_tensors(data), str(archive)


def _checksum_mismatch(path: Path) -> str | None:
    """Why ``path`` is not the published file (its sha256 differs: corrupted or truncated), or None."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    got, want = digest.hexdigest(), SHA256[path.name]
    return None if got == want else f"{path}: sha256 {got} is not the published {want} (corrupted or truncated copy)"


def _cifar_tensors(d):
    return tuple(
        torch.from_numpy(d[k]).to(torch.int64 if k[0] == "y" else torch.uint8)
        for k in ("x_train", "y_train", "x_test", "y_test")
    )


def _read_cifar_cache(cache: Path, labels: Path | None, looked: list[str]):
    if not cache.is_file():
        looked.append(f"{cache}: no decoded cache of the JPEG copy")
        return None
    try:
        with np.load(cache) as z:
            if str(z["format"]) != _CACHE_FORMAT:
                raise ValueError(f"format {z['format']} is not {_CACHE_FORMAT}")
            d = {k: z[k] for k in ("x_train", "y_train", "x_test", "y_test")}
        if d["x_train"].shape != (50000, 3, 32, 32) or d["x_test"].shape != (10000, 3, 32, 32):
            raise ValueError("wrong shapes")
        if labels is not None and labels.is_file():
            with np.load(labels) as canon:
                if not all(np.array_equal(d[k], canon[k]) for k in ("y_train", "y_test")):
                    raise ValueError(f"labels differ from {labels}")
    except Exception as e:  # a broken cache is rebuilt
        looked.append(f"{cache}: unusable cache ({type(e).__name__}: {e})")
        return None
    return _cifar_tensors(d)


def decode_cifar10_jpeg(archive: str | Path, labels: str | Path) -> dict[str, np.ndarray]:
    """Decode the JPEG copy into the canonical order: x_* uint8 [N,3,32,32], y_* int64.

    Member `<split>/<class>/<k>.jpg` is the k-th image (0-based) of that class in the original order.
    """
    from PIL import Image

    with np.load(labels) as canon:
        y = {s: canon[f"y_{s}"].astype(np.int64) for s in ("train", "test")}
    where = {(s, c): np.flatnonzero(y[s] == c) for s in y for c in range(len(CIFAR10_CLASSES))}
    x = {s: np.zeros((len(y[s]), 32, 32, 3), np.uint8) for s in y}
    seen = {s: np.zeros(len(y[s]), bool) for s in y}
    with tarfile.open(archive, "r:*") as tf:
        for m in tf:
            if not m.isfile():
                continue
            match = _JPEG_MEMBER.search(m.name)
            if match is None or match[2] not in CIFAR10_CLASSES:
                raise ValueError(f"{archive}: unexpected member {m.name}")
            s, c, k = match[1], CIFAR10_CLASSES.index(match[2]), int(match[3])
            if k >= len(where[s, c]):
                raise ValueError(
                    f"{archive}: {m.name} exceeds the {len(where[s, c])} canonical '{match[2]}' images"
                )
            i = where[s, c][k]
            if seen[s][i]:
                raise ValueError(f"{archive}: duplicate image for {s} index {i} ({m.name})")
            with Image.open(io.BytesIO(tf.extractfile(m).read())) as im:
                x[s][i] = np.asarray(im.convert("RGB"))
            seen[s][i] = True
    for s in y:
        if not seen[s].all():
            raise ValueError(f"{archive}: {int((~seen[s]).sum())} {s} images missing")
    out = {}
    for s in y:
        out[f"x_{s}"] = np.ascontiguousarray(x[s].transpose(0, 3, 1, 2))
        out[f"y_{s}"] = y[s]
    return out
