"""What runs print on a terminal: a progress bar labelled so that a sweep's jobs drawing beside each other tell
apart (``job_label``: ``#1 algo.beta=0.1``), and lines that never continue a bar (``fresh_lines``)."""

from __future__ import annotations

import logging

from omegaconf import DictConfig
from tqdm import tqdm

from normfl.run.sweep import swept_keys


def progress_bar(cfg: DictConfig, initial: int, on: bool, label: str | None, position: int | None = None) -> tqdm:
    """A run's progress bar (rounds, on stderr). A single run's says its algorithm and stays when the run ends; a sweep
    job's says ``label`` (its number and swept values: ``job_label``), which tells it from the bars of the jobs
    drawing beside it, and is erased when the run ends: the job's closing line stands for it. ``position``: its line
    among the bars of runs side by side in one process (``together``)."""
    return tqdm(total=cfg.rounds, initial=initial, disable=not on, desc=label or cfg.algo.name, leave=label is None,
                position=position, dynamic_ncols=True)


LABEL = 60                                     # characters of a sweep job's label at most


def progress_label(hydra_cfg: DictConfig | None) -> str | None:
    """The label of a sweep job's progress bar (``job_label``), from Hydra's settings of the job and the keys its
    sweep varies (``sweep.swept_keys``); None for a single run, whose bar keeps its algorithm's name."""
    from hydra.types import RunMode

    if hydra_cfg is None or hydra_cfg.hydra.mode != RunMode.MULTIRUN:
        return None
    return job_label(hydra_cfg.hydra.job.num, list(hydra_cfg.hydra.overrides.task), swept_keys() or [])


def job_label(num: int, overrides: list[str], keys: list[str]) -> str:
    """``#`` and a sweep job's number, then its values of the keys the sweep varies, as typed (``#1 algo.beta=0.1``;
    the number alone in a sweep of one job), at most ``LABEL`` characters. A parallel sweep's jobs draw their bars
    on one terminal: by their algorithm's name alone, which most sweeps do not vary, they looked the same."""
    values = dict(o.split("=", 1) for o in overrides if "=" in o)
    text = " ".join([f"#{num}", *(f"{k}={values[k]}" for k in keys if k in values)])
    return text if len(text) <= LABEL else text[:LABEL - 1] + "…"


FRESH = "\r\x1b[K"        # a terminal's cursor back to the start of its line, and that line erased


def fresh(stream) -> str:
    """What starts a line on ``stream`` afresh: on a terminal ``FRESH``, so a progress bar left on the cursor's line
    (by this run, or by another job of a parallel sweep drawing on the same terminal) is replaced, never continued;
    nothing on a file or a pipe, which keep their lines as written."""
    try:
        return FRESH if stream.isatty() else ""
    except (AttributeError, ValueError):         # no isatty, or closed
        return ""


class FreshLine(logging.Formatter):
    """A console handler's lines, each started afresh (``fresh``) in the same write as the line itself: the writes
    of a sweep's parallel jobs to one terminal interleave only between writes, so no bar drawn between a separate
    erase and the line can glue to it."""

    def __init__(self, inner: logging.Formatter | None, prefix: str):
        super().__init__()
        self.inner, self.prefix = inner or logging.Formatter(), prefix

    def format(self, record: logging.LogRecord) -> str:
        return self.prefix + self.inner.format(record)


def fresh_lines(*loggers: logging.Logger) -> None:
    """Start every line that ``loggers`` write on a terminal afresh (``FreshLine``); their log files are left as
    they are. Called again (Hydra configures the handlers anew for each job), it changes nothing twice."""
    for logger in loggers:
        for handler in logger.handlers:
            if (isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
                    and not isinstance(handler.formatter, FreshLine) and (prefix := fresh(handler.stream))):
                handler.setFormatter(FreshLine(handler.formatter, prefix))
