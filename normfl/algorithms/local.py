"""Local operators T_i of FEDNORMEC §4 and the pseudo-gradient (x - T_i(x)) / γ they define.

- ``gd`` with T steps:  x_i^{j+1} = x_i^j - (γ/T) ∇f_i(x_i^j), j = 0..T-1, x_i^0 = x
  (T = 1 gives T_i(x) = x - γ∇f_i(x), so the pseudo-gradient is ∇f_i(x)).
- ``ig``: one cyclic incremental-gradient pass over the client's N samples in a fixed order, in
  batches of b: x_i^{j+1} = x_i^j - γ (b_j/N) ∇f_{i,B_j}(x_i^j) (b = 1 is the paper's per-sample pass).

``local_sgd`` is the local training of the DP-NormFedAvg experiments (NFA Sec. 6): E steps of
PyTorch's SGD on minibatches, with heavy-ball momentum and weight decay, from a fresh optimizer.
"""

from __future__ import annotations

import torch

from normfl.algorithms.base import Clients
from normfl.privacy.mechanisms import SampledGaussian
from normfl.syncs import host_side

OPERATORS = ("gd", "ig")


def pseudo_gradient(x: torch.Tensor, clients: Clients, gamma: float, steps: int = 1, operator: str = "gd",
                    ig_batch_size: int = 1, ids=None) -> tuple[torch.Tensor, torch.Tensor]:
    """([n, d] pseudo-gradients (x - T_i(x))/γ, [n] client losses at x), of every client or of ``ids``."""
    if operator == "gd":
        G, loss = clients.grads(x, ids=ids)                       # step 0 is at x itself
        if steps == 1:
            return G, loss
        X = x - (gamma / steps) * G
        for _ in range(steps - 1):
            X = X - (gamma / steps) * clients.grads(X, ids=ids)[0]
    elif operator == "ig":
        X, loss = x, None
        with host_side():                                          # host ids (``ops.Participation``)
            mine = None if ids is None else ids.tolist()
        for batches in clients.cyclic_pass(ig_batch_size):      # each batch weighted b_j / N ...
            batches = batches if mine is None else [batches[i] for i in mine]
            G, step_loss = clients.grads(X, batches)             # ... which grads applies: (b_j/N) ∇f_{i,B_j}
            X = X - gamma * G
            loss = step_loss if loss is None else loss + step_loss
    else:
        raise ValueError(f"local.operator={operator!r}; allowed: {', '.join(OPERATORS)}")
    return (x - X) / gamma, loss


def local_sgd(x: torch.Tensor, clients: Clients, ids, steps: int, lr: float, momentum: float = 0.0,
              weight_decay: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Clients ``ids`` each run ``steps`` steps of ``torch.optim.SGD`` (dampening 0, no Nesterov) from x
    on their next minibatches, with a zero momentum buffer:

        d = ∇f_i(w) + λ w,   b = μ b + d,   w = w - η b.

    Where the backend computes clients side by side (vmap, stacked), every client steps together;
    otherwise one client at a time, all its steps in a row: its vectors stay in cache (9% faster than
    stepping every client together on NormFedAvg's MLP, bit for bit the same). Returns ([len(ids), d]
    final points w_{k,E}, [len(ids)] minibatch losses at x)."""
    with host_side():                                              # host ids (``ops.Participation``)
        ids = torch.as_tensor(ids).reshape(-1).tolist()
    W = torch.empty(len(ids), x.numel(), device=x.device, dtype=x.dtype)
    loss = torch.empty(len(ids), device=x.device, dtype=x.dtype)
    first = 0
    for block in ([ids] if clients.side_by_side else [[i] for i in ids]):
        rows, first = slice(first, first + len(block)), first + len(block)
        w, buf = x, None
        for _ in range(steps):
            g, step_loss = clients.grads(w, ids=block)              # a fresh tensor: updated in place below
            if weight_decay:
                g.add_(w, alpha=weight_decay)
            if buf is None:
                buf, loss[rows] = g, step_loss
            else:
                buf.mul_(momentum).add_(g)
            w = x - lr * buf if w is x else w.sub_(buf, alpha=lr)    # x itself is never written
        W[rows] = w
    return W, loss


def local_dpsgd(x: torch.Tensor, clients: Clients, steps: int, lr: float, mech: SampledGaussian,
                batch: torch.Tensor, gen: torch.Generator):
    """Every client runs ``steps`` DP-SGD steps from x (ALI Alg. 1 lines 6-11, Alg. 2 lines 7-12):
    a Poisson batch at ``mech.rate``, per-sample gradients clipped to ``mech.clip``, and

        g̃ = (Σ_s clip(∇ℓ(w; s)) + N(0, σ²C² I)) / B,   w = w - η g̃,

    the noise added by ``mech`` (``privacy.mechanisms.SampledGaussian``), with B = ``batch[i]``: client
    i's expected batch size q·|D_i| (reading C-A18), or a set divisor. Returns ([n, d] final models, [n] mean
    losses of the first step's batches, the last step's batches, and the models that step started from)."""
    W, loss, batches, before = x, None, None, x
    for _ in range(steps):
        S, step_loss, batches = clients.clipped_grad_sums(W, mech.rate, mech.clip)
        loss = step_loss if loss is None else loss
        before, W = W, W - lr * mech(S, gen) / batch[:, None]
    return W, loss, batches, before
