"""Client engine: the model as a flat vector, per-client batches, and per-client gradients.

Three backends compute the same thing, ``G[i] = grad of client i's mean loss at X[i]``:

- ``sequential``: a plain loop over clients with autograd; the reference and the baseline.
- ``vmap``: one ``torch.func.vmap(grad_and_value(functional_call))`` over the client axis.
- ``analytic``: for a stack of Linear layers with ReLU between them (the MLP, logreg), a loop over
  clients with the backward pass written out: no autograd graph, the weights read as views of x and
  each gradient written straight into its row of G.

``auto`` times those that apply on the run's first round and keeps the fastest (cached per model, size
and device in ``~/.cache/normfl/backend.json``), since which wins depends on model and hardware.

BatchNorm. Every client's forward pass runs in train mode, so it normalises with the statistics
of its own batch. The evaluation model's running statistics follow one rule on both backends:
the clients' batches update them in client order, as if each client ran its forward pass in
turn on one shared model (spec normec.md A4). The vmap backend gives every client a copy of the
running buffers, lets each update its copy, and folds the copies in client order afterwards:
with momentum m, copy_i = (1-m) r + m mu_i, and the sequential result is
(1-m)^n r + sum_i (1-m)^(n-1-i) (copy_i - (1-m) r). Buffers are never communicated or averaged
across clients beyond this, and they are not part of x.
"""

from __future__ import annotations

import copy
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from normfl.cache import memo
from normfl.data import augment_crop_flip, normalize

BACKENDS = ("auto", "sequential", "vmap", "analytic")
ORACLES = ("minibatch", "full")
PRECISIONS = ("fp32", "bf16")


def pick_device(name: str) -> torch.device:
    """``auto`` prefers CUDA, then Apple MPS, then the CPU."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device.name='cuda' but torch.cuda.is_available() is False; use auto or cpu")
    if name == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError("device.name='mps' but MPS is not available; use auto or cpu")
    return torch.device(name)


class FlatModel:
    """A module whose trainable parameters are viewed as one flat vector x in R^d.

    The order of x is the order of ``model.parameters()`` (so ``params.npy`` loads back with
    ``torch.nn.utils.vector_to_parameters``).
    """

    def __init__(self, module: nn.Module, device: torch.device, precision: str = "fp32"):
        self.module = module.to(device)
        self.device, self.precision = device, precision
        self.names = [n for n, _ in module.named_parameters()]
        self.shapes = [p.shape for p in module.parameters()]
        self.sizes = [p.numel() for p in module.parameters()]
        self.dim = sum(self.sizes)

    def forward(self, xb: torch.Tensor) -> torch.Tensor:
        """The module's output, in the run's precision: as is, or under bf16 autocast and then cast to fp32
        (parameters, gradients and everything the algorithms do with them stay fp32; only the model's
        matmuls and convolutions run in bf16)."""
        if self.precision != "bf16":
            return self.module(xb)
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            return self.module(xb).float()

    def vector(self) -> torch.Tensor:
        return torch.nn.utils.parameters_to_vector(self.module.parameters()).detach().clone()

    def load(self, x: torch.Tensor) -> None:
        torch.nn.utils.vector_to_parameters(x, self.module.parameters())

    def as_params(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views of x (``[d]`` or ``[n, d]``) shaped like the parameters."""
        lead = x.shape[:-1]
        chunks = torch.split(x, self.sizes, dim=-1)
        return {n: c.reshape(*lead, *s) for n, c, s in zip(self.names, chunks, self.shapes, strict=True)}

    def buffers(self) -> dict[str, torch.Tensor]:
        return {n: b.detach().clone() for n, b in self.module.named_buffers()}

    def set_buffers(self, buffers: dict[str, torch.Tensor]) -> None:
        for n, b in self.module.named_buffers():
            b.copy_(buffers[n])

    @torch.no_grad()
    def evaluate(self, x: torch.Tensor, xs: torch.Tensor, ys: torch.Tensor, prep, batch: int | None = None):
        """(mean cross-entropy, accuracy) of x on a dataset, in eval mode.

        Default batch: 100 on a CPU, where it stays in cache (ResNet20 on the CIFAR-10 test set, one
        thread: 4.1 s against 8.8 s at batch 1000, same accuracy); 1000 on an accelerator."""
        batch = batch or (100 if self.device.type == "cpu" else 1000)
        self.load(x)
        self.module.eval()
        loss, correct = 0.0, 0
        for s in range(0, len(ys), batch):
            xb, yb = prep(xs[s:s + batch]), ys[s:s + batch].to(self.device)
            out = self.forward(xb)
            loss += F.cross_entropy(out, yb, reduction="sum").item()
            correct += (out.argmax(1) == yb).sum().item()
        self.module.train()
        return loss / len(ys), correct / len(ys)


class Preprocess:
    """uint8 (or float) batch -> normalised float batch on the device, with optional crop+flip."""

    def __init__(self, mean, std, device: torch.device):
        self.mean, self.std, self.device = tuple(mean), tuple(std), device

    def __call__(self, xb: torch.Tensor, augment_gen: torch.Generator | None = None) -> torch.Tensor:
        if augment_gen is not None:       # on raw pixels, so padding is black as in Idelbayev's pipeline
            xb = augment_crop_flip(xb, augment_gen)
        return normalize(xb, self.mean, self.std).to(self.device, non_blocking=True)


class ClientData:
    """Each client's shard and its batch stream.

    ``minibatch``: every round each client takes the next ``batch_size`` samples of its shard in
    a seeded shuffled order, reshuffling at the start of each pass; a tail shorter than a batch
    is skipped, so every batch has the same size. ``full``: the whole shard, no augmentation,
    in fixed chunks (the gradient is the exact mean over the shard).
    """

    def __init__(self, x, y, parts, batch_size, seed, prep: Preprocess, augment: bool,
                 oracle: str = "minibatch", chunk: int = 1000):
        self.x, self.y, self.parts, self.prep = x, y, [torch.as_tensor(p) for p in parts], prep
        self.batch = [min(batch_size, len(p)) for p in parts]
        self.oracle, self.chunk, self.seed, self.augment = oracle, chunk, seed, augment
        self.streams: dict[int, list] = {}    # client -> [rng, order, pos, aug], made when first used
        self._fixed: dict = {}                 # the deterministic batch lists (full oracle, IG passes)

    def __len__(self) -> int:
        return len(self.parts)

    def state_dict(self) -> dict:
        """The clients' sampling streams (a checkpoint's share of the data)."""
        return {"streams": self.streams}

    def load_state_dict(self, state: dict) -> None:
        self.streams = state["streams"]

    def uniform(self) -> bool:
        """Whether every client's batches have the same shapes (what vmap needs)."""
        sizes = self.batch if self.oracle == "minibatch" else [len(p) for p in self.parts]
        return len(set(sizes)) == 1

    def _stream(self, i: int) -> list:
        """Client i's sampling state, made on first use, so 100,000 clients cost only those that compute."""
        if i not in self.streams:
            rng = np.random.default_rng([self.seed, 1, i])
            aug = torch.Generator().manual_seed(self.seed * 7919 + i) if self.augment else None
            self.streams[i] = [rng, rng.permutation(len(self.parts[i])), 0, aug]
        return self.streams[i]

    def _piece(self, idx, weight: float = 1.0, aug: torch.Generator | None = None):
        """(inputs, labels, weight) of the samples ``idx``; index_select gathers rows twice as fast as x[idx]."""
        xb, yb = (t.index_select(0, idx.to(t.device)) for t in (self.x, self.y))
        return self.prep(xb, aug), yb.to(self.prep.device), weight

    def _minibatch(self, i: int):
        b, st = self.batch[i], self._stream(i)
        if st[2] + b > len(st[1]):
            st[1], st[2] = st[0].permutation(len(self.parts[i])), 0
        idx = self.parts[i][st[1][st[2]:st[2] + b]]
        st[2] += b
        return self._piece(idx, 1.0, st[3])

    def next_batches(self, ids=None) -> list[list[tuple[torch.Tensor, torch.Tensor, float]]]:
        """Per client (all, or those in ``ids``), the list of (x, y, weight) pieces whose weighted
        gradients sum to its oracle. Only these clients' batch streams advance."""
        ids = self._ids(ids)
        if self.oracle == "minibatch":
            return [[self._minibatch(i)] for i in ids]
        if "full" not in self._fixed:          # deterministic: prepared once, reused every round
            self._fixed["full"] = [[self._piece(c, len(c) / len(p)) for c in torch.split(p, self.chunk)]
                                   for p in self.parts]
        return [self._fixed["full"][i] for i in ids]

    def poisson_batches(self, rate: float, ids=None) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
        """Per client (all, or those in ``ids``), one Poisson sample of its shard: every sample is taken
        independently with probability ``rate`` (DP-SGD's sampling), so sizes vary and can be 0."""
        return [self._piece(self.parts[i][torch.from_numpy(self._stream(i)[0].random(len(self.parts[i])) < rate)])
                for i in self._ids(ids)]

    def _ids(self, ids) -> list[int]:
        return list(range(len(self))) if ids is None else [int(i) for i in ids]

    def peek(self, ids=None):
        """The batches the next ``next_batches(ids)`` will return, without consuming them."""
        saved = {i: (copy.deepcopy(st[:3]), st[3].get_state() if st[3] is not None else None)
                 for i, st in self.streams.items()}
        batches = self.next_batches(ids)
        self.streams = {i: self.streams[i] for i in saved}           # drop the streams peek made
        for i, (head, aug) in saved.items():
            self.streams[i][:3] = head
            if aug is not None:
                self.streams[i][3].set_state(aug)
        return batches

    def cyclic_batches(self, batch_size: int) -> list[list[list[tuple]]]:
        """One fixed-order pass over every shard in consecutive batches (no shuffling, no
        augmentation): a list of steps, each a per-client list of one (x, y, b_j / N_i) piece.
        Needs equal shard sizes, so that all clients take the same number of steps. Prepared once."""
        sizes = {len(p) for p in self.parts}
        if len(sizes) > 1:
            raise ValueError(f"an incremental-gradient pass needs equal shard sizes, got {sorted(sizes)}")
        n_i = sizes.pop()
        key = ("cyclic", batch_size)
        if key not in self._fixed:
            self._fixed[key] = [[[self._piece(p[s:s + batch_size], len(p[s:s + batch_size]) / n_i)]
                                 for p in self.parts] for s in range(0, n_i, batch_size)]
        return self._fixed[key]


class Clients:
    """The clients as an algorithm sees them: gradients on their next batches, or on given ones."""

    def __init__(self, engine: ClientEngine, data: ClientData):
        self.engine, self.data = engine, data

    def peek(self, ids=None):
        """The next round's batches of every client (or of ``ids``), left in place for ``grads``."""
        return self.data.peek(ids)

    def grads(self, x: torch.Tensor, batches=None, ids=None):
        """Gradients at x (``[d]``, or one row per client) on each client's next batches, or on
        ``batches``; with ``ids``, only those clients compute (x then has one row per id)."""
        if batches is None:
            batches = self.data.next_batches(ids)
        return self.engine.grads(x, batches)

    def cyclic_pass(self, batch_size: int):
        return self.data.cyclic_batches(batch_size)

    def clipped_grad_sums(self, x: torch.Tensor, rate: float, clip: float):
        """DP-SGD's gradient step input: each client Poisson-samples its shard at ``rate`` and sums its
        per-sample gradients at x (``[d]`` or one row per client), each clipped to norm ``clip``.
        Returns ([n, d] sums, [n] mean losses, the batches)."""
        batches = self.data.poisson_batches(rate)
        return (*self.engine.clipped_sums(x, batches, clip), batches)


class ClientEngine:
    """Per-client gradients ``G[i] = grad f_i(X[i])`` and losses, by the chosen backend."""

    def __init__(self, flat: FlatModel, backend: str = "sequential"):
        self.flat, self.backend = flat, backend
        self.norm_layers = _norm_layers(flat.module)       # per-sample norms from layers, or None: vmap
        self.linear_stack = _linear_stack(flat.module)     # the analytic backend's layers, or None
        if backend == "analytic" and not self.linear_stack:
            raise ValueError("analytic takes a Flatten, then Linear layers with a ReLU between each two, "
                             "as model=mlp, logreg build")

    def backends(self) -> tuple[str, ...]:
        """The backends that apply to this model."""
        return ("sequential", "vmap") + (("analytic",) if self.linear_stack else ())

    def grads(self, x: torch.Tensor, batches) -> tuple[torch.Tensor, torch.Tensor]:
        """x: ``[d]`` (every client at the same point) or ``[n, d]``; returns ``([n, d], [n])``."""
        if self.backend == "analytic":
            fn = self._analytic
        elif self.backend == "vmap" and len(batches) > 1 and uniform(batches):
            fn = self._vmap
        else:
            fn = self._sequential
        if all(len(b) == 1 and b[0][2] == 1.0 for b in batches):     # one minibatch each: no reweighting
            return fn(x, [b[0] for b in batches])
        n = len(batches)
        G = torch.zeros(n, self.flat.dim, device=x.device, dtype=x.dtype)
        loss = torch.zeros(n, device=x.device, dtype=x.dtype)
        for j in range(max(len(b) for b in batches)):       # one piece per client at a time
            idx = [i for i, b in enumerate(batches) if j < len(b)]   # clients with a j-th piece
            piece = [batches[i][j] for i in idx]
            g, l = fn(x if x.dim() == 1 else x[idx], piece)
            w = torch.tensor([p[2] for p in piece], device=x.device, dtype=x.dtype)
            G[idx] += w[:, None] * g
            loss[idx] += w * l
        return G, loss

    def clipped_sums(self, x: torch.Tensor, pieces, clip: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Per client i: sum over the samples s of its piece of ∇ℓ(x_i; s) / max(1, ||∇ℓ(x_i; s)|| / clip),
        and the mean loss (0 for an empty piece). A loop over clients: Poisson batches differ in size.

        Models built of Linear and Conv2d layers only (the MLP, the CNN, logreg) take two ordinary
        backward passes: per-sample gradient norms come from each layer's inputs and output gradients,
        and the clipped sum is the gradient of the loss reweighted by the clip factors. Other models get
        per-sample gradients from ``torch.func.vmap`` over the samples."""
        flat = self.flat
        sums = torch.zeros(len(pieces), flat.dim, device=x.device, dtype=x.dtype)
        losses = torch.zeros(len(pieces), device=x.device, dtype=x.dtype)
        clipped = _clipped_by_norms if self.norm_layers else _clipped_by_vmap
        for i, (xb, yb, _) in enumerate(pieces):
            if len(yb) == 0:
                continue
            sums[i], losses[i] = clipped(flat, x if x.dim() == 1 else x[i], xb, yb, clip, self.norm_layers)
        return sums, losses

    def _sequential(self, x, piece):
        flat, params = self.flat, list(self.flat.module.parameters())
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

    def _analytic(self, x, piece):
        """The backward pass of z = W_L relu(... relu(W_1 a_0 + b_1) ...) + b_L under the mean
        cross-entropy, written out: dz = (softmax(z) - onehot(y)) / B, and per layer (last first)
        dW = dz^T a, db = sum of dz, then dz = (dz W) ⊙ [a > 0] for the layer below."""
        G = torch.empty(len(piece), self.flat.dim, device=x.device, dtype=x.dtype)
        losses = torch.empty(len(piece), device=x.device, dtype=x.dtype)
        for i, (xb, yb, _) in enumerate(piece):
            params = self.flat.as_params(x if x.dim() == 1 else x[i])
            grads = self.flat.as_params(G[i])
            weights = [(params[w], params.get(b), grads[w], grads.get(b)) for w, b in self.linear_stack]
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

    def _vmap(self, x, piece):
        flat, n = self.flat, len(piece)
        xb = torch.stack([p[0] for p in piece])
        yb = torch.stack([p[1] for p in piece])
        start = flat.buffers()
        buffers = {k: b.expand(n, *b.shape).clone() for k, b in start.items()}

        def loss_fn(params, bufs, xs, ys):
            return F.cross_entropy(functional_call(flat.module, (params, bufs), (xs,)), ys)

        in_x = 0 if x.dim() == 2 else None
        g, losses = vmap(grad_and_value(loss_fn), in_dims=(in_x, 0, 0, 0))(flat.as_params(x), buffers, xb, yb)
        G = torch.cat([g[name].reshape(n, -1) for name in flat.names], dim=1)
        flat.set_buffers(fold_running_stats(flat.module, start, buffers))
        return G, losses.detach()


def _linear_stack(module: nn.Module) -> list[tuple[str, str | None]] | None:
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


def _norm_layers(module: nn.Module) -> list[nn.Module] | None:
    """The Linear and Conv2d layers that hold every parameter of ``module``, or None if some parameter
    lives elsewhere (then per-sample norms cannot be read off layer inputs and output gradients)."""
    layers = [m for m in module.modules() if isinstance(m, nn.Linear)
              or (isinstance(m, nn.Conv2d) and m.groups == 1 and m.padding_mode == "zeros")]
    covered = {id(p) for m in layers for p in m.parameters(recurse=False)}
    return layers if layers and all(id(p) in covered for p in module.parameters()) else None


def _clipped_by_norms(flat: FlatModel, x, xb, yb, clip: float, layers):
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
            sq += _sq_norms(delta) * (_sq_norms(a) + (m.bias is not None))
            pieces.append((m, a, delta))
        else:
            u = F.unfold(a, m.kernel_size, m.dilation, m.padding, m.stride)                 # [b, in·k·k, L]
            dl = delta.flatten(2)                                                          # [b, out, L]
            per_sample = torch.einsum("bol,bkl->bok", dl, u).flatten(1)                    # [b, out·in·k·k]
            sq += _sq_norms(per_sample)
            bias = None
            if m.bias is not None:
                bias = dl.sum(2)                                                           # [b, out]
                sq += _sq_norms(bias)
            pieces.append((m, per_sample, bias))
    c = _clip_factors(sq, clip).to(loss.dtype)
    grads = {}
    for m, p, d in pieces:                      # d: per-sample bias gradients [b, out] (a Linear's is δ)
        grads[m.weight] = ((c[:, None] * d).T @ p if isinstance(m, nn.Linear) else c @ p).reshape(m.weight.shape)
        if m.bias is not None:
            grads[m.bias] = c @ d
    return torch.cat([grads[q].reshape(-1) for q in flat.module.parameters()]), loss.detach().mean()


def _sq_norms(t: torch.Tensor) -> torch.Tensor:
    """Per-sample squared norms of ``t`` ([b, ...]) as float64. One float32 reduction pass (squaring a
    float64 copy cost a third of a DP-SGD step); rows whose float32 sum of squares overflows are redone in
    float64, where the square of any float32 fits. Squares below float32's range (a norm under about 1e-19)
    read as 0, which leaves such a sample unclipped, as its exact norm does for any usable clip."""
    flat = t.flatten(1)
    sq = torch.linalg.vector_norm(flat, dim=1).double().pow(2)
    bad = ~torch.isfinite(sq)
    if bad.any():
        sq[bad] = flat[bad].double().pow(2).sum(1)
    return sq


def _clip_factors(sq: torch.Tensor, clip: float) -> torch.Tensor:
    """min(1, clip / ||g_s||) from squared norms; a NaN norm (0·inf from extreme inputs) drops the sample."""
    return 1.0 / torch.clamp(torch.nan_to_num(sq, nan=float("inf")).sqrt() / clip, min=1.0)


def _clipped_by_vmap(flat: FlatModel, x, xb, yb, clip: float, layers=None):
    """Clipped per-sample gradient sum of one client, per-sample gradients from vmap over the samples."""
    def loss_one(params, xs, ys):
        return F.cross_entropy(functional_call(flat.module, params, (xs.unsqueeze(0),)), ys.unsqueeze(0))

    g, loss = vmap(grad_and_value(loss_one), in_dims=(None, 0, 0))(flat.as_params(x), xb, yb)
    G = torch.cat([g[name].reshape(len(yb), -1) for name in flat.names], dim=1)             # [b, d]
    return _clip_factors(_sq_norms(G), clip).to(G.dtype) @ G, loss.mean()


def fold_running_stats(module: nn.Module, start: dict, copies: dict) -> dict:
    """Compose per-client BatchNorm buffer updates in client order (see module docstring)."""
    out = dict(start)
    for prefix, m in module.named_modules():
        if not isinstance(m, nn.modules.batchnorm._BatchNorm) or not m.track_running_stats:
            continue
        if m.momentum is None:
            raise NotImplementedError("BatchNorm with momentum=None is not supported by the vmap backend")
        keep = 1.0 - m.momentum
        for stat in ("running_mean", "running_var"):
            key = f"{prefix}.{stat}" if prefix else stat
            r, c = start[key], copies[key]
            n = c.shape[0]
            pw = keep ** torch.arange(n - 1, -1, -1, device=c.device, dtype=c.dtype)
            out[key] = keep ** n * r + (pw[:, None] * (c - keep * r)).sum(0)
        key = f"{prefix}.num_batches_tracked" if prefix else "num_batches_tracked"
        out[key] = start[key] + copies[key].shape[0]
    return out


def uniform(batches) -> bool:
    """Whether every client's batch pieces have the same shapes, which vmap needs."""
    shapes = {tuple(tuple(p[0].shape) for p in b) for b in batches}
    return len(shapes) == 1


def choose_backend(engine: ClientEngine, x: torch.Tensor, batches, key: str, reps: int = 2) -> str:
    """Time the backends that apply on real batches (model state restored) and return the fastest;
    remembered per ``key`` and candidates (see ``normfl.cache``)."""
    names = [b for b in engine.backends() if b != "vmap" or uniform(batches)]      # vmap needs equal batches
    if len(names) == 1:
        return names[0]

    def measure():
        saved, times = engine.flat.buffers(), {}
        for name in names:
            engine.backend = name
            engine.grads(x, batches)                          # warm-up
            runs = []
            for _ in range(reps):
                t = time.perf_counter()
                engine.grads(x, batches)
                if x.is_cuda:
                    torch.cuda.synchronize()
                runs.append(time.perf_counter() - t)
            times[name] = min(runs)
        engine.flat.set_buffers(saved)
        return min(times, key=times.get)

    return memo("backend", f"{key}|{','.join(names)}", measure)
