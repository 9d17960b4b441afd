"""``backend=auto``: time the backends that apply on the run's first batches and keep the fastest,
remembered per model, size and device in ``~/.cache/normfl/backend.json`` (which wins depends on both)."""

from __future__ import annotations

import logging
import time

import torch

from normfl.cache import memo
from normfl.engine.clients import ClientEngine, uniform

log = logging.getLogger(__name__)


def choose_backend(engine: ClientEngine, x: torch.Tensor, batches, key: str, reps: int = 2) -> str:
    """Time the backends that apply on real batches (model state restored) and return the fastest;
    remembered per ``key`` and candidates (see ``normfl.cache``)."""
    even = uniform(batches)                           # vmap needs equal batches; so does stacked with BatchNorm
    needs_even = {"vmap", "stacked"} if engine.stacked and engine.stacked.has_batchnorm else {"vmap"}
    names = [b for b in engine.backends() if even or b not in needs_even]
    if len(names) == 1:
        return names[0]

    def measure():
        log.info("backend=auto: timing %s on %d clients' batches (once for this setting on this machine)",
                 ", ".join(names), len(batches))
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
