"""For a stack of Linear layers with ReLU between them (the MLP, logreg): a loop over clients with the
backward pass written out, no autograd graph, the weights read as views of x and each gradient written
straight into its row of G."""

from __future__ import annotations

import torch
from torch import nn


def linear_stack(module: nn.Module) -> list[tuple[str, str | None]] | None:
    """(weight, bias) parameter names of a Sequential that is a Flatten of all but the batch axis, then
    Linear layers with a ReLU between each two and none after the last; None for any other model."""
    mods = list(module.named_children()) if isinstance(module, nn.Sequential) else []
    if not mods or not isinstance(mods[0][1], nn.Flatten) or (mods[0][1].start_dim, mods[0][1].end_dim) != (1, -1):
        return None
    linear, relus = mods[1::2], mods[2::2]
    if not linear or len(relus) != len(linear) - 1 or not all(isinstance(m, nn.Linear) for _, m in linear) \
            or not all(type(m) is nn.ReLU for _, m in relus):
        return None
    return [(f"{n}.weight", f"{n}.bias" if m.bias is not None else None) for n, m in linear]


def grads(flat, layers, x: torch.Tensor, piece) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward pass of z = W_L relu(... relu(W_1 a_0 + b_1) ...) + b_L under the mean
    cross-entropy, written out: dz = (softmax(z) - onehot(y)) / B, and per layer (last first)
    dW = dz^T a, db = sum of dz, then dz = (dz W) ⊙ [a > 0] for the layer below."""
    G = torch.empty(len(piece), flat.dim, device=x.device, dtype=x.dtype)
    losses = torch.empty(len(piece), device=x.device, dtype=x.dtype)
    for i, (xb, yb, _) in enumerate(piece):
        params = flat.as_params(x if x.dim() == 1 else x[i])
        grads = flat.as_params(G[i])
        weights = [(params[w], params.get(b), grads[w], grads.get(b)) for w, b in layers]
        acts = [xb.flatten(1)]                                 # the input of each layer
        for j, (w, b, _, _) in enumerate(weights):
            z = acts[-1] @ w.T if b is None else torch.addmm(b, acts[-1], w.T)
            acts.append(z.relu_() if j < len(weights) - 1 else z)
        logp = torch.log_softmax(acts.pop(), dim=1)
        rows = torch.arange(len(yb), device=yb.device)
        losses[i] = -logp[rows, yb].mean()
        dz = logp.exp_()
        dz[rows, yb] -= 1.0
        dz /= len(yb)
        for j in range(len(weights) - 1, -1, -1):
            w, _, gw, gb = weights[j]
            torch.mm(dz.T, acts[j], out=gw)
            if gb is not None:
                torch.sum(dz, 0, out=gb)
            if j:
                dz = (dz @ w).mul_(acts[j] > 0)
    return G, losses
