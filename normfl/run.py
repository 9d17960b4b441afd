"""One experiment: validate, load data, partition, build model and algorithm, run the rounds, record."""

from __future__ import annotations

import json
import logging
import math
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


def build(cfg: DictConfig) -> Setup:
    """Data, partition, model, algorithm and clients from a validated config, with the backend chosen."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = pick_device(cfg.device.name)
    try:                                     # before the data: a setting the algorithm lacks is bad input
        algo = instantiate(cfg.algo)
    except InstantiationException as err:
        raise ConfigError("algo", cfg.algo.name, str(err.__cause__ or err)) from err
    ds, parts = build_data(cfg)
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

    prep = Preprocess(ds.mean, ds.std, device)
    x_train, x_test = ds.x_train, ds.x_test
    if not cfg.dataset.augment:              # normalize once, on the device: a batch is then a gather
        x_train, x_test, prep = prep(x_train), prep(x_test), Preprocess((), (), device)
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


def run(cfg: DictConfig, out_dir: Path) -> dict:
    """Run one experiment into ``out_dir``; returns the summary. Raises ConfigError on bad input.

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
    setup = build(cfg)
    ds, flat, x, algo, clients = setup.ds, setup.flat, setup.x, setup.algo, setup.clients

    label_histogram(setup.parts, ds.y_train.numpy(), ds.num_classes).to_csv(out_dir / "partition.csv")
    rec = Recorder(out_dir, cfg.logger, OmegaConf.to_container(cfg, resolve=True))
    bits = algo.bits_per_coord or 8 * x.element_size()
    upload_bytes = flat.dim * bits / 8

    def evaluate(row, at, k):
        row["test_loss"], row["test_acc"] = flat.evaluate(at, setup.x_test, ds.y_test, setup.prep)
        if cfg.eval_train:
            row["full_train_loss"], _ = flat.evaluate(at, clients.data.x, ds.y_train, setup.prep)
        if algo.private:
            row.update(algo.spent(k))

    if state:                                                # continue where the checkpoint left off
        x, sent, rec.rows = state["x"].to(x.device), state["sent"], state["rows"]
        algo.load_state_dict(state["algo"])
        clients.data.load_state_dict(state["data"])
        flat.set_buffers(state["buffers"])
        clients.engine.backend = state["backend"]
        log.info("resuming from round %d (%s)", rec.rows[-1]["round"], checkpoint.NAME)
    else:
        row0 = {"round": 0, "noise_std": algo.noise_std, "bits_per_coord": bits, "transmissions": 0,
                "transmissions_total": 0, "bytes_uploaded": 0, "bytes_total": 0, "wall_time": 0.0}
        evaluate(row0, x, 0)
        rec.add(row0)
        sent = 0
    start = rec.rows[-1]["round"]
    status, t0 = "completed", time.perf_counter() - rec.rows[-1]["wall_time"]
    bar = tqdm(range(start, cfg.rounds), disable=not cfg.progress, desc=cfg.algo.name, dynamic_ncols=True,
               initial=start, total=cfg.rounds)
    for k in bar:
        x, info = algo.round(k, x, clients)
        sent += info["uploads"]
        row = {"round": k + 1, "train_loss": info["loss"], "noise_std": algo.noise_std, "bits_per_coord": bits,
               "transmissions": info["uploads"], "transmissions_total": sent,
               "bytes_uploaded": info["uploads"] * upload_bytes, "bytes_total": sent * upload_bytes,
               **{name: info[name] for name in ("tau", "steps_total") if name in info}}
        loss = info["loss"]                                  # None: no client computed this round
        diverged = (loss is not None and not math.isfinite(loss)) or not bool(torch.isfinite(x).all())
        last = k + 1 == cfg.rounds or info.get("done", False)         # budget-limited algorithms stop early
        if diverged:
            row["test_loss"] = row["test_acc"] = math.nan
        elif (k + 1) % cfg.eval_every == 0 or last:
            evaluate(row, x, k + 1)
            bar.set_postfix(loss=f"{loss:.3f}" if loss is not None else "-", acc=f"{row['test_acc']:.3f}")
        row["wall_time"] = time.perf_counter() - t0
        rec.add(row)
        if diverged:
            status = "diverged"
            log.warning("round %d: non-finite loss or model; run recorded as diverged", k + 1)
            break
        if row.get("test_acc") is not None:
            rec.flush()
        if last:
            break
        if cfg.checkpoint_every and (k + 1) % cfg.checkpoint_every == 0:
            checkpoint.save(out_dir, key, {
                "x": x, "sent": sent, "rows": rec.rows, "algo": algo.state_dict(),
                "data": clients.data.state_dict(), "buffers": flat.buffers(), "backend": clients.engine.backend,
                "wall_time_s": time.perf_counter() - t_start})
    bar.close()
    rec.flush()
    if cfg.save_params and status == "completed":
        tmp = out_dir / ".params.npy.tmp"
        with open(tmp, "wb") as fh:
            np.save(fh, x.cpu().numpy())
        tmp.replace(out_dir / "params.npy")
    summary = rec.summary({
        "status": status, "config_key": key, "profile": cfg.profile, "algo": cfg.algo.name, "data": ds.label,
        "data_source": ds.source,
        "split": ds.split, "train_size": len(ds.y_train), "test_size": len(ds.y_test),
        "clients": cfg.clients, "rounds": cfg.rounds, "seed": cfg.seed, "dim": flat.dim,
        "backend": clients.engine.backend, "precision": cfg.precision, "device": str(setup.device),
        "threads": torch.get_num_threads(),
        "noise_std": algo.noise_std, "bits_per_coord": bits, "private": algo.private,
        "privacy": algo.privacy_report(rec.rows[-1]["round"]) if algo.private else None,
        "wall_time_s": time.perf_counter() - t_start,
        "seconds_per_round": (time.perf_counter() - t0) / max(1, rec.rows[-1]["round"]),
        "peak_rss_mb": peak_rss_mb(),
        "versions": {"normfl": normfl.__version__, "torch": torch.__version__,
                     "python": platform.python_version()},
    })
    checkpoint.remove(out_dir)                               # the summary now stands for the run
    return summary


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
        log.exception("job %s failed", hc.job.num)
        write_atomic(out_dir / "summary.json", json.dumps({"status": "failed", "error": repr(err)}) + "\n")
        return None
