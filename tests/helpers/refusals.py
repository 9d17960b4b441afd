"""Bad input from the user's side: ``python train.py`` run in this process (Hydra and all, so a corpus of refusals
stays cheap), a small valid npz to spoil, and what every refusal must do (exit 1 with one ``normfl:`` line, no
traceback, the disk left exactly as it was)."""

import contextlib
import io
import logging
import runpy
import sys
from pathlib import Path

import numpy as np

from .paths import REPO

# The run each bad-input case changes
BAD_INPUT_BASE = ["dataset=fashion_mnist", "dataset.train_limit=2000", "dataset.test_limit=500", "model=logreg",
                  "rounds=3", "clients=4", "progress=false", "device=cpu"]


def train_here(data_root, run_dir, *overrides) -> tuple[int, str]:
    """``python train.py`` on ``BAD_INPUT_BASE`` in this process: (exit code, stderr)."""
    # Hydra's logging configs would close every handler of this process (pytest's too): none here
    argv, sys.argv = sys.argv, ["train.py", f"data_root={data_root}", *BAD_INPUT_BASE, *overrides,
                                f"hydra.run.dir={run_dir}", "hydra.job_logging.root=null",
                                "hydra.hydra_logging.root=null"]
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level           # Hydra's logging config replaces them
    err, code = io.StringIO(), 0
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()) as out:
            runpy.run_path(str(REPO / "train.py"), run_name="__main__")
        err.write(out.getvalue())
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
        if isinstance(e.code, str):
            err.write(e.code + "\n")
    finally:
        sys.argv = argv
        for h in root.handlers[:]:          # the run's stdout handler: closed, as at a process's end
            if h not in handlers:
                root.removeHandler(h)
                h.close()
        for h in handlers:
            if h not in root.handlers:
                root.addHandler(h)
        root.setLevel(level)
    return code, err.getvalue()


def disk(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()} | {
        str(p.relative_to(root)) + "/": b"" for p in root.rglob("*") if p.is_dir()}


def npz(path: Path, **change) -> Path:
    """A small valid npz (float 8x8 images, 3 classes), with arrays replaced by ``change``."""
    r = np.random.default_rng(0)
    x, y = r.random((200, 1, 8, 8)).astype(np.float32), r.integers(0, 3, 200)
    arrays = {"x": x, "y": y, "x_test": x[:50], "y_test": y[:50], **change}
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    return path


def refused(tmp_path, data_root, overrides, expect, run_dir=None):
    """``train_here`` with ``overrides`` is refused: exit 1, its first line ``normfl: ...``, no traceback, every
    string of ``expect`` said, nothing under ``tmp_path`` made or removed. Returns what it said."""
    run_dir = run_dir or tmp_path / "run"
    before = disk(tmp_path)
    code, err = train_here(data_root, run_dir, *overrides)
    lines = [line for line in err.splitlines() if line.strip()]
    expect = (expect,) if isinstance(expect, str) else expect
    assert code == 1 and lines[0].startswith("normfl: ") and "Traceback" not in err, err
    assert all(e in err for e in expect), err
    assert disk(tmp_path) == before                          # nothing made, nothing removed
    return err
