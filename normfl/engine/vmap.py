"""One ``torch.func.vmap(grad_and_value(functional_call))`` over the client axis.

Every client gets a copy of the BatchNorm running buffers; the copies are folded in client order
afterwards (``normfl.engine.batchnorm``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad_and_value, vmap

from normfl.engine.batchnorm import fold_running_stats


def grads(flat, x: torch.Tensor, piece) -> tuple[torch.Tensor, torch.Tensor]:
    """As ``sequential.grads``; every client's batch must have the same shape."""
    n = len(piece)
    xb = torch.stack([p[0] for p in piece])
    yb = torch.stack([p[1] for p in piece])
    buffers = {k: b.expand(n, *b.shape).clone() for k, b in flat.module.named_buffers()}

    def loss_fn(params, bufs, xs, ys):
        return F.cross_entropy(functional_call(flat.module, (params, bufs), (xs,)), ys)

    in_x = 0 if x.dim() == 2 else None
    with flat.layout.off():
        g, losses = vmap(grad_and_value(loss_fn), in_dims=(in_x, 0, 0, 0))(flat.as_params(x), buffers, xb, yb)
    G = torch.cat([g[name].reshape(n, -1) for name in flat.names], dim=1)
    fold_running_stats(flat.module, buffers, n)
    return G, losses.detach()
