"""One experiment: validate, load data, partition, build model and algorithm, run the rounds, record."""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import platform
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

import normfl
from normfl import checkpoint
from normfl.config import ConfigError, config_key, validate, validate_data
from normfl.data import ClientData, Preprocess, label_histogram
from normfl.engine import ClientEngine, Clients, FlatModel, choose_backend, pick_device
from normfl.engine.lockstep import Lockstep
from normfl.privacy import Privacy
from normfl.results import FINISHED, Recorder, write_atomic

log = logging.getLogger("normfl")
INPUT_ERRORS = (ConfigError, FileNotFoundError)


def _kind(node: DictConfig) -> str:
    """The short name of a config group's target, e.g. 'iid' for normfl.data.partition.iid."""
    return node._target_.rsplit(".", 1)[1]


def build_data(cfg: DictConfig):
    """The dataset (with its label) and the client partition, as the config says."""
    extra = ("augment", "train_limit", "test_limit")
    ds_cfg = {k: v for k, v in OmegaConf.to_container(cfg.dataset, resolve=True).items() if k not in extra}
    try:
        ds = instantiate(ds_cfg)
    except InstantiationException as err:  # e.g. a split the data cannot give
        if isinstance(err.__cause__, FileNotFoundError):
            raise err.__cause__ from None
        raise ConfigError("dataset", _kind(cfg.dataset), str(err.__cause__ or err)) from err
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
    prep: Preprocess           # turns a batch cut from x_test or clients.data.x into model input
    x_test: torch.Tensor       # ds.x_test, or normalized once when there is no augmentation (as clients.data.x)
    clients: Clients           # the engine and the clients' data (clients.data)


# What runs must share to train side by side in one process (``train_together``): their data, their
# model and the way the pass runs. Everything else (the algorithm and its settings, privacy, rounds,
# participation, evaluation) may differ: each run keeps its own state and batch streams.
SHARED = ("dataset", "partition", "model", "clients", "seed", "batch_size", "oracle", "precision", "backend",
          "device", "threads", "deterministic", "data_root", "offline_data")


def shared_key(cfg: DictConfig, keys=SHARED) -> str:
    """Runs with the same key share ``keys`` of their configs."""
    return json.dumps({k: OmegaConf.to_container(cfg, resolve=True).get(k) for k in keys}, sort_keys=True, default=str)


def build(cfg: DictConfig, cache: dict | None = None) -> Setup:
    """Data, partition, model, algorithm and clients from a validated config, with the backend chosen.
    Runs built with one ``cache`` load and prepare the same data once."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    deterministic = bool(cfg.get("deterministic", False))
    if deterministic:                        # cuBLAS needs a fixed workspace for repeatable sums
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(deterministic)
    device = pick_device(cfg.device.name)
    try:                                     # before the data: a setting the algorithm lacks is bad input
        algo = instantiate(cfg.algo)
    except InstantiationException as err:
        raise ConfigError("algo", cfg.algo.name, str(err.__cause__ or err)) from err
    cache = {} if cache is None else cache
    key = shared_key(cfg, ("dataset", "partition", "clients", "seed", "device", "data_root", "offline_data"))
    if key not in cache:
        cache[key] = _prepared_data(cfg, device)
    ds, parts, prep, x_train, x_test = cache[key]
    validate_data(cfg, parts)

    torch.manual_seed(cfg.seed)
    try:
        model = instantiate(cfg.model, in_shape=tuple(ds.x_train.shape[1:]), num_classes=ds.num_classes)
    except InstantiationException as err:    # e.g. a convolutional model on flat features
        raise ConfigError("model", _kind(cfg.model), f"a model for inputs of shape {tuple(ds.x_train.shape[1:])} "
                          f"({err.__cause__ or err})") from err
    flat = FlatModel(model, device, cfg.precision)
    x = flat.vector()
    algo.setup(x, cfg.clients, cfg.rounds, build_privacy(cfg), cfg.seed)

    data = ClientData(x_train, ds.y_train, parts, cfg.batch_size, cfg.seed, prep,
                      augment=bool(cfg.dataset.augment), oracle=cfg.oracle)
    try:
        engine = ClientEngine(flat, cfg.backend, in_shape=tuple(ds.x_train.shape[1:]))
    except ValueError as err:                # a backend this model's layers do not allow
        raise ConfigError("backend", cfg.backend, f"one of {', '.join(engine_options(flat, ds))} with "
                          f"model={_kind(cfg.model)} ({err})") from err
    clients = Clients(engine, data)
    if cfg.backend == "auto":                # timed on up to 64 clients' batches: enough to tell, cheap at 10^5
        engine.backend = choose_backend(engine, x, clients.peek(range(min(len(data), 64))),
                                        _backend_key(cfg, flat.dim, device))
    elif cfg.backend == "vmap" and not data.uniform():
        raise ConfigError("backend", "vmap", "sequential or auto: clients' batches differ in size")
    elif cfg.backend == "stacked" and engine.stacked.has_batchnorm and not data.uniform():
        raise ConfigError("backend", "stacked", "sequential or auto: clients' batches differ in size, and a "
                          "model with BatchNorm needs equal batches to run them side by side")
    return Setup(device, ds, parts, flat, x, algo, prep, x_test, clients)


def _prepared_data(cfg: DictConfig, device: torch.device):
    """(dataset, partition, preprocessing, training inputs, test inputs): without augmentation the inputs
    are normalized once, on the run's device, so that a batch is a gather."""
    ds, parts = build_data(cfg)
    prep = Preprocess(ds.mean, ds.std, device)
    x_train, x_test = ds.x_train, ds.x_test
    if not cfg.dataset.augment:
        x_train, x_test, prep = prep(x_train), prep(x_test), Preprocess((), (), device)
    return ds, parts, prep, x_train, x_test


class Training:
    """One run from its first round (or its checkpoint) to its summary: ``record`` takes the outcome of
    round ``k`` from ``x``; ``active`` says whether another round is due."""

    def __init__(self, cfg: DictConfig, out_dir: Path, key: str, state: dict | None, t_start: float,
                 setup: Setup, progress: bool):
        self.cfg, self.out_dir, self.key, self.t_start, self.setup = cfg, Path(out_dir), key, t_start, setup
        self.algo, self.clients, self.x, flat = setup.algo, setup.clients, setup.x, setup.flat
        label_histogram(setup.parts, setup.ds.y_train.numpy(), setup.ds.num_classes).to_csv(
            self.out_dir / "partition.csv")
        self.rec = Recorder(self.out_dir, cfg.logger, OmegaConf.to_container(cfg, resolve=True))
        self.bits = self.algo.bits_per_coord or 8 * self.x.element_size()
        self.upload_bytes = flat.dim * self.bits / 8
        if state:                                            # continue where the checkpoint left off
            self.x, self.sent, self.rec.rows = state["x"].to(self.x.device), state["sent"], state["rows"]
            self.algo.load_state_dict(state["algo"])
            self.clients.data.load_state_dict(state["data"])
            flat.set_buffers(state["buffers"])
            self.clients.engine.backend = state["backend"]
            log.info("resuming from round %d (%s)", self.rec.rows[-1]["round"], checkpoint.NAME)
        else:
            row0 = {"round": 0, "noise_std": self.algo.noise_std, "bits_per_coord": self.bits, "transmissions": 0,
                    "transmissions_total": 0, "bytes_uploaded": 0, "bytes_total": 0, "wall_time": 0.0}
            self.evaluate(row0, self.x, 0)
            self.rec.add(row0)
            self.sent = 0
        self.k = self.rec.rows[-1]["round"]
        self.status, self.t0 = "completed", time.perf_counter() - self.rec.rows[-1]["wall_time"]
        self.active = self.k < cfg.rounds
        self.bar = tqdm(total=cfg.rounds, initial=self.k, disable=not progress, desc=cfg.algo.name,
                        dynamic_ncols=True)

    def evaluate(self, row: dict, at: torch.Tensor, k: int) -> None:
        s = self.setup
        row["test_loss"], row["test_acc"] = s.flat.evaluate(at, s.x_test, s.ds.y_test, s.prep)
        if self.cfg.eval_train:
            row["full_train_loss"], _ = s.flat.evaluate(at, self.clients.data.x, s.ds.y_train, s.prep)
        if self.algo.private:
            row.update(self.algo.spent(k))

    def record(self, x: torch.Tensor, info: dict) -> None:
        """Round k's outcome: x^{k+1} and the algorithm's info; evaluates, records and checkpoints."""
        cfg, k, self.x = self.cfg, self.k, x
        self.sent += info["uploads"]
        row = {"round": k + 1, "train_loss": info["loss"], "noise_std": self.algo.noise_std,
               "bits_per_coord": self.bits, "transmissions": info["uploads"], "transmissions_total": self.sent,
               "bytes_uploaded": info["uploads"] * self.upload_bytes, "bytes_total": self.sent * self.upload_bytes,
               **{name: info[name] for name in ("tau", "steps_total") if name in info}}
        loss = info["loss"]                                  # None: no client computed this round
        diverged = (loss is not None and not math.isfinite(loss)) or not bool(torch.isfinite(x).all())
        last = k + 1 == cfg.rounds or info.get("done", False)         # budget-limited algorithms stop early
        if diverged:
            row["test_loss"] = row["test_acc"] = math.nan
        elif (k + 1) % cfg.eval_every == 0 or last:
            self.evaluate(row, x, k + 1)
            self.bar.set_postfix(loss=f"{loss:.3f}" if loss is not None else "-", acc=f"{row['test_acc']:.3f}")
        row["wall_time"] = time.perf_counter() - self.t0
        self.rec.add(row)
        self.k, self.active = k + 1, not (diverged or last)
        self.bar.update()
        if diverged:
            self.status = "diverged"
            log.warning("%s round %d: non-finite loss or model; run recorded as diverged", self.out_dir.name, k + 1)
            return
        if row.get("test_acc") is not None:
            self.rec.flush()
        if self.active and cfg.checkpoint_every and (k + 1) % cfg.checkpoint_every == 0:
            flat = self.setup.flat
            checkpoint.save(self.out_dir, self.key, {
                "x": x, "sent": self.sent, "rows": self.rec.rows, "algo": self.algo.state_dict(),
                "data": self.clients.data.state_dict(), "buffers": flat.buffers(),
                "backend": self.clients.engine.backend, "wall_time_s": time.perf_counter() - self.t_start})

    def finish(self) -> dict:
        """Write the final metrics, parameters and summary; the checkpoint goes."""
        cfg, s, x = self.cfg, self.setup, self.x
        self.bar.close()
        self.rec.flush()
        if cfg.save_params and self.status == "completed":
            tmp = self.out_dir / ".params.npy.tmp"
            with open(tmp, "wb") as fh:
                np.save(fh, x.cpu().numpy())
            tmp.replace(self.out_dir / "params.npy")
        summary = self.rec.summary({
            "status": self.status, "config_key": self.key, "profile": cfg.profile, "algo": cfg.algo.name,
            "data": s.ds.label, "data_source": s.ds.source,
            "split": s.ds.split, "train_size": len(s.ds.y_train), "test_size": len(s.ds.y_test),
            "clients": cfg.clients, "rounds": cfg.rounds, "seed": cfg.seed, "dim": s.flat.dim,
            "backend": self.clients.engine.backend, "precision": cfg.precision, "device": str(s.device),
            "threads": torch.get_num_threads(),
            "noise_std": self.algo.noise_std, "bits_per_coord": self.bits, "private": self.algo.private,
            "privacy": self.algo.privacy_report(self.rec.rows[-1]["round"]) if self.algo.private else None,
            "wall_time_s": time.perf_counter() - self.t_start,
            "seconds_per_round": (time.perf_counter() - self.t0) / max(1, self.rec.rows[-1]["round"]),
            "peak_rss_mb": peak_rss_mb(),
            "versions": {"normfl": normfl.__version__, "torch": torch.__version__,
                         "python": platform.python_version()},
        })
        checkpoint.remove(self.out_dir)                      # the summary now stands for the run
        return summary


def start(cfg: DictConfig, out_dir: Path, cache: dict | None = None, progress: bool | None = None):
    """A run's ``Training`` (fresh, or from its checkpoint), or the summary of its finished run.
    Raises ConfigError on bad input.

    With ``resume`` (the default), a run directory that already holds this config's finished run is
    left as it is, and one holding its checkpoint continues from there."""
    validate(cfg)
    key = config_key(cfg)
    if cfg.resume and (done := finished(out_dir, key)):
        log.info("%s already holds this config's finished run (resume=false reruns it)", out_dir)
        return done
    if not cfg.resume:
        checkpoint.remove(out_dir)
    state = checkpoint.load(out_dir, key)
    t_start = time.perf_counter() - (state["wall_time_s"] if state else 0.0)
    setup = build(cfg, cache)
    return Training(cfg, out_dir, key, state, t_start, setup, cfg.progress if progress is None else progress)


def run(cfg: DictConfig, out_dir: Path) -> dict:
    """Run one experiment into ``out_dir``; returns the summary (see ``start``)."""
    t = start(cfg, out_dir)
    if isinstance(t, dict):
        return t
    while t.active:
        t.record(*t.algo.round(t.k, t.x, t.clients))
    return t.finish()


def train_together(jobs: list[tuple[DictConfig, Path]], max_runs: int = 32, log_name: str = "train.log") -> list:
    """Train the jobs (config, run directory) of a sweep, those that share ``SHARED`` side by side in one
    process, at most ``max_runs`` at a time (``normfl.engine.lockstep``); returns each job's summary, or
    None for a job refused (its directory removed, as ``main`` does) or failed (recorded as failed).
    One run that fails or diverges ends alone; the others go on."""
    results: list = [None] * len(jobs)
    groups: dict[str, list[int]] = {}
    for i, (cfg, _) in enumerate(jobs):
        groups.setdefault(shared_key(cfg), []).append(i)
    for members in groups.values():
        for first in range(0, len(members), max_runs):
            chunk, cache, trainings = members[first:first + max_runs], {}, {}
            for i in chunk:
                cfg, out_dir = jobs[i]
                try:
                    t = start(cfg, out_dir, cache, progress=False)
                except INPUT_ERRORS as err:
                    _discard(Path(out_dir), log_name)
                    log.error("job %s skipped: %s", i, err)
                    continue
                except Exception as err:
                    _failed(Path(out_dir), i, err)
                    continue
                if isinstance(t, dict):
                    results[i] = t
                else:
                    trainings[i] = t
            _side_by_side(list(trainings.values()))
            for i, t in trainings.items():
                results[i] = t.finish() if t.status != "failed" else None
    return results


def _side_by_side(trainings: list[Training]) -> None:
    """Their rounds in lockstep until each is over; a run whose round raises is recorded as failed."""
    lockstep = Lockstep()
    try:
        while active := [t for t in trainings if t.active]:
            results = lockstep.round([(functools.partial(t.algo.round, t.k, t.x), t.clients) for t in active])
            for t, result in zip(active, results, strict=True):
                if isinstance(result, BaseException):
                    if not isinstance(result, Exception):
                        raise result                     # KeyboardInterrupt, SystemExit: stop everything
                    t.status, t.active = "failed", False
                    t.bar.close()
                    _failed(t.out_dir, t.out_dir.name, result)
                else:
                    t.record(*result)
    finally:
        lockstep.close()


def _failed(out_dir: Path, job, err: BaseException) -> None:
    log.error("job %s failed: %r", job, err, exc_info=err)
    write_atomic(out_dir / "summary.json", json.dumps({"status": "failed", "error": repr(err)}) + "\n")


def finished(out_dir: Path, key: str) -> dict | None:
    """The summary of this config's completed or diverged run in ``out_dir``, if it holds one."""
    try:
        summary = json.loads((Path(out_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if summary.get("config_key") == key and summary.get("status") in FINISHED else None


def peak_rss_mb() -> float | None:
    """The process's peak resident memory so far, in MiB (None where the OS does not say)."""
    try:
        import resource
    except ImportError:                      # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss       # KiB on Linux, bytes on macOS
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def build_privacy(cfg: DictConfig) -> Privacy:
    return Privacy(accountant=cfg.accountant.name, **OmegaConf.to_container(cfg.privacy, resolve=True))


def engine_options(flat: FlatModel, ds) -> tuple[str, ...]:
    """The backends a model allows, for the error that refuses another."""
    return ("auto", *ClientEngine(flat, in_shape=tuple(ds.x_train.shape[1:])).backends())


def _backend_key(cfg: DictConfig, dim: int, device: torch.device) -> str:
    """What the faster backend depends on: model, size, hardware, clients, batch, precision, torch, threads."""
    hw = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    return "|".join(map(str, (_kind(cfg.model), dim, device, hw, cfg.clients, cfg.batch_size,
                              cfg.oracle, cfg.precision, torch.__version__, torch.get_num_threads())))


def _discard(out_dir: Path, log_name: str) -> None:
    """Remove what Hydra wrote for a refused run (its .hydra folder and log), and the folder if that
    leaves it empty; anything else already in a reused folder is kept."""
    shutil.rmtree(out_dir / ".hydra", ignore_errors=True)
    (out_dir / log_name).unlink(missing_ok=True)
    try:
        out_dir.rmdir()
    except OSError:
        pass


def main(cfg: DictConfig) -> dict | None:
    """Hydra entry: run into Hydra's output dir; refuse bad configs without leaving a run dir."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    out_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    try:
        return run(cfg, out_dir)
    except INPUT_ERRORS as err:  # refused before training: no run directory is left behind
        _discard(out_dir, f"{hc.job.name}.log")
        if multirun:
            log.error("job %s skipped: %s", hc.job.num, err)
            return None
        sys.exit(f"normfl: {err}")
    except Exception as err:  # a failed job is recorded, and a sweep carries on
        if not multirun:
            raise
        _failed(out_dir, hc.job.num, err)
        return None
