"""Each client's shard and its batch stream: what a client computes on, round after round.

``ClientData`` owns the sampling: every client draws its batches from its own seeded stream, made the
first time it computes, so a run's batches depend only on (seed, client, how often it computed).
``Preprocess`` turns a batch of stored samples into model input on the run's device.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from normfl.data.transforms import augment_crop_flip, normalize

ORACLES = ("minibatch", "full")


class Preprocess:
    """uint8 (or float) batch -> normalised float batch on the device, with optional crop+flip
    (``scale``: transforms.SCALES)."""

    def __init__(self, mean, std, device: torch.device, scale: str = "unit"):
        self.mean, self.std, self.device, self.scale = tuple(mean), tuple(std), device, scale

    def __call__(self, xb: torch.Tensor, augment_gen: torch.Generator | None = None) -> torch.Tensor:
        if augment_gen is not None:       # on raw pixels, so padding is black as in Idelbayev's pipeline
            xb = augment_crop_flip(xb, augment_gen)
        return normalize(xb, self.mean, self.std, self.scale).to(self.device, non_blocking=True)


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

    def steps_per_pass(self) -> int:
        """The minibatch steps in which every client's stream goes once over its shard (the smallest shard's
        full batches: the stream skips a tail shorter than a batch, then reshuffles)."""
        return min(len(p) // b for p, b in zip(self.parts, self.batch, strict=True))

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
