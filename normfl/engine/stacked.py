"""The stacked backend: every client of a round in ONE forward and ONE backward pass.

Client i is group i of every layer. The clients' batches are stacked along the channel axis, so B
images of C channels for G clients are one tensor ``[B, G·C, H, W]`` (flat features: ``[B, G·F]``),
and each layer acts on it as G independent copies of itself:

- Conv2d: a grouped convolution, client i's filters on group i of the channels;
- BatchNorm2d: one BatchNorm over the G·C channels, so each client normalises with its own batch
  statistics and updates its own copy of the running statistics, folded in client order afterwards
  (``normfl.engine.batchnorm``);
- GroupNorm: G times the groups over G times the channels;
- Linear: a batched matmul of ``[B, G, in]`` with client i's ``[out, in]``;
- ReLU, pooling, Flatten, ResNet20's option-A shortcut: on each group's channels as they are.

Gradients: X is ``[G, d]``, one row per client, and the layers read their weights as views of it, so
one backward pass of the sum of the clients' mean losses leaves each client's gradient in its row.
Batches of unequal size (DP-SGD's Poisson batches, uneven shards) are padded to the largest with a
mask, which keeps every sample's weight exact; models with BatchNorm need equal batches, since padding
would enter the batch statistics.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from normfl import models
from normfl.engine.batchnorm import ClientStats
from normfl.engine.clipping import clip_factors, norm_layers, sq_norms


class NotStackable(ValueError):
    """A layer the stacked backend cannot run group by group."""


class _Conv2d(nn.Module):
    def __init__(self, m: nn.Conv2d):
        super().__init__()
        if m.padding_mode != "zeros":
            raise NotStackable(f"a Conv2d with padding_mode={m.padding_mode!r}")
        self.weight, self.bias = m.weight, m.bias              # the same names; given [G, *shape] at call time
        self.stride, self.padding, self.dilation, self.groups = m.stride, m.padding, m.dilation, m.groups
        self.kernel_size = m.kernel_size

    def forward(self, x):
        w = self.weight
        b = None if self.bias is None else self.bias.reshape(-1)
        return F.conv2d(x, w.flatten(0, 1), b, self.stride, self.padding, self.dilation, w.shape[0] * self.groups)


class _Linear(nn.Module):
    def __init__(self, m: nn.Linear):
        super().__init__()
        self.weight, self.bias = m.weight, m.bias

    def forward(self, x):
        if x.dim() != 2:
            raise NotStackable("a Linear layer on inputs of more than two axes")
        g, _, width = self.weight.shape
        y = torch.einsum("bgi,goi->bgo", x.reshape(len(x), g, width), self.weight)
        return (y if self.bias is None else y + self.bias).flatten(1)


class _BatchNorm2d(nn.Module):
    def __init__(self, m: nn.BatchNorm2d):
        super().__init__()
        self.weight, self.bias, self.momentum, self.eps = m.weight, m.bias, m.momentum, m.eps
        self.register_buffer("running_mean", m.running_mean)   # given [G, C] copies at call time
        self.register_buffer("running_var", m.running_var)

    def forward(self, x):
        rm, rv = (None if b is None else b.view(-1) for b in (self.running_mean, self.running_var))
        w, b = (None if p is None else p.reshape(-1) for p in (self.weight, self.bias))
        return F.batch_norm(x, rm, rv, w, b, self.training or rm is None, self.momentum or 0.0, self.eps)


class _GroupNorm(nn.Module):
    def __init__(self, m: nn.GroupNorm):
        super().__init__()
        self.weight, self.bias, self.num_groups, self.num_channels, self.eps = (
            m.weight, m.bias, m.num_groups, m.num_channels, m.eps)

    def forward(self, x):
        w, b = (None if p is None else p.reshape(-1) for p in (self.weight, self.bias))
        return F.group_norm(x, x.shape[1] // self.num_channels * self.num_groups, w, b, self.eps)


class _ShortcutA(nn.Module):
    def __init__(self, m: models.ShortcutA):
        super().__init__()
        self.c_in, self.pad = m.c_in, m.pad

    def forward(self, x):
        s = x[:, :, ::2, ::2]
        s = s.reshape(len(s), s.shape[1] // self.c_in, self.c_in, *s.shape[2:])
        return F.pad(s, (0, 0, 0, 0, self.pad, self.pad)).flatten(1, 2)


GROUPED = {nn.Conv2d: _Conv2d, nn.Linear: _Linear, nn.BatchNorm2d: _BatchNorm2d, nn.GroupNorm: _GroupNorm,
           models.ShortcutA: _ShortcutA}
# Modules whose own code only acts per channel (or per group of channels as a whole): they run as they are.
# ResNet20 and its block slice H and W, add, and pool; their shape-changing shortcut is a ShortcutA.
AS_IS = (nn.Sequential, nn.ReLU, nn.MaxPool2d, nn.AvgPool2d, nn.Identity, models.ResNet20, models._BasicBlock)


def grouped(module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose layers act group by group (parameter and buffer names unchanged);
    NotStackable names the first module it cannot run so."""
    def convert(m: nn.Module, name: str) -> nn.Module:
        if type(m) in GROUPED:
            return GROUPED[type(m)](m)
        flatten_all = isinstance(m, nn.Flatten) and (m.start_dim, m.end_dim) == (1, -1)
        if type(m) not in AS_IS and not flatten_all:
            raise NotStackable(f"{name or 'the model'} is a {type(m).__name__}")
        for child_name, child in list(m.named_children()):
            setattr(m, child_name, convert(child, f"{name}.{child_name}".lstrip(".")))
        return m

    return convert(copy.deepcopy(module), "")


def stack_inputs(piece, capacity: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(inputs ``[B, G·C, ...]``, labels ``[B, G]``, mask ``[B, G]`` or None) of G clients' batches;
    batches shorter than the longest, or than ``capacity`` (a size fixed for a run, so that passes keep
    one shape), are padded with zeros and masked out."""
    sizes = [len(p[1]) for p in piece]
    cap = max(max(sizes), capacity or 0)
    if min(sizes) == cap:
        return torch.stack([p[0] for p in piece], 1).flatten(1, 2), torch.stack([p[1] for p in piece], 1), None
    xb = piece[0][0].new_zeros(cap, len(piece), *piece[0][0].shape[1:])
    yb = piece[0][1].new_zeros(cap, len(piece))
    for i, (x, y, _) in enumerate(piece):
        xb[:len(y), i], yb[:len(y), i] = x, y
    mask = torch.arange(cap, device=yb.device)[:, None] < torch.tensor(sizes).to(yb.device, non_blocking=True)
    return xb.flatten(1, 2), yb, mask


class StackedPass:
    """The run's model with client i as group i (see the module docstring)."""

    def __init__(self, flat):
        self.flat = flat
        self.module = grouped(flat.module)
        flat.grouped_layout.cover([m for m in self.module.modules() if isinstance(m, _Conv2d)])
        self.has_batchnorm = any(isinstance(m, nn.BatchNorm2d) for m in flat.module.modules())
        layers = norm_layers(flat.module)       # per-sample norms from layer inputs: the same layers, grouped
        names = {id(m): n for n, m in flat.module.named_modules()}
        mods = dict(self.module.named_modules())
        self.norm_layers = None if layers is None else [(names[id(m)], mods[names[id(m)]]) for m in layers]
        self.client_stats: dict[int, ClientStats] = {}         # by number of clients in a pass

    @torch.no_grad()
    def check(self, in_shape) -> None:
        """NotStackable unless the grouped model maps two clients' inputs of this shape to their outputs side
        by side (a Linear layer on inputs of more than two axes, say, does not): one pass of two zero samples."""
        x = torch.zeros(2, *in_shape, device=self.flat.device)
        X = self.flat.vector().expand(2, -1)
        stats = ClientStats(self.flat.module, 2).fill()
        out = functional_call(self.module, (self.flat.as_params(X), stats), (torch.stack([x, x], 1).flatten(1, 2),))
        self.flat.module.eval()
        want = self.flat.module(x).shape
        self.flat.module.train()
        if tuple(out.shape) != (2, 2 * want[1]) or len(want) != 2:
            raise NotStackable(f"the grouped model's output has shape {tuple(out.shape)} for outputs of shape "
                               f"{tuple(want)}")

    def takes(self, piece) -> bool:
        """Whether these batches can go in one pass (unequal sizes only without BatchNorm)."""
        return not self.has_batchnorm or len({tuple(p[0].shape) for p in piece}) == 1

    def _points(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """X ``[n, d]``: x itself, or x repeated for every client; a leaf that gradients can flow to."""
        return (x.detach().expand(n, -1) if x.dim() == 1 else x.detach()).requires_grad_()

    def losses(self, X, piece, stats: dict | None = None, capacity: int | None = None, fp32: bool = False):
        """Each client's mean loss on its batch at its row of X ([G]), and the output ``[B, G, K]``;
        ``stats``: the clients' copies of the BatchNorm running statistics, updated in place; ``capacity``:
        see ``stack_inputs``; ``fp32``: in fp32 whatever the run's precision."""
        return self.losses_stacked(X, *stack_inputs(piece, capacity), stats, fp32)

    def losses_stacked(self, X, xb, yb, mask, stats: dict | None = None, fp32: bool = False):
        """``losses`` of inputs already stacked (``stack_inputs``)."""
        run = (lambda fn, *args: fn(*args)) if fp32 else self.flat.run
        out = run(functional_call, self.module, (self.flat.as_params(X), stats or {}), (xb,))
        b, g = yb.shape
        ce = F.cross_entropy(out.reshape(b * g, -1), yb.reshape(-1), reduction="none").view(b, g)
        if mask is None:
            return ce.mean(0), ce
        ce = ce * mask
        return ce.sum(0) / mask.sum(0).clamp_min(1), ce

    def grads(self, x, piece, stats: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``([G, d] gradients, [G] mean losses)`` of G clients' batches at x (``[d]``) or X (``[G, d]``).
        Without ``stats``, BatchNorm's running statistics are the flat model's, updated by the rule."""
        X = self._points(x, len(piece))
        own = None
        if stats is None and self.has_batchnorm:
            if len(piece) not in self.client_stats:
                self.client_stats[len(piece)] = ClientStats(self.flat.module, len(piece))
            own = self.client_stats[len(piece)]
            stats = own.fill()
        loss, _ = self.losses(X, piece, stats)
        (G,) = torch.autograd.grad(loss.sum(), X)
        if own is not None:
            own.fold()
        return G, loss.detach()

    def clipped_sums(self, x, pieces, clip: float, capacity: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """DP-SGD's per-sample clipped gradient sums of G clients' batches (``clipping.clipped_by_norms``
        for all clients in one pass), padded to ``capacity``; needs a model of Linear and Conv2d layers only.
        In fp32 under any precision, as the sequential path's (precision=bf16 leaves DP-SGD's clipping alone)."""
        X = self._points(x, len(pieces))
        inputs, outputs = {}, {}

        def keep(m, args, out):
            inputs[m], outputs[m] = args[0], out

        hooks = [m.register_forward_hook(keep) for _, m in self.norm_layers]
        try:
            loss, ce = self.losses(X, pieces, capacity=capacity, fp32=True)
        finally:
            for h in hooks:
                h.remove()
        deltas = torch.autograd.grad(ce.sum(), [outputs[m] for _, m in self.norm_layers])
        b, g = ce.shape
        sq = torch.zeros(b, g, device=ce.device, dtype=torch.float64)
        parts = []
        for (name, m), delta in zip(self.norm_layers, deltas, strict=True):
            a = inputs[m].detach()
            if isinstance(m, _Linear):
                a, delta = a.reshape(b, g, -1), delta.reshape(b, g, -1)
                sq += sq_norms(delta, 2) * (sq_norms(a, 2) + (m.bias is not None))
                parts.append((name, m, a, delta))
            else:
                u = F.unfold(a, m.kernel_size, m.dilation, m.padding, m.stride)
                u = u.view(b, g, -1, u.shape[-1])                                       # [b, g, in·k·k, L]
                dl = delta.flatten(2).view(b, g, -1, u.shape[-1])                        # [b, g, out, L]
                per_sample = torch.einsum("bgol,bgkl->bgok", dl, u)
                sq += sq_norms(per_sample, 2)
                bias = None
                if m.bias is not None:
                    bias = dl.sum(3)                                                     # [b, g, out]
                    sq += sq_norms(bias, 2)
                parts.append((name, m, per_sample, bias))
        c = clip_factors(sq, clip).to(ce.dtype)                                          # [b, g]
        grads = {}
        for name, m, p, d in parts:
            if isinstance(m, _Linear):
                grads[f"{name}.weight"] = torch.einsum("bgo,bgi->goi", c[..., None] * d, p)
            else:
                grads[f"{name}.weight"] = torch.einsum("bg,bgok->gok", c, p)
            if m.bias is not None:
                grads[f"{name}.bias"] = torch.einsum("bg,bgo->go", c, d)
        sums = torch.cat([grads[n].reshape(g, -1) for n in self.flat.names], dim=1)
        return sums, loss.detach()
