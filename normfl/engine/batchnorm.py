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

import functools

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


@functools.lru_cache(maxsize=64)
def _powers(keep: float, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(1-m)^(n-1-i) for i = 0..n-1: the weight of client i's update once the clients after it have run."""
    return keep ** torch.arange(n - 1, -1, -1, device=device, dtype=dtype)


def fold_running_stats(module: nn.Module, copies: dict, n: int) -> None:
    """Compose n clients' updates of their copies (``[n, C]`` per buffer) in client order, into the module's
    running statistics, in place: r <- (1-m)^n r + sum_i (1-m)^(n-1-i) (copy_i - (1-m) r)."""
    buffers = dict(module.named_buffers())
    for prefix, m in tracked(module):
        keep = 1.0 - m.momentum
        for stat in STATS:
            r, c = buffers[_key(prefix, stat)], copies[_key(prefix, stat)]
            update = (_powers(keep, n, c.dtype, c.device)[:, None] * (c - keep * r)).sum(0)
            r.mul_(keep ** n).add_(update)
        buffers[_key(prefix, "num_batches_tracked")].add_(n)


class ClientStats:
    """n clients' copies of a module's running statistics in buffers made once (a captured pass reads and
    writes the same addresses each time): ``fill`` sets every copy to the module's statistics and returns
    them, ``fold`` composes the clients' updates back into the module (``fold_running_stats``)."""

    def __init__(self, module: nn.Module, n: int):
        self.module, self.n = module, n
        live = dict(module.named_buffers())
        self.copies = {_key(p, s): live[_key(p, s)].new_empty(n, *live[_key(p, s)].shape)
                       for p, _ in tracked(module) for s in STATS}

    def fill(self) -> dict[str, torch.Tensor]:
        live = dict(self.module.named_buffers())
        for key, copy in self.copies.items():
            copy.copy_(live[key].expand_as(copy))
        return self.copies

    def fold(self) -> None:
        fold_running_stats(self.module, self.copies, self.n)


class RunsStats(ClientStats):
    """``ClientStats`` of runs side by side in one pass (``run.vectorized``): n clients of each run, run after
    run; each run's copies start from its own module's statistics and fold back into it."""

    def __init__(self, modules: list[nn.Module], n: int):
        super().__init__(modules[0], len(modules) * n)
        self.runs = [(m, slice(r * n, (r + 1) * n)) for r, m in enumerate(modules)]

    def fill(self) -> dict[str, torch.Tensor]:
        for module, rows in self.runs:
            live = dict(module.named_buffers())
            for key, copy in self.copies.items():
                copy[rows].copy_(live[key].expand_as(copy[rows]))
        return self.copies

    def fold(self) -> None:
        for module, rows in self.runs:
            fold_running_stats(module, {k: v[rows] for k, v in self.copies.items()}, rows.stop - rows.start)
