"""Each client's shard and its batch stream: what a client computes on, round after round.

``ClientData`` owns the sampling: every client draws its batches from its own seeded stream, made the
first time it computes, so a run's batches depend only on (seed, client, how often it computed). The
draws are made on the host and are small (each client's sample indices and augmentation offsets); the
samples live on the run's device, where ``Batches`` turns one table of draws into one step's batches of
every client with a few batched tensor operations.
"""

from __future__ import annotations

import collections
import copy
import threading

import numpy as np
import torch

from normfl import ops
from normfl.data.transforms import crop_flip, draw_crop_flip, normalize
from normfl.syncs import host_side

ORACLES = ("minibatch", "full")
POISSON_TAIL = 1e-6        # the chance that a client's Poisson batch is larger than its run's padded capacity


class Preprocess:
    """Stored samples (uint8 or float) -> normalised float model input on the device (``scale``:
    transforms.SCALES); the samples are moved first, so the arithmetic runs where they will be used."""

    def __init__(self, mean, std, device: torch.device, scale: str = "unit"):
        # made on the device once: a tensor made from a list on a GPU at every batch is a copy that waits
        self.mean, self.std = (torch.tensor(v, dtype=torch.float32, device=device) for v in (tuple(mean), tuple(std)))
        self.device, self.scale = device, scale

    def __call__(self, xb: torch.Tensor) -> torch.Tensor:
        return normalize(xb.to(self.device, non_blocking=True), self.mean, self.std, self.scale)


class Batches:
    """The device half of batch making: a table of draws (sample indices, and crop and flip offsets when
    augmenting) goes to the device in one copy; gather, crop, flip and normalisation are batched tensor
    operations there. ``x``, ``y``: the samples on the device (raw when augmenting: the crop pads with black
    pixels, as torchvision does). Runs made from one prepared dataset share one ``Batches`` (``users``), and
    then a table seen among the last few is answered with the batch already made: runs side by side with one
    seed draw the same tables, so they share one batch a step. A ``Batches`` of one run keeps nothing."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, prep: Preprocess, keep: int = 4):
        self.x, self.y, self.prep = x.to(prep.device), y.to(prep.device), prep
        self.recent: collections.OrderedDict = collections.OrderedDict()
        self.keep, self.lock, self.made, self.users = keep, threading.Lock(), 0, 0

    def __call__(self, idx: np.ndarray, draws: torch.Tensor | None = None, share: bool = True):
        """(inputs, labels) of the samples ``idx`` (host int64), cropped and flipped by ``draws`` (``[3, len
        (idx)]`` host rows of ``draw_crop_flip``) when given."""
        with host_side():
            table = torch.from_numpy(np.asarray(idx, dtype=np.int64))[None]
            if draws is not None:
                table = torch.cat([table, draws])
            key = table.numpy().tobytes() if share and self.users > 1 else None
        with self.lock:
            if key is not None and key in self.recent:
                self.recent.move_to_end(key)
                return self.recent[key]
            t = table.to(self.x.device, non_blocking=True)
            xb, yb = self.x.index_select(0, t[0]), self.y.index_select(0, t[0])
            if draws is not None:
                xb = crop_flip(xb, t[1:])
            out, self.made = (self.prep(xb), yb), self.made + 1
            if key is not None:
                self.recent[key] = out
                if len(self.recent) > self.keep:
                    self.recent.popitem(last=False)
            return out


class ClientData:
    """Each client's shard and its batch stream.

    ``minibatch``: every round each client takes the next ``batch_size`` samples of its shard in
    a seeded shuffled order, reshuffling at the start of each pass; a tail shorter than a batch
    is skipped, so every batch has the same size. ``full``: the whole shard, no augmentation,
    in fixed chunks (the gradient is the exact mean over the shard).
    """

    def __init__(self, x, y, parts, batch_size, seed, prep: Preprocess, augment: bool,
                 oracle: str = "minibatch", chunk: int = 1000, batches: Batches | None = None):
        self.batches = batches or Batches(x, y, prep)
        self.batches.users += 1
        self.x, self.y, self.prep = self.batches.x, self.batches.y, prep
        self.parts = [torch.as_tensor(p) for p in parts]
        self._index = [p.numpy() for p in self.parts]           # the same, for the host's index arithmetic
        self.batch = [min(batch_size, len(p)) for p in parts]
        self.oracle, self.chunk, self.seed, self.augment = oracle, chunk, seed, augment
        self.streams: dict[int, list] = {}    # client -> [rng, order, pos, aug], made when first used
        self._fixed: dict = {}                 # the deterministic batch lists (full oracle, IG passes)
        self._capacity: dict[float, int] = {}  # Poisson batch capacity by sampling rate

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

    def short_shards(self, batch_size: int) -> str | None:
        """A line for the run's log where some clients hold fewer than ``batch_size`` samples (each such client's
        minibatch is then its whole shard), else None."""
        short = [len(p) for p, b in zip(self.parts, self.batch, strict=True) if b < batch_size]
        if self.oracle != "minibatch" or not short:
            return None
        return (f"batch_size={batch_size}: {len(short)} of {len(self)} clients hold fewer samples (the smallest "
                f"{min(short)}); each such client's minibatch is its whole shard")

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

    def draws_as(self, other: ClientData) -> bool:
        """Whether this data's next batches are ``other``'s, whatever is asked of them: the same samples, shards,
        batch sizes, seed and augmentation, and streams that stand where ``other``'s stand (runs side by side
        with one seed, at one step)."""
        if self.streams is other.streams:
            return True
        if (self.batches is not other.batches or (self.seed, self.batch, self.augment, self.oracle) !=
                (other.seed, other.batch, other.augment, other.oracle) or len(self.parts) != len(other.parts)
                or self.streams.keys() != other.streams.keys()
                or not all(a is b or torch.equal(a, b) for a, b in zip(self.parts, other.parts, strict=True))):
            return False
        for i, (rng, order, pos, aug) in self.streams.items():
            o = other.streams[i]
            if (pos != o[2] or rng.bit_generator.state != o[0].bit_generator.state or not np.array_equal(order, o[1])
                    or (aug is None) != (o[3] is None) or (aug is not None and not torch.equal(aug.get_state(),
                                                                                             o[3].get_state()))):
                return False
        return True

    def _take(self, i: int) -> tuple[np.ndarray, torch.Tensor | None]:
        """Client i's next minibatch draws on the host: its sample indices and, when augmenting, its crop and
        flip offsets (``[3, b]``)."""
        b, st = self.batch[i], self._stream(i)
        if st[2] + b > len(st[1]):
            st[1], st[2] = st[0].permutation(len(self.parts[i])), 0
        idx = self._index[i][st[1][st[2]:st[2] + b]]
        st[2] += b
        return idx, (draw_crop_flip(b, st[3]) if st[3] is not None else None)

    def _pieces(self, idx: list[np.ndarray], draws=None, weights=None, share: bool = True) -> list:
        """One (x, y, weight) piece per index array, from one device gather of them all."""
        sizes = [len(i) for i in idx]
        xb, yb = self.batches(np.concatenate(idx) if idx else np.zeros(0, np.int64),
                              torch.cat(draws, 1) if draws else None, share)
        weights = [1.0] * len(idx) if weights is None else weights
        return list(zip(xb.split(sizes), yb.split(sizes), weights, strict=True))

    def next_batches(self, ids=None) -> list[list[tuple[torch.Tensor, torch.Tensor, float]]]:
        """Per client (all, or those in ``ids``), the list of (x, y, weight) pieces whose weighted
        gradients sum to its oracle. Only these clients' batch streams advance."""
        ids = self._ids(ids)
        if self.oracle == "minibatch":
            taken = [self._take(i) for i in ids]
            return [[piece] for piece in self._pieces([t[0] for t in taken],
                                                      [t[1] for t in taken] if self.augment and ids else None)]
        if "full" not in self._fixed:          # deterministic: prepared once, reused every round
            chunks = [np.array_split(p, range(self.chunk, len(p), self.chunk)) for p in self._index]
            flat = self._pieces([c for cs in chunks for c in cs], weights=[len(c) / len(p) for p, cs in
                                zip(self._index, chunks, strict=True) for c in cs], share=False)
            it = iter(flat)
            self._fixed["full"] = [[next(it) for _ in cs] for cs in chunks]
        return [self._fixed["full"][i] for i in ids]

    def poisson_batches(self, rate: float, ids=None) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
        """Per client (all, or those in ``ids``), one Poisson sample of its shard: every sample is taken
        independently with probability ``rate`` (DP-SGD's sampling), so sizes vary and can be 0."""
        ids = self._ids(ids)
        return self._pieces([self._index[i][ops.poisson_sample(self._stream(i)[0], len(self._index[i]), rate)]
                             for i in ids], share=False)

    def poisson_capacity(self, rate: float) -> int:
        """A batch size that one client's Poisson batch at ``rate`` exceeds with probability below POISSON_TAIL:
        passes padded to it keep one shape (a larger draw is padded to its own size: the sampling stays exact)."""
        if rate not in self._capacity:
            # here, not at the top: scipy.stats takes most of a second to load
            from scipy.stats import binom

            self._capacity[rate] = int(max(binom.ppf(1 - POISSON_TAIL, len(p), rate) for p in self.parts))
        return self._capacity[rate]

    def pad_to(self, rate: float) -> int | None:
        """The batch size a stacked pass pads Poisson batches at ``rate`` to: ``poisson_capacity`` where a CUDA
        graph replays passes of one shape; None on other devices, where padding would only add work (setting
        D on the CPU: 1.4 times the pass)."""
        return self.poisson_capacity(rate) if self.x.device.type == "cuda" else None

    def _ids(self, ids) -> list[int]:
        """The clients asked for, as host ints (``ids`` are host ids: ``ops.Participation.draw``)."""
        if ids is None:
            return list(range(len(self)))
        with host_side():
            return ids.tolist() if isinstance(ids, torch.Tensor) else [int(i) for i in ids]

    def peek(self, ids=None):
        """The batches the next ``next_batches(ids)`` will return, without consuming them."""
        saved = {i: (copy.deepcopy(st[:3]), st[3].get_state() if st[3] is not None else None)
                 for i, st in self.streams.items()}
        batches = self.next_batches(ids)
        for i in self.streams.keys() - saved.keys():                  # drop the streams peek made (in place: runs
            del self.streams[i]                                       # side by side may share the dict)
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
            starts = range(0, n_i, batch_size)
            flat = iter(self._pieces([p[s:s + batch_size] for s in starts for p in self._index],
                                     weights=[min(batch_size, n_i - s) / n_i for s in starts for _ in self._index],
                                     share=False))
            self._fixed[key] = [[[next(flat)] for _ in self._index] for _ in starts]
        return self._fixed[key]
