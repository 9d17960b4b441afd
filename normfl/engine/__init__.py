"""The client engine: the model as a flat vector and every client's gradients, by one of four backends.

- ``flat``: the model's parameters as one vector x in R^d (``FlatModel``), and the run's device;
- ``clients``: the clients as an algorithm sees them (``Clients``) and the engine that dispatches to a
  backend (``ClientEngine``);
- the backends, each computing ``G[i] = grad of client i's mean loss at X[i]``: ``sequential`` (the
  reference loop), ``vmap`` (torch.func over clients), ``analytic`` (Linear/ReLU stacks, backward
  written out), ``stacked`` (every client as one group of one grouped model, one pass);
- ``clipping``: DP-SGD's per-sample clipping; ``batchnorm``: the running-statistics rule every backend
  follows; ``auto``: timing the backends that apply and keeping the fastest.

The clients' batches and their sampling streams live with the data (``normfl.data.clients``).
"""

from normfl.engine.auto import choose_backend
from normfl.engine.batchnorm import fold_running_stats
from normfl.engine.clients import BACKENDS, ClientEngine, Clients
from normfl.engine.flat import MEMORY_FORMATS, PRECISIONS, FlatModel, pick_device

__all__ = ["BACKENDS", "MEMORY_FORMATS", "PRECISIONS", "ClientEngine", "Clients", "FlatModel", "choose_backend",
           "fold_running_stats", "pick_device"]
