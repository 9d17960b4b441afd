"""Which keys a run takes: conf/config.yaml's at the top level; in each group, the arguments of what the group
builds or the keys its option file lists. A key nothing reads (a misspelling, another option's key) is refused
with the keys that are read there."""

from __future__ import annotations

import functools
import inspect
from pathlib import Path

from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

from normfl.errors import ConfigError

CONF = Path(__file__).resolve().parents[2] / "conf"
# What the code passes a group's target itself, beside the group's keys; privacy's node has no _target_.
GIVEN = {"algo": (), "partition": ("labels", "client_ids", "num_clients", "seed"),
         "model": ("in_shape", "num_classes"), "privacy": ("accountant", "releases_per_round"), "dataset": ()}
READ_BESIDE = {"dataset": ("augment", "train_limit", "test_limit", "scale")}   # read by the run, not the loader
OPTION_FILES = ("logger", "accountant", "device")   # groups whose option file lists every key the option takes
PRIVACY_TARGET = "normfl.privacy.Privacy"


def parameters(obj) -> list:
    """The named parameters ``obj`` (a class or a function) takes: a class's ``__init__``'s, with those of the
    constructors it passes ``*args, **kw`` on to (a subclass's first)."""
    found = []
    for fn in [c.__init__ for c in obj.__mro__ if "__init__" in vars(c)] if isinstance(obj, type) else [obj]:
        params = inspect.signature(fn).parameters.values()
        found += [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"]
        if not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
            break
    return found


def accepted_keys(target: str, given=()) -> list[str]:
    """The keys a config node of ``target`` may set, sorted: its ``parameters``, less ``given`` (what the code
    passes)."""
    return sorted({p.name for p in parameters(get_object(target))} - set(given))


def constructor_defaults(target: str) -> dict:
    """The default of each of ``target``'s ``parameters`` that has one (a subclass's wins); empty where ``target``
    does not import."""
    try:
        params = parameters(get_object(target))
    except Exception:
        return {}
    return {p.name: p.default for p in reversed(params) if p.default is not p.empty}


def algorithm(cfg: DictConfig) -> type:
    """The class ``algo._target_`` names, whose declarations the checks read (``normfl.algorithms.base.Algorithm``:
    ``own_noise``, ``own_round``, ``canaries``, ``adds_noise``); Algorithm's defaults where it names none that
    imports (building it then says why)."""
    from normfl.algorithms.base import Algorithm

    try:
        cls = get_object(str(get(cfg, "algo._target_")))
    except Exception:                       # no such target: building it says so
        return Algorithm
    return cls if isinstance(cls, type) and issubclass(cls, Algorithm) else Algorithm


@functools.cache
def root() -> DictConfig:
    """conf/config.yaml (empty where conf/ is not beside the package)."""
    return OmegaConf.load(CONF / "config.yaml") if (CONF / "config.yaml").is_file() else OmegaConf.create()


@functools.cache
def top_level_keys() -> frozenset[str]:
    """conf/config.yaml's keys and its groups' names (empty where conf/ is not beside the package)."""
    groups = {next(iter(d)) for d in root().get("defaults", []) if isinstance(d, DictConfig)}
    return frozenset((set(root()) - {"defaults"}) | groups)


def validate_keys(cfg: DictConfig) -> None:
    """A key no part of normfl reads (a misspelling, a key of another group's option) is refused with the keys
    that are read there: at the top level; in algo, partition, model, privacy and dataset, whose keys are the
    arguments of what they build; in logger, accountant and device, whose option files list their keys; in
    audit, whose keys conf/config.yaml lists."""
    known = top_level_keys()
    for key in cfg:
        if known and key not in known:
            raise ConfigError(key, cfg[key], f"a key of conf/config.yaml or a config group: {', '.join(sorted(known))}")
    for group, given in GIVEN.items():
        node = get(cfg, group)
        if not isinstance(node, DictConfig):
            continue
        target = node.get("_target_", PRIVACY_TARGET)
        try:
            accepted = sorted({*accepted_keys(target, given), *READ_BESIDE.get(group, ())})
        except Exception:                   # no such target: building it says so
            continue
        name = node.get("name") or target.rsplit(".", 1)[1] if group != "privacy" else None
        refuse_unknown(node, group, accepted, f"{group}={name}" if name else group)
    for group in OPTION_FILES:
        node, option = get(cfg, group), get(cfg, f"{group}.name")
        if isinstance(node, DictConfig) and (keys := option_file(group, str(option))):
            refuse_unknown(node, group, sorted(keys), f"{group}={option}")
    if isinstance(node := get(cfg, "audit"), DictConfig) and "audit" in root():
        refuse_unknown(node, "audit", sorted(root().audit), "audit")


@functools.cache
def option_file(group: str, name: str) -> dict:
    """conf/<group>/<name>.yaml with the options of its group it builds on (its ``defaults``), as a dict."""
    path = CONF / group / f"{name}.yaml"
    if not path.is_file():
        return {}
    node = OmegaConf.to_container(OmegaConf.load(path))
    merged = {}
    for base in node.pop("defaults", []):
        if isinstance(base, str) and base != "_self_":
            merged.update(option_file(group, base))
    return {**merged, **node}


def refuse_unknown(node: DictConfig, group: str, accepted: list, where: str) -> None:
    unknown = [k for k in node if not str(k).startswith("_") and k not in accepted and k != "defaults"]
    if unknown:
        raise ConfigError(f"{group}.{unknown[0]}", node[unknown[0]],
                          f"the keys of {where}: {', '.join(accepted) or 'none'}")


def get(cfg: DictConfig, key: str, missing=None):
    node = cfg
    for part in key.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            return missing
        node = node[part]
    return node
