"""The model as a flat vector x in R^d, and the device a run computes on."""

from __future__ import annotations

import platform
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from normfl.errors import ConfigError

PRECISIONS = ("fp32", "tf32", "bf16")     # full fp32 | fp32 with CUDA's TF32 matmuls and convolutions | bf16 autocast
MEMORY_FORMATS = ("auto", "channels_last", "contiguous")   # auto: see memory_format()


def cpuinfo(field: str) -> str | None:
    """The value of the first ``field`` line of /proc/cpuinfo ("model name", "flags"); None off Linux."""
    try:
        with open("/proc/cpuinfo") as fh:
            return next(line.split(":", 1)[1].strip() for line in fh if line.startswith(field))
    except (OSError, StopIteration):
        return None


def device_name(device: torch.device) -> str:
    """The hardware behind ``device``: the GPU's name, or the CPU's model name."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpuinfo("model name") or platform.processor() or platform.machine()


def set_numerics(precision: str, deterministic: bool) -> None:
    """The process's numerics for a run, stated rather than left to torch's defaults: TF32 only with
    ``precision=tf32`` (so fp32 means fp32 on a recent NVIDIA GPU too), cuDNN's autotuner on unless the run
    must repeat every bit, torch's deterministic algorithms when it must."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.benchmark = not deterministic
    if torch.are_deterministic_algorithms_enabled() != deterministic:   # torch's setter imports its compiler
        torch.use_deterministic_algorithms(deterministic)               # (about a second) to set its flag


def numerics() -> dict:
    """The flags ``set_numerics`` set, as they stand (for a run's summary)."""
    return {"tf32": torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "deterministic": torch.are_deterministic_algorithms_enabled()}


def pick_device(name: str) -> torch.device:
    """``auto`` prefers CUDA, then Apple MPS, then the CPU."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", "cuda", "auto or cpu (torch sees no CUDA device on this machine)")
    if name == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ConfigError("device", "mps", "auto or cpu (torch sees no MPS device on this machine)")
    return torch.device(name)


class Layout:
    """Forward hooks on a model's convolutions that store their outputs channels-last (NHWC in memory; the
    same values to every op) while ``on``. torch keeps that layout through ReLU, pooling, BatchNorm and the next
    convolution, so one hook per convolution lays out every activation after the first. The values are the
    same, the float rounding of the kernels that run on them is not. The hooks are attached only while on: an
    idle one would cost about 5 µs a convolution call, per client and step."""

    def __init__(self, on: bool):
        self.modules, self.handles, self._on = [], [], on

    def cover(self, modules) -> None:
        """Lay out these convolutions' outputs too."""
        self.modules += modules
        self.on = self._on

    @property
    def applies(self) -> bool:
        return bool(self.modules)

    @property
    def on(self) -> bool:
        return self._on

    @on.setter
    def on(self, value: bool) -> None:
        self._on = value
        for h in self.handles:
            h.remove()
        self.handles = [m.register_forward_hook(_channels_last) for m in self.modules] if value else []

    @contextmanager
    def off(self):
        """Plain layout for a while: vmap cannot lay out its batched tensors channels-last."""
        on, self.on = self.on, False
        try:
            yield
        finally:
            self.on = on

    @property
    def name(self) -> str:
        return "channels_last" if self.on else "contiguous"


def _channels_last(module, args, out):
    return out.contiguous(memory_format=torch.channels_last) if out.dim() == 4 else None


def memory_format(name: str, device: torch.device, precision: str = "fp32") -> tuple[bool, bool]:
    """Whether (the model's own passes and evaluation, the stacked pass) lay out activations channels-last.
    ``auto``: where it measured faster (``scripts/bench.py``, docs/engine.md). On a CPU the model's (ResNet20's
    sequential round 0.81-0.87x, the CNN's evaluation 0.62-0.64x), not the stacked pass's (the CNN's DP-SGD
    round 0.95-1.11x, ResNet20's in bf16 0.92-1.08x). On CUDA the stacked pass's in bf16 (ResNet20's pass
    0.88x in both of two runs on an H200), not in fp32 (its round 1.16x in both), nor the model's (in the
    second run the sequential round 1.14-1.19x, the evaluation 1.17x). On other devices neither, until
    measured."""
    if name == "auto":
        return device.type == "cpu", device.type == "cuda" and precision == "bf16"
    return (name == "channels_last",) * 2


class FlatModel:
    """A module whose trainable parameters are viewed as one flat vector x in R^d.

    The order of x is the order of ``model.parameters()`` (so ``params.npy`` loads back with
    ``torch.nn.utils.vector_to_parameters``). ``layout``: one of ``MEMORY_FORMATS``, how the activations of
    the module (``layout``) and of the stacked pass built from it (``grouped_layout``) lie in memory.
    """

    def __init__(self, module: nn.Module, device: torch.device, precision: str = "fp32",
                 layout: str = "contiguous"):
        self.module = module.to(device)
        self.device, self.precision = device, precision
        self.names = [n for n, _ in module.named_parameters()]
        self.shapes = [p.shape for p in module.parameters()]
        self.sizes = [p.numel() for p in module.parameters()]
        self.dim = sum(self.sizes)
        convs = [m for m in module.modules() if isinstance(m, nn.Conv2d)]
        own, grouped = (on and bool(convs) for on in memory_format(layout, device, precision))
        self.layout, self.grouped_layout = Layout(own), Layout(grouped)    # the stacked pass covers its own
        self.layout.cover(convs)

    @property
    def memory_format(self) -> str:
        """The layout of the activations: one format, or the module's and the stacked pass's."""
        own, grouped = self.layout.name, self.grouped_layout.name
        return own if own == grouped else f"{own} (stacked pass: {grouped})"

    def run(self, fn, *args) -> torch.Tensor:
        """``fn(*args)``, a model's forward pass, in the run's precision: as it is, or under bf16 autocast and
        then cast to fp32 (parameters, gradients and everything the algorithms do with them stay fp32;
        only the model's matmuls and convolutions run in bf16)."""
        if self.precision != "bf16":
            return fn(*args)
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            return fn(*args).float()

    def forward(self, xb: torch.Tensor) -> torch.Tensor:
        """The module's output, in the run's precision (``run``)."""
        return self.run(self.module, xb)

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
    def evaluate(self, x: torch.Tensor, xs: torch.Tensor, ys: torch.Tensor, prep=None, batch: int | None = None):
        """(mean cross-entropy, accuracy) of x on a dataset (model input, or stored samples that ``prep`` turns
        into model input), in eval mode.

        Default batch: 100 on a CPU, where it stays in cache (ResNet20 on the CIFAR-10 test set, one
        thread: 4.1 s against 8.8 s at batch 1000, same accuracy); 1000 on an accelerator. The sums stay
        on the device until the end: one host synchronisation per evaluation, not one per batch."""
        batch = batch or (100 if self.device.type == "cpu" else 1000)
        self.load(x)
        self.module.eval()
        loss = torch.zeros((), dtype=torch.float64, device=self.device)
        correct = torch.zeros((), dtype=torch.int64, device=self.device)
        for s in range(0, len(ys), batch):
            xb, yb = xs[s:s + batch], ys[s:s + batch].to(self.device)
            xb = xb if prep is None else prep(xb)
            out = self.forward(xb)
            loss += F.cross_entropy(out, yb, reduction="sum")
            correct += (out.argmax(1) == yb).sum()
        self.module.train()
        return loss.item() / len(ys), correct.item() / len(ys)
