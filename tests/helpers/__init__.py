"""Test-only parts shared by the test modules, which import them from here (``from tests.helpers import X``) and
never from one another:

- ``paths``: ``REPO``, ``CONF``, ``OFFLINE`` (the offline copies of the datasets), ``script`` (scripts/<name>.py);
- ``configs``: ``composed`` (a config as train.py composes it), the small run of the equality tests (``BASE``,
  ``EXTRA``, ``ALGOS``, ``config``), ``MODELS``, ``SCALAR_GRIDS``;
- ``runs``: ``train`` (``python train.py`` in its own process), ``train_command``, ``trained``, ``ended``;
- ``compare``: two runs compared (``assert_same_run``, ``same``, ``resumed_equals_whole``), a markdown table read
  (``rows``);
- ``refusals``: ``train_here`` (train.py in this process), ``refused``, ``npz``, ``disk``;
- ``models``: ``flat_model`` (a seeded ``FlatModel`` on the CPU), ``CPU``;
- ``standins``: clients with closed-form gradients (``Quadratic``, ``DPSGDClients``, ``run_dpfl``);
- ``algorithms``: algorithms loaded by config (``algo._target_=tests.helpers.Crasher``, ``Momentum``, ...)."""

from .algorithms import Crasher, ForgetfulMomentum, LateMomentum, Momentum, WithoutAutograd
from .compare import METRICS, NOT_COMPARED, assert_same_run, outputs, resumed_equals_whole, rows, same
from .configs import ALGOS, BASE, CIFAR, CIFAR_RESNET20, EXTRA, MODELS, SCALAR_GRIDS, composed, config
from .models import CPU, flat_model
from .paths import CONF, OFFLINE, REPO, script
from .refusals import BAD_INPUT_BASE, disk, npz, refused, train_here
from .runs import ended, train, train_command, trained
from .standins import DPSGDClients, Quadratic, run_dpfl

# The test algorithms are loaded by config as tests.helpers.NAME, the name their messages and pickles carry too
for _cls in (Crasher, ForgetfulMomentum, LateMomentum, Momentum, WithoutAutograd):
    _cls.__module__ = __name__

__all__ = ["ALGOS", "BAD_INPUT_BASE", "BASE", "CIFAR", "CIFAR_RESNET20", "CONF", "CPU", "Crasher", "DPSGDClients",
           "EXTRA", "ForgetfulMomentum", "LateMomentum", "METRICS", "MODELS", "Momentum", "NOT_COMPARED", "OFFLINE",
           "Quadratic", "REPO", "SCALAR_GRIDS", "WithoutAutograd", "assert_same_run", "composed", "config", "disk",
           "ended", "flat_model", "npz", "outputs", "refused", "resumed_equals_whole", "rows", "run_dpfl", "same",
           "script", "train", "train_command", "train_here", "trained"]
