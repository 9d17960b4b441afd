"""The benchmark suite: normfl's round time against the compute floor and against paper-style code.

    python scripts/bench.py [--settings A B C D] [--reps 5] [--threads N] [override ...]

For each paper setting it times, in one process and taking turns so that machine drift hits every
variant alike (medians over ``--reps`` rounds, after one warm-up round; the paper-style variant over the
first ``--paper-reps`` of them):

- ``normfl/<backend>``: one whole round of the algorithm (client computation, its vector work,
  noise) through ``normfl.run.build``, the objects a run uses, for each backend that applies;
- ``floor``: the bare forward + backward (+ optimizer step where the clients take local steps) of
  exactly the samples that round used, in plain PyTorch on one ordinary model, data already in memory,
  one client's batch at a time (the per-client loop floor);
- ``dense floor``: the same samples, every client's batch of one step in ONE batch through one plain
  model (what a round costs if per-client gradients were free); on CUDA in channels_last and replayed
  from a CUDA graph;
- ``paper-style``: the same work done the way the papers' public code does it: a deepcopy of the
  global model per client, a torch DataLoader over PIL images with torchvision transforms, and
  state-dict averaging (per-sample gradients by a loop over samples for DP-SGD);
- ``eval``: one pass over the test set (normfl's evaluation; for a convolutional model also in the other
  memory format);
- ``+bf16``: normfl's sequential and stacked backends and the floors under bf16 autocast
  (``precision=bf16``; not for DP-SGD, whose per-sample clipping stays fp32);
- ``+contiguous`` / ``+channels_last``: for a convolutional model, each variant (but vmap, which stays
  plain) and the evaluation again in the memory format the run would not give it (``memory_format``), so
  that one table says which layout is faster where.

Settings: A NORMEC (CIFAR-10 ResNet20, 10 clients x one gradient of batch 32); B NormFedAvg
(Fashion-MNIST MLP, 25 of 50 clients x 20 local steps x batch 256); C FEDNORMEC (20 clients,
p = 0.25: every client computes, the box); D DPFL (Fashion-MNIST CNN, per-sample clipped DP-SGD, one
local step). Extra overrides apply to every setting. ``--together N`` runs of setting A (a grid of β and γ)
trained side by side as ``hydra/launcher=stacked`` trains such a grid, one vectorized round of all of them
(``normfl.run.vectorized``, backend stacked), against the dense floor of their N x 320 images (default 16 on
CUDA, 0 on a CPU, where it takes minutes), and ``--in-a-row`` (default on CUDA) the first setting's rounds as a
run takes them, one after another without a synchronisation between them, are timed right after the first
setting. Last, sweep-level
parallelism: runs per hour of a 2 x 2 grid, one job at a time with all threads against joblib jobs with one
thread each. Prints one table (seconds and ratio to the floor) and writes outputs/bench/bench.csv.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import pandas as pd
import torch

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:       # loaded from its file (tests/test_bench.py) rather than run: its parts beside it
    sys.path.insert(0, str(HERE))
from benchmarks.runs import in_a_row, together  # noqa: E402
from benchmarks.setting import bench  # noqa: E402
from benchmarks.settings import PAPER_REPS, REPO, SETTINGS  # noqa: E402
from benchmarks.sweep import sweep_throughput  # noqa: E402


def main():
    """The parts asked for, in turn, each written to the CSV as it ends; then the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--reps", type=int, default=30 if torch.cuda.is_available() else 5,
                    help="timed rounds per variant, after one warm-up (default 30 on CUDA, 5 on a CPU)")
    ap.add_argument("--paper-reps", type=int, default=PAPER_REPS,
                    help=f"timed rounds of the paper-style variant, at most --reps (default {PAPER_REPS}): its "
                         "DataLoader over PIL images runs on the host, 7.2 times the floor for setting B on a 2-core "
                         "CPU (9.2 s a round), and B's bench at 10 rounds did not finish in 150 s on an H200 machine")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--sweep-rounds", type=int, default=30, help="rounds per run of the sweep comparison (0: skip)")
    ap.add_argument("--together", type=int, default=16 if torch.cuda.is_available() else 0,
                    help="runs of setting A trained side by side (0: skip; default 16 on CUDA, 0 otherwise)")
    ap.add_argument("--in-a-row", action=argparse.BooleanOptionalAction, default=torch.cuda.is_available(),
                    help="the first setting's rounds as a run takes them, timed in a row (default: on CUDA)")
    ap.add_argument("--out", type=Path, default=REPO / "outputs" / "bench" / "bench.csv")
    args, overrides = ap.parse_known_args()
    if args.paper_reps < 1:
        ap.error(f"--paper-reps={args.paper_reps}: at least 1 (the paper-style variant is timed on that many rounds)")
    if args.threads:
        overrides.append(f"threads={args.threads}")
    rows = []
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save(new_rows):             # after each part: a bench stopped at a time limit keeps what it measured
        rows.extend(new_rows)
        pd.DataFrame(rows).to_csv(args.out, index=False)

    parts = [(name, functools.partial(bench, name, overrides, args.reps, args.paper_reps)) for name in args.settings]
    if args.together:               # right after the first setting: with A, the GPU's targets, before a limit cuts
        parts.insert(1, (f"{args.together} runs side by side", functools.partial(together, overrides, args.reps,
                                                                                  args.together)))
    if args.in_a_row:
        parts.insert(1, (f"{args.settings[0]} in a row", functools.partial(in_a_row, args.settings[0], overrides,
                                                                            args.reps)))
    for name, part in parts:
        save(part())
        print(f"  {name} done", file=sys.stderr)
    if args.sweep_rounds:
        save(sweep_throughput(overrides, args.sweep_rounds))
    df = pd.DataFrame(rows)
    print(df.drop(columns=["what"]).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    for name in args.settings:
        print(f"{name}: {SETTINGS[name][0]}")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
