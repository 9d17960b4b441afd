"""Config validation: every bad value is refused before any data is read or any step is taken.

Each rule names the key, the value it got and what is allowed.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import json
import math
import os
from pathlib import Path

import numpy as np
from hydra.utils import get_object
from omegaconf import DictConfig, ListConfig, OmegaConf

from normfl.algorithms.fed import BOUNDINGS, MEMORY_UPDATES
from normfl.algorithms.local import OPERATORS
from normfl.algorithms.nfa import MECHANISMS, NOISE_AT, SCOPES, SENSITIVITIES, UPLOADS
from normfl.algorithms.tau import T_MODES, TAU_RULES
from normfl.data.clients import ORACLES
from normfl.data.sources import SPLITS, holdout_indices, npz_client_ids
from normfl.data.transforms import SCALES
from normfl.engine import BACKENDS, MEMORY_FORMATS, PRECISIONS
from normfl.engine.capture import CAPTURES, capturable
from normfl.engine.flat import pick_device
from normfl.errors import ConfigError
from normfl.ops import PARTICIPATIONS
from normfl.privacy import ACCOUNTANTS, CALIBRATIONS, K_COUNTS, LOG_BASES, NOISE_ON, RELATIONS
from normfl.privacy.sgm import METHODS as RC_METHODS

EPSILON_MAX = 100.0                         # the largest privacy.epsilon a run takes
NOISE_MAX = 1e6                             # the largest noise multiplier (1e300 overflowed dp-accounting's RDP)
FLAGS = ("resume", "eval_train", "deterministic", "progress", "save_params", "dataset.augment", "dataset.download",
         "partition.capped", "algo.private", "algo.server_norm", "algo.adaptive", "algo.literal_psi",
         "algo.scale_to_unit", "privacy.amplification", "privacy.K_plus_one", "privacy.sqrt_covers_log")
"""The true/false keys: where one is set it must be a bool (any string counted as true, null as false)."""
READINGS = ("text", "pass")                 # what one round is (reading A2, docs/readings.md)
GRID_PROFILES = ("paper", "text", "code", "quick")  # the settings a figure's grid runs with (make <id> profile=...)
PROFILES = (*GRID_PROFILES, "custom")       # how a run came about: a figure's grid, or by hand


CONF = Path(__file__).resolve().parents[1] / "conf"
# What the code passes a group's target itself, beside the group's keys; privacy's node has no _target_.
GIVEN = {"algo": (), "partition": ("labels", "client_ids", "num_clients", "seed"),
         "model": ("in_shape", "num_classes"), "privacy": ("accountant", "releases_per_round"), "dataset": ()}
READ_BESIDE = {"dataset": ("augment", "train_limit", "test_limit", "scale")}   # read by the run, not the loader
OPTION_FILES = ("logger", "accountant", "device")   # groups whose option file lists every key the option takes
PRIVACY_TARGET = "normfl.privacy.Privacy"


def accepted_keys(target: str, given=()) -> list[str]:
    """The keys a config node of ``target`` (a class or a function) may set, sorted: the arguments it takes,
    with those of the constructors a class passes ``*args, **kw`` on to, less ``given`` (what the code passes)."""
    obj = get_object(target)
    keys = set()
    for fn in [c.__init__ for c in obj.__mro__ if "__init__" in vars(c)] if isinstance(obj, type) else [obj]:
        params = inspect.signature(fn).parameters.values()
        keys |= {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        if not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
            break
    return sorted(keys - {"self", *given})


@functools.cache
def _root() -> DictConfig:
    """conf/config.yaml (empty where conf/ is not beside the package)."""
    return OmegaConf.load(CONF / "config.yaml") if (CONF / "config.yaml").is_file() else OmegaConf.create()


@functools.cache
def top_level_keys() -> frozenset[str]:
    """conf/config.yaml's keys and its groups' names (empty where conf/ is not beside the package)."""
    groups = {next(iter(d)) for d in _root().get("defaults", []) if isinstance(d, DictConfig)}
    return frozenset((set(_root()) - {"defaults"}) | groups)


def _validate_keys(cfg: DictConfig) -> None:
    """A key no part of normfl reads (a misspelling, a key of another group's option) is refused with the keys
    that are read there: at the top level; in algo, partition, model, privacy and dataset, whose keys are the
    arguments of what they build; in logger, accountant and device, whose option files list their keys; in
    audit, whose keys conf/config.yaml lists."""
    known = top_level_keys()
    for key in cfg:
        if known and key not in known:
            raise ConfigError(key, cfg[key], f"a key of conf/config.yaml or a config group: {', '.join(sorted(known))}")
    for group, given in GIVEN.items():
        node = _get(cfg, group)
        if not isinstance(node, DictConfig):
            continue
        target = node.get("_target_", PRIVACY_TARGET)
        try:
            accepted = sorted({*accepted_keys(target, given), *READ_BESIDE.get(group, ())})
        except Exception:                   # no such target: building it says so
            continue
        name = node.get("name") or target.rsplit(".", 1)[1] if group != "privacy" else None
        _refuse_unknown(node, group, accepted, f"{group}={name}" if name else group)
    for group in OPTION_FILES:
        node, option = _get(cfg, group), _get(cfg, f"{group}.name")
        if isinstance(node, DictConfig) and (keys := _option(group, str(option))):
            _refuse_unknown(node, group, sorted(keys), f"{group}={option}")
    if isinstance(node := _get(cfg, "audit"), DictConfig) and "audit" in _root():
        _refuse_unknown(node, "audit", sorted(_root().audit), "audit")


@functools.cache
def _option(group: str, option: str) -> dict:
    """conf/<group>/<option>.yaml with the options of its group it builds on (its ``defaults``), as a dict."""
    path = CONF / group / f"{option}.yaml"
    if not path.is_file():
        return {}
    node = OmegaConf.to_container(OmegaConf.load(path))
    merged = {}
    for base in node.pop("defaults", []):
        if isinstance(base, str) and base != "_self_":
            merged.update(_option(group, base))
    return {**merged, **node}


def _unread(cfg: DictConfig, key: str, why: str, default=KeyError) -> None:
    """Refuse ``key`` where the run would not read it, unless it keeps its default: ``default``, else the value in
    the file of the group's option (algo: ``algo.name``; dataset: the file of the same loader)."""
    group, _, leaf = key.partition(".")
    if default is KeyError:
        if group == "algo":
            option = _option("algo", cfg.algo.name)
        else:
            files = [_option(group, f.stem) for f in sorted((CONF / group).glob("*.yaml"))]
            option = next((o for o in files if o.get("_target_") == _get(cfg, f"{group}._target_")), {})
        default = option.get(leaf, KeyError)
    value = _get(cfg, key)
    value = OmegaConf.to_container(value) if isinstance(value, ListConfig) else value
    if default is not KeyError and value != default:
        raise ConfigError(key, value, f"{'null' if default is None else default} {why}")


def _refuse_unknown(node: DictConfig, group: str, accepted: list, where: str) -> None:
    unknown = [k for k in node if not str(k).startswith("_") and k not in accepted and k != "defaults"]
    if unknown:
        raise ConfigError(f"{group}.{unknown[0]}", node[unknown[0]],
                          f"the keys of {where}: {', '.join(accepted) or 'none'}")


def _get(cfg: DictConfig, key: str, missing=None):
    node = cfg
    for part in key.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            return missing
        node = node[part]
    return node


def _number(cfg, key, ok, allowed, integer=False, optional=False):
    v = _get(cfg, key)
    if v is None and optional:
        return
    kinds = (int,) if integer else (int, float)
    if isinstance(v, bool) or not isinstance(v, kinds) or not math.isfinite(v) or not ok(v):
        raise ConfigError(key, v, allowed if integer else f"{allowed}, finite")


def _choice(cfg, key, options, optional=True):
    v = _get(cfg, key)
    if v is None and optional:
        return
    if v not in options:
        raise ConfigError(key, v, " | ".join(map(str, options)))


def _natural(cfg: DictConfig) -> bool:
    return (_get(cfg, "partition._target_") or "").endswith(".natural")


def resolve_clients(cfg: DictConfig) -> None:
    """partition=natural: the number of clients is the data's. ``clients=null`` becomes the number of distinct
    client ids among the training samples the run uses (the npz's `client` array, after dataset.split=holdout
    and dataset.train_limit); an explicit ``clients`` that differs is refused. Reads only that array (and `y`).
    Call it before ``validate`` and ``config_key``, so that both, and the recorded config, hold the count.
    Other partitions, or a dataset.path that is missing or no file, are left to ``validate``."""
    ds = _get(cfg, "dataset")
    if not _natural(cfg) or not isinstance(ds, DictConfig) or "path" not in ds or OmegaConf.is_missing(ds, "path"):
        return
    path, split, limit = ds.path, ds.get("split", "standard"), ds.get("train_limit")
    if not isinstance(path, str) or not Path(path).is_file():
        return
    if split in ("pooled", "per_client"):
        raise ConfigError("dataset.split", split, "standard or holdout with partition=natural (test samples have "
                          "no client ids)")
    ids = npz_client_ids(path)
    if ids is None:
        raise ConfigError("partition", "natural", f"only with an npz carrying a `client` array ({path} has none)")
    cuts = []
    if split == "holdout":
        try:
            ids = ids[holdout_indices(len(ids), ds.holdout_fraction, ds.split_seed)[0]]
        except (TypeError, ValueError):          # a bad holdout_fraction or split_seed: validate names it
            return
        cuts.append("dataset.split=holdout")
    if isinstance(limit, int) and not isinstance(limit, bool) and 1 <= limit < len(ids):
        ids = ids[:limit]
        cuts.append(f"dataset.train_limit={limit}")
    where = f" in the {len(ids)} training samples the run uses: {', '.join(cuts)}" if cuts else ""
    count = len(np.unique(ids))
    if cfg.clients is None:
        cfg.clients = count
    elif cfg.clients != count or isinstance(cfg.clients, bool):
        raise ConfigError("clients", cfg.clients, f"{count} (the distinct client ids of {path}'s client array"
                          f"{where}) with partition=natural, or null")


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError on the first bad value."""
    _validate_keys(cfg)
    for key in FLAGS:
        if not isinstance(v := _get(cfg, key, missing=False), bool):
            raise ConfigError(key, v, "True | False")
    _number(cfg, "rounds", lambda v: v >= 1, "an integer >= 1", integer=True)
    if _get(cfg, "clients") is None and not _natural(cfg):
        raise ConfigError("clients", None, "an integer >= 1 (null only with partition=natural: the number of "
                          "distinct client ids in the data)")
    _number(cfg, "clients", lambda v: v >= 1, "an integer >= 1", integer=True, optional=True)
    _number(cfg, "seed", lambda v: 0 <= v < 2**32, "an integer in [0, 2^32)", integer=True)
    _number(cfg, "algo_seed", lambda v: 0 <= v < 2**32, "null (seed) or an integer in [0, 2^32)", integer=True,
            optional=True)
    _number(cfg, "batch_size", lambda v: v >= 1, "an integer >= 1", integer=True)
    _number(cfg, "eval_every", lambda v: v >= 1, "an integer >= 1", integer=True)
    _number(cfg, "eval_subset", lambda v: 0 < v <= 1, "null (the whole test set) or a number in (0, 1]",
            optional=True)
    cores = os.cpu_count() or 1
    _number(cfg, "threads", lambda v: 1 <= v <= cores, f"null or an integer in [1, {cores}] (this machine's cores)",
            integer=True, optional=True)
    _number(cfg, "checkpoint_every", lambda v: v >= 0, "an integer >= 0 (0: no checkpoints)", integer=True)
    _choice(cfg, "profile", PROFILES, optional=False)
    _choice(cfg, "oracle", ORACLES, optional=False)
    _choice(cfg, "backend", BACKENDS, optional=False)
    _choice(cfg, "precision", PRECISIONS, optional=False)
    _choice(cfg, "memory_format", MEMORY_FORMATS, optional=False)
    _choice(cfg, "capture", CAPTURES, optional=False)
    _validate_audit(cfg)
    if _get(cfg, "capture") == "on":
        why_not = capturable(pick_device(cfg.device.name), bool(cfg.get("deterministic", False)))
        if why_not:
            raise ConfigError("capture", "on", f"auto or off ({why_not})")
        if cfg.backend not in ("stacked", "auto"):
            raise ConfigError("capture", "on", f"auto or off with backend={cfg.backend} (only the stacked pass is "
                              "captured: backend=stacked)")
    _choice(cfg, "reading", READINGS, optional=False)
    if _get(cfg, "reading") == "pass":
        if cfg.oracle != "minibatch":
            raise ConfigError("reading", "pass", "text with oracle=full (a full-gradient round is a pass already)")
        if _get(cfg, "algo._target_") in ("normfl.algorithms.NormFedAvg", "normfl.algorithms.DPFL"):
            raise ConfigError("reading", "pass", f"text with algo={cfg.algo.name} (its paper defines its round: "
                              "local steps, or DP-SGD steps charged to a privacy budget)")
    if cfg.precision == "bf16" and cfg.device.name == "mps":
        raise ConfigError("precision", "bf16", "fp32 on mps (bf16 autocast needs a CPU or CUDA device)")
    if cfg.precision == "bf16" and cfg.backend in ("vmap", "analytic"):
        raise ConfigError("precision", "bf16", f"fp32 with backend={cfg.backend} (bf16 autocast runs on "
                          "backend=sequential or stacked, between which auto then picks)")
    _choice(cfg, "device.name", ("auto", "cpu", "cuda", "mps"), optional=False)
    device = pick_device(cfg.device.name).type        # a device this machine lacks is refused here
    if cfg.precision == "tf32" and device != "cuda":
        raise ConfigError("precision", "tf32", f"fp32 or bf16 on {device} (TF32 is a mode of CUDA's matmuls and "
                          "convolutions)")
    _choice(cfg, "logger.name", ("csv", "wandb"), optional=False)
    _choice(cfg, "logger.mode", ("offline", "online", "disabled"))
    for key in ("logger.project", "logger.entity"):
        v = _get(cfg, key)
        if v is not None and not (isinstance(v, str) and v and not set(v) & set("/\\#?%:")):
            raise ConfigError(key, v, f"{'null or ' * (key == 'logger.entity')}a name without / \\ # ? % :")
    if cfg.logger.name == "wandb" and importlib.util.find_spec("wandb") is None:
        raise ConfigError("logger", "wandb", "csv here (the wandb package is not installed: pip install wandb)")

    if _get(cfg, "algo._target_") == "normfl.algorithms.NormFedAvg":
        _validate_nfa(cfg)
    elif _get(cfg, "algo._target_") == "normfl.algorithms.DPFL":
        _validate_dpfl(cfg)
    else:
        _number(cfg, "algo.gamma", lambda v: v > 0, "a number > 0")
        _number(cfg, "algo.beta", lambda v: v > 0, "a number > 0")
    _number(cfg, "algo.alpha", lambda v: v >= 0, "a number >= 0", optional=True)
    for key in ("p", "algo.p"):       # the weights q_i = 1/p are float32: a smaller p made them NaN, "diverged"
        _number(cfg, key, lambda v: 1e-30 <= v <= 1, "a number in [1e-30, 1]", optional=True)
    if _get(cfg, "p") not in (None, 1, 1.0) and _get(cfg, "algo.p") is None:      # the algorithm would ignore it
        raise ConfigError("p", cfg.p, f"1.0 with algo={cfg.algo.name}, which lets every client take part each "
                          "round; the federated algorithms (fed_normec, dp_fed_normec, fedavg, dp_fedavg) sample "
                          "clients with p")

    _number(cfg, "privacy.epsilon", lambda v: 0 < v <= EPSILON_MAX, f"a number in (0, {EPSILON_MAX:g}] (a larger "
            "ε certifies nothing, and its noise is too small to account: ε = 1,000 took 7 GiB and 7 minutes)")
    _number(cfg, "privacy.delta", lambda v: 0 < v < 1, "a number in (0, 1)")
    _number(cfg, "privacy.c", lambda v: 0 < v <= NOISE_MAX, f"a number in (0, {NOISE_MAX:g}]")
    _number(cfg, "privacy.noise_multiplier_override", lambda v: 0 <= v <= NOISE_MAX,
            f"null or a number in [0, {NOISE_MAX:g}]", optional=True)
    _choice(cfg, "privacy.log_base", LOG_BASES + (10,))
    _choice(cfg, "privacy.noise_on", NOISE_ON)
    _choice(cfg, "privacy.K", K_COUNTS)
    _choice(cfg, "privacy.calibration", CALIBRATIONS, optional=False)
    _choice(cfg, "privacy.neighbouring", RELATIONS, optional=False)
    _choice(cfg, "accountant.name", ("paper",) + ACCOUNTANTS, optional=False)
    _validate_calibration(cfg)
    if (cfg.privacy.calibration != "paper" and cfg.accountant.name == "rdp" and cfg.privacy.neighbouring == "replace"
            and cfg.privacy.amplification):
        raise ConfigError("accountant", "rdp", "pld for Poisson sampling under replace-one (dp-accounting's RDP "
                          "does not support it)")
    if cfg.privacy.noise_on == "raw_delta" and cfg.privacy.calibration != "paper":
        raise ConfigError("privacy.noise_on", "raw_delta", "scaled_message when calibrating with an accountant")
    _validate_privacy_reads(cfg)

    _number(cfg, "algo.eta", lambda v: v > 0, "null or a number > 0", optional=True)
    _number(cfg, "algo.local_steps", lambda v: v >= 1, "an integer >= 1", integer=True, optional=True)
    _number(cfg, "algo.ig_batch_size", lambda v: v >= 1, "an integer >= 1", integer=True, optional=True)
    _choice(cfg, "algo.local_operator", OPERATORS)
    _choice(cfg, "algo.memory_update", MEMORY_UPDATES)
    _choice(cfg, "algo.participation", PARTICIPATIONS)
    _choice(cfg, "algo.bounding", BOUNDINGS)
    _choice(cfg, "algo.noise_by", ("client", "server"))
    operator = _get(cfg, "algo.local_operator")
    if operator == "ig":
        _unread(cfg, "algo.local_steps", "with algo.local_operator=ig (one incremental pass over the shard)")
    elif operator == "gd":
        _unread(cfg, "algo.ig_batch_size", "with algo.local_operator=gd (algo.local_operator=ig reads it)")
    if _get(cfg, "algo.noise_by") is not None and not cfg.algo.get("private"):
        _unread(cfg, "algo.noise_by", "with algo.private=false (no noise to add)")
    if _get(cfg, "algo.participation") == "cohort":
        _number(cfg, "algo.cohort_size", lambda v: 1 <= v <= (cfg.clients or math.inf),
                f"an integer in [1, clients={cfg.clients}]",
                integer=True)
        if cfg.privacy.amplification and cfg.algo.get("private"):
            raise ConfigError("privacy.amplification", True, "false with cohort participation (amplification is "
                              "accounted for Poisson sampling only)")
        if _get(cfg, "algo.p") not in (None, 1, 1.0):     # a cohort's chance is cohort_size / clients
            raise ConfigError("algo.p", cfg.algo.p, "1.0 with algo.participation=cohort (algo.cohort_size sets who "
                              "takes part; p is Bernoulli participation's)")
    elif _get(cfg, "algo.participation") == "bernoulli" and _get(cfg, "algo.cohort_size") is not None:
        raise ConfigError("algo.cohort_size", cfg.algo.cohort_size, "null with algo.participation=bernoulli (each "
                          "client takes part with chance p; algo.participation=cohort draws cohort_size clients)")
    if _get(cfg, "algo.bounding") == "none" and cfg.algo.get("private"):
        raise ConfigError("algo.bounding", "none", "norm or clip when algo.private=true (the noise needs a bound)")

    _choice(cfg, "dataset.split", SPLITS, optional=False)
    _number(cfg, "dataset.holdout_fraction", lambda v: 0 < v < 1, "a number in (0, 1)")
    _choice(cfg, "dataset.scale", SCALES)
    _validate_normalization(cfg)
    for key in ("dataset.train_limit", "dataset.test_limit"):
        _number(cfg, key, lambda v: v >= 1, "null or an integer >= 1", integer=True, optional=True)
    _choice(cfg, "model.norm", ("batch", "group"))
    _choice(cfg, "model.init", ("default", "zeros"))
    _number(cfg, "partition.shards_per_client", lambda v: v >= 1, "an integer >= 1", integer=True, optional=True)
    _number(cfg, "partition.alpha", lambda v: v > 0, "a number > 0", optional=True)
    for key in ("partition.min_size", "partition.num_shards", "partition.shard_size"):
        _number(cfg, key, lambda v: v >= 1, "null or an integer >= 1", integer=True, optional=True)
    _number(cfg, "dataset.split_seed", lambda v: 0 <= v < 2**32, "an integer in [0, 2^32)", integer=True)
    if _get(cfg, "dataset.split") == "standard":
        for key in ("holdout_fraction", "split_seed"):
            _unread(cfg, f"dataset.{key}", "with dataset.split=standard (the official train/test sets)")
    if _get(cfg, "oracle") == "full":
        _unread(cfg, "batch_size", "with oracle=full (each client's whole shard)", _root().get("batch_size", KeyError))
    hidden, model = _get(cfg, "model.hidden"), (_get(cfg, "model._target_") or "").rsplit(".", 1)[-1]
    listed = model != "cnn"                               # mlp: a width per layer; cnn: one hidden layer's width
    widths = list(hidden) if isinstance(hidden, ListConfig) and listed else [hidden]
    if hidden is not None and not (isinstance(hidden, ListConfig) == listed and all(
            isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in widths)):
        raise ConfigError("model.hidden", OmegaConf.to_container(hidden) if isinstance(hidden, ListConfig) else hidden,
                          f"{'a list of integers >= 1' if listed else 'an integer >= 1'} with model={model}")

    if _get(cfg, "dataset._target_") == "normfl.data.load_npz" and OmegaConf.is_missing(cfg.dataset, "path"):
        raise ConfigError("dataset.path", "???", "the path of an .npz file: dataset=npz dataset.path=FILE")
    if _get(cfg, "dataset.path") is not None and not Path(cfg.dataset.path).is_file():
        raise ConfigError("dataset.path", cfg.dataset.path, "an existing .npz file")
    for key in ("data_root", "offline_data"):
        if not isinstance(v := _get(cfg, key), str) or not v:
            raise ConfigError(key, v, "a directory's path (data_root: torchvision's data and the caches; offline_data: "
                              "the offline copies)")
    env = os.environ.get("NORMFL_OFFLINE_DATA")
    if env and not Path(env).is_dir():
        raise ConfigError("offline_data (from $NORMFL_OFFLINE_DATA)", env, "an existing directory")
    if (_get(cfg, "partition._target_") or "").endswith("natural") and _get(cfg, "dataset.path") is None:
        raise ConfigError("partition", "natural", "only with dataset=npz carrying a `client` array")


def _validate_normalization(cfg: DictConfig) -> None:
    """dataset.mean and dataset.std: lists of finite numbers of one length (empty: no normalisation), std > 0.
    Their length against the data's channels is checked once the data is read (``run.setup``)."""
    lists = {}
    for key, ok, rule in (("dataset.mean", math.isfinite, "finite numbers"),
                          ("dataset.std", lambda v: math.isfinite(v) and v > 0, "numbers > 0")):
        v = _get(cfg, key, missing=[])
        items = list(v) if isinstance(v, ListConfig | list | tuple) else None
        if items is None or not all(isinstance(e, int | float) and not isinstance(e, bool) and ok(e) for e in items):
            raise ConfigError(key, OmegaConf.to_container(v) if isinstance(v, ListConfig) else v,
                              f"a list of {rule}, one per channel of the data ([]: no normalisation)")
        lists[key] = items
    if len(lists["dataset.mean"]) != len(lists["dataset.std"]):
        raise ConfigError("dataset.mean", lists["dataset.mean"], f"as many numbers as dataset.std "
                          f"({len(lists['dataset.std'])}), one per channel of the data")


def _validate_calibration(cfg: DictConfig) -> None:
    """A certificate asked for half-way is refused, never replaced by the papers' formula: the noise is
    calibrated by an accountant only with both ``privacy.calibration=accountant`` and ``accountant=rdp|pld``."""
    calibration, accountant = cfg.privacy.calibration, cfg.accountant.name
    own = {"normfl.algorithms.NormFedAvg": "its noise comes from NFA Theorem 1 (QTDL) or cpSGD (Binomial)",
           "normfl.algorithms.DPFL": "its noise is algo.sigma, and its budget R_c comes from its own accountant"}
    if (why := own.get(_get(cfg, "algo._target_"))) and (calibration, accountant) != ("paper", "paper"):
        raise ConfigError("privacy.calibration" if calibration != "paper" else "accountant",
                          calibration if calibration != "paper" else accountant,
                          f"paper (privacy.calibration=paper accountant=paper) with algo={cfg.algo.name}: {why}")
    if calibration == "accountant" and accountant == "paper":
        raise ConfigError("accountant", "paper", "rdp | pld with privacy.calibration=accountant (the accountant "
                          "that solves σ for privacy.epsilon and certifies it; `paper` is the papers' formula, "
                          "which certifies nothing)")
    if calibration == "paper" and accountant != "paper":
        raise ConfigError("privacy.calibration", "paper", f"accountant with accountant={accountant}, to calibrate "
                          f"the noise to privacy.epsilon with {accountant}; or accountant=paper to keep the papers' "
                          "formula (every private run reports the ε that RDP and PLD certify for it either way)")


PRIVATE_ALGOS = ("dp_normec, dp_clip21, dp_fed_normec, dp_fedavg, dpsgd_norm with algo.private=true, dpfl, ali_dpfl, "
                 "dp_normfedavg, nfa_binomial, nfa_clip_tdl")
FORMULA_KEYS = ("c", "log_base", "sqrt_covers_log", "K_plus_one", "K", "noise_on")   # the papers' noise formula's


def private(cfg: DictConfig) -> bool:
    """Whether the run adds noise: the Gaussian algorithms with algo.private, DP-SGD's, NormFedAvg's mechanisms."""
    target = _get(cfg, "algo._target_")
    if target == "normfl.algorithms.NormFedAvg":
        return _get(cfg, "algo.mechanism") != "none"
    return target == "normfl.algorithms.DPFL" or bool(_get(cfg, "algo.private"))


def _validate_privacy_reads(cfg: DictConfig) -> None:
    """A privacy key the run does not read is refused, not ignored: every one without noise; all but ε and δ
    where the algorithm brings its own mechanism (NormFedAvg, DPFL); the papers' formula under an accountant;
    amplification where no client is sampled."""
    name, target = cfg.algo.name, _get(cfg, "algo._target_")
    if not private(cfg):
        reads, why = (), f"with algo={name}, which adds no noise (the private algorithms: {PRIVATE_ALGOS})"
        if cfg.accountant.name != "paper":
            raise ConfigError("accountant", cfg.accountant.name, f"paper {why}")
    elif target in ("normfl.algorithms.NormFedAvg", "normfl.algorithms.DPFL"):
        reads, why = ("epsilon", "delta"), f"with algo={name}, whose mechanism reads privacy.epsilon and delta alone"
    elif cfg.privacy.calibration == "accountant":
        reads = [k for k in cfg.privacy if k not in FORMULA_KEYS]
        why = "with privacy.calibration=accountant (the accountant solves σ; this key is the papers' formula's)"
    else:
        reads, why = list(cfg.privacy), ""
    for key, default in _option("privacy", "default").items():
        if key not in reads and _get(cfg, f"privacy.{key}", default) != default:
            raise ConfigError(f"privacy.{key}", cfg.privacy[key], f"{default} {why}")
    if "amplification" in reads and cfg.privacy.amplification and _get(cfg, "algo.p") in (None, 1, 1.0):
        raise ConfigError("privacy.amplification", True, f"false with algo={name} at p={_get(cfg, 'algo.p', 1)}: "
                          "amplification by sampling needs clients sampled, p < 1")


def _validate_nfa(cfg: DictConfig) -> None:
    """The keys of NormFedAvg and its variants (conf/algo/normfedavg.yaml)."""
    _number(cfg, "algo.eta0", lambda v: v > 0, "a number > 0")
    _number(cfg, "algo.lr_decay", lambda v: 0 < v <= 1, "a number in (0, 1]")
    _number(cfg, "algo.local_steps", lambda v: v >= 1, "an integer >= 1", integer=True)
    _number(cfg, "algo.momentum", lambda v: 0 <= v < 1, "a number in [0, 1)")
    _number(cfg, "algo.weight_decay", lambda v: v >= 0, "a number >= 0")
    _number(cfg, "algo.cohort_size", lambda v: 1 <= v <= (cfg.clients or math.inf),
            f"null (all) or an integer in [1, clients={cfg.clients}]", integer=True, optional=True)
    for key, options in (("upload", UPLOADS), ("mechanism", MECHANISMS), ("scope", SCOPES),
                         ("sensitivity", SENSITIVITIES), ("noise_at", NOISE_AT)):
        _choice(cfg, f"algo.{key}", options, optional=False)
    _number(cfg, "algo.s", lambda v: v >= 1, "an integer >= 1", integer=True)
    _number(cfg, "algo.mu", lambda v: v > 0, "a number > 0")
    a = cfg.algo
    schedule = "a list of [k_start, value] pairs, distinct integers k_start >= 0 with 0 among them, finite values > 0"
    if (a.beta is None) == (a.beta_over_eta is None):
        raise ConfigError("algo.beta", a.beta, f"{schedule}, or null with algo.beta_over_eta set (exactly one)")
    if a.beta is not None:
        pairs = list(a.beta) if not isinstance(a.beta, (int, float, str)) else None
        ok = pairs and all(isinstance(p, ListConfig) and len(p) == 2 and isinstance(p[0], int)
                           and not isinstance(p[1], bool) and isinstance(p[1], (int, float))
                           and 0 < p[1] < math.inf for p in pairs)
        ok = ok and min(p[0] for p in pairs) == 0 and len({p[0] for p in pairs}) == len(pairs)
        if not ok:
            raise ConfigError("algo.beta", a.beta, schedule)
    else:
        _number(cfg, "algo.beta_over_eta", lambda v: v > 0, "a number > 0")
    quantized = a.mechanism != "none"
    _number(cfg, "algo.clip", lambda v: v > 0 and (v <= 1 or not quantized),
            "a number in (0, 1] (the quantizer needs |coordinates| <= 1)" if quantized else "a number > 0")
    if a.get("scale_to_unit") and a.upload != "clip":
        raise ConfigError("algo.scale_to_unit", True, f"false with algo.upload={a.upload} (it scales a clipped update)")
    if quantized and a.upload == "update":
        raise ConfigError("algo.upload", "update", "unit or clip with a quantizing mechanism (|coordinates| <= 1)")
    if a.mechanism == "binomial" and a.scope != "per_round":
        raise ConfigError("algo.scope", a.scope, "per_round with mechanism=binomial (cpSGD's per-round guarantee)")
    if a.noise_at == "server" and a.mechanism != "qtdl":
        raise ConfigError("algo.noise_at", "server", "client unless mechanism=qtdl (the aggregate-level variant)")
    if a.mechanism == "none":
        for key in ("s", "mu", "scope", "sensitivity", "noise_at"):
            _unread(cfg, f"algo.{key}", f"with algo.mechanism=none (algo={a.name} quantizes nothing and adds no noise)")
    elif a.sensitivity == "worst_case":
        _unread(cfg, "algo.mu", "with algo.sensitivity=worst_case (μ is eq. 6's heuristic's)")
    if a.upload != "clip":
        _unread(cfg, "algo.clip", f"with algo.upload={a.upload} (the clipping bound of algo.upload=clip)")


def _validate_dpfl(cfg: DictConfig) -> None:
    """The keys of DPFL / ALI-DPFL (conf/algo/dpfl.yaml)."""
    for key in ("lr", "sigma", "clip"):
        _number(cfg, f"algo.{key}", lambda v: v > 0, "a number > 0")
    _number(cfg, "algo.sample_rate", lambda v: 0 < v <= 1, "a number in (0, 1]")
    _number(cfg, "algo.tau", lambda v: v >= 1, "an integer >= 1", integer=True)
    _number(cfg, "algo.tau_cap", lambda v: v >= 1, "an integer >= 1", integer=True)
    _number(cfg, "algo.rc_override", lambda v: v >= 1, "null or an integer >= 1", integer=True, optional=True)
    _number(cfg, "algo.divisor", lambda v: v > 0, "null (each client's expected batch q·|D_i|) or a number > 0",
            optional=True)
    _number(cfg, "algo.lambda_const", lambda v: 0 < v < 1, "null or a number in (0, 1)", optional=True)
    _number(cfg, "algo.omega_const", lambda v: v > 0, "null or a number > 0", optional=True)
    _choice(cfg, "algo.rc_method", RC_METHODS, optional=False)
    _choice(cfg, "algo.tau_rule", TAU_RULES, optional=False)
    _choice(cfg, "algo.T_mode", T_MODES, optional=False)
    if cfg.algo.adaptive:
        _unread(cfg, "algo.tau", f"with algo.adaptive=true ({cfg.algo.name} chooses τ each round; algo=dpfl fixes it)",
                default=1)
    if cfg.oracle != "minibatch":
        raise ConfigError("oracle", cfg.oracle, f"minibatch with algo={cfg.algo.name} (its batches are Poisson "
                          "samples at algo.sample_rate)")
    if _get(cfg, "model.norm") == "batch":
        raise ConfigError("model.norm", "batch", "group (DP-SGD's per-sample gradients are undefined with BatchNorm)")


# the algorithms whose mechanism has a canary audit (normfl.privacy.audit.canaries): Gaussian noise added by each
# client or by the server, and DP-SGD on each client; NormFedAvg's discrete mechanisms are audited one message
# at a time instead (normfl.privacy.audit.messages, make audit)
AUDITED = ("normfl.algorithms.NormEC", "normfl.algorithms.Clip21", "normfl.algorithms.FedNormEC",
           "normfl.algorithms.FedAvg", "normfl.algorithms.DPSGDNorm", "normfl.algorithms.DPFL")
AUDIT_MODES = ("sidecar", "inband")


def _validate_audit(cfg: DictConfig) -> None:
    _number(cfg, "audit.canaries", lambda v: v >= 0 and v % 2 == 0, "an even integer >= 0 (0: no audit; half "
            "the canaries in, half out)", integer=True, optional=True)
    _choice(cfg, "audit.mode", AUDIT_MODES)
    n = _get(cfg, "audit.canaries")
    if not n:
        return
    target = _get(cfg, "algo._target_")
    if target not in AUDITED:
        raise ConfigError("audit.canaries", n, "0 here: canaries audit the Gaussian mechanisms (dp_normec, "
                          "dp_clip21, dp_fed_normec, dp_fedavg, dpsgd_norm algo.private=true, dpfl, ali_dpfl); the "
                          "discrete mechanisms of dp_normfedavg are audited per message (make audit)")
    if not private(cfg):                             # DP-SGD is always private; NormFedAvg is not AUDITED
        raise ConfigError("audit.canaries", n, "0 for a run without privacy (nothing to audit)")


def validate_data(cfg: DictConfig, parts) -> None:
    """Checks on the partition, still before training."""
    if len(parts) != cfg.clients:
        raise ConfigError("clients", cfg.clients, f"the partition's {len(parts)} clients")
    empty = [i for i, p in enumerate(parts) if len(p) == 0]
    if empty:
        raise ConfigError("partition", cfg.partition._target_, f"a partition giving every client data "
                          f"(clients {empty[:5]} got none)")
    sizes = sorted({len(p) for p in parts})
    if cfg.algo.get("local_operator") == "ig" and len(sizes) > 1:
        raise ConfigError("algo.local_operator", "ig", f"gd, or a partition with equal shard sizes (an incremental "
                          f"pass takes the same steps on every client; sizes here run {sizes[0]}..{sizes[-1]})")


# What does not change what a run computes: left out of its key (the run store's folder names, and
# the check that a checkpoint or a finished run in a folder belongs to the config asking for it).
NOT_IN_KEY = ("hydra", "threads", "progress", "backend", "device", "logger", "data_root", "offline_data",
              "save_params", "checkpoint_every", "resume", "deterministic", "capture", "audit", "memory_format")

KEY_DEFAULTS = {"precision": "fp32", "reading": "text", "privacy.K": "rounds", "eval_subset": None,
                "algo.divisor": None, "dataset.scale": "unit", "partition.capped": False, "algo.scale_to_unit": False,
                "algo_seed": None}
# A fixed-τ DPFL run never chooses τ: it accepts these options unread (an experiment sets them for its ALI-DPFL
# runs, as experiment=alidpfl_authors_code does the τ rule) and its key holds them at their defaults
ADAPTIVE_ONLY = {"algo.tau_rule": "g_bound_v1", "algo.T_mode": "static", "algo.tau_cap": 100,
                 "algo.lambda_const": None, "algo.omega_const": None}
# Raw pixels (dataset.scale=raw) are not normalised: such a run accepts the mean and std unread (an experiment sets
# them for its normalised input, as the ALI-DPFL ones do) and its key leaves them out
RAW_UNREAD = ("dataset.mean", "dataset.std")
# Where the data lives is not what a run computes: the key holds these paths as the defaults' text whatever
# they resolve to ($NORMFL_DATA, data_root=..., a GPU box's copy), so keys made before this stand
KEY_PATHS = {"dataset.root": "data", "dataset.offline_dir": "../shared/data"}


def _holder(data: dict, key: str) -> tuple[dict | None, str]:
    """The dict that holds dotted ``key`` in ``data`` and the key's last part (None if no dict holds it)."""
    *path, last = key.split(".")
    for part in path:
        data = data.get(part) if isinstance(data, dict) else None
    return (data, last) if isinstance(data, dict) and last in data else (None, last)


def config_key(cfg: DictConfig) -> str:
    """A stable hash of what a run computes: the resolved config without NOT_IN_KEY (an in-band audit, which
    changes what the run computes, stays in)."""
    whole = OmegaConf.to_container(cfg, resolve=True)
    data = {k: v for k, v in whole.items() if k not in NOT_IN_KEY}
    for key, default in KEY_DEFAULTS.items():  # keys added later: absent at their default, so older keys stand
        node, last = _holder(data, key)
        if node is not None and node[last] == default:
            del node[last]
    for key, default in ADAPTIVE_ONLY.items():
        node, last = _holder(data, key)
        if node is not None and node.get("adaptive") is False:
            node[last] = default
    for key in RAW_UNREAD if (data.get("dataset") or {}).get("scale") == "raw" else ():
        node, last = _holder(data, key)
        if node is not None:
            del node[last]
    for key, text in KEY_PATHS.items():
        node, last = _holder(data, key)
        if node is not None:
            node[last] = text
    audit = whole.get("audit") or {}
    if audit.get("mode") == "inband" and audit.get("canaries"):     # canaries in the run's own noise draws
        data["audit"] = {"mode": "inband", "canaries": audit["canaries"]}
    text = json.dumps(data, sort_keys=True, default=str)
    return f"{cfg.algo.name}-{hashlib.sha1(text.encode()).hexdigest()[:12]}"
