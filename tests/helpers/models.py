"""Models for the engine's tests: a flat model built with torch's seed at 0, on the CPU."""

import torch

from normfl.engine import FlatModel

CPU = torch.device("cpu")


def flat_model(builder, in_shape=(3, 32, 32), layout="contiguous", **kw):
    """``builder(in_shape, 10, **kw)`` (a model of ``normfl.models``) as a ``FlatModel`` on the CPU, its weights
    drawn after ``torch.manual_seed(0)``."""
    torch.manual_seed(0)
    return FlatModel(builder(in_shape, 10, **kw), CPU, layout=layout)
