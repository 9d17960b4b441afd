"""A run's parts built from its config: data and partition, model, algorithm, clients and the backend."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from normfl.config import READ_BESIDE, ConfigError, resolve_clients, validate_data
from normfl.data import ClientData, DataNotFoundError, Preprocess, client_test_split
from normfl.data.clients import Batches
from normfl.engine import ClientEngine, Clients, FlatModel, choose_backend, pick_device
from normfl.engine.capture import CapturedRound
from normfl.engine.flat import device_name, set_numerics
from normfl.privacy import Privacy
from normfl.privacy.audit import joining

log = logging.getLogger(__name__)


def _kind(node: DictConfig) -> str:
    """The short name of a config group's target, e.g. 'iid' for normfl.data.partition.iid."""
    return node._target_.rsplit(".", 1)[1]


def build_data(cfg: DictConfig):
    """The dataset (with its label) and the client partition, as the config says (``clients`` resolved:
    ``build``)."""
    ds_cfg = {k: v for k, v in OmegaConf.to_container(cfg.dataset, resolve=True).items()
              if k not in READ_BESIDE["dataset"]}
    try:
        ds = instantiate(ds_cfg)
    except InstantiationException as err:  # e.g. a split the data cannot give
        cause = err.__cause__
        root, failed = Path(cfg.data_root).expanduser().resolve(), getattr(cause, "filename", None)
        if (isinstance(cause, OSError) and not isinstance(cause, DataNotFoundError) and failed
                and (Path(failed).is_relative_to(root) or root.is_relative_to(failed))):   # making or writing it
            raise ConfigError("data_root", cfg.data_root, f"a directory normfl can make and write, where torchvision's "
                              f"data and the caches go ({cause.strerror}: {cause.filename})") from None
        if isinstance(cause, (FileNotFoundError, ConfigError)):     # a missing or bad data file
            raise cause from None
        raise ConfigError("dataset", _kind(cfg.dataset), str(err.__cause__ or err)) from err
    full = len(ds.y_train), len(ds.y_test)             # the sizes before the limits, for the log line
    if cfg.dataset.train_limit or cfg.dataset.test_limit:
        ds = ds.head(cfg.dataset.train_limit, cfg.dataset.test_limit)
    if cfg.clients > len(ds.y_train) and _kind(cfg.partition) != "sampled_shards":
        raise ConfigError("clients", cfg.clients,
                          f"at most the {len(ds.y_train)} training samples (or partition=sampled_shards)")
    split = instantiate(cfg.partition)
    try:
        if _kind(cfg.partition) == "natural":
            parts = split(ds.client_ids.numpy(), num_clients=cfg.clients)
        else:
            parts = split(ds.y_train.numpy(), num_clients=cfg.clients, seed=cfg.seed)
    except ValueError as err:  # the partition cannot be made from this data
        raise ConfigError("partition", _kind(cfg.partition), str(err)) from err
    if ds.split == "per_client":                # each client's test piece, cut from its share
        pooled = len(ds.y_train)
        try:
            ds, parts = client_test_split(ds, parts, cfg.dataset.holdout_fraction, cfg.dataset.split_seed)
        except ValueError as err:
            raise ConfigError("dataset.holdout_fraction", cfg.dataset.holdout_fraction, str(err)) from err
        full = full[0], len(ds.y_test)
        ds = ds.head(None, cfg.dataset.test_limit)
        log.info(ds.size_line(*full, pooled=pooled))
    else:
        log.info(ds.size_line(*full))
    return ds, parts


@dataclass
class Setup:
    """What a run is made of, before its first round."""

    device: torch.device
    ds: object                 # the dataset (normfl.data.ArrayDataset)
    parts: list                # each client's training indices
    flat: FlatModel
    x: torch.Tensor            # x^0
    algo: object               # the algorithm, set up for cfg.rounds
    prep: Preprocess           # turns a batch cut from clients.data.x into model input (for eval_train)
    x_test: torch.Tensor       # ds.x_test normalised once, on the device: model input as it is
    y_test: torch.Tensor       # ds.y_test on the device
    clients: Clients           # the engine and the clients' data (clients.data)
    steps_per_round: int       # communication steps a round makes: 1, or a pass's steps with reading=pass


# What runs must share to train side by side in one process (``train_together``): their data, their
# model and the way the pass runs. Everything else (the algorithm and its settings, privacy, rounds,
# participation, evaluation) may differ: each run keeps its own state and batch streams.
SHARED = ("dataset", "partition", "model", "clients", "seed", "batch_size", "oracle", "precision", "backend",
          "device", "threads", "deterministic", "memory_format", "data_root", "offline_data")


def shared_key(cfg: DictConfig, keys=SHARED) -> str:
    """Runs with the same key share ``keys`` of their configs."""
    return json.dumps({k: OmegaConf.to_container(cfg, resolve=True).get(k) for k in keys}, sort_keys=True, default=str)


def algo_seed(cfg: DictConfig) -> int:
    """The seed of the algorithm's own draws (its noise, quantizer, cohorts, Poisson batches): ``algo_seed``, or
    ``seed`` when that is null, as in every config before the key existed."""
    return cfg.seed if cfg.get("algo_seed") is None else cfg.algo_seed


def build(cfg: DictConfig, cache: dict | None = None) -> Setup:
    """Data, partition, model, algorithm and clients from a validated config, with the backend chosen.
    Runs built with one ``cache`` load and prepare the same data once."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    deterministic = bool(cfg.get("deterministic", False))
    if deterministic:                        # cuBLAS needs a fixed workspace for repeatable sums
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    set_numerics(cfg.precision, deterministic)
    device = pick_device(cfg.device.name)
    resolve_clients(cfg)                     # partition=natural: clients from the data (start did it; bench.py not)
    algo = build_algo(cfg.algo)              # before the data: a setting the algorithm lacks is bad input
    cache = {} if cache is None else cache
    key = shared_key(cfg, ("dataset", "partition", "clients", "seed", "device", "data_root", "offline_data"))
    if key not in cache:
        cache[key] = _prepared_data(cfg, device)
    ds, parts, prep, batches, x_test, y_test = cache[key]
    validate_data(cfg, parts)

    torch.manual_seed(cfg.seed)
    try:
        model = instantiate(cfg.model, in_shape=tuple(ds.x_train.shape[1:]), num_classes=ds.num_classes)
    except InstantiationException as err:    # e.g. a convolutional model on flat features
        raise ConfigError("model", _kind(cfg.model), f"a model for inputs of shape {tuple(ds.x_train.shape[1:])} "
                          f"({err.__cause__ or err})") from err
    flat = FlatModel(model, device, cfg.precision, cfg.get("memory_format", "auto"))
    _takes_the_data(flat, x_test[:2], cfg)
    x = flat.vector()
    data = ClientData(batches.x, batches.y, parts, cfg.batch_size, cfg.seed, prep,
                      augment=bool(cfg.dataset.augment), oracle=cfg.oracle, batches=batches)
    if not algo.poisson_batches and (short := data.short_shards(cfg.batch_size)):
        log.info(short)                      # DP-SGD's batches are Poisson draws at algo.sample_rate instead
    steps = data.steps_per_pass() if cfg.get("reading", "text") == "pass" else 1
    # a release audit's canary clients join the run: its algorithm serves n + N clients (normfl.privacy.audit.release)
    algo.setup(x, cfg.clients + joining(cfg), cfg.rounds * steps, build_privacy(cfg, steps), algo_seed(cfg))
    try:
        engine = ClientEngine(flat, cfg.backend, in_shape=tuple(ds.x_train.shape[1:]),
                              capture=cfg.get("capture", "auto"))
    except ValueError as err:                # a backend this model's layers do not allow
        raise ConfigError("backend", cfg.backend, f"one of {', '.join(engine_options(flat, ds))} with "
                          f"model={_kind(cfg.model)} ({err})") from err
    clients = Clients(engine, data)
    if cfg.backend == "auto":                # timed on up to 64 clients' batches: enough to tell, cheap at 10^5
        engine.backend = choose_backend(engine, x, clients.peek(range(min(len(data), 64))),
                                        _backend_key(cfg, flat))
    if device.type == "cuda" and cfg.get("capture", "auto") != "off" and (engine.backend != "stacked"
                                                                         or engine.why_eager):
        log.info("capture: rounds run eagerly (%s)", engine.why_eager or f"backend={engine.backend}: only the "
                 "stacked pass is captured")
    elif cfg.backend == "vmap" and not data.uniform():
        raise ConfigError("backend", "vmap", "sequential or auto: clients' batches differ in size")
    elif cfg.backend == "stacked" and engine.stacked.has_batchnorm and not data.uniform():
        raise ConfigError("backend", "stacked", "sequential or auto: clients' batches differ in size, and a "
                          "model with BatchNorm needs equal batches to run them side by side")
    return Setup(device, ds, parts, flat, x, algo, prep, x_test, y_test, clients, steps)


def _takes_the_data(flat: FlatModel, xb: torch.Tensor, cfg: DictConfig) -> None:
    """Two test samples through the model in eval mode (no statistics change): a model that cannot take the
    data's shape (a convolution larger than the images, flat features into a convolution) is bad input."""
    was_training = flat.module.training
    try:
        with torch.no_grad():
            flat.module.eval()(xb)
    except RuntimeError as err:
        raise ConfigError("model", _kind(cfg.model), f"a model for inputs of shape {tuple(xb.shape[1:])} (it "
                          f"raised: {str(err).splitlines()[0]})") from err
    finally:
        flat.module.train(was_training)


def one_pass_box(algo, clients: Clients) -> bool:
    """Whether a run's round is tensor work around one stacked pass of one minibatch a client (its algorithm
    declares ``captures_round``): what a round captured whole (``round_of``) needs."""
    return algo.captures_round and clients.engine.backend == "stacked" and clients.data.oracle == "minibatch"


def round_of(algo, clients: Clients):
    """The run's round: for ``one_pass_box`` runs with equal minibatches, the whole round on static buffers
    (``engine.capture.CapturedRound``: one CUDA graph on a GPU); otherwise the algorithm's."""
    engine = clients.engine
    if engine.static is None or not one_pass_box(algo, clients) or not clients.data.uniform():
        return algo.round
    return CapturedRound(algo, engine.static, engine.static.capture, engine.why_eager)


def build_algo(node: DictConfig):
    """The algorithm of ``cfg.algo`` (its keys checked by ``config.validate``); a value its constructor raises
    on is refused naming the algorithm and what it raised."""
    try:
        return instantiate(node)
    except InstantiationException as err:
        cause = err.__cause__ or err
        raise ConfigError("algo", node.name, f"values algo={node.name}'s constructor takes (it raised "
                          f"{type(cause).__name__}: {cause})") from err


def _prepared_data(cfg: DictConfig, device: torch.device):
    """(dataset, partition, preprocessing, the clients' ``Batches``, test inputs, test labels), all on the run's
    device. The test set is normalised once. The training set is too without augmentation, so that a batch
    is a gather; with augmentation it stays raw (CIFAR-10 as uint8: 150 MB), normalised batch by batch after
    its crop."""
    ds, parts = build_data(cfg)
    prep = Preprocess(ds.mean, ds.std, device, cfg.dataset.get("scale", "unit"))
    if cfg.dataset.get("scale") == "raw" and (len(ds.mean) or len(ds.std)):
        log.info("dataset.scale=raw: the pixels are not normalised (dataset.mean and dataset.std are not read)")
    try:
        x_train, x_test = ds.x_train, prep(ds.x_test)
    except ValueError as err:                # dataset.mean / std of another number of channels than the data's
        c = ds.x_test.shape[1]
        raise ConfigError("dataset.mean", list(ds.mean), f"{'1 or ' * (c > 1)}{c} number{'s' * (c > 1)} (the "
                          f"data has {c} channel{'s' * (c > 1)}), as many in dataset.std") from err
    if not cfg.dataset.augment:
        x_train, prep = prep(x_train), Preprocess((), (), device)
    return ds, parts, prep, Batches(x_train, ds.y_train, prep), x_test, ds.y_test.to(device)


def build_privacy(cfg: DictConfig, releases_per_round: int = 1) -> Privacy:
    return Privacy(accountant=cfg.accountant.name, releases_per_round=releases_per_round,
                   **OmegaConf.to_container(cfg.privacy, resolve=True))


def engine_options(flat: FlatModel, ds) -> tuple[str, ...]:
    """The backends a model allows, for the error that refuses another."""
    return ("auto", *ClientEngine(flat, in_shape=tuple(ds.x_train.shape[1:])).backends())


def _backend_key(cfg: DictConfig, flat: FlatModel) -> str:
    """What the faster backend depends on: model, size, hardware, clients, batch, precision, memory format, torch,
    threads."""
    return "|".join(map(str, (_kind(cfg.model), flat.dim, flat.device, device_name(flat.device), cfg.clients,
                              cfg.batch_size, cfg.oracle, cfg.precision, flat.memory_format, torch.__version__,
                              torch.get_num_threads())))
