"""A dataset of one's own in an .npz file, every array checked before use (``DataError`` names the file, the
array, the problem and what is allowed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from normfl.data.sources.dataset import ArrayDataset, check_split, make
from normfl.errors import DataError

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
    return make(
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
