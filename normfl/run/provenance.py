"""Where and on what a run ran, for its summary: the device and its name, the versions of what computed it,
normfl's commit, and the process's peak memory."""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import subprocess
import sys
from pathlib import Path

import torch

import normfl
from normfl.engine.flat import device_name


def where(device: torch.device) -> dict:
    """Where a run ran, for its summary: the device's name, the versions of what computed it (torch, CUDA,
    cuDNN and the libraries its numbers depend on) and the commit of normfl's checkout (``-dirty`` with
    uncommitted changes; None outside a git checkout)."""
    cuda = device.type == "cuda"
    versions = {"normfl": normfl.__version__, "torch": torch.__version__, "python": platform.python_version(),
                "cuda": torch.version.cuda if cuda else None, "cudnn": torch.backends.cudnn.version() if cuda else None}
    for package in ("torchvision", "numpy", "dp-accounting", "hydra-core", "omegaconf"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {"device_name": device_name(device), "versions": versions, "commit": commit()}


@functools.cache
def commit() -> str | None:
    """normfl's commit, ``-dirty`` with uncommitted changes, or None outside a git checkout (asked of git once
    a process)."""
    root = Path(normfl.__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty else "")


def peak_rss_mb() -> float | None:
    """The process's peak resident memory so far, in MiB (None where the OS does not say)."""
    try:
        import resource
    except ImportError:                      # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss       # KiB on Linux, bytes on macOS
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024
