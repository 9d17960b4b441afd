"""Batched preprocessing on tensors [B, C, ...] (no per-sample Python loops)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

# How stored pixels become model input. unit: uint8 / 255, then (x - mean) / std (every paper's text).
# raw: the 0-255 values as floats, no mean or std. The MindSpore port of ALI-DPFL trains on these: its
# generate_fmnist.py (cheng-t/ALI-DPFL, dataset/, lines 49-56) builds a Normalize transform but drops
# what ``map`` returns, so the saved arrays are the raw pixels.
SCALES = ("unit", "raw")


def normalize(x: torch.Tensor, mean: Sequence[float] | torch.Tensor = (), std: Sequence[float] | torch.Tensor = (),
              scale: str = "unit") -> torch.Tensor:
    """uint8 -> float32 in [0, 1]; then per-channel (x - mean) / std over dim 1 if `mean` is given (float32
    tensors already on x's device are used as they are, with no copy).

    Float input is only cast to float32 (no /255) before the optional normalization. With
    ``scale="raw"`` the values are only cast: uint8 pixels stay 0-255 and mean, std are not used.
    """
    if scale not in SCALES:
        raise ValueError(f"scale={scale!r} is not one of {SCALES}")
    if scale == "raw":
        return x.to(torch.float32)
    out = x.to(torch.float32) / 255.0 if x.dtype == torch.uint8 else x.to(torch.float32)
    if len(mean) != len(std):
        raise ValueError(f"mean {tuple(map(float, mean))} and std {tuple(map(float, std))} must have the same length")
    if not len(mean):
        return out
    if x.ndim < 2 or len(mean) not in (1, x.shape[1]):
        raise ValueError(
            f"mean has {len(mean)} channels but x has shape {tuple(x.shape)} (channels on dim 1)"
        )
    shape = (1, -1) + (1,) * (x.ndim - 2)
    m = torch.as_tensor(mean, dtype=torch.float32, device=x.device).view(shape)
    s = torch.as_tensor(std, dtype=torch.float32, device=x.device).view(shape)
    return (out - m) / s


def draw_crop_flip(b: int, generator: torch.Generator, padding: int = 4) -> torch.Tensor:
    """The random part of RandomCrop(padding) + RandomHorizontalFlip(0.5) for b samples, on the generator's
    device: ``[3, b]`` int64 rows (top offsets, left offsets, flips), three draws in that order."""
    top = torch.randint(0, 2 * padding + 1, (b,), generator=generator, device=generator.device)
    left = torch.randint(0, 2 * padding + 1, (b,), generator=generator, device=generator.device)
    flip = torch.rand(b, generator=generator, device=generator.device) < 0.5
    return torch.stack([top, left, flip.long()])


def crop_flip(x: torch.Tensor, draws: torch.Tensor, padding: int = 4) -> torch.Tensor:
    """Each sample of a [B,C,H,W] batch cropped and flipped as ``draws`` (``draw_crop_flip``) say, with zero
    fill: batched gathers on x's device, no per-sample loop.

    Zero fill means zero in x's own units: apply it to uint8 / [0, 1] images before `normalize` to pad with
    black pixels as torchvision does, or after it to pad with the mean colour."""
    if x.ndim != 4:
        raise ValueError(f"x must be [B, C, H, W], got shape {tuple(x.shape)}")
    if padding < 0:
        raise ValueError(f"padding={padding} must be >= 0")
    b, c, h, w = x.shape
    dev = x.device
    top, left, flip = draws.to(dev)
    if padding:
        x = F.pad(x, (padding, padding, padding, padding))
    rows = top[:, None] + torch.arange(h, device=dev)  # [B, H]
    cols_ = torch.arange(w, device=dev)
    cols = left[:, None] + torch.where(flip[:, None].bool(), w - 1 - cols_, cols_)  # [B, W]
    bi = torch.arange(b, device=dev).view(b, 1, 1, 1)
    ci = torch.arange(c, device=dev).view(1, c, 1, 1)
    return x[bi, ci, rows.view(b, 1, h, 1), cols.view(b, 1, 1, w)]


def augment_crop_flip(x: torch.Tensor, generator: torch.Generator, padding: int = 4) -> torch.Tensor:
    """RandomCrop(H×W, padding, zero fill) + RandomHorizontalFlip(0.5), per sample, for a [B,C,H,W] batch:
    ``crop_flip`` with ``draw_crop_flip``'s three draws from ``generator``."""
    if x.ndim != 4:
        raise ValueError(f"x must be [B, C, H, W], got shape {tuple(x.shape)}")
    return crop_flip(x, draw_crop_flip(len(x), generator, padding), padding)
