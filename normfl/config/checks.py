"""The checks every value rule is made of: a number in a range, one of a list of options, a key left at its
default where the run would not read it. Each raises ConfigError naming the key, its value and what is allowed."""

from __future__ import annotations

import math

from omegaconf import DictConfig, ListConfig, OmegaConf

from normfl.config.keys import CONF, constructor_defaults, get, option_file
from normfl.errors import ConfigError


def unread(cfg: DictConfig, key: str, why: str, default=KeyError) -> None:
    """Refuse ``key`` where the run would not read it, unless it keeps its default: ``default``, else the value in
    the file of the group's option (algo: ``algo.name``, or for an algorithm whose file is not normfl's, its
    constructor's default; dataset: the file of the same loader)."""
    group, _, leaf = key.partition(".")
    if default is KeyError:
        if group == "algo":
            given = option_file("algo", cfg.algo.name) or constructor_defaults(str(get(cfg, "algo._target_")))
        else:
            files = [option_file(group, f.stem) for f in sorted((CONF / group).glob("*.yaml"))]
            given = next((o for o in files if o.get("_target_") == get(cfg, f"{group}._target_")), {})
        default = given.get(leaf, KeyError)
    value = get(cfg, key)
    value = OmegaConf.to_container(value) if isinstance(value, ListConfig) else value
    if default is not KeyError and value != default:
        raise ConfigError(key, value, f"{'null' if default is None else default} {why}")


def number(cfg, key, ok, allowed, integer=False, optional=False):
    v = get(cfg, key)
    if v is None and optional:
        return
    kinds = (int,) if integer else (int, float)
    if isinstance(v, bool) or not isinstance(v, kinds) or not math.isfinite(v) or not ok(v):
        raise ConfigError(key, v, allowed if integer else f"{allowed}, finite")


def choice(cfg, key, options, optional=True):
    v = get(cfg, key)
    if v is None and optional:
        return
    if v not in options:
        raise ConfigError(key, v, " | ".join(map(str, options)))
