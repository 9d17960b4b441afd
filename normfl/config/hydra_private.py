"""Hydra's private API, all of normfl's use of it in one place. Hydra publishes no function for three things normfl
needs, and its own code does them with what it keeps private (``hydra._internal``, and its config loader's
repository, which the published ``ConfigLoader`` does not have); a Hydra release may change any of them without
notice, so they are named here for what normfl asks of them and nowhere else (tests/test_layers.py checks that no
other module imports ``hydra._internal``). Each is tried by tests that fail when Hydra changes it: composing
(tests/test_reproduce.py, ``compose`` against Hydra composing whole) and a sweep's jobs (tests/test_bad_input.py).

- ``set_values``: set override values on a composed config as Hydra's composition does
  (``ConfigLoaderImpl._apply_overrides_to_config``), for ``normfl.config.compose``;
- ``is_group``: whether a name is a config group (``ConfigLoaderImpl.repository``), also for ``compose``;
- ``basic_sweep``: a sweep's jobs in the order Hydra's basic sweeper numbers them (``BasicSweeper.split_arguments``),
  for ``normfl.run.sweep``, which checks a sweep's jobs before any starts.
"""

from __future__ import annotations

from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from omegaconf import DictConfig


def set_values(overrides: list, cfg: DictConfig) -> None:
    """Set the values of ``overrides`` (parsed ``Override``s that set a value, not a config group) on ``cfg``,
    with Hydra's own function: add, delete, set null, a list, a dict, and the refusal of a key that does not exist."""
    ConfigLoaderImpl._apply_overrides_to_config(overrides, cfg)


def is_group(loader, name: str) -> bool:
    """Whether ``name`` is a config group in the search path of ``loader`` (Hydra's config loader)."""
    return loader.repository.group_exists(name)


def basic_sweep(overrides: list) -> list[list[str]]:
    """The jobs of a sweep of ``overrides`` (parsed), each a list of overrides, numbered as Hydra's basic sweeper
    numbers them (by position: job ``i`` is the ``i``-th)."""
    return [list(job) for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]
