"""What a run directory guarantees: one run at a time, and no other invocation's records touched.

- A run holds its directory with a lock file (``.lock``: its pid and host) from the moment it is
  accepted until it ends; a second run there is refused while the holder lives. A lock left by a
  process of this host that is gone (killed) is taken over.
- A directory holding another config's run (its summary, checkpoint or ``.hydra/config.yaml``) is
  refused, naming both configs; only the same config continues there (resume) or, asked with
  ``resume=false``, starts over.
- A run accepted in its directory first removes the half-written files (``.*.tmp``) a killed writer left.
- A refused run removes exactly what it created: the files and folders that were not there when it
  started, the lines it appended to a log that was, and the directory if it was empty. The run's
  ``.hydra/`` record is written only once it is accepted (Hydra's own is turned off in
  ``conf/config.yaml``).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from normfl import checkpoint
from normfl.errors import ConfigError

LOCK = ".lock"
DIR_KEY = "hydra.run.dir"            # how the user names the directory (a sweep's job: hydra.sweep.dir)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:          # someone else's process: alive
        return True
    return True


def _lock_state(lock: Path) -> dict | str:
    """Who holds ``lock`` (``pid``, ``host``, ``since``); "none" where there is no lock file, "stale" where its
    process is gone (on this host) or the file is broken and older than a minute (one being written is held)."""
    try:
        info = json.loads(lock.read_text())
    except FileNotFoundError:
        return "none"
    except (OSError, ValueError):
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return "none"
        return {"pid": None, "host": "?", "since": None} if age < 60 else "stale"
    if info.get("host") == socket.gethostname() and not _alive(int(info.get("pid", -1))):
        return "stale"
    return info


def holder(path: Path) -> dict | None:
    """Who holds the directory (``pid``, ``host``, ``since``), or None if nobody alive does."""
    state = _lock_state(Path(path) / LOCK)
    return state if isinstance(state, dict) else None


def _remove_stale(lock: Path) -> None:
    """Remove a lock whose process is gone, one claimant at a time: each holds ``.lock.takeover`` while it reads
    the lock again and removes it only if that read says stale (not if it is missing: another claimant may be
    making its own this instant). Only a takeover removes a stale lock, so the file read is the file removed.
    Unguarded, two claimants' removals of one stale lock let both hold the directory. A claimant that finds
    another at it waits a moment and tries again; a takeover left by a process killed in it goes after a minute."""
    mutex = lock.with_name(LOCK + ".takeover")
    try:
        fd = os.open(mutex, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            if time.time() - mutex.stat().st_mtime > 60:
                mutex.unlink(missing_ok=True)
        except FileNotFoundError:
            pass
        time.sleep(0.01)
        return
    os.close(fd)
    try:
        if _lock_state(lock) == "stale":
            lock.unlink(missing_ok=True)
    finally:
        mutex.unlink(missing_ok=True)


class RunDir:
    """One invocation's hold on its run directory: ``claim`` it, ``record`` the accepted config,
    ``release`` at the end, or ``discard`` what this invocation made when it is refused."""

    def __init__(self, path: Path, log_name: str | None = None):
        self.path, self.log_name, self.held = Path(path), log_name, False
        self.hydra_cfg = None                    # Hydra's settings of the job, once recorded
        self.before = set(os.listdir(self.path)) if self.path.is_dir() else None   # None: not there yet
        log = self.path / log_name if log_name else None
        self.log_size = log.stat().st_size if log is not None and log.is_file() else None

    def claim(self, key: str) -> None:
        """Take the lock, then refuse a directory holding another config's run (ConfigError)."""
        self.path.mkdir(parents=True, exist_ok=True)
        lock = self.path / LOCK
        me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        for _ in range(200):
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                if (info := holder(self.path)) is not None:
                    raise ConfigError(DIR_KEY, str(self.path), f"a directory no live run holds (held by pid "
                                      f"{info.get('pid')} on {info.get('host')} since {info.get('since')}; "
                                      "wait for it, or choose another run directory)") from None
                _remove_stale(lock)                          # its process is gone
                continue
            with os.fdopen(fd, "w") as fh:
                json.dump(me, fh)
            self.held = True
            break
        else:
            raise ConfigError(DIR_KEY, str(self.path), "a directory whose lock file can be taken")
        other = self.owner()
        if other is not None and other != key:
            raise ConfigError(DIR_KEY, str(self.path), f"a new directory, or one holding this config's run ({key}); "
                              f"it holds a run of config {other}, which is never overwritten")
        for tmp in self.path.glob(".*.tmp"):                 # half-written by this config's run, killed mid-write:
            tmp.unlink(missing_ok=True)                      # no live writer is left (the lock is ours)

    def owner(self) -> str | None:
        """The config key of the run already in the directory: its summary's, its recorded config's, or
        (a directory from before runs recorded their config on acceptance) its checkpoint's; None if it
        holds none. The checkpoint, the largest of them, is read only when nothing else says."""
        try:
            summary = json.loads((self.path / "summary.json").read_text())
            if summary.get("config_key"):
                return summary["config_key"]
        except (OSError, ValueError):
            pass
        cfg_file = self.path / ".hydra" / "config.yaml"
        if cfg_file.is_file():
            from normfl.config import config_key

            try:
                return config_key(OmegaConf.load(cfg_file))
            except Exception:                                # unreadable: somebody's, not ours
                return "an unreadable .hydra/config.yaml"
        return checkpoint.owner(self.path)

    def record(self, cfg: DictConfig, overrides: list[str] | None = None, hydra_cfg: DictConfig | None = None) -> None:
        """Write the accepted run's ``.hydra/`` (config, overrides, Hydra's settings when known), and keep Hydra's
        settings (``hydra_cfg``: the job's W&B name and group are read from them, ``sweep.wandb_names``)."""
        self.hydra_cfg = hydra_cfg
        d = self.path / ".hydra"
        d.mkdir(exist_ok=True)
        files = {"config.yaml": cfg, "overrides.yaml": OmegaConf.create(list(overrides or [])),
                 "hydra.yaml": hydra_cfg}
        for name, node in files.items():
            if node is not None:
                tmp = d / f".{name}.tmp"
                OmegaConf.save(node, tmp)
                tmp.replace(d / name)

    def release(self) -> None:
        if self.held:
            (self.path / LOCK).unlink(missing_ok=True)
            self.held = False

    def discard(self) -> None:
        """Undo this invocation: release the lock and, if it held the directory, remove what it created and
        cut the log back (never when refused before: another run may be writing there); then remove the
        directory if it was empty."""
        held = self.held
        self.release()
        if not self.path.is_dir():
            return
        for name in set(os.listdir(self.path)) - (self.before or set()) if held else ():
            p = self.path / name
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
        if held and self.log_size is not None:
            with open(self.path / self.log_name, "r+b") as fh:
                fh.truncate(self.log_size)
        if not self.before:
            try:
                self.path.rmdir()
            except OSError:
                pass
