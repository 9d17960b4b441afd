"""One command on a GPU machine: the GPU tests, the suite's equality tests on CUDA, the benchmark and a timed
NORMEC pass, into one report.

    python scripts/gpu_check.py [--out DIR] [--parts tests suite bench launches pass] [overrides]   (make gpu-check)

The parts, in order, each with a time limit so that the whole stays under 9 minutes:

1. ``tests``: ``pytest -m gpu`` (tests/test_gpu.py: resume on CUDA, CPU against CUDA with TF32 off, capture
   against eager, rounds under CUDA's sync debug mode, ...);
2. ``suite``: the CPU suite's resume and equality tests (``SUITE``) with ``device=auto`` meaning CUDA
   (``NORMFL_TEST_DEVICE=cuda``): killed runs resume to the same bits, stacked equals sequential, runs side
   by side equal runs alone, captured equals eager, the same seed gives the same bits;
3. ``bench``: ``scripts/bench.py`` on setting A, A's rounds in a row and 16 runs of A side by side, 10 rounds
   each after a warm-up (on an H200 these finished within the part's 220 s and B, then next in it, did not; with
   30 rounds, the bench's default on CUDA, A alone filled 200 s); its CSV is written after each part, so a part
   stopped at its limit keeps what it measured;
4. ``launches``: ``scripts/launches.py`` on setting A with the GPU profiled: the kernels one round runs, their
   device time and the slowest; then the same of 16 runs of A side by side (one vectorized round), where the
   time limit allows;
5. ``pass``: three passes of NORMEC's paper setting (α-NormEC, CIFAR-10, 10 clients, batch 32,
   ``reading=pass``, bf16), each evaluated, timed by the last: its time per step, and the paper run of 300 passes
   (42,000 steps, 300 evaluations) it implies. (The first pass holds the warm-up: cuDNN's autotuner, the
   capture: one bf16 pass alone took 5.4 s on an H200, one fp32 pass 1.9 s).

and, only when asked for (``--parts bench-bcd``: the parts above fill one device call), ``bench-bcd``: the bench
of settings B, C and D, 10 rounds each (the paper-style variant 5), into DIR/bench-bcd.csv.

``--parts`` runs some of them (a device call of at most 10 minutes can take the parts in two calls). Writes
DIR/report.md (the device, versions, each part's outcome, the bench table with each row's phases and its
agreement with the first backend, the round's kernels, the pass) beside DIR/<part>.txt, DIR/bench.csv,
DIR/launches.csv and the pass's run folder.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from normfl.reproduce.figures import markdown_table  # noqa: E402

LIMITS = {"tests": 130, "suite": 110, "bench": 220, "launches": 30, "pass": 50,    # seconds each; 540 s in all
          "bench-bcd": 240}                                                         # asked for alone
DEFAULT = [name for name in LIMITS if name != "bench-bcd"]
TARGETS = ("targets (issue 29, H100): A stacked bf16 <= 4 ms a round; 16 runs side by side <= 2.8 ms per "
           "run-round; a NORMEC paper run (42,000 steps, 300 evaluations) <= 3 minutes")
SUITE = ["tests/test_resume.py", "tests/test_stacked.py", "tests/test_vectorized.py", "tests/test_capture.py",
         "tests/test_determinism.py", "-k", "not test_determinism or stacked or deterministic"]
NORMEC_PASS = ["algo=normec", "algo.beta=0.1", "algo.gamma=0.1", "algo.server_norm=false", "reading=pass",
               "rounds=3", "eval_every=1", "device=cuda", "backend=stacked", "precision=bf16", "progress=false",
               "checkpoint_every=0"]


def workers() -> list[str]:
    """pytest-xdist's workers for the suite where it is installed: its 62 tests, most of them whole runs in
    processes of their own, did not finish one by one in 120 s on an H200 (5 did)."""
    try:
        import xdist  # noqa: F401
    except ImportError:
        return []
    return ["-n", str(min(12, os.cpu_count() or 1))]


def step(name: str, cmd: list[str], out: Path, env: dict | None = None) -> dict:
    """Run one part with its time limit; its output goes to ``out / <name>.txt``."""
    t = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=LIMITS[name],
                              env={**os.environ, **(env or {})})
        status, text = ("passed" if done.returncode == 0 else f"failed (exit {done.returncode})"), \
            done.stdout + done.stderr
    except subprocess.TimeoutExpired as err:
        status, text = f"stopped at its {LIMITS[name]} s limit", f"{err.stdout or ''}{err.stderr or ''}"
    (out / f"{name}.txt").write_text(text if isinstance(text, str) else text.decode(errors="replace"))
    return {"status": status, "seconds": time.perf_counter() - t, "tail": str(text)[-1500:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "outputs" / "gpu-check")
    ap.add_argument("--parts", nargs="+", default=DEFAULT, choices=list(LIMITS))
    args, overrides = ap.parse_known_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        sys.exit("gpu-check needs a CUDA device; torch sees none here")
    py = sys.executable
    pytest = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    commands = {
        "tests": ([*pytest, "-m", "gpu", "tests/test_gpu.py"], None),
        "suite": ([*pytest, *workers(), *SUITE], {"NORMFL_TEST_DEVICE": "cuda"}),
        "bench": ([py, "scripts/bench.py", "--settings", "A", "--together", "16", "--reps", "10",
                   "--sweep-rounds", "0", "--out", str(out / "bench.csv"), *overrides], None),
        "bench-bcd": ([py, "scripts/bench.py", "--settings", "B", "C", "D", "--together", "0", "--no-in-a-row",
                       "--reps", "10", "--sweep-rounds", "0", "--out", str(out / "bench-bcd.csv"), *overrides], None),
        "launches": ([py, "scripts/launches.py", "--settings", "A", "--together", "16", "device=cuda", "--out",
                      str(out / "launches.csv"), *overrides], None),
        "pass": ([py, "train.py", *NORMEC_PASS, f"hydra.run.dir={out / 'normec-pass'}", *overrides], None),
    }
    parts = {}
    for name in (n for n in LIMITS if n in args.parts):     # the report after each part: a call cut short keeps it
        cmd, env = commands[name]
        parts[name] = step(name, cmd, out, env)
        write_report(out, parts)
    print(f"written: {out / 'report.md'}")


def write_report(out: Path, parts: dict) -> None:
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    lines = [f"# gpu-check, {time.strftime('%Y-%m-%d %H:%M')}", "",
             f"{gpu}; torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}.",
             "", TARGETS, ""]
    for name, part in parts.items():
        lines.append(f"- {name}: {part['status']} in {part['seconds']:.0f} s")
    for name, title in (("tests", "GPU tests"), ("suite", "The suite's resume and equality tests on CUDA")):
        if name in parts:
            lines += ["", f"## {title}", "", "```", parts[name]["tail"].strip(), "```"]
    lines.append("")
    benches = [out / name for name in ("bench.csv", "bench-bcd.csv") if (out / name).exists()]
    if benches:
        cols = ["setting", "variant", "seconds", "vs_floor", "vs_dense_same_precision", "data_s", "data_host_s",
                "pass_s", "pass_host_s", "update_s", "other_s", "grad_rel_diff", "update_rel_diff", "per_run",
                "peak_memory_mb"]
        df = pd.concat([pd.read_csv(b) for b in benches], ignore_index=True)
        lines += ["## Bench (medians; seconds a round)", "",
                  markdown_table(df[[c for c in cols if c in df.columns]]), ""]
    launches = out / "launches.csv"
    if launches.exists():
        lines += ["## Kernels of one round (eager, torch profiler)", "",
                  markdown_table(pd.read_csv(launches).drop(columns=["what"])), ""]
    summary = out / "normec-pass" / "summary.json"
    if summary.exists():
        s = json.loads(summary.read_text())
        rows = pd.read_csv(out / "normec-pass" / "metrics.csv")
        last = rows["wall_time"].iloc[-1] - rows["wall_time"].iloc[-2]          # the last pass and its evaluation
        steps = rows["steps"].iloc[-1] - rows["steps"].iloc[-2]
        lines += ["## NORMEC passes", "",
                  f"The last of {s['final_round']} passes: {steps} steps in {last:.2f} s with its evaluation, "
                  f"{last / steps * 1e3:.2f} ms a step; 300 passes would take {300 * last / 60:.1f} min. Test "
                  f"accuracy after it: {s.get('final_test_acc')}; precision {s.get('precision')}; capture: "
                  f"{s.get('capture')}; numerics: {s.get('numerics')}.", ""]
    (out / "report.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
