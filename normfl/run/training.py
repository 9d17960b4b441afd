"""One run from its first round, or its checkpoint, to its summary, and how a run's records are kept. Beside it:
``signals`` (Ctrl-C and SIGTERM while it trains), ``provenance`` (where and on what it ran) and
``privacy_report`` (its privacy cautions, its summary's privacy block, the warning above privacy.epsilon)."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from normfl import checkpoint
from normfl.config import ConfigError, config_key, resolve_clients, validate
from normfl.data import label_histogram_csv
from normfl.engine.flat import numerics
from normfl.ops import EVALUATION, round_generator
from normfl.privacy import certified
from normfl.results import Recorder, duration, finished
from normfl.run.privacy_report import cautions, planned_spent, summary_block, warn_above_target
from normfl.run.provenance import peak_rss_mb, where
from normfl.run.rundir import RunDir
from normfl.run.setup import Setup, build, round_of
from normfl.run.signals import Interrupts
from normfl.run.sweep import wandb_names
from normfl.run.terminal import progress_bar, progress_label
from normfl.syncs import reading

log = logging.getLogger("normfl")
INPUT_ERRORS = (ConfigError, FileNotFoundError)


class Training:
    """One run from its first round (or its checkpoint) to its summary. ``record`` takes the outcome of
    communication step ``step`` (the algorithm's ``round(step, x, clients)``); a row of ``metrics.csv`` is
    written when round ``k`` ends: after every step, or under ``reading=pass`` after a pass's steps (its
    train loss the mean over them, its transmissions their sum). ``active`` says whether a step is due."""

    def __init__(self, cfg: DictConfig, out_dir: Path, key: str, state: dict | None, t_start: float,
                 setup: Setup, progress: bool, rundir: RunDir):
        self.cfg, self.out_dir, self.key, self.t_start, self.setup = cfg, Path(out_dir), key, t_start, setup
        self.rundir = rundir
        self.algo, self.clients, self.x, flat = setup.algo, setup.clients, setup.x, setup.flat
        audit, self.audit = cfg.get("audit", {}), None
        if audit.get("canaries"):
            # here, not at the top: the auditor's statistics (scipy) load in most of a second
            from normfl.privacy.audit import observer

            self.audit = observer(self.algo, self.clients, audit.canaries, self.x, cfg.seed,
                                  audit.get("mode", "sidecar"))
        # the algorithm's round, or that round captured whole (not in-band: a graph replays no canary's scoring)
        self.round = self.audit.round if self.audit and self.audit.inband else round_of(self.algo, self.clients)
        # how its rounds ran, for its summary (a vectorized group of runs side by side says so instead)
        self.captured = getattr(self.round, "captured", self.clients.engine.captured)
        (self.out_dir / "partition.csv").write_text(
            label_histogram_csv(setup.parts, setup.ds.y_train.numpy(), setup.ds.num_classes))
        self.rec = Recorder(self.out_dir, cfg.logger, OmegaConf.to_container(cfg, resolve=True),
                            wandb_names(rundir.hydra_cfg), (state or {}).get("wandb_id"))
        self.bits = self.algo.bits_per_coord or 8 * self.x.element_size()
        self.upload_bytes = flat.dim * self.bits / 8
        log.info(what_runs(cfg, setup, self.audit))
        if state:                                            # continue where the checkpoint left off
            checkpoint.restore(self, state)
            log.info("resuming from round %d (%s)", self.rec.rows[-1]["round"], checkpoint.NAME)
        # the bar from the start (a first evaluation or round can take minutes: the user sees what runs meanwhile)
        self.bar = progress_bar(cfg, self.rec.rows[-1]["round"] if state else 0, progress,
                                progress_label(rundir.hydra_cfg))
        if not state:
            row0 = {"round": 0, "steps": 0, "noise_std": self.algo.noise_std, "bits_per_coord": self.bits,
                    "transmissions": 0, "transmissions_total": 0, "bytes_uploaded": 0, "bytes_total": 0,
                    "wall_time": 0.0}
            self.evaluate(row0, self.x, 0)
            self.rec.add(row0)
            self.sent = 0
        self.k = self.rec.rows[-1]["round"]
        self.resumed_at = self.k if state else None         # the round a checkpoint took this start to
        self.step = self.rec.rows[-1].get("steps", self.k)          # checkpoints from before the column: k
        self.losses, self.uploads = [], 0                            # of the round's steps so far (on the device)
        self.unread: list[tuple[dict, torch.Tensor]] = []           # rows whose losses and flags are not read yet
        if state and "step" in state:                                # saved part-way through a round (Ctrl-C)
            self.step, self.losses, self.uploads = state["step"], list(state["losses"]), state["uploads"]
        # its first rounds: every attribute a round changes is declared (in-band canaries ride on the privatizer)
        self.watch = checkpoint.StateWatch(self.algo, ("mech",) if self.audit and self.audit.inband else ())
        self.status, self.t0 = "completed", time.perf_counter() - self.rec.rows[-1]["wall_time"]
        self.active = self.k < cfg.rounds
        self.first = (self.k, time.perf_counter())          # the estimate after this start's first round
        self.uncovered, self.weak_delta, self.not_certified = cautions(self.algo, flat.module, setup.parts)
        if self.algo.private:                                # said before the first round, and again at the end
            releases = self.algo.planned_releases(cfg.rounds * setup.steps_per_round)
            self.warn_privacy(planned_spent(self.algo.ledger, releases, self.algo.privacy.epsilon), ahead=True)

    def estimate(self, seconds: float, rounds: int) -> None:
        """After this start's first round: on a CPU, a run that would take longer than ``CPU_HINT_S`` to end says how
        long, and what runs faster. The bar is drawn now, with the round's time and the estimate (tqdm draws at most
        every 0.1 s, and would leave a fast first round unshown)."""
        self.first = None
        self.bar.refresh()
        left = seconds / rounds * (self.cfg.rounds - self.k)
        if self.setup.device.type == "cpu" and left > CPU_HINT_S:
            log.info("normfl: about %s to go on this CPU (%s a round). On a GPU: the same command with `device=cuda "
                     "backend=stacked`; on this CPU, a smaller setting, e.g. `dataset=fashion_mnist model=logreg "
                     "rounds=50` (Fashion-MNIST, logistic regression: about a minute), or `make run`, which picks "
                     "the setting a CPU can afford", duration(left), duration(seconds / rounds))

    def warn_privacy(self, spent: dict, ahead: bool) -> None:
        """A warning when the run certifies (or claims) more than privacy.epsilon: ``ahead`` before its first
        round, else at its end (``privacy_report.warn_above_target``)."""
        warn_above_target(self.cfg, self.algo, self.not_certified, spent, ahead)

    def save(self) -> None:
        """A checkpoint of the run as it stands after its last step (none if reading its rows shows that it
        diverged: it ends there)."""
        if self.read():
            with reading():
                state = checkpoint.snapshot(self, time.perf_counter() - self.t_start)
            checkpoint.save(self.out_dir, self.key, state)

    def evaluate(self, row: dict, at: torch.Tensor, releases: int) -> None:
        s, x_test, y_test = self.setup, self.setup.x_test, self.setup.y_test
        if self.cfg.get("eval_subset"):                      # a fresh random part of the test set each time
            x_test, y_test = eval_subset(x_test, y_test, self.cfg.eval_subset, self.cfg.seed, row["round"])
        row["test_loss"], row["test_acc"] = s.flat.evaluate(at, x_test, y_test)
        if self.cfg.eval_train:
            row["full_train_loss"], _ = s.flat.evaluate(at, self.clients.data.x, self.clients.data.y, s.prep)
        if self.algo.private:
            row.update(self.algo.spent(releases))

    def record(self, x: torch.Tensor, info: dict) -> None:
        """A step's outcome: x after it and the algorithm's info (its loss a tensor on the device, or None when
        no client computed). At the end of a round its row is made; at an evaluation, a checkpoint and the last
        round the rows made since the last read are read from the device (``read``), so the host never waits
        for the device between them."""
        cfg, k, self.x, self.step = self.cfg, self.k, x, self.step + 1
        self.sent += info["uploads"]
        self.uploads += info["uploads"]
        if self.audit is not None:                          # canaries beside the step, on their own draws
            self.audit.observe(self.step)
        if info["loss"] is not None:
            self.losses.append(info["loss"])
        if self.step % self.setup.steps_per_round and not info.get("done", False):
            return                                           # the round (a pass) goes on
        last = k + 1 == cfg.rounds or info.get("done", False)         # budget-limited algorithms stop early
        row = {"round": k + 1, "steps": self.step, "train_loss": self.losses, "noise_std": self.algo.noise_std,
               "bits_per_coord": self.bits, "transmissions": self.uploads, "transmissions_total": self.sent,
               "bytes_uploaded": self.uploads * self.upload_bytes, "bytes_total": self.sent * self.upload_bytes,
               **{name: info[name] for name in ("tau", "steps_total") if name in info}}
        # a model that is not finite stays so (every algorithm's x^{k+1} is built from x^k), so the round's
        # last x tells whether any of its steps diverged; its steps' losses are checked when read
        self.unread.append((row, torch.isfinite(x).all()))
        self.losses, self.uploads = [], 0
        self.k, self.active = k + 1, not last
        if self.watch is not None and not self.watch.check(self.algo):
            self.watch = None
        self.bar.update()
        evaluate = (k + 1) % cfg.eval_every == 0 or last
        if evaluate:
            with reading():
                self.evaluate(row, x, self.step)
        row["wall_time"] = time.perf_counter() - self.t0
        if self.first is not None:                           # this start's first round, its evaluation included
            self.estimate(time.perf_counter() - self.first[1], k + 1 - self.first[0])
        save = self.active and cfg.checkpoint_every and (k + 1) % cfg.checkpoint_every == 0
        if not (evaluate or save or last) or not self.read():
            return
        if evaluate:                 # a private run's train loss, of the clients' data without noise: metrics.csv only
            loss = {} if self.algo.private else \
                {"loss": f"{row['train_loss']:.3f}" if row["train_loss"] is not None else "-"}
            self.bar.set_postfix(**loss, acc=f"{row['test_acc']:.3f}")
            self.rec.flush()
        if save:
            self.save()

    def read(self) -> bool:
        """Bring the rows made since the last read into the records, their losses and divergence flags read
        from the device in one transfer (a row's train loss: the mean of its steps' losses). The first round
        whose loss or model is not finite, or whose evaluation is not, ends the run as diverged: its row is
        recorded with NaN test metrics and the rows after it are dropped. Returns whether the run is sound."""
        if not self.unread:
            return self.status != "diverged"
        rows, flags = [r for r, _ in self.unread], [f for _, f in self.unread]
        self.unread = []
        pending = [v for r in rows for v in r["train_loss"] if isinstance(v, torch.Tensor)]
        parts = [torch.stack(flags).double()] + ([torch.stack(pending).double().to(flags[0].device)] if pending else [])
        with reading():
            values = torch.cat(parts).tolist()
        losses = iter(values[len(flags):])
        for row, fine in zip(rows, values[:len(flags)], strict=True):
            steps = [next(losses) if isinstance(v, torch.Tensor) else v for v in row["train_loss"]]
            row["train_loss"] = sum(steps) / len(steps) if steps else None
            evaluated = [row[m] for m in ("test_loss", "full_train_loss") if m in row]
            if fine and all(math.isfinite(v) for v in steps + evaluated):
                self.rec.add(row)
                continue
            row["test_loss"] = row["test_acc"] = math.nan
            row.pop("full_train_loss", None)
            self.rec.add(row)
            self.k, self.step, self.active, self.status = row["round"], row["steps"], False, "diverged"
            log.warning("%s round %d: non-finite loss or model; run recorded as diverged", self.out_dir.name,
                        row["round"])
            return False
        return True

    def finish(self) -> dict:
        """Write the final metrics, parameters and summary; the checkpoint goes."""
        self.read()
        cfg, s, x = self.cfg, self.setup, self.x
        self.bar.close()
        self.rec.flush()
        if cfg.save_params and self.status == "completed":
            tmp = self.out_dir / ".params.npy.tmp"
            with open(tmp, "wb") as fh:
                np.save(fh, x.cpu().numpy())
            tmp.replace(self.out_dir / "params.npy")
        privacy = summary_block(self.algo, self.step, self.uncovered, self.weak_delta, self.not_certified)
        audit = self.audit.result(certified(privacy)[0], self.algo.privacy.delta) if self.audit is not None else None
        summary = self.rec.summary({
            "status": self.status, "config_key": self.key, "profile": cfg.profile, "algo": cfg.algo.name,
            "data": s.ds.label, "data_source": s.ds.source,
            "split": s.ds.split, "train_size": len(s.ds.y_train), "test_size": len(s.ds.y_test),
            "clients": cfg.clients, "rounds": cfg.rounds, "seed": cfg.seed,
            **({"algo_seed": cfg.algo_seed} if cfg.get("algo_seed") is not None else {}), "dim": s.flat.dim,
            "backend": self.clients.engine.backend, "precision": cfg.precision, "memory_format": s.flat.memory_format,
            "device": str(s.device),
            "numerics": numerics(),
            "capture": self.captured(),
            "threads": torch.get_num_threads(),
            "noise_std": self.algo.noise_std, "bits_per_coord": self.bits, "private": self.algo.private,
            "reading": cfg.get("reading", "text"), "steps": self.step, "steps_per_round": s.steps_per_round,
            "privacy": privacy, "audit": audit,
            "wall_time_s": time.perf_counter() - self.t_start,
            "training_time_s": self.rec.rows[-1]["wall_time"],          # its rounds' time, over every start
            "resumed_at_round": self.resumed_at,
            "seconds_per_round": (time.perf_counter() - self.t0) / max(1, self.rec.rows[-1]["round"]),
            "peak_rss_mb": peak_rss_mb(),
            **where(s.device),
        })
        checkpoint.remove(self.out_dir)                      # the summary now stands for the run
        if self.algo.private:
            self.warn_privacy(summary["privacy"], ahead=False)
        return summary


CPU_HINT_S = 30 * 60         # a CPU run estimated to take longer says so after its first round, and what runs faster


def what_runs(cfg: DictConfig, setup: Setup, audit) -> str:
    """The line a run starts with: its algorithm, data, model, clients, rounds and reading, device and backend,
    precision (and its audit)."""
    steps, algo = setup.steps_per_round, setup.algo
    reading = f"a pass of {steps} steps a round" if steps > 1 else "a step a round"
    taking = f" (each takes part w.p. {algo.p:g})" if algo.p < 1 else ""
    audited = "" if audit is None else (f", audited with {cfg.audit.canaries} canaries ({cfg.audit.mode}"
                                        + (": they join the clients)" if cfg.audit.mode == "release" else ")"))
    return (f"normfl: {type(algo).title(cfg.algo)} ({cfg.algo.name}) on {setup.ds.label}, "
            f"{cfg.model._target_.rsplit('.', 1)[-1]} "
            f"({setup.flat.dim:,} parameters), {cfg.clients} clients{taking}, {cfg.rounds} rounds ({reading}), "
            f"{setup.device.type}, backend {setup.clients.engine.backend}, {cfg.precision}{audited}")


def start(cfg: DictConfig, out_dir: Path, cache: dict | None = None, progress: bool | None = None,
          log_name: str | None = None, overrides: list[str] | None = None, hydra_cfg: DictConfig | None = None):
    """A run's ``Training`` (fresh, or from its checkpoint), or the summary of its finished run.

    Bad input (a config value, a data file, a directory another run holds or owns: ``rundir``) raises
    ConfigError or FileNotFoundError, and everything this call made in ``out_dir`` is removed again.
    With ``resume`` (the default), a directory that already holds this config's finished run is left as
    it is, and one holding its checkpoint continues from there; ``resume=false`` starts it over."""
    d = RunDir(out_dir, log_name)
    try:
        resolve_clients(cfg)                                 # partition=natural: the data's client count
        validate(cfg)
        key = config_key(cfg)
        d.claim(key)
        if cfg.resume and (done := finished(out_dir, key)):
            log.info("%s already holds this config's finished run (resume=false reruns it)", out_dir)
            d.release()
            return done
        state = checkpoint.load(out_dir, key) if cfg.resume else None
        t_start = time.perf_counter() - (state["wall_time_s"] if state else 0.0)
        setup = build(cfg, cache)
        if not cfg.resume:                                   # this config's (claim refused any other's), once
            checkpoint.remove(out_dir)                       # the run is sure to start: a refusal keeps it
        d.record(cfg, overrides, hydra_cfg)
        return Training(cfg, out_dir, key, state, t_start, setup, cfg.progress if progress is None else progress, d)
    except INPUT_ERRORS:
        d.discard()
        raise
    except BaseException:
        d.release()
        raise


def run(cfg: DictConfig, out_dir: Path, stop_asked=None, **kw) -> dict:
    """Run one experiment into ``out_dir``; returns the summary (see ``start``). ``stop_asked``: a stop asked
    outside this process (``Interrupts``)."""
    t = start(cfg, out_dir, **kw)
    if isinstance(t, dict):
        return t
    try:
        with Interrupts(stop_asked) as ctrl_c:
            while t.active:
                try:
                    t.record(*t.round(t.step, t.x, t.clients))
                except Exception:
                    if t.read():                 # not a run that diverged rounds ago, unread: a failure
                        raise
                ctrl_c.stop_if_asked([t])
        return t.finish()
    except Exception:
        t.rec.close(1)                           # failed: W&B says so now (a stop's run goes on when resumed)
        raise
    finally:
        t.rundir.release()


def eval_subset(x: torch.Tensor, y: torch.Tensor, fraction: float, seed: int, round_: int):
    """⌊fraction·|test|⌋ test samples drawn without replacement, afresh for each (seed, round). The ALI-DPFL
    authors' server scores each round on a fresh random 20% of its test set (XinpengLing/ALI-DPFL,
    system/utils/data_utils.py lines 112-115, called with q=0.2 at system/flcore/servers/serverdpfl.py
    line 167); their loader also drops the last partial batch of 64, which is not copied here."""
    idx = torch.randperm(len(y), generator=round_generator(seed, EVALUATION, round_, "cpu"))
    idx = idx[:max(1, int(fraction * len(y)))].sort().values.to(x.device)
    return x[idx], y[idx]
