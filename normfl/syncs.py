"""Host synchronisation: where a round would make the host wait for a GPU, counted on any device.

A round on a GPU runs at the device's pace only if the host never waits for it: no value read back
(``item``, ``tolist``, ``bool``/``float``/``int`` of a tensor), no data-dependent shape (``nonzero``,
boolean-mask indexing), no copy to the host. On a GPU, ``torch.cuda.set_sync_debug_mode`` catches them;
on the CPU nothing waits, so ``Counter`` finds the same calls by name, wherever they are made. It cannot
tell a copy to the run's own device from a copy to the host when both are the CPU: ``.cpu()``, ``.numpy()``
and ``.to("cpu")`` count, ``.to(device)`` does not (the GPU tests' sync debug mode sees those). A tensor made
from host values with a ``device=`` (``torch.tensor([...], device=x.device)``) counts: on a GPU it is a copy
the host waits for; ``torch.tensor([...]).to(device, non_blocking=True)`` queues the copy instead.

Two kinds of code may make such calls by design, and say so with a ``with`` block:

- ``host_side()``: work that runs on the host on host tensors by construction: the random draws of who
  takes part and of each client's batch (CPU generators), and the tables made from them;
- ``reading()``: the deliberate reads between rounds: an evaluation, a round's metrics row, a checkpoint.

Everything else a round does (the algorithms, the engine, the privatizers) must stay on the device.
"""

from __future__ import annotations

import contextlib
import threading
import traceback
from collections import Counter as Tally

import torch
from torch.overrides import TorchFunctionMode

# The calls that make a host wait for a device: a value read back, a shape that depends on values, a copy
# to the host.
READS = frozenset({"item", "tolist", "__bool__", "__float__", "__int__", "__index__", "numpy", "cpu"})
SHAPES = frozenset({"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive"})

_state = threading.local()


@contextlib.contextmanager
def _exempt():
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1


host_side = _exempt          # host work on host tensors (draws, tables): nothing to wait for
reading = _exempt            # a deliberate read between rounds (evaluation, a metrics row, a checkpoint)


def _name(func) -> str:
    return getattr(func, "__name__", str(func))


def is_sync(func, args, kwargs) -> bool:
    """Whether a tensor call of ``func`` with these arguments makes the host wait for the device."""
    name = _name(func)
    if name in READS or name in SHAPES:
        return True
    if name in ("tensor", "as_tensor") and "device" in kwargs and not isinstance(args[0], torch.Tensor):
        return True               # host values made into a tensor on a device: on a GPU a copy the host waits for
    if name == "to":              # a copy to the host, when asked for by name: on the CPU a run's own device is
        target = kwargs.get("device", args[1] if len(args) > 1 else None)     # the host too, so ``.to(device)``
        return target == "cpu"                                               # is not counted here
    if name == "__getitem__" and len(args) > 1:           # indexing by a boolean mask: a nonzero inside
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)
    return False


class Counter(TorchFunctionMode):
    """Counts the synchronising calls made in this thread outside ``host_side`` and ``reading`` blocks:
    ``count``, and ``where`` (call name and the first normfl frame that made it -> how often)."""

    def __init__(self):
        super().__init__()
        self.where: Tally = Tally()

    @property
    def count(self) -> int:
        return sum(self.where.values())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(_state, "depth", 0) == 0 and is_sync(func, args, kwargs):
            self.where[f"{_name(func)} at {_origin()}"] += 1
        return func(*args, **kwargs)


def _origin() -> str:
    """file:line of the innermost normfl frame below this module (the code that asked for the read)."""
    for frame in reversed(traceback.extract_stack()[:-1]):
        if "/normfl/" in frame.filename and not frame.filename.endswith("/normfl/syncs.py"):
            return f"{frame.filename.rsplit('/normfl/', 1)[1]}:{frame.lineno}"
    return "outside normfl"
