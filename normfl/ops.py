"""Shared parts of every algorithm: pure functions on tensors with a leading client axis.

A "stack" is a ``[clients, d]`` tensor (one flat vector per client). Norms are one global l2 norm
per row (spec normec.md §1.2), never per layer.
"""

from __future__ import annotations

import torch


def row_norms(v: torch.Tensor) -> torch.Tensor:
    """l2 norm of each row of ``[n, d]`` as ``[n, 1]`` (or of a vector as a 0-d tensor)."""
    return torch.linalg.vector_norm(v, dim=-1, keepdim=v.dim() > 1)


def norm_alpha(v: torch.Tensor, alpha: float) -> torch.Tensor:
    """Smoothed normalization Norm_α(v) = v / (α + ||v||), row-wise; Norm_0(0) = 0 [resolution]."""
    denom = alpha + row_norms(v)
    return v / torch.where(denom > 0, denom, torch.ones_like(denom))


def clip(v: torch.Tensor, tau: float) -> torch.Tensor:
    """Clipping Clip_τ(v) = min(1, τ/||v||) v, row-wise; Clip_τ(0) = 0."""
    n = row_norms(v)
    return v * torch.clamp(tau / torch.where(n > 0, n, torch.ones_like(n)), max=1.0)


def normalize(v: torch.Tensor) -> torch.Tensor:
    """v / ||v|| with 0/0 = 0 (NORMEC §4, server normalization)."""
    return norm_alpha(v, 0.0)


def server_step(x: torch.Tensor, direction: torch.Tensor, step: float, normalized: bool) -> torch.Tensor:
    """x - step * direction, or x - step * direction / ||direction|| with server normalization."""
    return x - step * (normalize(direction) if normalized else direction)


class GaussianNoise:
    """Gaussian privatizer: adds N(0, std^2 I) to each row of a stack.

    ``std`` is the per-coordinate standard deviation on the vector it is applied to; ``who`` says
    whether each client adds its own noise ('client') or the server adds one draw ('server').
    Draws come from a generator seeded by (seed, round), so a run is reproducible and every client
    and round gets fresh noise. ``std = 0`` adds nothing and draws nothing.
    """

    def __init__(self, std: float, seed: int, who: str = "client"):
        self.std, self.seed, self.who = float(std), int(seed), who

    def __call__(self, v: torch.Tensor, round_: int) -> torch.Tensor:
        if self.std == 0.0:
            return v
        gen = torch.Generator(device=v.device).manual_seed(self.seed * 1_000_003 + round_)
        return v + self.std * torch.randn(v.shape, generator=gen, device=v.device, dtype=v.dtype)
