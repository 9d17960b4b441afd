"""The papers' grids as runs: every run a figure or table needs, with its overrides, resolved config,
store key and the paper's name for it. Two kinds of file feed it; training reads neither.

``grids/<id>.yaml``, one per figure or table (``grids/normec_t2.yaml`` for NORMEC-T2)
    ``grid``: a list of blocks whose union is the ID's runs. A block names ``experiment``, a list of run
    groups (runnable experiments in ``conf/experiment/``, e.g. ``normec_np_sn``), and lists of values
    for config groups (``algo: [dpfl]``) or dotted keys (``algo.tau: [1, 2]``). Its runs are the
    product of those lists and of each group's own Hydra sweep (``hydra.sweeper.params``, what
    ``train.py -m experiment=<group>`` runs); a list in the block replaces the sweep's list for that key.
    ``quick`` / ``code``: lists that replace the same key's lists in every block under that profile.
``groups.yaml``
    Each run group's ``method`` (the paper's name for its runs) and ``profiles`` (the overrides each
    profile adds to its runs, kept with the group because figures drawing on it share its runs).
"""

from __future__ import annotations

import functools
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from normfl.config import GRID_PROFILES as PROFILES
from normfl.config import config_key
from normfl.config.compose import compose, on_conf
from normfl.errors import ConfigError

HERE = Path(__file__).resolve().parent
GRIDS = HERE / "grids"
ROOT = HERE.parents[1]                 # the checkout: conf/, train.py, and where runs are launched from
CONF = ROOT / "conf"

OPTIONAL_PROFILES = {  # profiles only some run groups define, and what they read differently from the paper's
    "text": "a round read literally, one minibatch step per client; reading A2",
    "code": "the ALI-DPFL authors' code as it runs: experiment=alidpfl_authors_code, their split, divisor 64, "
            "closed-form τ rule and 20% test subsets; Fashion-MNIST only",
}


def value_text(v) -> str:
    """A grid value as a Hydra override writes it."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(value_text(x) for x in v) + "]"
    return "null" if v is None else str(v)


@dataclass
class Job:
    params: dict                       # the grid point: key -> value (incl. experiment/groups)
    overrides: list[str]               # what train.py is given
    key: str                           # the store folder: config_key of the resolved config
    cfg: DictConfig | None = field(default=None, repr=False)
    method: str = ""                   # the paper's name for the run (groups.yaml)

    def dir(self, store: Path) -> Path:
        return store / self.key

    def command(self) -> str:
        return "python train.py " + " ".join(self.overrides)


def _load(path: Path) -> dict:
    return OmegaConf.to_container(OmegaConf.load(path), resolve=False)


@functools.cache
def groups() -> dict:
    """groups.yaml's run groups: name -> {method, profiles}."""
    return _load(HERE / "groups.yaml")["groups"]


def group(name: str) -> dict:
    if name not in groups():
        raise ConfigError("experiment", name, f"a run group of normfl/reproduce/groups.yaml: {' | '.join(groups())}")
    return groups()[name]


def load_grid(name: str) -> dict:
    path = GRIDS / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError("grid", name, " | ".join(sorted(p.stem for p in GRIDS.glob("*.yaml"))))
    return _load(path)


def blocks(name: str, profile: str) -> list[tuple[str, dict[str, list]]]:
    """An ID's grid under a profile as (run group, lists of values by key) pairs, one per block and group,
    in file order: the group's own sweep, then the block's lists, then the profile's."""
    if profile not in PROFILES:
        raise ConfigError("profile", profile, " | ".join(PROFILES))
    grid = load_grid(name)
    replace = grid.get(profile, {}) if profile != "paper" else {}   # the profile's lists, in every block
    out = []
    for block in grid["grid"]:
        for experiment in replace.get("experiment", block["experiment"]):
            lists = {**sweep(experiment), **{k: v for k, v in block.items() if k != "experiment"}}
            out.append((experiment, {k: replace.get(k, v) for k, v in lists.items()}))
    return out


def grid_points(name: str, profile: str) -> list[dict]:
    """The grid points of an ID's grid under a profile, in file order."""
    return [{"experiment": experiment, **dict(zip(lists, values, strict=True))}
            for experiment, lists in blocks(name, profile) for values in itertools.product(*lists.values())]


@functools.cache
def sweep(name: str) -> dict[str, list]:
    """A run group's Hydra sweep (``hydra.sweeper.params``) as lists of values (read once per process)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    path = CONF / "experiment" / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise ConfigError("experiment", name, " | ".join(known))
    params = OmegaConf.select(OmegaConf.load(path), "hydra.sweeper.params", default=None) or {}
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    return {o.key_or_group: list(o.sweep_iterator()) if o.is_sweep_override() else [o.value()] for o in parsed}


def method(name: str, point: dict) -> str:
    """The paper's name for the run of group ``name`` at ``point`` (groups.yaml's ``method``)."""
    label = group(name)["method"]
    if isinstance(label, dict):                           # {key: {value: name}}: the name follows one key
        ((key, names),) = label.items()
        label = names[point[key]]
    return re.sub(r"\{([\w.]+)\}", lambda m: value_text(point[m[1]]), label)


def settings(name: str, profile: str) -> dict | None:
    """The overrides ``profile`` adds to the runs of group ``name``; None where the group defines none."""
    found = group(name)["profiles"].get(profile)
    return {} if found is None and profile not in OPTIONAL_PROFILES else found


def has_profile(name: str, profile: str) -> bool:
    """Whether an ID's grid can run under ``profile`` (an optional one: its run groups define it)."""
    return profile in PROFILES and all(settings(p["experiment"], profile) is not None
                                       for p in grid_points(name, profile))


@functools.cache
def key(overrides: tuple[str, ...]) -> str:
    """The store key of the run these overrides make (once per process: the IDs' grids share many runs)."""
    return config_key(compose(overrides))


def point_overrides(point: dict, profile: str) -> list[str]:
    """The ``train.py`` overrides of a grid point under ``profile``: its own, then its group's profile settings."""
    pairs = [*point.items(), *settings(point["experiment"], profile).items()]
    return [*(f"{k}={value_text(v)}" for k, v in pairs), f"profile={profile}"]


def launchers() -> list[str]:
    """The Hydra launchers ``train.py -m`` can be given here (``hydra/launcher=...``): normfl's and the
    installed plugins'."""
    with on_conf() as loader:
        return loader.get_group_options("hydra/launcher")


@functools.cache
def jobs(name: str, profile: str) -> list[Job]:
    """Every run of an ID's grid, with its resolved config, store key and method: a grid point, then
    its group's profile settings."""
    if not has_profile(name, profile):
        have = [p for p in PROFILES if has_profile(name, p)]
        raise ConfigError("profile", profile, f"{' | '.join(have)} for {name} (its run groups define no "
                          f"{profile} profile; text exists for the NORMEC and FEDNORMEC IDs, code for "
                          "ALI-DPFL's)")
    out = []
    for point in grid_points(name, profile):
        overrides = point_overrides(point, profile)
        out.append(Job(point, overrides, key(tuple(overrides)), compose(tuple(overrides)),
                       method(point["experiment"], point)))
    unique = {job.key: job for job in reversed(out)}          # blocks may overlap: first one wins
    return [job for job in out if unique[job.key] is job]
