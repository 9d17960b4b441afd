"""Shared fixtures: the offline copies of the real datasets, and one data root per test session."""

import os
import tempfile
from pathlib import Path

import pytest

# Runs a test finishes through the reproduction driver are recorded apart from the committed records
os.environ.setdefault("NORMFL_RECORDS", tempfile.mkdtemp(prefix="normfl-test-records-"))
# The CPU suite computes on the CPU on a GPU machine too: device=auto reads $NORMFL_DEVICE (subprocesses
# inherit it); tests/test_gpu.py asks for device=cuda by name. NORMFL_TEST_DEVICE=cuda runs the suite's
# device=auto tests on a GPU instead (scripts/gpu_check.py does so for the resume and equality tests)
os.environ["NORMFL_DEVICE"] = os.environ.get("NORMFL_TEST_DEVICE", "cpu")
# One torch thread per process (set before torch loads; subprocesses inherit it): `make test` runs two workers on
# two cores, and their runs at torch's default of a thread per core oversubscribe them, where OpenMP's waiting
# threads spin (the end-to-end and resume tests took 16-19% longer that way). A run's `threads=` still wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")
from tests.helpers import OFFLINE  # noqa: E402  (the helpers load torch: after the environment above)


@pytest.fixture(scope="session")
def offline_dir() -> Path:
    if not OFFLINE.is_dir():
        pytest.fail(f"the offline datasets are missing: expected them in {OFFLINE} (set NORMFL_OFFLINE_DATA)")
    return OFFLINE


@pytest.fixture(scope="session")
def data_root(tmp_path_factory) -> Path:
    """One writable data root for the whole suite, shared by pytest-xdist's workers (a loader locks the root
    while it prepares the data there), so CIFAR-10's JPEG copy is decoded once."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "data"
    root.mkdir(exist_ok=True)
    return root


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    """The tests memoise (backend timings, noise calibrations) into a cache of their own: never into the
    user's ~/.cache/normfl, whose timings of tiny test models would otherwise steer real runs' auto."""
    os.environ["NORMFL_CACHE"] = str(tmp_path_factory.mktemp("cache"))
