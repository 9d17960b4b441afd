"""Configs the test modules share: a run's config composed as train.py composes it; the small run of the
determinism and equality tests (``BASE``, each algorithm's ``EXTRA``); the model each client operator is run with
(``MODELS``); and grids of runs that differ only in scalars, which step as one (``SCALAR_GRIDS``)."""

from hydra import compose, initialize_config_dir

from .paths import CONF


def composed(*overrides: str):
    """conf/config.yaml with ``overrides``, as ``python train.py OVERRIDES`` composes it."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides))


ALGOS = sorted(p.stem for p in (CONF / "algo").glob("*.yaml"))
BASE = ["dataset=fashion_mnist", "model=logreg", "clients=4", "rounds=3", "eval_every=2", "dataset.train_limit=800",
        "dataset.test_limit=200", "batch_size=16", "save_params=true", "progress=false", "checkpoint_every=2"]
EXTRA = {"nfa_binomial": ["algo.local_steps=2"],
         "nfa_clip_tdl": ["algo.local_steps=2", "privacy.epsilon=0.1", "privacy.delta=1e-9"],
         "nfa_fedavg": ["algo.local_steps=2"], "normfedavg": ["algo.local_steps=2"],
         "dp_normfedavg": ["algo.local_steps=2"]}


def config(data_root, *overrides):
    """The small run ``BASE`` (4 clients of 200 Fashion-MNIST samples, logistic regression, 3 rounds) on
    ``data_root``, with ``overrides``."""
    return composed(*BASE, f"data_root={data_root}", *overrides)


# Every client operator on a model it is run with: T local GD steps on ResNet20 with GroupNorm, NFA's local
# SGD with momentum on the MLP, DP-SGD's per-sample clipping on the CNN, one gradient on ResNet20 with
# BatchNorm (its running statistics too: they enter the test loss).
CIFAR = ["dataset=cifar10", "dataset.train_limit=96", "dataset.test_limit=50", "batch_size=8", "clients=3"]
MODELS = {
    "resnet20-batch normec": [*CIFAR, "algo=normec", "model=resnet20"],
    "resnet20-group fed_normec": [*CIFAR, "algo=fed_normec", "model=resnet20", "model.norm=group",
                                  "algo.local_steps=2"],
    "mlp normfedavg": ["algo=normfedavg", "model=mlp", "algo.local_steps=2"],
    "cnn dpfl": ["algo=dpfl", "model=cnn", "model.hidden=32"],
}

# Runs that differ only in scalars (``normfl.run.vectorized``), grid by grid
SCALAR_GRIDS = {
    "normec": [["algo=normec", "algo.beta=0.1", "algo.gamma=0.1"],
               ["algo=normec", "algo.beta=1.0", "algo.gamma=0.01", "algo.server_norm=false"],
               ["algo=normec", "algo.beta=0.5", "algo.gamma=0.05", "algo.alpha=0.5"]],
    "dp": [["algo=dp_normec", "algo.beta=0.1", "privacy.epsilon=8"],
           ["algo=dp_normec", "algo.beta=0.3", "algo.gamma=0.05", "privacy.epsilon=2"]],
    "clip21": [["algo=clip21", "algo.beta=0.5"], ["algo=dp_clip21", "algo.beta=1.0"],
               ["algo=clip21", "algo.beta=2.0", "algo.gamma=0.05"]],
    "resnet20": [["algo=normec", "algo.beta=0.1"], ["algo=normec", "algo.beta=1.0", "algo.gamma=0.01"]],
    "dpsgd": [["algo=dpsgd_norm", "algo.beta=0.1"], ["algo=dpsgd_norm", "algo.beta=1.0", "algo.gamma=0.05",
                                                     "algo.alpha=0.5"]],
    "dp_dpsgd": [["algo=dpsgd_norm", "algo.private=true", "algo.beta=0.1", "privacy.epsilon=8"],
                 ["algo=dpsgd_norm", "algo.private=true", "algo.beta=0.3", "privacy.epsilon=2"]],
    # every client computes and updates its memory; one participation draw (p) for the group, so some rounds
    # upload from nobody (4 clients, p = 0.3, 6 rounds)
    "fed_normec": [["algo=fed_normec", "p=0.3", "algo.beta=0.1"],
                   ["algo=fed_normec", "p=0.3", "algo.beta=0.5", "algo.gamma=0.05", "algo.eta=0.2"],
                   ["algo=fed_normec", "p=0.3", "algo.beta=1.0", "algo.server_norm=true", "algo.alpha=0.5"]],
    "dp_fed_normec": [["algo=dp_fed_normec", "p=0.5", "algo.beta=0.1", "privacy.epsilon=8"],
                      ["algo=dp_fed_normec", "p=0.5", "algo.beta=0.3", "algo.gamma=0.05", "privacy.epsilon=2"]],
    # only the participants compute: the group's pass takes theirs (none in round 2)
    "dp_fedavg": [["algo=dp_fedavg", "p=0.3", "algo.beta=0.1", "privacy.epsilon=8"],
                  ["algo=dp_fedavg", "p=0.3", "algo.beta=0.3", "algo.gamma=0.05", "privacy.epsilon=2"]],
    "dp_fedavg_server": [["algo=dp_fedavg", "algo.noise_by=server", "algo.beta=0.1", "algo.literal_psi=true"],
                         ["algo=dp_fedavg", "algo.noise_by=server", "algo.beta=0.3", "algo.gamma=0.05",
                          "algo.literal_psi=true"]],
}
# the "resnet20" grid's data and model
CIFAR_RESNET20 = ["dataset=cifar10", "model=resnet20", "dataset.train_limit=96", "dataset.test_limit=50",
                  "batch_size=8", "clients=3"]
