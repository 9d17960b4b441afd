"""BatchNorm's running statistics: one rule for every backend (reading A4, docs/readings.md).

Every client's forward pass runs in train mode, so it normalises with the statistics of its own
batch. The evaluation model's running statistics are updated by the clients' batches in client
order, as if each client ran its forward pass in turn on one shared model. A backend that runs the
clients side by side gives every client a copy of the running buffers, lets each update its copy,
and folds the copies in client order afterwards: with momentum m, copy_i = (1-m) r + m mu_i, and the
sequential result is (1-m)^n r + sum_i (1-m)^(n-1-i) (copy_i - (1-m) r). Buffers are never
communicated or averaged across clients beyond this, and they are not part of x.
"""

from __future__ import annotations

import torch
from torch import nn

STATS = ("running_mean", "running_var")


def tracked(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The BatchNorm layers of ``module`` that keep running statistics, by name."""
    out = []
    for prefix, m in module.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
            if m.momentum is None:
                raise NotImplementedError("BatchNorm with momentum=None (a cumulative average) is not supported "
                                          "by the backends that run clients side by side")
            out.append((prefix, m))
    return out


def _key(prefix: str, stat: str) -> str:
    return f"{prefix}.{stat}" if prefix else stat


def client_copies(module: nn.Module, start: dict, n: int) -> dict[str, torch.Tensor]:
    """Each of n clients' own copy of the running statistics, ``[n, C]`` per buffer."""
    return {_key(p, s): start[_key(p, s)].expand(n, *start[_key(p, s)].shape).clone()
            for p, _ in tracked(module) for s in STATS}


def fold_running_stats(module: nn.Module, start: dict, copies: dict, n: int) -> dict:
    """Compose n clients' updates of their copies (``[n, C]`` per buffer) in client order."""
    out = dict(start)
    for prefix, m in tracked(module):
        keep = 1.0 - m.momentum
        for stat in STATS:
            key = _key(prefix, stat)
            r, c = start[key], copies[key]
            pw = keep ** torch.arange(n - 1, -1, -1, device=c.device, dtype=c.dtype)
            out[key] = keep ** n * r + (pw[:, None] * (c - keep * r)).sum(0)
        key = _key(prefix, "num_batches_tracked")
        out[key] = start[key] + n
    return out
