"""Dataset loaders: whole datasets as tensors, from torchvision, an offline copy or an .npz file.

Every loader tries its sources in a fixed order and raises :class:`DataNotFoundError` listing each
place it looked. There is never a fallback to synthetic data.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import shutil
import socket
import tarfile
import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass

import numpy as np
import torch

from normfl.errors import DataError

log = logging.getLogger(__name__)

SPLITS = ("standard", "holdout", "pooled", "per_client")
OFFLINE_ENV = "NORMFL_OFFLINE_DATA"
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CIFAR10_JPEG_ARCHIVE = "cifar10-jpeg.tar.xz"
CIFAR10_LABELS = "cifar10-canonical-labels.npz"
SHA256 = {  # the offline copy's files, as published with it (in the README.md beside them)
    CIFAR10_JPEG_ARCHIVE: "c6a3459d6a507684c4b097fa19f6367762beeb91d82527ac99ff463bcde30208",
    CIFAR10_LABELS: "2adcb621b226054b45ea498e5151b50747ee667e75829c059844e7b78f6b5196",
}
CIFAR10_CACHE = "cifar10-jpeg-cache.npz"
_CACHE_FORMAT = "normfl-cifar10-jpeg-v1"
_JPEG_MEMBER = re.compile(r"(?:^|/)(train|test)/([a-z]+)/(\d+)\.jpg$")


class DataNotFoundError(FileNotFoundError):
    """No source of a dataset was usable; the message lists every place looked and how to fix it."""


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


# ----------------------------------------------------------------------------------------- splits


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


def _make(name, label, source, arrays, split, holdout_fraction, split_seed, mean, std, client_ids=None):
    x_tr, y_tr, x_te, y_te = arrays
    num_classes = int(max(int(y.max()) for y in (y_tr, y_te) if y is not None and len(y))) + 1
    x_tr, y_tr, x_te, y_te, client_ids = apply_split(
        split, x_tr, y_tr, x_te, y_te, holdout_fraction, split_seed, client_ids
    )
    log.debug("%s: %d train / %d test (%s split) from %s", label, len(y_tr), len(y_te), split, source)
    return ArrayDataset(
        name, label, source, x_tr, y_tr, x_te, y_te, num_classes, tuple(mean), tuple(std), client_ids, split
    )


# ------------------------------------------------------------------------------------ helpers


def _offline_dir(offline_dir: str | os.PathLike | None) -> Path | None:
    offline_dir = offline_dir if offline_dir is not None else os.environ.get(OFFLINE_ENV) or None
    return None if offline_dir is None else Path(offline_dir).expanduser()


def _no_offline_dir() -> str:
    return f"offline copy: no offline dir given (offline_dir=None and ${OFFLINE_ENV} unset)"


def _reachable(url: str, timeout: float = 3.0) -> str | None:
    """None if a TCP connection to the url's host (or its proxy) opens within `timeout`, else why not."""
    parts = urlsplit(url)
    host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    proxy = getproxies().get(parts.scheme)
    if proxy and not proxy_bypass(host):
        p = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host, port = p.hostname, p.port or 80
    result: list[str | None] = []

    def probe():  # in a thread, because DNS look-ups ignore socket timeouts
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result.append(None)
        except OSError as e:
            result.append(str(e))

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout + 0.5)
    if not result:
        return f"no connection to {host}:{port} within {timeout:g} s"
    return None if result[0] is None else f"cannot connect to {host}:{port}: {result[0]}"


def _try_download(url: str, download: bool, fetch: Callable[[], object], looked: list[str]) -> bool:
    if not download:
        looked.append(f"download from {url}: not attempted (download=False)")
        return False
    why = _reachable(url)
    if why is not None:
        looked.append(f"download from {url}: skipped ({why})")
        return False
    try:
        fetch()
        return True
    except Exception as e:  # any failure means: try the next source
        looked.append(f"download from {url}: failed ({type(e).__name__}: {e})")
        return False


def _not_found(what: str, looked: list[str], how: list[str]) -> DataNotFoundError:
    lines = [f"{what} not found. Looked in:"] + [f"  - {x}" for x in looked]
    lines += [f"To provide {what}, do one of:"] + [f"  - {x}" for x in how]
    return DataNotFoundError("\n".join(lines))


@contextmanager
def _root_lock(root: Path, name: str):
    """Exclusive lock on `root/.normfl-<name>.lock` (parallel sweep jobs); a no-op where not possible."""
    f = None
    try:
        import fcntl

        root.mkdir(parents=True, exist_ok=True)
        f = open(root / f".normfl-{name}.lock", "w")
        fcntl.flock(f, fcntl.LOCK_EX)
    except (ImportError, OSError) as e:
        log.debug("no lock in %s: %s", root, e)
    try:
        yield
    finally:
        if f is not None:
            f.close()  # releases the lock


def _save_npz_atomic(path: Path, **arrays: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------ CIFAR-10


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
    from torchvision.datasets import CIFAR10

    check_split(split)
    root, offline, looked = Path(root).expanduser(), _offline_dir(offline_dir), []
    label, source = "CIFAR-10", f"torchvision:{root}"
    with _root_lock(root, "cifar10"):  # one process prepares the data, the others wait
        arrays = _cifar_torchvision(root, looked)
        if arrays is None and _try_download(
            CIFAR10.url, download, lambda: CIFAR10(str(root), train=True, download=True), looked
        ):
            arrays = _cifar_torchvision(root, looked)
        if arrays is None:
            label = "CIFAR-10 (JPEG copy)"
            arrays, source = _cifar_jpeg(root, offline, looked)
    if arrays is None:
        raise _not_found(
            "CIFAR-10",
            looked,
            [
                f"put torchvision's CIFAR-10 ({root / 'cifar-10-batches-py'}) under root, e.g. by running "
                "torchvision.datasets.CIFAR10(root, download=True) on a machine with internet access",
                "pass download=True on a machine that can reach www.cs.toronto.edu",
                f"pass offline_dir (or set ${OFFLINE_ENV}) to a folder holding {CIFAR10_JPEG_ARCHIVE} and "
                f"{CIFAR10_LABELS} (lossy JPEG copy; results are labelled 'CIFAR-10 (JPEG copy)')",
            ],
        )
    return _make("cifar10", label, source, arrays, split, holdout_fraction, split_seed, mean, std)


def _cifar_torchvision(root: Path, looked: list[str]):
    from torchvision.datasets import CIFAR10

    folder = root / CIFAR10.base_folder
    if not folder.is_dir():
        looked.append(f"{folder}: not found (torchvision CIFAR-10)")
        return None
    try:
        tr, te = (CIFAR10(str(root), train=t, download=False) for t in (True, False))
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
        looked.append(_no_offline_dir())
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
        _save_npz_atomic(cache, format=np.array(_CACHE_FORMAT), **data)
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


# -------------------------------------------------------------------------------- Fashion-MNIST


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
    root, offline, looked = Path(root).expanduser(), _offline_dir(offline_dir), []
    raw = root / "FashionMNIST" / "raw"
    with _root_lock(root, "fashion_mnist"):
        arrays = _fmnist_torchvision(root, False, looked)
        source = f"torchvision:{root}"
        if arrays is None and offline is None:
            looked.append(_no_offline_dir())
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
        if arrays is None and _try_download(
            FashionMNIST.mirrors[0] + FashionMNIST.resources[0][0],
            download,
            lambda: FashionMNIST(str(root), train=True, download=True),
            looked,
        ):
            arrays, source = _fmnist_torchvision(root, False, looked), f"torchvision:{root}"
    if arrays is None:
        raise _not_found(
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
    return _make(
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


# ------------------------------------------------------------------------------------------ npz


MAX_CLASSES = 1000          # labels of an npz dataset lie in [0, MAX_CLASSES)


def load_npz(
    path, split: str = "standard", holdout_fraction: float = 0.1, split_seed: int = 42, mean=(), std=()
) -> ArrayDataset:
    """Arrays from an .npz: `x`, `y`, optional `x_test`/`y_test`, optional `client` (train client ids).
    Every array is checked (``DataError`` names the file, the array, the problem and what is allowed)."""
    check_split(split)
    path = Path(path).expanduser()
    keys, arrays = _read_npz(path)
    x = _npz_x(arrays["x"], "x", path)
    y = _npz_y(arrays["y"], "y", len(x), path)
    x_te = y_te = None
    if "x_test" in keys:
        x_te = _npz_x(arrays["x_test"], "x_test", path)
        y_te = _npz_y(arrays["y_test"], "y_test", len(x_te), path)
        if x_te.dtype != x.dtype or x_te.shape[1:] != x.shape[1:]:
            raise DataError(path, "x_test", f"{x_te.dtype} {tuple(x_te.shape)}",
                            f"the dtype and sample shape of x ({x.dtype} {tuple(x.shape)})")
    clients = _npz_y(arrays["client"], "client", len(x), path, labels=False) if "client" in keys else None
    if x_te is None and split != "holdout":
        raise DataError(path, "x_test", f"absent, so split={split!r} has no test set",
                        "split=holdout (dataset.split=holdout), or a file with x_test and y_test")
    if split == "holdout" and int(len(x) * holdout_fraction) < 1:
        raise DataError(path, "x", f"{len(x)} samples: holdout_fraction={holdout_fraction} holds out none",
                        "enough samples for a test set of at least one")
    return _make(
        "npz", f"npz:{path.name}", str(path), (x, y, x_te, y_te), split, holdout_fraction, split_seed, mean, std,
        clients
    )


def npz_client_ids(path) -> np.ndarray | None:
    """The `client` array of an npz dataset (None when it has none), checked as ``load_npz`` checks it, reading
    only it and `y` (for the number of samples): what ``partition=natural`` needs before the data is loaded."""
    path = Path(path).expanduser()
    keys, arrays = _read_npz(path, ("y", "client"))
    if "client" not in keys:
        return None
    y = arrays["y"]
    _npz_y(y, "y", len(y) if y.ndim else 0, path)
    return _npz_y(arrays["client"], "client", len(y), path, labels=False).numpy()


def _read_npz(path: Path, names=None) -> tuple[set[str], dict[str, np.ndarray]]:
    """(the names of the arrays in the npz at ``path``, those arrays, or only ``names`` of them), after
    checking that it is a readable npz with the arrays a dataset needs."""
    if not path.is_file():
        raise FileNotFoundError(f"npz dataset not found: {path}")
    with open(path, "rb") as fh:
        head = fh.read(4)
    if head != b"PK\x03\x04":       # an .npz is a zip archive
        raise DataError(path, "the file", "empty (0 bytes)" if not head else f"not an .npz (it begins {head!r})",
                        "a file written by numpy.savez / savez_compressed")
    try:
        with np.load(path, allow_pickle=False) as z:
            keys = set(z.files)
            arrays = {k: z[k] for k in z.files if names is None or k in names}
    except Exception as err:             # empty, text, truncated, pickled: numpy says what
        raise DataError(path, "the file", f"not a readable .npz ({type(err).__name__}: {err})",
                        "a file written by numpy.savez / savez_compressed, without pickled objects") from None
    if not {"x", "y"} <= keys or ("x_test" in keys) != ("y_test" in keys):
        raise DataError(path, "its arrays", f"has {sorted(keys)}", "x, y, and optionally both x_test and y_test, "
                        "and client")
    return keys, arrays


def _npz_x(x: np.ndarray, key: str, path: Path) -> torch.Tensor:
    """uint8 [N,H,W] -> [N,1,H,W]; uint8 [N,H,W,C], C in (1, 3) -> NCHW; float [N, ...] -> float32 as is."""
    if x.ndim < 2 or x.shape[0] < 1 or 0 in x.shape[1:]:
        raise DataError(path, key, f"shape {x.shape}", "one sample per row, at least one sample: [N, features] "
                        "or [N, H, W(, C)] images")
    if x.dtype == np.uint8:
        if x.ndim == 3:
            x = x[:, None]
        elif x.ndim == 4 and x.shape[-1] in (1, 3):
            x = x.transpose(0, 3, 1, 2)
        return torch.from_numpy(np.ascontiguousarray(x))
    if np.issubdtype(x.dtype, np.floating):
        x = np.ascontiguousarray(x, dtype=np.float32)
        if not np.isfinite(x).all():
            bad = np.argwhere(~np.isfinite(x))[0]
            raise DataError(path, key, f"{int((~np.isfinite(x)).sum())} values are NaN or infinite (the first at "
                            f"index {tuple(int(i) for i in bad)}, as float32)", "finite numbers")
        return torch.from_numpy(x)
    raise DataError(path, key, f"dtype {x.dtype}", "uint8 images or floating-point features")


def _npz_y(y: np.ndarray, key: str, n: int, path: Path, labels: bool = True) -> torch.Tensor:
    if not np.issubdtype(y.dtype, np.integer) or y.shape != (n,):
        raise DataError(path, key, f"{y.dtype} {y.shape}", f"integers of shape ({n},), one per sample")
    if n and y.min() < 0:
        raise DataError(path, key, f"value {int(y.min())}", "integers >= 0")
    if labels and n and y.max() >= MAX_CLASSES:
        raise DataError(path, key, f"label {int(y.max())}", f"class labels 0..{MAX_CLASSES - 1} (the model gets one "
                        "output per class up to the largest label)")
    return torch.from_numpy(y.astype(np.int64))
