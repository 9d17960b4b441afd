"""Shared parts of every algorithm: pure functions on tensors with a leading client axis.

A "stack" is a ``[clients, d]`` tensor (one flat vector per client). Norms are one global l2 norm
per row (spec normec.md §1.2), never per layer.
"""

from __future__ import annotations

import numpy as np
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


def round_generator(seed: int, stream: int, round_: int, device) -> torch.Generator:
    """A generator for one (seed, stream, round): independent streams for noise and participation."""
    state = np.random.SeedSequence([seed, stream, round_]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator(device=device).manual_seed(int(state) & (2**63 - 1))


class GaussianNoise:
    """Gaussian privatizer: adds N(0, std^2 I) to each row of a stack (or to one vector).

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
        gen = round_generator(self.seed, 0, round_, v.device)
        return v + self.std * torch.randn(v.shape, generator=gen, device=v.device, dtype=v.dtype)


def bernoulli_weights(n: int, p: float, seed: int, round_: int, device=None) -> torch.Tensor:
    """q_i = 1/p with probability p, else 0, independently per client (FEDNORMEC Alg. 1 line 7)."""
    if p >= 1.0:
        return torch.ones(n, device=device)
    gen = round_generator(seed, 1, round_, device)
    return (torch.rand(n, generator=gen, device=device) < p).float() / p


def cohort(n: int, size: int, seed: int, round_: int, device=None) -> torch.Tensor:
    """The ids (sorted) of a uniform cohort of ``size`` of the n clients, drawn without replacement."""
    gen = round_generator(seed, 1, round_, device)
    return torch.randperm(n, generator=gen, device=device)[:size].sort().values


def cohort_weights(n: int, size: int, seed: int, round_: int, device=None) -> torch.Tensor:
    """The cohort weighted n/size (0 for the rest), so that (1/n) sum_i q_i u_i is the cohort mean."""
    q = torch.zeros(n, device=device)
    q[cohort(n, size, seed, round_, device)] = n / size
    return q
