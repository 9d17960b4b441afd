"""Sweep-level parallelism: runs per hour of a small grid, one job at a time against joblib jobs."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

from .settings import REPO


def sweep_throughput(overrides: list[str], rounds: int) -> list[dict]:
    """Runs per hour of a 2 x 2 NORMEC grid (β, γ), one job at a time with every core, against Hydra's
    joblib launcher with the cores split between jobs (each a ``train.py -m`` sweep in its own dir)."""
    cores = os.cpu_count() or 1
    grid = ["algo=normec", "algo.beta=0.01,0.1", "algo.gamma=0.01,0.1", f"rounds={rounds}", f"eval_every={rounds}",
            "progress=false", "backend=sequential", *(o for o in overrides if not o.startswith("threads="))]
    modes = {f"1 job x {cores} threads": [f"threads={cores}"],
             f"{cores} jobs x 1 thread (joblib)": ["threads=1", "hydra/launcher=joblib",
                                                   f"hydra.launcher.n_jobs={cores}"]}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, extra) in enumerate(modes.items()):
            t = time.perf_counter()
            subprocess.run([sys.executable, str(REPO / "train.py"), "-m", *grid, *extra, f"hydra.sweep.dir={tmp}/{i}"],
                           cwd=REPO, check=True, capture_output=True)
            rows.append({"setting": "sweep", "what": f"2 x 2 NORMEC grid, {rounds} rounds", "variant": label,
                         "seconds": time.perf_counter() - t, "runs_per_hour": 4 * 3600 / (time.perf_counter() - t)})
    return rows
