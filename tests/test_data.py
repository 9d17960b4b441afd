"""Loaders (on the real offline copies), splits, npz files and batched transforms."""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from normfl.data import (
    DataNotFoundError,
    augment_crop_flip,
    holdout_indices,
    load_cifar10,
    load_fashion_mnist,
    load_npz,
    normalize,
    sources,
)
from normfl.data.transforms import draw_crop_flip
from tests.helpers import OFFLINE


def need(*names: str) -> None:
    missing = [n for n in names if not (OFFLINE / n).exists()]
    if missing:
        pytest.fail(
            f"offline data missing: {[str(OFFLINE / n) for n in missing]} (set {sources.OFFLINE_ENV})"
        )


@pytest.fixture(autouse=True)
def _no_env_offline_dir(monkeypatch):
    monkeypatch.delenv(sources.OFFLINE_ENV, raising=False)


# ----------------------------------------------------------------------------------- Fashion-MNIST


@pytest.mark.slow
def test_fashion_mnist_from_offline_copy(tmp_path):
    need("FashionMNIST/raw")
    ds = load_fashion_mnist(tmp_path, OFFLINE, download=False)
    assert (ds.name, ds.label, ds.split, ds.num_classes) == ("fashion_mnist", "Fashion-MNIST", "standard", 10)
    assert ds.x_train.shape == (60000, 1, 28, 28) and ds.x_test.shape == (10000, 1, 28, 28)
    assert ds.x_train.dtype == torch.uint8 and ds.y_train.dtype == torch.int64
    assert torch.bincount(ds.y_train).tolist() == [6000] * 10
    assert torch.bincount(ds.y_test).tolist() == [1000] * 10
    mean = ds.x_train.numpy().mean(dtype=np.float64) / 255
    assert mean == pytest.approx(0.2860, abs=1e-3)
    assert (ds.mean, ds.std) == ((0.2860,), (0.3530,))
    # the copy in root is now a plain torchvision dataset, found without the offline dir
    again = load_fashion_mnist(tmp_path, None, download=False, split="holdout")
    assert again.source == f"torchvision:{tmp_path}"
    assert (len(again.y_train), len(again.y_test)) == (54000, 6000)
    tr, te = holdout_indices(60000, 0.1, 42)
    assert torch.equal(again.x_test, ds.x_train[te]) and torch.equal(again.y_train, ds.y_train[tr])


@pytest.mark.slow
def test_fashion_mnist_is_read_as_torchvision_reads_it_and_a_damaged_file_is_extracted_again(tmp_path):
    """normfl reads torchvision's extracted idx files itself (importing torchvision costs about 2 s at every
    start): the same tensors as torchvision's reader; a damaged or emptied file is named, and extracted again
    from the offline copy's verified archives."""
    from torchvision.datasets import FashionMNIST

    need("FashionMNIST/raw")
    ds = load_fashion_mnist(tmp_path, OFFLINE, download=False)
    tr, te = (FashionMNIST(str(tmp_path), train=t, download=False) for t in (True, False))
    assert torch.equal(ds.x_train, tr.data[:, None]) and torch.equal(ds.y_train, tr.targets.long())
    assert torch.equal(ds.x_test, te.data[:, None]) and torch.equal(ds.y_test, te.targets.long())
    raw = tmp_path / "FashionMNIST" / "raw"
    assert [f.removesuffix(".gz") for f, _ in FashionMNIST.resources] == [
        f for pair in sources.fashion_mnist.IDX_FILES for f in pair]
    for name, damage, why in [("t10k-labels-idx1-ubyte", lambda b: b[:100], "holds 92 bytes of data"),
                              ("train-images-idx3-ubyte", lambda b: b"", "is not an idx file"),
                              ("t10k-images-idx3-ubyte", lambda b: b"\0\0\x0d\x03" + b[4:], "is not an idx file")]:
        (raw / name).write_bytes(damage((raw / name).read_bytes()))
        with pytest.raises(DataNotFoundError, match=f"{re.escape(str(raw))}: unusable \\({name} {why}"):
            load_fashion_mnist(tmp_path, None, download=False)
        again = load_fashion_mnist(tmp_path, OFFLINE, download=False)
        assert again.source.endswith("(copied from " + str(OFFLINE / "FashionMNIST" / "raw") + ")")
        assert torch.equal(again.x_train, ds.x_train) and torch.equal(again.y_test, ds.y_test)
    assert not list(raw.glob(".*.tmp"))


def test_fashion_mnist_not_found_lists_places(tmp_path):
    root, offline = tmp_path / "root", tmp_path / "offline"
    offline.mkdir()
    with pytest.raises(DataNotFoundError) as err:
        load_fashion_mnist(root, offline, download=False)
    msg = str(err.value)
    for place in (root / "FashionMNIST" / "raw", offline / "FashionMNIST" / "raw", "download=False"):
        assert str(place) in msg
    assert isinstance(err.value, FileNotFoundError)
    (offline / "FashionMNIST" / "raw").mkdir(parents=True)
    (offline / "FashionMNIST" / "raw" / "train-images-idx3-ubyte.gz").write_bytes(b"not the archive")
    with pytest.raises(DataNotFoundError) as err:
        load_fashion_mnist(root, offline, download=False)
    assert "missing: train-labels-idx1-ubyte.gz, t10k-images" in str(err.value)
    assert "wrong md5: train-images-idx3-ubyte.gz (offline copy)" in str(err.value)


# ---------------------------------------------------------------------------------------- CIFAR-10


@pytest.fixture(scope="session")
def cifar(tmp_path_factory):
    """Decode the JPEG copy once per session; returns (root, dataset, seconds)."""
    need("cifar10-jpeg.tar.xz", "cifar10-canonical-labels.npz")
    root = tmp_path_factory.mktemp("cifar")
    start = time.perf_counter()
    ds = load_cifar10(root, OFFLINE, download=False)
    return root, ds, time.perf_counter() - start


@pytest.mark.slow
def test_cifar_jpeg_copy(cifar):
    root, ds, _ = cifar
    assert (ds.name, ds.label, ds.split, ds.num_classes) == (
        "cifar10",
        "CIFAR-10 (JPEG copy)",
        "standard",
        10,
    )
    assert ds.x_train.shape == (50000, 3, 32, 32) and ds.x_test.shape == (10000, 3, 32, 32)
    assert ds.x_train.dtype == torch.uint8 and ds.y_train.dtype == torch.int64
    with np.load(OFFLINE / "cifar10-canonical-labels.npz") as canon:
        assert np.array_equal(ds.y_train.numpy(), canon["y_train"])
        assert np.array_equal(ds.y_test.numpy(), canon["y_test"])
    x = ds.x_train.numpy()
    means = [x[:, c].mean(dtype=np.float64) / 255 for c in range(3)]
    assert means == pytest.approx([0.4913, 0.4821, 0.4465], abs=2e-3)
    assert (root / sources.CIFAR10_CACHE).is_file()
    assert not list(root.glob(".*.tmp"))


@pytest.mark.slow
def test_cifar_second_load_uses_cache(cifar, monkeypatch):
    root, ds, first = cifar

    def no_decode(*args, **kwargs):
        raise AssertionError("decoded the JPEGs again instead of using the cache")

    monkeypatch.setattr(sources.cifar10, "decode_cifar10_jpeg", no_decode)
    start = time.perf_counter()
    again = load_cifar10(root, OFFLINE, download=False)
    took = time.perf_counter() - start
    assert again.label == "CIFAR-10 (JPEG copy)"
    assert torch.equal(again.x_train, ds.x_train) and torch.equal(again.y_test, ds.y_test)
    assert took < 5.0 and took < first, (took, first)
    # the cache is used even without an offline dir
    assert load_cifar10(root, None, download=False).source == str(root / sources.CIFAR10_CACHE)


@pytest.mark.slow
def test_cifar_holdout_and_pooled(cifar):
    root, ds, _ = cifar
    ho = load_cifar10(root, None, download=False, split="holdout")
    assert ho.split == "holdout"
    assert (len(ho.x_train), len(ho.y_train), len(ho.x_test), len(ho.y_test)) == (45000, 45000, 5000, 5000)
    tr, te = holdout_indices(50000, 0.1, 42)
    assert np.array_equal(np.sort(np.concatenate([tr, te])), np.arange(50000))  # disjoint and complete
    assert torch.equal(ho.x_train, ds.x_train[tr]) and torch.equal(ho.y_train, ds.y_train[tr])
    assert torch.equal(ho.x_test, ds.x_train[te]) and torch.equal(ho.y_test, ds.y_train[te])
    pooled = load_cifar10(root, None, download=False, split="pooled")
    assert (len(pooled.y_train), len(pooled.y_test)) == (54000, 6000)


def _fake_torchvision_cifar(root: Path, per_batch: int = 4) -> tuple[np.ndarray, list[int]]:
    """Tiny files in torchvision's CIFAR-10 layout (only to test the NHWC -> NCHW conversion)."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    rows, labels = [], []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        lab = rng.integers(0, 10, per_batch).tolist()
        with open(folder / name, "wb") as f:
            pickle.dump({"data": data, "labels": lab}, f)
        rows.append(data)
        labels += lab
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": list(sources.CIFAR10_CLASSES)}, f)
    return np.concatenate(rows), labels


def test_cifar_torchvision_copy_comes_first(tmp_path, monkeypatch):
    import torchvision.datasets.cifar as tv_cifar

    rows, labels = _fake_torchvision_cifar(tmp_path / "root")
    monkeypatch.setattr(tv_cifar, "check_integrity", lambda *a, **k: True)  # fake files have other md5s
    ds = load_cifar10(tmp_path / "root", tmp_path / "empty", download=False)
    assert ds.label == "CIFAR-10" and ds.source.startswith("torchvision:")
    assert ds.x_train.shape == (20, 3, 32, 32) and ds.x_train.is_contiguous()
    assert torch.equal(ds.x_train, torch.from_numpy(rows[:20]).view(20, 3, 32, 32))
    assert torch.equal(ds.x_test.flatten(1), torch.from_numpy(rows[20:]))
    assert ds.y_train.tolist() == labels[:20] and ds.y_test.dtype == torch.int64


@pytest.mark.slow
def test_the_datasets_load_without_importing_torchvision(cifar, data_root):
    """torchvision costs about 2 s at the start of every run: it is imported only to download, to check an
    offline copy the first time, or for torchvision's own CIFAR-10 files, whose names are checked here."""
    from torchvision.datasets import CIFAR10

    assert (sources.cifar10.TORCHVISION_FOLDER, sources.cifar10.TORCHVISION_URL) == (CIFAR10.base_folder, CIFAR10.url)
    load_fashion_mnist(data_root, OFFLINE, download=False)               # the offline copy, extracted once
    code = (f"import sys; from normfl.data import load_cifar10, load_fashion_mnist\n"
            f"c = load_cifar10({str(cifar[0])!r}, {str(OFFLINE)!r}, download=False)\n"
            f"f = load_fashion_mnist({str(data_root)!r}, {str(OFFLINE)!r}, download=False)\n"
            "print(c.label, f.label, 'torchvision' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["CIFAR-10", "(JPEG", "copy)", "Fashion-MNIST", "False"], out.stderr[-2000:]


def test_cifar_not_found_lists_places(tmp_path):
    root, offline = tmp_path / "root", tmp_path / "offline"
    offline.mkdir()
    with pytest.raises(DataNotFoundError) as err:
        load_cifar10(root, offline, download=False)
    msg = str(err.value)
    places = [root / "cifar-10-batches-py", root / sources.CIFAR10_CACHE, "download=False"]
    places += [
        offline / sources.CIFAR10_JPEG_ARCHIVE,
        offline / sources.CIFAR10_LABELS,
        "NORMFL_OFFLINE_DATA",
    ]
    for place in places:
        assert str(place) in msg
    with pytest.raises(DataNotFoundError, match="offline_dir=None"):
        load_cifar10(root, None, download=False)


@pytest.mark.parametrize("loader", [load_cifar10, load_fashion_mnist])
def test_relative_places_name_the_working_directory(loader, tmp_path, monkeypatch):
    """A relative root or offline folder (the default ../shared/data, say) is read from the working directory:
    run from elsewhere, the error says which one; an absent offline copy is called missing, not damaged."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataNotFoundError) as err:
        loader("data", "../elsewhere", download=False)
    assert f"relative paths are read from the working directory, {tmp_path}" in str(err.value)
    assert "wrong md5" not in str(err.value)
    with pytest.raises(DataNotFoundError) as err:
        loader(tmp_path / "data", tmp_path / "offline", download=False)
    assert "working directory" not in str(err.value)


def test_offline_dir_from_env_var(tmp_path, monkeypatch):
    monkeypatch.setenv(sources.OFFLINE_ENV, str(tmp_path / "from-env"))
    with pytest.raises(
        DataNotFoundError, match=re.escape(str(tmp_path / "from-env" / sources.CIFAR10_JPEG_ARCHIVE))
    ):
        load_cifar10(tmp_path / "root", None, download=False)


def test_unreachable_download_is_skipped_fast(tmp_path, monkeypatch):
    monkeypatch.setattr(sources.places, "reachable", lambda url, timeout=3.0: "test: no network")
    with pytest.raises(DataNotFoundError, match="skipped \\(test: no network\\)"):
        load_cifar10(tmp_path, None, download=True)
    looked: list[str] = []
    monkeypatch.setattr(sources.places, "reachable", lambda url, timeout=3.0: None)
    assert not sources.places.try_download("http://x", True, lambda: 1 / 0, looked)
    assert "ZeroDivisionError" in looked[0]


def test_reachable_fails_fast_on_unknown_host():
    start = time.perf_counter()
    assert sources.places.reachable("https://no-such-host.invalid/x", timeout=1.0) is not None
    assert time.perf_counter() - start < 3.0


def test_bad_split_name(tmp_path):
    with pytest.raises(ValueError, match="split='train'.*standard"):
        load_cifar10(tmp_path, None, download=False, split="train")
    with pytest.raises(ValueError, match="holdout_fraction"):
        holdout_indices(10, 1.0, 0)


# --------------------------------------------------------------------------------------------- npz


def test_npz_round_trip_with_natural_clients(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (30, 8, 8, 3), dtype=np.uint8)
    y, client = rng.integers(0, 4, 30), np.repeat(np.arange(3), 10)
    x_test, y_test = rng.integers(0, 256, (6, 8, 8, 3), dtype=np.uint8), np.array([0, 1, 2, 3, 4, 4])
    np.savez(tmp_path / "toy.npz", x=x, y=y, x_test=x_test, y_test=y_test, client=client)
    ds = load_npz(tmp_path / "toy.npz")
    assert (ds.name, ds.label, ds.num_classes, ds.mean) == ("npz", "npz:toy.npz", 5, ())
    assert ds.x_train.shape == (30, 3, 8, 8) and ds.x_train.dtype == torch.uint8
    assert torch.equal(ds.x_train, torch.from_numpy(x).permute(0, 3, 1, 2))
    assert ds.y_train.dtype == torch.int64 and ds.client_ids.tolist() == client.tolist()
    ho = load_npz(tmp_path / "toy.npz", split="holdout", holdout_fraction=0.2, split_seed=3)
    tr, te = holdout_indices(30, 0.2, 3)
    assert ho.client_ids.tolist() == client[tr].tolist() and ho.y_test.tolist() == y[te].tolist()


def test_npz_without_test_arrays_needs_holdout(tmp_path):
    x = np.random.default_rng(0).normal(size=(20, 5))
    np.savez(tmp_path / "flat.npz", x=x, y=np.arange(20) % 2)
    with pytest.raises(ValueError, match="holdout"):
        load_npz(tmp_path / "flat.npz")
    ds = load_npz(tmp_path / "flat.npz", split="holdout")
    assert ds.x_train.dtype == torch.float32 and ds.x_train.shape == (18, 5) and len(ds.y_test) == 2
    np.savez(tmp_path / "gray.npz", x=np.zeros((4, 6, 6), np.uint8), y=np.zeros(4, int))
    assert load_npz(tmp_path / "gray.npz", split="holdout", holdout_fraction=0.25).x_train.shape == (
        3,
        1,
        6,
        6,
    )


def test_npz_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.npz"):
        load_npz(tmp_path / "nope.npz")


# -------------------------------------------------------------------------------------- transforms


def test_normalize():
    x = torch.full((2, 3, 4, 4), 255, dtype=torch.uint8)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    out = normalize(x, mean, std)
    assert out.dtype == torch.float32
    for c in range(3):
        assert torch.allclose(out[:, c], torch.tensor((1 - mean[c]) / std[c]))
    assert torch.equal(normalize(torch.zeros(2, 1, 3, 3, dtype=torch.uint8)), torch.zeros(2, 1, 3, 3))
    f = torch.rand(2, 5, dtype=torch.float64)
    assert torch.allclose(normalize(f), f.float())  # float input without mean: only cast
    assert torch.allclose(normalize(f, (0.5,), (0.25,)), (f.float() - 0.5) / 0.25)
    with pytest.raises(ValueError):
        normalize(x, (0.5, 0.5), (1.0, 1.0))


def test_augment_is_deterministic_and_shape_preserving():
    x = torch.rand(64, 3, 32, 32)
    a = augment_crop_flip(x, torch.Generator().manual_seed(7))
    b = augment_crop_flip(x, torch.Generator().manual_seed(7))
    c = augment_crop_flip(x, torch.Generator().manual_seed(8))
    assert a.shape == x.shape and torch.equal(a, b) and not torch.equal(a, c)
    xu = (x * 255).to(torch.uint8)  # uint8 works too (pad = black), same draws as for float
    u = augment_crop_flip(xu, torch.Generator().manual_seed(7))
    assert u.dtype == torch.uint8 and torch.equal(
        u.float(), augment_crop_flip(xu.float(), torch.Generator().manual_seed(7))
    )


def test_augment_flip_only_without_padding():
    x = torch.rand(200, 2, 5, 7)
    out = augment_crop_flip(x, torch.Generator().manual_seed(0), padding=0)
    same = (out == x).flatten(1).all(1)
    flipped = (out == x.flip(-1)).flatten(1).all(1)
    assert bool((same | flipped).all()) and 50 < int(flipped.sum()) < 150


def crops_of(x: torch.Tensor, out: torch.Tensor, padding: int) -> torch.Tensor:
    """[3, B] (top offset, left offset, flipped) of each output: which window of the zero-padded input it is,
    flipped or not, read off two pixels (x[i, 0, r, c] = 1 + (i·H + r)·W + c, and rows and columns p, p + 1 of
    a window of an input larger than 2p + 1 each way come from the input); then every output must be that
    window, pixel for pixel."""
    b, _, h, w = x.shape
    assert h > 2 * padding + 1 and w > 2 * padding + 1 and torch.equal(x.flatten(), torch.arange(1, x.numel() + 1.0))
    a, c = (out[:, 0, padding, padding + j].long() - 1 for j in (0, 1))
    assert bool((a >= 0).all() and ((a // w) == (c // w)).all())            # from one row of the input
    row, col, flip = a // w % h, a % w, (c % w < a % w).long()
    found = torch.stack([row, col - flip * (w - 1 - 2 * padding), flip])      # top, left; a flip mirrors the window
    padded = torch.nn.functional.pad(x, (padding,) * 4)
    for dy, dx, f in found.unique(dim=1).T.tolist():
        sel = ((found[0] == dy) & (found[1] == dx) & (found[2] == f)).nonzero().flatten()
        window = padded[sel, :, dy:dy + h, dx:dx + w]
        assert torch.equal(out[sel], window.flip(-1) if f else window), (dy, dx, f)
    return found


@pytest.mark.parametrize("padding", [1, 4])
def test_augment_crops_every_offset_uniformly_and_flips_half(padding):
    """RandomCrop(padding) takes each of the (2p+1)² offsets with equal chance and flips half of the crops,
    independently: a biased crop (offsets from range(2p), or from one side only, top and left tied), a flip
    always or never, or offsets applied to the other axis are caught. Each output's offset and flip are read
    back exactly from inputs whose every pixel is distinct: all (2p+1)²·2 cells must occur, the counts pass a
    chi-square test of uniformity at level 1e-6, the flips a 5-sigma bound, and the outputs are the draws of
    draw_crop_flip (top for rows, left for columns) for the same generator, drawn in the order the runs use."""
    k = 2 * padding + 1
    b, h, w = 100 * 2 * k * k, k + 1, k + 2          # 100 expected per cell; every window holds input pixels
    x = torch.arange(1, b * h * w + 1, dtype=torch.float32).view(b, 1, h, w)
    out = augment_crop_flip(x, torch.Generator().manual_seed(0), padding=padding)
    top, left, flip = crops_of(x, out, padding)
    assert torch.equal(torch.stack([top, left, flip]), draw_crop_flip(b, torch.Generator().manual_seed(0), padding))
    if padding == 4:                                   # the draws of the runs' CIFAR-10 augmentation, seed 0
        assert (top[:4].tolist(), left[:4].tolist(), flip[:4].tolist()) == ([8, 0, 2, 6], [4, 2, 0, 5], [0, 0, 1, 1])
    counts = torch.bincount((top * k + left) * 2 + flip, minlength=2 * k * k).double()
    assert bool((counts > 0).all())
    chi2 = float(((counts - 100) ** 2 / 100).sum())
    assert chi2 < {1: 60.1, 4: 261.1}[padding], chi2   # chi-square isf(1e-6) for 2k²-1 = 17 and 161 degrees
    assert abs(int(flip.sum()) - b / 2) < 5 * (b / 4) ** 0.5
