"""Run outputs: a tidy per-round table, a summary, and optional W&B logging; and where a reader finds a run's
config and table, in its run directory or in its committed record.

Every file is written atomically (temporary file, then rename), so a reader never sees half a file.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import numbers
import os
import threading
from pathlib import Path

from normfl.errors import ConfigError

COLUMNS = ("round", "steps", "train_loss", "full_train_loss", "test_loss", "test_acc", "eps_rdp", "eps_pld",
           "eps_composed", "eps_paper", "noise_std", "bits_per_coord", "tau", "steps_total", "transmissions",
           "transmissions_total", "bytes_uploaded", "bytes_total", "wall_time")

log = logging.getLogger("normfl")
FINISHED = ("completed", "diverged")         # statuses of a run that needs no rerun ("failed" may)


def _finite(v) -> bool:
    return isinstance(v, numbers.Number) and math.isfinite(v)


def strict(value):
    """``value`` with every non-finite float (NaN, inf) replaced by None, for strict JSON."""
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value


def write_atomic(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all; writers racing on one path (a sweep's jobs on its jobs.csv) each
    write their own temporary file, and the last rename wins."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def last5_mean_test_acc(rows: list[dict]) -> float | None:
    """NFA's table statistic: the mean test accuracy of a run's last five evaluations, the rows whose
    ``test_acc`` is a finite number (all of them when there are fewer; a diverged round's NaN is none), or
    None when there is none. A summary's ``last5_mean_test_acc``, which the report's tables read back."""
    last5 = [r["test_acc"] for r in rows if _finite(r.get("test_acc"))][-5:]
    return sum(last5) / len(last5) if last5 else None


def wandb_group(given: str | None, names: dict) -> str | None:
    """A run's W&B group: ``logger.group`` as given, none for ``''``, and the run's default for null."""
    return names.get("group") if given is None else given or None


class Recorder:
    """Collects per-round rows; ``flush`` rewrites ``metrics.csv`` atomically. With ``logger=wandb`` also a W&B
    run of its own (``reinit="create_new"``: runs side by side in one process each keep theirs), named and grouped
    by ``names`` (``name``, ``group``: the run's defaults) unless ``logger.group`` is set. ``wandb_id``: the W&B
    run a resumed run continues (its checkpoint keeps it): online the same W&B run goes on; offline each start
    writes a part with that id, which ``wandb sync`` uploads in the order they started, as one run."""

    def __init__(self, out_dir: Path, logger_cfg=None, config: dict | None = None, names: dict | None = None,
                 wandb_id: str | None = None):
        self.out_dir, self.rows, self.wandb_id = Path(out_dir), [], wandb_id
        self.wandb = None
        if logger_cfg is not None and logger_cfg.name == "wandb":
            import wandb

            names = names or {}
            try:
                self.wandb = wandb.init(mode=logger_cfg.mode, project=logger_cfg.project,
                                        entity=logger_cfg.entity, dir=str(self.out_dir), config=config,
                                        name=names.get("name"), group=wandb_group(logger_cfg.get("group"), names),
                                        tags=list(logger_cfg.get("tags") or []) or None, notes=logger_cfg.get("notes"),
                                        reinit="create_new", id=wandb_id, resume="allow" if wandb_id else None)
                self.wandb_id = self.wandb.id
            except wandb.errors.UsageError as err:      # online without a login: refused before the first round
                raise ConfigError("logger.mode", logger_cfg.mode, f"offline or disabled, or online once logged in "
                                  f"(wandb login, or $WANDB_API_KEY): wandb said {str(err).splitlines()[0]!r}") from err

    def add(self, row: dict) -> None:
        """One round's metrics. Scalars only, so no client's data or update can be logged by accident."""
        for k, v in row.items():
            if v is not None and not isinstance(v, (numbers.Number, str)):
                raise TypeError(f"metric {k!r} must be a scalar (a number, str or None), got {type(v).__name__}")
        self.rows.append(row)
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in row.items() if v is not None and k != "round"}, step=row["round"])

    def flush(self) -> None:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        write_atomic(self.out_dir / "metrics.csv", buf.getvalue())

    def summary(self, info: dict) -> dict:
        """The run's summary, written as strict JSON: a value that is not a finite number (a diverged
        round's loss) is null, and an evaluation that gave none is never the final or best one."""
        evals = [r for r in self.rows if _finite(r.get("test_acc"))]
        best = max(evals, key=lambda r: r["test_acc"], default=None)
        last = evals[-1] if evals and info.get("status") != "diverged" else None    # a diverged run has no final model
        losses = [r["train_loss"] for r in self.rows if r.get("train_loss") is not None]
        info = {
            **info,
            "final_round": self.rows[-1]["round"] if self.rows else 0,
            "final_test_acc": last and last["test_acc"],
            "last5_mean_test_acc": last5_mean_test_acc(self.rows),
            "final_test_loss": last and last["test_loss"],
            "best_test_acc": best and best["test_acc"],
            "best_round": best and best["round"],
            "final_train_loss": losses[-1] if losses else None,
        }
        info = strict(info)
        write_atomic(self.out_dir / "summary.json", json.dumps(info, indent=2, default=str, allow_nan=False) + "\n")
        if self.wandb is not None:
            self.wandb.summary.update({k: v for k, v in info.items() if isinstance(v, (int, float, str))})
            self.wandb.summary.update(epsilon_label(info.get("privacy")))
        self.close(0)
        return info

    def close(self, exit_code: int) -> None:
        """End the W&B run now, with ``exit_code`` (W&B marks a non-zero one failed), not at the process's exit: a
        failed job's would show as running, then finished, while a sweep's next jobs train in the same process."""
        if self.wandb is not None:
            self.wandb.finish(exit_code=exit_code)
            self.wandb = None


def epsilon_label(privacy: dict | None) -> dict:
    """The ε a private run reports, named for what it is (W&B's run summary, which takes scalars only):
    ``epsilon_certified``, or ``epsilon_claimed`` with ``epsilon_not_certified`` saying why it is no certificate
    (``privacy.not_certified``); nothing for a run without privacy or without an ε."""
    from normfl.privacy import certified

    eps = certified(privacy)[0] if privacy else None
    if eps is None or not math.isfinite(eps):
        return {}
    why = privacy.get("not_certified")
    return {"epsilon_claimed": eps, "epsilon_not_certified": "; ".join(why)} if why else {"epsilon_certified": eps}


def finished(out_dir: Path, key: str) -> dict | None:
    """The summary of this config's completed or diverged run in ``out_dir``, if it holds one."""
    try:
        summary = json.loads((Path(out_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if summary.get("config_key") == key and summary.get("status") in FINISHED else None


RECORD_METRICS = "metrics.csv.xz"           # a committed record's per-round table (normfl.reproduce.records)


def config_file(run_dir: Path) -> Path:
    """A run's config: a record's ``config.yaml``, else a run directory's ``.hydra/config.yaml``."""
    run_dir = Path(run_dir)
    return run_dir / "config.yaml" if (run_dir / "config.yaml").is_file() else run_dir / ".hydra" / "config.yaml"


def metrics_file(run_dir: Path) -> Path:
    """A run's per-round table: a run directory's ``metrics.csv``, else a record's ``metrics.csv.xz``."""
    plain = Path(run_dir) / "metrics.csv"
    return plain if plain.is_file() else Path(run_dir) / RECORD_METRICS


def shown(path) -> str:
    """A path as a user would type it: relative to the working directory when it is under it."""
    rel = os.path.relpath(path)
    return str(path) if rel.startswith("..") else rel


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    m, s = divmod(round(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h {m:02d}m" if h else f"{m}m {s:02d}s" if m else f"{seconds:.1f}s"


def closing_line(summary: dict, out_dir: Path, log_name: str = "train.log") -> str:
    """The one line that ends a run: status, how long (a resumed run: its rounds' time over every start, not the
    time since its first start), final and best test accuracy, its privacy (``privacy_said``) and audit, where."""
    status, where = summary.get("status", "failed"), shown(out_dir)
    if status not in FINISHED:
        return f"normfl: {status}: {summary.get('error')}; traceback in {Path(where) / log_name}"

    def pct(v):
        return "–" if v is None else f"{100 * v:.2f}%"

    resumed = summary.get("resumed_at_round")
    took = (f"in {duration(summary.get('wall_time_s'))}" if resumed is None else       # a resumed run: its training
            f"in {duration(summary.get('training_time_s'))} of training, resumed at round {resumed}")
    parts = [f"normfl: {status} {took}" + (f" at round {summary.get('final_round')}" if status == "diverged" else ""),
             f"test accuracy {pct(summary.get('final_test_acc'))} final, {pct(summary.get('best_test_acc'))} best "
             f"(round {summary.get('best_round')})"]
    privacy = summary.get("privacy")
    parts.append(privacy_said(privacy) if privacy else "not private")
    if summary.get("audit"):
        parts.append(audit_said(summary["audit"]))
    parts.append(where)
    return " | ".join(parts)


def audit_said(audit: dict) -> str:
    """An audited run's part of its closing line: its observer, its verdict and bounds, and the first reason a release
    audit refutes the certificate for, e.g. ``audit (release): REFUTES the certificate: un-noised values reached the
    released model in 20 of 20 steps (first: step 1) ...``."""
    bounds = f"ε ≥ {audit['eps_lower']:.2f} (curve {audit['eps_lower_curve']:.2f})"
    head = f"audit ({audit.get('mode', 'sidecar')}, {audit['canaries']} canaries): "
    if audit["verdict"] == "consistent with the certificate":
        return head + f"consistent, {bounds}"
    why = audit.get("why") or [f"{bounds} above the certified {audit['eps_certified']:.2f}"]
    return head + f"REFUTES the certificate: {why[0]}"


def privacy_said(privacy: dict) -> str:
    """A private run's part of its closing line: the ε asked and the ε it certifies (or claims, and why it is no
    certificate) by the accountant that gives it (``privacy.certified``). A run that a budget of DP-SGD steps stops
    (ALI-DPFL, fixed-τ DPFL: its privacy block has ``R_c``) first says how much of that budget, whose ε is the one
    asked, it spent (``budget_said``), then its certified ε: what it spent, in the three measures it has."""
    from normfl.privacy import certified

    eps, by = certified(privacy)
    target = privacy.get("target_epsilon")
    if by == "no noise":
        verdict = "∞: no noise added"
    elif eps is None:
        verdict = "none certified"
    else:
        why = privacy.get("not_certified")
        verdict = (f"{eps:.4g} {'claimed' if why else 'certified'} ({by})"
                   + (": ABOVE the target" if target is not None and eps > target else "")
                   + (f"; not a certificate: {'; '.join(why)}" if why else ""))
    budget = budget_said(privacy)
    return f"{budget}; ε {verdict}" if budget else f"ε {target:g} asked, {verdict}"


def budget_said(privacy: dict) -> str | None:
    """How much of its budget a run stopped by one spent, in the measure that stops it: its DP-SGD steps against R_c
    (the steps its ε supports by the paper's accountant), and that accountant's ε against the target, e.g.
    ``budget: 414 of R_c = 598 steps spent, ε 2.178 of 2.5 by the paper's accountant``; None for any other run."""
    steps, r_c, target = privacy.get("steps_taken"), privacy.get("R_c"), privacy.get("target_epsilon")
    if steps is None or r_c is None:
        return None
    paper = privacy.get("epsilon_paper")
    eps = f"ε {paper:.4g} of {target:g} by the paper's accountant" if _finite(paper) else f"ε {target:g} asked"
    return f"budget: {steps} of R_c = {r_c} steps spent, {eps}"


def record_failure(out_dir: Path, job, err: BaseException, key: str | None = None, console: bool = True) -> None:
    """A failed run's summary, and its traceback in the log (and on the console, unless ``console`` is False: a
    cause its user mends, ``errors.RunStopped``, is said there in one line instead)."""
    if console:
        log.error("job %s failed: %r", job, err, exc_info=err)
    else:
        record = log.makeRecord(log.name, logging.ERROR, __file__, 0, "job %s failed: %s", (job, err),
                                (type(err), err, err.__traceback__))
        for handler in {*logging.getLogger().handlers, *log.handlers}:
            if isinstance(handler, logging.FileHandler) and record.levelno >= handler.level:
                handler.handle(record)
    failure = {"status": "failed", "config_key": key, "error": repr(err)}
    write_atomic(out_dir / "summary.json", json.dumps(failure) + "\n")
