"""The value rules: every bad value is refused before any data is read or any step is taken, with the key, the
value it got and what is allowed. The privacy node's rules are in ``privacy_rules``."""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, ListConfig, OmegaConf

from normfl.algorithms.fed import BOUNDINGS, MEMORY_UPDATES
from normfl.algorithms.local import OPERATORS
from normfl.config import checks
from normfl.config.checks import choice, number, unread
from normfl.config.keys import algorithm, get, root, validate_keys
from normfl.config.privacy_rules import validate_audit, validate_privacy
from normfl.data.clients import ORACLES
from normfl.data.sources import SPLITS, holdout_indices, npz_client_ids
from normfl.data.transforms import SCALES
from normfl.engine import BACKENDS, MEMORY_FORMATS, PRECISIONS
from normfl.engine.capture import CAPTURES, capturable
from normfl.engine.flat import pick_device
from normfl.errors import ConfigError
from normfl.ops import PARTICIPATIONS

FLAGS = ("resume", "eval_train", "deterministic", "progress", "save_params", "dataset.augment", "dataset.download",
         "partition.capped", "algo.private", "algo.server_norm", "algo.adaptive", "algo.literal_psi",
         "algo.scale_to_unit", "privacy.amplification", "privacy.K_plus_one", "privacy.sqrt_covers_log")
"""The true/false keys: where one is set it must be a bool (any string counted as true, null as false)."""
READINGS = ("text", "pass")                 # what one round is (reading A2, docs/readings.md)
GRID_PROFILES = ("paper", "text", "code", "quick")  # the settings a figure's grid runs with (make <id> profile=...)
PROFILES = (*GRID_PROFILES, "custom")       # how a run came about: a figure's grid, or by hand


def _natural(cfg: DictConfig) -> bool:
    return (get(cfg, "partition._target_") or "").endswith(".natural")


def resolve_clients(cfg: DictConfig) -> None:
    """partition=natural: the number of clients is the data's. ``clients=null`` becomes the number of distinct
    client ids among the training samples the run uses (the npz's `client` array, after dataset.split=holdout
    and dataset.train_limit); an explicit ``clients`` that differs is refused. Reads only that array (and `y`).
    Call it before ``validate`` and ``config_key``, so that both, and the recorded config, hold the count.
    Other partitions, or a dataset.path that is missing or no file, are left to ``validate``."""
    ds = get(cfg, "dataset")
    if not _natural(cfg) or not isinstance(ds, DictConfig) or "path" not in ds or OmegaConf.is_missing(ds, "path"):
        return
    path, split, limit = ds.path, ds.get("split", "standard"), ds.get("train_limit")
    if not isinstance(path, str) or not Path(path := os.path.expanduser(path)).is_file():
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
    validate_keys(cfg)
    for key in FLAGS:
        if not isinstance(v := get(cfg, key, missing=False), bool):
            raise ConfigError(key, v, "True | False")
    number(cfg, "rounds", lambda v: v >= 1, "an integer >= 1", integer=True)
    if get(cfg, "clients") is None and not _natural(cfg):
        raise ConfigError("clients", None, "an integer >= 1 (null only with partition=natural: the number of "
                          "distinct client ids in the data)")
    number(cfg, "clients", lambda v: v >= 1, "an integer >= 1", integer=True, optional=True)
    number(cfg, "seed", lambda v: 0 <= v < 2**32, "an integer in [0, 2^32)", integer=True)
    number(cfg, "algo_seed", lambda v: 0 <= v < 2**32, "null (seed) or an integer in [0, 2^32)", integer=True,
            optional=True)
    number(cfg, "batch_size", lambda v: v >= 1, "an integer >= 1", integer=True)
    number(cfg, "eval_every", lambda v: v >= 1, "an integer >= 1", integer=True)
    number(cfg, "eval_subset", lambda v: 0 < v <= 1, "null (the whole test set) or a number in (0, 1]",
           optional=True)
    cores = os.cpu_count() or 1
    number(cfg, "threads", lambda v: 1 <= v <= cores, f"null or an integer in [1, {cores}] (this machine's cores)",
           integer=True, optional=True)
    number(cfg, "checkpoint_every", lambda v: v >= 0, "an integer >= 0 (0: no checkpoints)", integer=True)
    choice(cfg, "profile", PROFILES, optional=False)
    choice(cfg, "oracle", ORACLES, optional=False)
    choice(cfg, "backend", BACKENDS, optional=False)
    choice(cfg, "precision", PRECISIONS, optional=False)
    choice(cfg, "memory_format", MEMORY_FORMATS, optional=False)
    choice(cfg, "capture", CAPTURES, optional=False)
    validate_audit(cfg)
    if get(cfg, "capture") == "on":
        why_not = capturable(pick_device(cfg.device.name), bool(cfg.get("deterministic", False)))
        if why_not:
           raise ConfigError("capture", "on", f"auto or off ({why_not})")
        if cfg.backend not in ("stacked", "auto"):
           raise ConfigError("capture", "on", f"auto or off with backend={cfg.backend} (only the stacked pass is "
                              "captured: backend=stacked)")
    choice(cfg, "reading", READINGS, optional=False)
    if get(cfg, "reading") == "pass":
        if cfg.oracle != "minibatch":
           raise ConfigError("reading", "pass", "text with oracle=full (a full-gradient round is a pass already)")
        if why := algorithm(cfg).own_round:
           raise ConfigError("reading", "pass", f"text with algo={cfg.algo.name} ({why})")
    if cfg.precision == "bf16" and cfg.device.name == "mps":
        raise ConfigError("precision", "bf16", "fp32 on mps (bf16 autocast needs a CPU or CUDA device)")
    if cfg.precision == "bf16" and cfg.backend in ("vmap", "analytic"):
        raise ConfigError("precision", "bf16", f"fp32 with backend={cfg.backend} (bf16 autocast runs on "
                          "backend=sequential or stacked, between which auto then picks)")
    choice(cfg, "device.name", ("auto", "cpu", "cuda", "mps"), optional=False)
    device = pick_device(cfg.device.name).type        # a device this machine lacks is refused here
    if cfg.precision == "tf32" and device != "cuda":
        raise ConfigError("precision", "tf32", f"fp32 or bf16 on {device} (TF32 is a mode of CUDA's matmuls and "
                          "convolutions)")
    choice(cfg, "logger.name", ("csv", "wandb"), optional=False)
    choice(cfg, "logger.mode", ("offline", "online", "disabled"))
    for key in ("logger.project", "logger.entity"):
        v = get(cfg, key)
        if v is not None and not (isinstance(v, str) and v and not set(v) & set("/\\#?%:")):
           raise ConfigError(key, v, f"{'null or ' * (key == 'logger.entity')}a name without / \\ # ? % :")
    for key in ("logger.group", "logger.notes"):
        if not isinstance(v := get(cfg, key), (str, type(None))):
            raise ConfigError(key, v, f"null or a string (a number quoted: {key}=\"'7'\")")
    tags = get(cfg, "logger.tags", missing=[])
    if not isinstance(tags, (list, ListConfig)) or not all(isinstance(t, str) and 1 <= len(t) <= 64 for t in tags):
        raise ConfigError("logger.tags", OmegaConf.to_container(tags) if isinstance(tags, ListConfig) else tags,
                          "a list of strings of 1 to 64 characters (W&B's limit), e.g. logger.tags='[grid1,fmnist]'")
    if cfg.logger.name == "wandb" and importlib.util.find_spec("wandb") is None:
        raise ConfigError("logger", "wandb", "csv here (the wandb package is not installed: pip install wandb)")

    algorithm(cfg).check(cfg, checks)                # its own keys, as its class declares
    number(cfg, "algo.alpha", lambda v: v >= 0, "a number >= 0", optional=True)
    for key in ("p", "algo.p"):       # the weights q_i = 1/p are float32: a smaller p made them NaN, "diverged"
        number(cfg, key, lambda v: 1e-30 <= v <= 1, "a number in [1e-30, 1]", optional=True)
    if get(cfg, "p") not in (None, 1, 1.0) and get(cfg, "algo.p") is None:      # the algorithm would ignore it
        raise ConfigError("p", cfg.p, f"1.0 with algo={cfg.algo.name}, which lets every client take part each "
                          "round; the federated algorithms (fed_normec, dp_fed_normec, fedavg, dp_fedavg) sample "
                          "clients with p")

    validate_privacy(cfg)

    number(cfg, "algo.eta", lambda v: v > 0, "null or a number > 0", optional=True)
    number(cfg, "algo.local_steps", lambda v: v >= 1, "an integer >= 1", integer=True, optional=True)
    number(cfg, "algo.ig_batch_size", lambda v: v >= 1, "an integer >= 1", integer=True, optional=True)
    choice(cfg, "algo.local_operator", OPERATORS)
    choice(cfg, "algo.memory_update", MEMORY_UPDATES)
    choice(cfg, "algo.participation", PARTICIPATIONS)
    choice(cfg, "algo.bounding", BOUNDINGS)
    choice(cfg, "algo.noise_by", ("client", "server"))
    operator = get(cfg, "algo.local_operator")
    if operator == "ig":
        unread(cfg, "algo.local_steps", "with algo.local_operator=ig (one incremental pass over the shard)")
    elif operator == "gd":
        unread(cfg, "algo.ig_batch_size", "with algo.local_operator=gd (algo.local_operator=ig reads it)")
    if get(cfg, "algo.noise_by") is not None and not cfg.algo.get("private"):
        unread(cfg, "algo.noise_by", "with algo.private=false (no noise to add)")
    if get(cfg, "algo.participation") == "cohort":
        number(cfg, "algo.cohort_size", lambda v: 1 <= v <= (cfg.clients or math.inf),
               f"an integer in [1, clients={cfg.clients}]",
               integer=True)
        if cfg.privacy.amplification and cfg.algo.get("private"):
           raise ConfigError("privacy.amplification", True, "false with cohort participation (amplification is "
                              "accounted for Poisson sampling only)")
        if get(cfg, "algo.p") not in (None, 1, 1.0):     # a cohort's chance is cohort_size / clients
           raise ConfigError("algo.p", cfg.algo.p, "1.0 with algo.participation=cohort (algo.cohort_size sets who "
                              "takes part; p is Bernoulli participation's)")
    elif get(cfg, "algo.participation") == "bernoulli" and get(cfg, "algo.cohort_size") is not None:
        raise ConfigError("algo.cohort_size", cfg.algo.cohort_size, "null with algo.participation=bernoulli (each "
                          "client takes part with chance p; algo.participation=cohort draws cohort_size clients)")
    if get(cfg, "algo.bounding") == "none" and cfg.algo.get("private"):
        raise ConfigError("algo.bounding", "none", "norm or clip when algo.private=true (the noise needs a bound)")

    choice(cfg, "dataset.split", SPLITS, optional=False)
    number(cfg, "dataset.holdout_fraction", lambda v: 0 < v < 1, "a number in (0, 1)")
    choice(cfg, "dataset.scale", SCALES)
    _validate_normalization(cfg)
    for key in ("dataset.train_limit", "dataset.test_limit"):
        number(cfg, key, lambda v: v >= 1, "null or an integer >= 1", integer=True, optional=True)
    choice(cfg, "model.norm", ("batch", "group"))
    choice(cfg, "model.init", ("default", "zeros"))
    number(cfg, "partition.shards_per_client", lambda v: v >= 1, "an integer >= 1", integer=True, optional=True)
    number(cfg, "partition.alpha", lambda v: v > 0, "a number > 0", optional=True)
    for key in ("partition.min_size", "partition.num_shards", "partition.shard_size"):
        number(cfg, key, lambda v: v >= 1, "null or an integer >= 1", integer=True, optional=True)
    number(cfg, "dataset.split_seed", lambda v: 0 <= v < 2**32, "an integer in [0, 2^32)", integer=True)
    if get(cfg, "dataset.split") == "standard":
        for key in ("holdout_fraction", "split_seed"):
            unread(cfg, f"dataset.{key}", "with dataset.split=standard (the official train/test sets)")
    if get(cfg, "oracle") == "full":
        unread(cfg, "batch_size", "with oracle=full (each client's whole shard)", root().get("batch_size", KeyError))
    hidden, model = get(cfg, "model.hidden"), (get(cfg, "model._target_") or "").rsplit(".", 1)[-1]
    listed = model != "cnn"                               # mlp: a width per layer; cnn: one hidden layer's width
    widths = list(hidden) if isinstance(hidden, ListConfig) and listed else [hidden]
    if hidden is not None and not (isinstance(hidden, ListConfig) == listed and all(
            isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in widths)):
        raise ConfigError("model.hidden", OmegaConf.to_container(hidden) if isinstance(hidden, ListConfig) else hidden,
                          f"{'a list of integers >= 1' if listed else 'an integer >= 1'} with model={model}")

    if get(cfg, "dataset._target_") == "normfl.data.load_npz" and OmegaConf.is_missing(cfg.dataset, "path"):
        raise ConfigError("dataset.path", "???", "the path of an .npz file: dataset=npz dataset.path=FILE")
    if get(cfg, "dataset.path") is not None and not Path(path := os.path.expanduser(cfg.dataset.path)).is_file():
        where = "" if Path(path).is_absolute() else f" (relative to the working directory, {Path.cwd()})"
        raise ConfigError("dataset.path", path, f"an existing .npz file{where}")
    for key in ("data_root", "offline_data"):
        if not isinstance(v := get(cfg, key), str) or not v:
            raise ConfigError(key, v, "a directory's path (data_root: torchvision's data and the caches; offline_data: "
                              "the offline copies)")
    env = os.environ.get("NORMFL_OFFLINE_DATA")
    if env and not Path(env := os.path.expanduser(env)).is_dir():
        raise ConfigError("offline_data (from $NORMFL_OFFLINE_DATA)", env, "an existing directory")
    if (get(cfg, "partition._target_") or "").endswith("natural") and get(cfg, "dataset.path") is None:
        raise ConfigError("partition", "natural", "only with dataset=npz carrying a `client` array")


def _validate_normalization(cfg: DictConfig) -> None:
    """dataset.mean and dataset.std: lists of finite numbers of one length (empty: no normalisation), std > 0.
    Their length against the data's channels is checked once the data is read (``run.setup``)."""
    lists = {}
    for key, ok, rule in (("dataset.mean", math.isfinite, "finite numbers"),
                          ("dataset.std", lambda v: math.isfinite(v) and v > 0, "numbers > 0")):
        v = get(cfg, key, missing=[])
        items = list(v) if isinstance(v, ListConfig | list | tuple) else None
        if items is None or not all(isinstance(e, int | float) and not isinstance(e, bool) and ok(e) for e in items):
            raise ConfigError(key, OmegaConf.to_container(v) if isinstance(v, ListConfig) else v,
                              f"a list of {rule}, one per channel of the data ([]: no normalisation)")
        lists[key] = items
    if len(lists["dataset.mean"]) != len(lists["dataset.std"]):
        raise ConfigError("dataset.mean", lists["dataset.mean"], f"as many numbers as dataset.std "
                          f"({len(lists['dataset.std'])}), one per channel of the data")


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
