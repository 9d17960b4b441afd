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
import weakref

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


class _Packed:
    """A module's BatchNorm running statistics packed by width, made once per module (``packed``): the
    ``running_mean`` and ``running_var`` of every tracked layer of C channels become rows of one ``[L, C]``
    tensor (``rows[C]``), their ``num_batches_tracked`` entries of one ``[layers]`` tensor, so that a fold of all
    layers is a few tensor operations (a kernel launch each on a GPU) instead of a few per layer. The module
    keeps using them as its buffers (views); ``FlatModel.set_buffers`` writes into them in place."""

    def __init__(self, module: nn.Module):
        layers = tracked(module)
        self.keys: dict[int, list[str]] = {}            # width -> the buffer names of its rows, in order
        self.keep: dict[int, list[float]] = {}          # width -> 1 - momentum of each row's layer
        for prefix, m in layers:
            for stat in STATS:
                width = getattr(m, stat).shape[0]
                self.keys.setdefault(width, []).append(_key(prefix, stat))
                self.keep.setdefault(width, []).append(1.0 - m.momentum)
        live = dict(module.named_buffers())
        self.rows = {w: torch.stack([live[k] for k in keys]) for w, keys in self.keys.items()}
        self.counts = torch.stack([m.num_batches_tracked for _, m in layers]) if layers else None
        for w, keys in self.keys.items():
            for row, key in zip(self.rows[w], keys, strict=True):
                _set_buffer(module, key, row)
        for i, (prefix, _) in enumerate(layers):
            _set_buffer(module, _key(prefix, "num_batches_tracked"), self.counts[i])
        self._factors: dict[tuple[int, int], tuple] = {}

    def factors(self, w: int, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """For the rows of width w and a pass of n clients: 1-m of each row, (1-m)^(n-1-i) for client i, and
        (1-m)^n, shaped to meet ``[L, R, n, C]`` copies; made once (a tensor made from host values is a copy
        that waits on a GPU, and the thread path makes a ``ClientStats`` every pass)."""
        if (w, n) not in self._factors:
            rows, keep = self.rows[w], self.keep[w]
            like = {"dtype": rows.dtype, "device": rows.device}
            self._factors[w, n] = (torch.tensor(keep, **like)[:, None, None, None],
                                   torch.stack([_powers(k, n, **like) for k in keep])[:, None, :, None],
                                   torch.tensor([k ** n for k in keep], **like)[:, None, None])
        return self._factors[w, n]

    def backs(self, module: nn.Module) -> bool:
        """Whether the module's buffers are still these rows (``module.to`` or a buffer set anew replaces them)."""
        live = dict(module.named_buffers())
        return all(live[k].data_ptr() == row.data_ptr() for w, keys in self.keys.items()
                   for k, row in zip(keys, self.rows[w], strict=True))


def _set_buffer(module: nn.Module, key: str, value: torch.Tensor) -> None:
    owner, _, name = key.rpartition(".")
    setattr(module.get_submodule(owner) if owner else module, name, value)


_PACKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def packed(module: nn.Module) -> _Packed:
    """The module's packed running statistics (``_Packed``), made the first time it is asked for (and made anew
    if its buffers were replaced since): every ``ClientStats`` of one module shares them, so a CUDA graph that
    recorded a fold writes where the module reads."""
    pk = _PACKED.get(module)
    if pk is None or not pk.backs(module):
        pk = _PACKED[module] = _Packed(module)
    return pk


class ClientStats:
    """n clients' copies of the running statistics of one module, or of each of R modules of one architecture
    (runs side by side in one pass, ``run.vectorized``: n clients of each run, run after run), in buffers made
    once (a captured pass reads and writes the same addresses each time). ``fill`` sets every client's copies to
    its module's statistics and returns them (``[R·n, C]`` per buffer); ``fold`` composes the clients' updates
    back into each module, in client order (the rule of ``fold_running_stats``). Both work on all layers of a
    width at once (``_Packed``): about 30 tensor operations for a ResNet20 whatever R, against some 250 a
    module layer by layer."""

    def __init__(self, modules: nn.Module | list[nn.Module], n: int):
        modules = [modules] if isinstance(modules, nn.Module) else list(modules)
        self.packs, self.n = [packed(m) for m in modules], n
        first, r = self.packs[0], len(modules)
        self.copies, self._grouped, self._before = {}, {}, {}
        for w, keys in first.keys.items():
            grouped = first.rows[w].new_empty(len(keys), r * n, w)    # each layer's copies: one [R·n, C] block
            self._grouped[w] = (grouped.view(len(keys), r, n, w), *first.factors(w, n))
            self.copies.update(zip(keys, grouped, strict=True))

    def _stats(self, w: int) -> torch.Tensor:
        """The modules' rows of width w as ``[L, R, C]`` (a view for one module, a stacked copy for several)."""
        if len(self.packs) == 1:
            return self.packs[0].rows[w][:, None]
        return torch.stack([pk.rows[w] for pk in self.packs], 1)

    def fill(self) -> dict[str, torch.Tensor]:
        """Every client's copies set to its module's statistics, which ``fold`` then starts from (the pass between
        them changes only the copies)."""
        for w, (copies, *_) in self._grouped.items():
            self._before[w] = self._stats(w)
            copies.copy_(self._before[w][:, :, None])
        return self.copies

    def fold(self) -> None:
        """r <- (1-m)^n r + sum_i (1-m)^(n-1-i) (copy_i - (1-m) r), every layer and module at once."""
        for w, (copies, keep, powers, keep_n) in self._grouped.items():
            stats = self._before[w]
            update = (powers * (copies - keep * stats[:, :, None])).sum(2)
            if len(self.packs) == 1:
                stats.mul_(keep_n).add_(update)
            else:
                torch._foreach_copy_([pk.rows[w] for pk in self.packs], list((stats * keep_n + update).unbind(1)))
        counts = [pk.counts for pk in self.packs if pk.counts is not None]
        if counts:
            torch._foreach_add_(counts, self.n)
