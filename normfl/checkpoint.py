"""A run's checkpoint: everything needed to continue it from the last saved round, bit for bit.

One file, ``checkpoint.pt`` in the run directory, written atomically (temporary file, then rename),
so a run killed at any moment leaves either the previous checkpoint or the new one. It records the
config key it belongs to; resuming under another config is refused.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from normfl.errors import ConfigError

NAME = "checkpoint.pt"


def snapshot(run, wall_time_s: float) -> dict:
    """Everything a ``Training`` needs to go on from the step it has just taken: the model, the records,
    the algorithm's ``state``, the clients' batch streams, the model's buffers, the backend chosen, and the
    steps of a round under way (its losses and uploads so far: Ctrl-C may stop a pass part-way). Tensors are
    copies: a vectorized run's x and state are views of its group's."""
    return {"x": run.x.clone(), "sent": run.sent, "rows": run.rec.rows, "algo": run.algo.state_dict(),
            "data": run.clients.data.state_dict(), "buffers": run.setup.flat.buffers(),
            "backend": run.clients.engine.backend, "wall_time_s": wall_time_s,
            "step": run.step, "losses": [float(v) for v in run.losses], "uploads": run.uploads,
            "audit": None if run.audit is None else (run.audit.scores, run.audit.steps)}


def restore(run, state: dict) -> None:
    """Put a ``snapshot`` back into a freshly built ``Training``."""
    run.x, run.sent, run.rec.rows = state["x"].to(run.x.device), state["sent"], state["rows"]
    run.algo.load_state_dict(state["algo"], run.x.device)     # read on the CPU, whatever device wrote it
    run.clients.data.load_state_dict(state["data"])
    run.setup.flat.set_buffers(state["buffers"])
    run.clients.engine.backend = state["backend"]
    if run.audit is not None and state.get("audit") is not None:       # the canaries' scores so far
        run.audit.scores, run.audit.steps = state["audit"][0].to(run.x.device), state["audit"][1]


def save(out_dir: Path, key: str, state: dict) -> None:
    path = Path(out_dir) / NAME
    tmp = path.with_name(f".{NAME}.tmp")
    with open(tmp, "wb") as fh:
        torch.save({"config_key": key, **state}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def load(out_dir: Path, key: str) -> dict | None:
    """The checkpoint in ``out_dir`` (None if there is none); refused if it is another config's."""
    path = Path(out_dir) / NAME
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:                             # truncated or not a checkpoint
        raise ConfigError("resume", str(path), f"a readable checkpoint ({err}); remove it by hand to start over "
                          "here, or choose another run directory") from err
    if state.get("config_key") != key:
        raise ConfigError("resume", str(path), f"a checkpoint of this config ({key}), not of "
                          f"{state.get('config_key')}; choose another run directory")
    return state


def peek(out_dir: Path) -> dict | None:
    """The checkpoint in ``out_dir`` whoever's it is: None if there is none, {} if it is unreadable."""
    path = Path(out_dir) / NAME
    if not path.exists():
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception:
        return {}


def owner(out_dir: Path) -> str | None:
    """The config key of the checkpoint in ``out_dir`` (None if there is none)."""
    state = peek(out_dir)
    return None if state is None else state.get("config_key", f"an unreadable {NAME}")


def remove(out_dir: Path) -> None:
    (Path(out_dir) / NAME).unlink(missing_ok=True)
