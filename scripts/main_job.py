"""What ``make run`` prints after the main job: its final test accuracy against the paper's number for the
same setting (NORMEC Table 2, when the run is one of its cells), and the command that runs the paper's
setting, 300 passes, on a GPU.

    python scripts/main_job.py RUN_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from normfl.reproduce.paper import paper_value, param_label  # noqa: E402

GPU = ("python train.py reading=pass eval_every=10 device=cuda backend=stacked precision=bf16 "
       "algo.beta={beta} algo.gamma={gamma} algo.server_norm={sn}")


def table2(cfg) -> float | None:
    """NORMEC Table 2's final accuracy for this run's cell, if it is one (α-NormEC, α = 0.01, non-private,
    CIFAR-10, 10 clients, batch 32, seed 42, the paper's γ for its β)."""
    a = cfg.algo
    cell = (a.get("_target_") == "normfl.algorithms.NormEC" and not a.get("private") and a.get("alpha") == 0.01
            and cfg.dataset._target_ == "normfl.data.load_cifar10" and cfg.dataset.split == "holdout"
            and not cfg.dataset.train_limit and not cfg.dataset.test_limit and cfg.clients == 10
            and cfg.batch_size == 32 and cfg.seed == 42)
    if not cell:
        return None
    block = "normec_sn" if a.server_norm else "normec_no_sn"
    row = param_label("beta", float(a.beta))
    if paper_value("NORMEC-T2", block=block, row=row, column="gamma", default=None) != a.gamma:
        return None
    return paper_value("NORMEC-T2", block=block, row=row, column="final_accuracy", default=None)


def main(run_dir: Path) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    acc = summary.get("final_test_acc")
    ours = f"{100 * acc:.2f}%" if acc is not None else "no accuracy"
    print(f"\n{run_dir}: {summary['status']}, final test accuracy {ours} after {summary['final_round']} rounds "
          f"({summary.get('reading', 'text')} reading; {summary['data']}).")
    paper = table2(cfg) if summary["status"] == "completed" else None
    if paper is None:
        print("No paper number is printed for exactly this setting.")
        return
    print(f"NORMEC Table 2 prints {paper:.2f}% for it: {100 * acc - paper:+.2f} points.")
    if summary.get("reading", "text") == "text":
        print("This run took the text's reading of a round (one minibatch step per client), 300 steps in all. The "
              "paper's numbers need a round read as one pass over each client's shard (reading A2 in "
              "docs/readings.md; 140 steps a pass, 42,000 in all), which is a GPU job:\n  "
              + GPU.format(beta=cfg.algo.beta, gamma=cfg.algo.gamma, sn=str(cfg.algo.server_norm).lower()))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
