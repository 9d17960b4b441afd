"""A run's checkpoint: everything needed to continue it from the last saved round, bit for bit.

One file, ``checkpoint.pt`` in the run directory, written atomically (temporary file, then rename),
so a run killed at any moment leaves either the previous checkpoint or the new one. It records the
config key it belongs to; resuming under another config is refused.
"""

from __future__ import annotations

import functools
import io
import os
from pathlib import Path

import torch

from normfl.errors import ConfigError, RunStopped

NAME = "checkpoint.pt"


def snapshot(run, wall_time_s: float) -> dict:
    """Everything a ``Training`` needs to go on from the step it has just taken: the model, the records,
    the algorithm's ``state``, the clients' batch streams, the model's buffers, the backend chosen, and the
    steps of a round under way (its losses and uploads so far: Ctrl-C may stop a pass part-way), and the W&B run
    it continues (``logger=wandb``). Tensors are copies: a vectorized run's x and state are views of its group's."""
    return {"x": run.x.clone(), "sent": run.sent, "rows": run.rec.rows, "algo": run.algo.state_dict(),
            "data": run.clients.data.state_dict(), "buffers": run.setup.flat.buffers(),
            "backend": run.clients.engine.backend, "wall_time_s": wall_time_s,
            "step": run.step, "losses": [float(v) for v in run.losses], "uploads": run.uploads,
            "audit": None if run.audit is None else run.audit.state_dict(),
            "wandb_id": run.rec.wandb_id}


def restore(run, state: dict) -> None:
    """Put a ``snapshot`` back into a freshly built ``Training``."""
    run.x, run.sent, run.rec.rows = state["x"].to(run.x.device), state["sent"], state["rows"]
    run.algo.load_state_dict(state["algo"], run.x.device)     # read on the CPU, whatever device wrote it
    run.clients.data.load_state_dict(state["data"])
    run.setup.flat.set_buffers(state["buffers"])
    run.clients.engine.backend = state["backend"]
    if run.audit is not None and state.get("audit") is not None:       # the canaries' scores so far
        run.audit.load_state_dict(state["audit"])


class UndeclaredState(RunStopped):
    """An algorithm's attribute changed from round to round without being named in its ``state``."""


def _fingerprint(value) -> bytes | None:
    """``value`` to the bit, to compare later: a tensor's dtype, shape and bytes (a view's own elements, not its
    storage's), anything else as torch.save writes it; None where it cannot be written (not watched)."""
    try:
        if isinstance(value, torch.Tensor):
            v = value.detach().reshape(-1).contiguous()
            return f"{v.dtype}{tuple(value.shape)}".encode() + v.view(torch.uint8).cpu().numpy().tobytes()
        buf = io.BytesIO()
        torch.save(value, buf)
        return buf.getvalue()
    except Exception:                                  # noqa: BLE001 (a lambda, a lock, an open file...)
        return None


class StateWatch:
    """The first ``ROUNDS`` rounds of a run: every attribute of its algorithm but those its ``state`` (saved by a
    checkpoint) and its ``scratch`` (remade each round) name must keep its value, to the bit, from set-up on. One
    that changes (a momentum buffer, a step counter, a cache filled in round 0) would be lost by a checkpoint,
    and the run resumed from it would end elsewhere under the same run key: the run stops with
    ``UndeclaredState`` naming it, before its first checkpoint (at checkpoint_every=1, before its second)."""

    ROUNDS = 2

    def __init__(self, algo, kept: tuple[str, ...] = ()):
        """``kept``: attributes the checkpoint keeps elsewhere (in-band canaries ride on the privatizer, ``mech``,
        and their scores are the checkpoint's ``audit``)."""
        self.kept = kept
        self.seen, self.rounds = self._look(algo), 0

    def _look(self, algo) -> dict:
        skip = set(algo.state) | set(getattr(algo, "scratch", ())) | set(self.kept)
        return {name: _fingerprint(v) for name, v in vars(algo).items() if name not in skip
                and not isinstance(getattr(type(algo), name, None), functools.cached_property)}   # made once, on use

    def check(self, algo) -> bool:
        """After a round: raise ``UndeclaredState`` if an attribute changed; whether to go on watching."""
        now = self._look(algo)
        changed = [n for n, seen in now.items() if seen is not None and self.seen.get(n) != seen]
        if changed:
            cls = type(algo)
            names = ", ".join(repr(n) for n in changed)
            raise UndeclaredState(
                f"{cls.__module__}.{cls.__qualname__} changed {names} in round {self.rounds + 1} but its `state` "
                f"does not name {'them' if len(changed) > 1 else 'it'}: a checkpoint would lose "
                f"{'them' if len(changed) > 1 else 'it'}, and the run resumed from it would end elsewhere. Add "
                f"{names} to the class's `state` (what a round changes and the next reads), or to its `scratch` "
                "if every round remakes it")
        self.seen, self.rounds = now, self.rounds + 1
        return self.rounds < self.ROUNDS


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
