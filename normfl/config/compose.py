"""The root config (conf/config.yaml) with a list of overrides, as Hydra composes it, outside a Hydra run: for the
refusal of a misspelled key (``normfl.run.cli.unknown_key``) and for the runs of the papers' grids
(``normfl.reproduce.jobs``), which compose hundreds of configs in one process."""

from __future__ import annotations

import contextlib
import copy
import functools

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig

from normfl.config.hydra_private import is_group, set_values
from normfl.config.keys import CONF


@functools.cache
def compose(overrides: tuple[str, ...]) -> DictConfig:
    """The root config with these overrides, as Hydra composes it (once per process: figures share runs).
    Hydra builds the defaults from the config-group overrides, then sets the other overrides' values on
    the result; most runs of a grid differ only in values, so the first step is made once per choice of
    groups (``whole``) and only the second is made per run, by Hydra's own function."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    values = [o for o in parsed if _sets_a_value(o)]
    cfg = copy.deepcopy(whole(tuple(o.input_line for o in parsed if o not in values)))
    set_values(values, cfg)
    return cfg


@functools.cache
def whole(overrides: tuple[str, ...]) -> DictConfig:
    """The root config with these overrides, Hydra composing it whole (``hydra.compose``)."""
    with on_conf():
        return hydra_compose(config_name="config", overrides=list(overrides))


@contextlib.contextmanager
def on_conf():
    """Hydra initialised on ``conf/``, its config loader; Hydra is left as it was found."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        yield GlobalHydra.instance().config_loader()


def _sets_a_value(override) -> bool:
    """Whether Hydra sets ``override`` on the composed config rather than choosing a config group with it
    (as ``hydra._internal.defaults_list.Overrides`` sorts them); Hydra's own and sweep overrides stay with
    the groups, in the whole composition."""
    if override.is_hydra_override() or override.is_sweep_override():
        return False
    return isinstance(override.value(), dict) or not _is_group(override.key_or_group)


@functools.cache
def _is_group(name: str) -> bool:
    with on_conf() as loader:
        return is_group(loader, name)
