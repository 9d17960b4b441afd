"""Running experiments: ``setup`` builds a run's parts from its config, ``training`` takes one run from its
first round (or its checkpoint) to its summary, ``together`` trains the runs of a sweep side by side (those
that differ only in scalars as one: ``vectorized``), ``cli`` is what ``train.py`` calls under Hydra, and ``sweep``
what a sweep (``train.py -m``) does beside its jobs: it checks them, notes their outcomes and ends with their table."""

from normfl.run.cli import main
from normfl.run.setup import SHARED, Setup, build, build_data, shared_key
from normfl.run.together import train_together
from normfl.run.training import Training, run, start

__all__ = ["SHARED", "Setup", "Training", "build", "build_data", "main", "run", "shared_key", "start",
           "train_together"]
