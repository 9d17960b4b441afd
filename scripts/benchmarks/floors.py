"""The compute floors a round is measured against: the bare forward + backward of its samples, one client's
batch at a time (``Floor``) or every client's batch of a step in one (``DenseFloor``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from hydra.utils import instantiate


def local_steps(cfg) -> bool:
    """Whether the clients take optimizer steps (then the floor and paper-style code step too)."""
    return bool(cfg.algo.get("local_steps", 1) > 1 or cfg.algo.get("sample_rate"))


def sgd(cfg, params):
    """The clients' optimizer as the algorithm configures it (NFA: momentum 0.9, weight decay 1e-4)."""
    return torch.optim.SGD(params, lr=1e-3, momentum=cfg.algo.get("momentum") or 0.0,
                           weight_decay=cfg.algo.get("weight_decay") or 0.0)


class Floor:
    """Forward + backward (+ SGD step) of each logged piece on one plain model, nothing else
    (optionally under bf16 autocast, the floor of precision=bf16)."""

    def __init__(self, cfg, ds, device, bf16: bool = False):
        self.model = instantiate(cfg.model, in_shape=tuple(ds.x_train.shape[1:]), num_classes=ds.num_classes)
        self.model.to(device).train()
        self.opt = sgd(cfg, self.model.parameters()) if local_steps(cfg) else None
        self.autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)

    def step(self, xb, yb):
        self.model.zero_grad(set_to_none=True)
        with self.autocast:
            loss = F.cross_entropy(self.model(xb).float(), yb)
        loss.backward()
        if self.opt:
            self.opt.step()

    def __call__(self, log):
        for _, _, batches in log:
            for pieces in batches:
                for xb, yb, _ in pieces:
                    if len(yb):
                        self.step(xb, yb)


class DenseFloor(Floor):
    """Each logged step's samples, every client's batch together, in ONE forward + backward (+ SGD step) of
    one plain model: the round without per-client gradients. On CUDA the model and inputs are channels_last
    and each step shape is replayed from a CUDA graph captured by ``prepare`` (untimed)."""

    def __init__(self, cfg, ds, device, bf16: bool = False):
        super().__init__(cfg, ds, device, bf16)
        self.cuda = device.type == "cuda"
        if self.cuda and ds.x_train.dim() == 4:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.graphs: dict = {}

    @staticmethod
    def steps(log):
        """One (inputs, labels) batch per logged call: every client's pieces of that step, concatenated."""
        for _, _, batches in log:
            width = max(len(b) for b in batches)
            for j in range(width):
                pieces = [b[j] for b in batches if j < len(b) and len(b[j][1])]
                if pieces:
                    yield torch.cat([p[0] for p in pieces]), torch.cat([p[1] for p in pieces])

    def prepare(self, log):
        """On CUDA: capture a graph for every step shape of the log not yet seen (warm-up on a side stream)."""
        if not self.cuda:
            return
        for xb, yb in self.steps(log):
            key = (tuple(xb.shape), tuple(yb.shape))
            if key in self.graphs:
                continue
            static_x = xb.clone().contiguous(memory_format=torch.channels_last) if xb.dim() == 4 else xb.clone()
            static_y = yb.clone()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    self.step(static_x, static_y)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.step(static_x, static_y)
            self.graphs[key] = (graph, static_x, static_y)

    def __call__(self, log):
        for xb, yb in self.steps(log):
            entry = self.graphs.get((tuple(xb.shape), tuple(yb.shape)))
            if entry is None:
                self.step(xb, yb)
            else:
                graph, static_x, static_y = entry
                static_x.copy_(xb)
                static_y.copy_(yb)
                graph.replay()
