"""Where a loader looks: the offline copy's folder, a download when the host answers, the error that lists every
place looked; and the lock and atomic write that let parallel jobs prepare one data root."""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass

log = logging.getLogger(__name__)

OFFLINE_ENV = "NORMFL_OFFLINE_DATA"


class DataNotFoundError(FileNotFoundError):
    """No source of a dataset was usable; the message lists every place looked and how to fix it."""


def offline_path(offline_dir: str | os.PathLike | None) -> Path | None:
    offline_dir = offline_dir if offline_dir is not None else os.environ.get(OFFLINE_ENV) or None
    return None if offline_dir is None else Path(offline_dir).expanduser()


def no_offline_dir() -> str:
    return f"offline copy: no offline dir given (offline_dir=None and ${OFFLINE_ENV} unset)"


def reachable(url: str, timeout: float = 3.0) -> str | None:
    """None if a TCP connection to the url's host (or its proxy) opens within `timeout`, else why not."""
    parts = urlsplit(url)
    host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    proxy = getproxies().get(parts.scheme)
    if proxy and not proxy_bypass(host):
        p = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host, port = p.hostname, p.port or 80
    result: list[str | None] = []

    def probe():  # in a thread, because DNS look-ups ignore socket timeouts
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result.append(None)
        except OSError as e:
            result.append(str(e))

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout + 0.5)
    if not result:
        return f"no connection to {host}:{port} within {timeout:g} s"
    return None if result[0] is None else f"cannot connect to {host}:{port}: {result[0]}"


def try_download(url: str, download: bool, fetch: Callable[[], object], looked: list[str]) -> bool:
    if not download:
        looked.append(f"download from {url}: not attempted (download=False)")
        return False
    why = reachable(url)
    if why is not None:
        looked.append(f"download from {url}: skipped ({why})")
        return False
    try:
        fetch()
        return True
    except Exception as e:  # any failure means: try the next source
        looked.append(f"download from {url}: failed ({type(e).__name__}: {e})")
        return False


def not_found(what: str, looked: list[str], how: list[str], places=()) -> DataNotFoundError:
    """The error listing every place looked and how to fix it; where one of ``places`` (the root, the offline
    folder) is a relative path, it names the working directory it was read from."""
    lines = [f"{what} not found. Looked in:"] + [f"  - {x}" for x in looked]
    if any(p is not None and not Path(p).is_absolute() for p in places):
        lines.append(f"  (relative paths are read from the working directory, {Path.cwd()})")
    lines += [f"To provide {what}, do one of:"] + [f"  - {x}" for x in how]
    return DataNotFoundError("\n".join(lines))


@contextmanager
def root_lock(root: Path, name: str):
    """Exclusive lock on `root/.normfl-<name>.lock` (parallel sweep jobs); a no-op where not possible."""
    f = None
    try:
        import fcntl

        root.mkdir(parents=True, exist_ok=True)
        f = open(root / f".normfl-{name}.lock", "w")
        fcntl.flock(f, fcntl.LOCK_EX)
    except (ImportError, OSError) as e:
        log.debug("no lock in %s: %s", root, e)
    try:
        yield
    finally:
        if f is not None:
            f.close()  # releases the lock


def save_atomic(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write ``path`` through ``write(file)`` whole or not at all: into a temporary file beside it, then renamed
    (a process killed mid-write leaves at most that temporary file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
