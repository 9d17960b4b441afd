"""The reference backend: a plain loop over clients with autograd, one client's batch at a time."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def grads(flat, x: torch.Tensor, piece) -> tuple[torch.Tensor, torch.Tensor]:
    """``G[i]``, ``loss[i]``: the gradient and mean loss of client i's batch ``piece[i]`` at x (``[d]``) or X[i]."""
    params = list(flat.module.parameters())
    G = torch.empty(len(piece), flat.dim, device=x.device, dtype=x.dtype)
    losses = torch.empty(len(piece), device=x.device, dtype=x.dtype)
    if x.dim() == 1:
        flat.load(x)
    for i, (xb, yb, _) in enumerate(piece):
        if x.dim() == 2:
            flat.load(x[i])
        loss = F.cross_entropy(flat.forward(xb), yb)
        torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)], out=G[i])
        losses[i] = loss.detach()
    return G, losses
