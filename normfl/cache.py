"""A small on-disk memo for results that are slow to compute and depend only on their key
(backend timings, noise calibrations). One JSON file per kind in ``$NORMFL_CACHE`` or
``~/.cache/normfl``; written atomically; a broken or unwritable cache is simply recomputed."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("NORMFL_CACHE", Path.home() / ".cache" / "normfl"))


def memo(kind: str, key: str, compute: Callable[[], object]):
    path = cache_dir() / f"{kind}.json"
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if key in known:
        return known[key]
    value = known[key] = compute()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError:
        pass
    return value
