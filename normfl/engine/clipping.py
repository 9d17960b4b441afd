"""DP-SGD's per-sample clipping of one client's batch: sum over its samples s of
∇ℓ(x; s) / max(1, ||∇ℓ(x; s)|| / C), with the mean loss.

Models built of Linear and Conv2d layers only (the MLP, the CNN, logreg) take one ordinary backward
pass to the layers' outputs: per-sample gradient norms come from each layer's inputs and output
gradients, and the clipped sum is built from the same pieces. Other models get per-sample gradients
from ``torch.func.vmap`` over the samples.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from normfl.syncs import host_side


def norm_layers(module: nn.Module) -> list[nn.Module] | None:
    """The Linear and Conv2d layers that hold every parameter of ``module``, or None if some parameter
    lives elsewhere (then per-sample norms cannot be read off layer inputs and output gradients)."""
    layers = [m for m in module.modules() if isinstance(m, nn.Linear)
              or (isinstance(m, nn.Conv2d) and m.groups == 1 and m.padding_mode == "zeros")]
    covered = {id(p) for m in layers for p in m.parameters(recurse=False)}
    return layers if layers and all(id(p) in covered for p in module.parameters()) else None


def clipped_by_norms(flat, x, xb, yb, clip: float, layers):
    """Clipped per-sample gradient sum of one client from one backward pass, to the layers' outputs.
    For a Linear layer the per-sample weight gradient is δ_s a_s^T, so its squared norm is
    ||δ_s||² ||a_s||² and the clipped sum is (c ⊙ δ)^T A; for a Conv2d it is δ_s U_s^T with U_s the
    unfolded input, formed per sample for its norm and then summed with the weights c_s."""
    flat.load(x)
    inputs, outputs = {}, {}

    def keep(m, args, out):                     # returns None: the forward pass is unchanged
        inputs[m], outputs[m] = args[0], out

    hooks = [m.register_forward_hook(keep) for m in layers]
    try:
        loss = F.cross_entropy(flat.module(xb), yb, reduction="none")
    finally:
        for h in hooks:
            h.remove()
    deltas = torch.autograd.grad(loss.sum(), [outputs[m] for m in layers])
    sq = torch.zeros(len(yb), device=loss.device, dtype=torch.float64)
    pieces = []                                 # per layer: what its clipped sum is built from
    for m, delta in zip(layers, deltas, strict=True):
        a = inputs[m].detach()
        if isinstance(m, nn.Linear):
            if a.dim() != 2:
                raise NotImplementedError("per-sample norms need Linear inputs of shape [batch, features]")
            sq += sq_norms(delta) * (sq_norms(a) + (m.bias is not None))
            pieces.append((m, a, delta))
        else:
            u = F.unfold(a, m.kernel_size, m.dilation, m.padding, m.stride)                 # [b, in·k·k, L]
            dl = delta.flatten(2)                                                          # [b, out, L]
            per_sample = torch.einsum("bol,bkl->bok", dl, u).flatten(1)                    # [b, out·in·k·k]
            sq += sq_norms(per_sample)
            bias = None
            if m.bias is not None:
                bias = dl.sum(2)                                                           # [b, out]
                sq += sq_norms(bias)
            pieces.append((m, per_sample, bias))
    c = clip_factors(sq, clip).to(loss.dtype)
    grads = {}
    for m, p, d in pieces:                      # d: per-sample bias gradients [b, out] (a Linear's is δ)
        grads[m.weight] = ((c[:, None] * d).T @ p if isinstance(m, nn.Linear) else c @ p).reshape(m.weight.shape)
        if m.bias is not None:
            grads[m.bias] = c @ d
    return torch.cat([grads[q].reshape(-1) for q in flat.module.parameters()]), loss.detach().mean()


def sq_norms(t: torch.Tensor, lead: int = 1) -> torch.Tensor:
    """Squared norms of ``t`` over all but its first ``lead`` axes, as float64.

    On a CPU: one float32 reduction pass (squaring a float64 copy cost a third of a DP-SGD step, and a
    float64-accumulating norm is 25 times slower there), and the rows whose float32 sum of squares overflows
    redone in float64: reading whether there are any waits for nothing on the CPU. Squares below float32's
    range (a norm under about 1e-19) read as 0, which leaves such a sample unclipped, as its exact norm does
    for any usable clip. On a GPU: one pass that accumulates in float64 (memory-bound, so no slower than
    float32, and it cannot overflow), with no read that would make the host wait."""
    flat = t.flatten(lead)
    if flat.device.type != "cpu":
        return torch.linalg.vector_norm(flat, dim=-1, dtype=torch.float64).pow(2)
    sq = torch.linalg.vector_norm(flat, dim=-1).double().pow(2)
    bad = ~torch.isfinite(sq)
    with host_side():
        overflow = bool(bad.any())
    if overflow:
        sq[bad] = flat[bad].double().pow(2).sum(-1)
    return sq


def clip_factors(sq: torch.Tensor, clip: float) -> torch.Tensor:
    """min(1, clip / ||g_s||) from squared norms; a NaN norm (0·inf from extreme inputs) drops the sample."""
    return 1.0 / torch.clamp(torch.nan_to_num(sq, nan=float("inf")).sqrt() / clip, min=1.0)


def clipped_by_vmap(flat, x, xb, yb, clip: float, layers=None):
    """Clipped per-sample gradient sum of one client, per-sample gradients from vmap over the samples."""
    def loss_one(params, xs, ys):
        return F.cross_entropy(functional_call(flat.module, params, (xs.unsqueeze(0),)), ys.unsqueeze(0))

    with flat.layout.off():
        g, loss = vmap(grad_and_value(loss_one), in_dims=(None, 0, 0))(flat.as_params(x), xb, yb)
    G = torch.cat([g[name].reshape(len(yb), -1) for name in flat.names], dim=1)             # [b, d]
    return clip_factors(sq_norms(G), clip).to(G.dtype) @ G, loss.mean()
