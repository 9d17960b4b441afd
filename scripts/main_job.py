"""The main job, ``make run``: α-NormEC's default setup (NORMEC Table 2's cell with SN, β = γ = 0.1) in the
setting this machine can afford, then its final test accuracy against the paper's number for that setting.

    python scripts/main_job.py RUN_DIR [overrides]

On a machine with CUDA it is the paper's setting, the paper profile's run of that cell: a round read as one pass
over each client's shard (reading A2), 300 passes (42,000 steps), evaluated after each, the clients stacked under
bf16 autocast; it becomes the cell's record in outputs/records (commit it). On a CPU, where that is about 14
hours, it is the text's reading (one step a round, 300 steps), evaluated every 10 rounds, and it ends with the
command that runs the paper's setting on a GPU. Overrides come last, so they win either way.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from normfl.reproduce import jobs, records  # noqa: E402
from normfl.reproduce.paper import paper_value, param_label  # noqa: E402
from normfl.results import FINISHED  # noqa: E402

CPU = ["eval_every=10"]
GPU = [*(f"{k}={jobs.value_text(v)}" for k, v in jobs.settings("normec_np_sn", "paper").items()), "profile=paper",
       "device=cuda", "backend=stacked"]                                 # the paper profile's run of the cell
GPU_COMMAND = "python train.py " + " ".join(GPU) + " algo.beta={beta} algo.gamma={gamma} algo.server_norm={sn}"


def setting() -> list[str]:
    """The main job's overrides on this machine."""
    return GPU if torch.cuda.is_available() else CPU


def table2(cfg) -> float | None:
    """NORMEC Table 2's final accuracy for this run's cell, if it is one (α-NormEC, α = 0.01, non-private,
    CIFAR-10, 10 clients, batch 32, seed 42, the paper's γ for its β)."""
    a = cfg.algo
    cell = (a.get("name") == "normec" and not a.get("private") and a.get("alpha") == 0.01
            and cfg.dataset._target_ == "normfl.data.load_cifar10" and cfg.dataset.split == "holdout"
            and not cfg.dataset.train_limit and not cfg.dataset.test_limit and cfg.clients == 10
            and cfg.batch_size == 32 and cfg.seed == 42)
    if not cell or printed(a, "gamma") != a.gamma:
        return None
    return printed(a, "final_accuracy")


def printed(algo, column: str) -> float | None:
    """What NORMEC Table 2 prints in ``column`` (``gamma``: the best γ; ``final_accuracy``) for α-NormEC's block (with
    or without SN) and β, if it prints that β."""
    block = "normec_sn" if algo.server_norm else "normec_no_sn"
    return paper_value("NORMEC-T2", block=block, row=param_label("beta", float(algo.beta)), column=column, default=None)


def report(run_dir: Path) -> None:
    """The run's final accuracy, and the paper's number for its setting where Table 2 prints one."""
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
              + GPU_COMMAND.format(beta=cfg.algo.beta, gamma=cfg.algo.gamma, sn=str(cfg.algo.server_norm).lower()))


def main(run_dir: Path, overrides: list[str]) -> int:
    cmd = [sys.executable, str(REPO / "train.py"), *setting(), f"hydra.run.dir={run_dir}", *overrides]
    print("main job:", " ".join(cmd[2:]), flush=True)
    proc = subprocess.Popen(cmd, cwd=REPO)
    while (code := _wait(proc)) is None:     # a Ctrl-C reaches the run too: it saves a checkpoint and stops
        pass
    if (run_dir / "summary.json").exists():
        report(run_dir)
        record(run_dir)
    return code


def record(run_dir: Path) -> None:
    """A finished paper-profile run of a NORMEC-T2 cell (the main job on a GPU) becomes that cell's record."""
    summary = json.loads((run_dir / "summary.json").read_text())
    if summary.get("profile") != "paper" or summary["status"] not in FINISHED:
        return
    if summary["config_key"] in {job.key for job in jobs.jobs("normec_t2", "paper")}:
        print(f"record {records.pack(run_dir)}: {records.RECORDS / summary['config_key']} (NORMEC-T2, paper "
              "profile; commit it)")


def _wait(proc: subprocess.Popen) -> int | None:
    """The run's exit code, or None on a Ctrl-C to this process (subprocess.call would kill the run then, before
    it saves its checkpoint)."""
    try:
        return proc.wait()
    except KeyboardInterrupt:
        return None


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2:]))
