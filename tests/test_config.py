"""Every config composes and passes validation; every bad value is refused with key, value and rule."""

import pytest
import torch
from omegaconf import OmegaConf

from normfl.config import FLAGS, ConfigError, validate
from tests.helpers import CONF, composed, train

GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir())


@pytest.mark.parametrize("group, option", [(g, p.stem) for g in GROUPS for p in sorted((CONF / g).glob("*.yaml"))])
def test_every_config_composes_and_validates(group, option):
    extra = ["dataset.path=" + __file__] if option == "npz" else []
    if option == "natural":
        extra = ["dataset=npz", "dataset.path=" + __file__]
    if option in ("dpfl", "ali_dpfl"):
        extra = ["model=cnn"]                       # DP-SGD refuses the default ResNet20's BatchNorm
    if group == "accountant" and option != "paper":  # an accountant calibrates only when asked to (issue 27), and
        extra = ["privacy.calibration=accountant", "algo=dp_normec"]       # only a private run reads it
    if group == "budget":
        extra = ["algo=dpfl", "model=cnn"]          # ALI-DPFL's (ε, R_s) cells: a run without noise refuses an ε
    cfg = composed(f"{group}={option}", *extra)
    OmegaConf.to_container(cfg, resolve=True)      # every interpolation resolves
    absent = {"cuda": not torch.cuda.is_available(),
              "mps": not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())}
    if group == "device" and absent.get(option):   # a device this machine lacks is refused up front
        with pytest.raises(ConfigError, match=f"device='{option}'; allowed: auto or cpu"):
            validate(cfg)
        return
    validate(cfg)


def test_default_is_normec_setup():
    cfg = composed()
    assert (cfg.algo.name, cfg.dataset._target_.rsplit(".", 1)[1], cfg.model._target_.rsplit(".", 1)[1]) == \
        ("normec", "load_cifar10", "resnet20")
    assert (cfg.clients, cfg.batch_size, cfg.rounds, cfg.seed) == (10, 32, 300, 42)


@pytest.mark.parametrize("override, key", [
    ("rounds=0", "rounds"), ("clients=0", "clients"), ("algo.beta=0", "algo.beta"),
    ("algo.beta=-1", "algo.beta"), ("algo.gamma=0", "algo.gamma"), ("algo.alpha=-0.1", "algo.alpha"),
    ("p=0", "p"), ("p=1.5", "p"), ("algo=fed_normec", None), ("algo.eta=0", "algo.eta"),
    ("privacy.epsilon=0", "privacy.epsilon"),
    ("privacy.delta=1", "privacy.delta"), ("privacy.delta=0", "privacy.delta"),
    ("oracle=exact", "oracle"), ("backend=gpu", "backend"), ("device=cpu", None),
    ("dataset.split=random", "dataset.split"), ("batch_size=0", "batch_size"),
    ("model.norm=layer", "model.norm"), ("privacy.noise_on=server", "privacy.noise_on"),
    ("dataset=npz", "dataset.path"), ("partition=dirichlet", None), ("partition.alpha=0", "partition.alpha"),
    ("privacy.calibration=exact", "privacy.calibration"), ("privacy.neighbouring=swap", "privacy.neighbouring"),
    ("accountant=pld", "privacy.calibration"), ("accountant.name=prv", "accountant.name"), ("profile=fast", "profile"),
    ("checkpoint_every=-1", "checkpoint_every"), ("resume=maybe", "resume"), ("precision=fp16", "precision"),
])
def test_validation_names_key_value_and_rule(override, key):
    if override == "partition.alpha=0":
        cfg = composed("partition=dirichlet", override)
    elif override == "algo.eta=0":
        cfg = composed("algo=fed_normec", override)
    elif override == "dataset=npz":
        cfg = composed(override, "dataset.path=/no/such/file.npz")
    else:
        cfg = composed(override)
    if key is None:
        validate(cfg)
        return
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert err.value.key == key
    msg = str(err.value)
    assert key in msg and "allowed" in msg


def _bool_leaves(node, prefix=""):
    if isinstance(node, dict):
        for k, v in node.items():
            if k not in ("defaults", "hydra", "_partial_"):
                yield from _bool_leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(node, bool):
        yield prefix


def test_every_true_false_key_of_the_configs_is_checked():
    """A true/false key that validation does not check takes any string as true and null as false: with
    ``privacy.sqrt_covers_log=null`` a run certified ε = 2.886 where the same run with false certifies 12.27."""
    found = set()
    for path in CONF.rglob("*.yaml"):
        group = path.parent.relative_to(CONF).parts
        if group and group[0] == "hydra":
            continue
        package = "" if not group or group[0] in ("experiment", "budget") else group[0]   # _global_ packages
        found |= set(_bool_leaves(OmegaConf.to_container(OmegaConf.load(path)), package))
    assert found and found <= set(FLAGS), sorted(found - set(FLAGS))


@pytest.mark.parametrize("override", ["algo.server_norm=maybe", "algo.private=null", "dataset.augment=1",
                                      "privacy.sqrt_covers_log=null", "progress=yes"])
def test_a_true_false_key_takes_only_true_or_false(override):
    with pytest.raises(ConfigError, match=r"allowed: True \| False") as err:
        validate(composed(override))
    assert err.value.key == override.split("=")[0]


@pytest.mark.slow
@pytest.mark.parametrize("override, needle", [
    (["algo.beta=-1"], "algo.beta=-1"), (["algo=nope"], "algo"), (["clients=100000", "dataset=fashion_mnist",
                                                                   "model=logreg"], "clients=100000"),
    (["dataset=fashion_mnist", "partition=shards", "partition.num_shards=7"], "num_shards=7"),
])
def test_refused_run_leaves_no_run_directory(tmp_path, data_root, override, needle):
    out = train(data_root, f"hydra.run.dir={tmp_path / 'run'}", *override, code=None)
    assert out.returncode != 0
    assert needle in out.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides, key", [
    (["algo=dp_fedavg", "algo.bounding=none"], "algo.bounding"),
    (["algo=fed_normec", "algo.local_operator=sgd"], "algo.local_operator"),
    (["algo=fed_normec", "algo.local_steps=0"], "algo.local_steps"),
    (["algo=dp_fedavg", "algo.participation=cohort", "algo.cohort_size=11"], "algo.cohort_size"),
    (["algo=dp_fedavg", "algo.participation=cohort", "algo.cohort_size=5", "privacy.amplification=true"],
     "privacy.amplification"),
    (["privacy.calibration=accountant", "accountant=rdp", "privacy.neighbouring=replace",
      "privacy.amplification=true"], "accountant"),
    (["privacy.calibration=accountant", "accountant=pld", "privacy.noise_on=raw_delta"], "privacy.noise_on"),
    (["privacy.calibration=accountant"], "accountant"),                  # issue 27: a certificate asked half-way
    (["accountant=rdp"], "privacy.calibration"),
    (["algo=dp_normfedavg", "privacy.calibration=accountant", "accountant=pld"], "privacy.calibration"),
    (["algo=ali_dpfl", "model=cnn", "accountant=pld"], "accountant"),
])
def test_federated_and_privacy_combinations_are_checked(overrides, key):
    with pytest.raises(ConfigError) as err:
        validate(composed(*overrides))
    assert err.value.key == key
