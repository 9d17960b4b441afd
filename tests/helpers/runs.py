"""Runs: ``python train.py`` in a process of its own, as the user runs it (the one helper that starts it); and a
run built in this process, trained to its end or to a step."""

import subprocess
import sys

from .paths import REPO


def train_command(*args: str, multirun: bool = False) -> list[str]:
    """The command line of ``python train.py [-m] ARGS`` (for a process started and stopped by hand)."""
    return [sys.executable, str(REPO / "train.py"), *(["-m"] if multirun else []), *args]


def train(data_root, *overrides, multirun=False, code=0, options=(), cwd=REPO, timeout=600,
          **kw) -> subprocess.CompletedProcess:
    """``python train.py [-m] OPTIONS data_root=DATA_ROOT OVERRIDES`` as the user runs it, in its own process
    (``data_root=None``: the config's own); its exit status must be ``code`` unless that is None."""
    args = [*options, *([f"data_root={data_root}"] if data_root is not None else []), *overrides]
    out = subprocess.run(train_command(*args, multirun=multirun), cwd=cwd, capture_output=True, text=True,
                         timeout=timeout, **kw)
    if code is not None:
        assert out.returncode == code, out.stderr[-3000:]
    return out


def trained(t, until_step=None):
    """``t`` trained to its end, or until it has taken ``until_step`` steps."""
    while t.active and (until_step is None or t.step < until_step):
        t.record(*t.round(t.step, t.x, t.clients))
    return t


def ended(t) -> tuple:
    summary = t.finish()
    t.rundir.release()
    return t, summary
