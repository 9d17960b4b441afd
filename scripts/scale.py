"""Population scale: round time and peak memory of Fed-α-NormEC and FedAvg at 1,000 / 10,000 / 100,000
Fashion-MNIST clients with the same cohort per round, so round time should follow the cohort, not
the population. Each point is one `train.py` run (its own process, so peak RSS is its own).

    python scripts/scale.py [--clients 1000 10000 100000] [--cohort 100] [--model logreg mlp] [--rounds 20]

Prints one table and writes outputs/bench/scale.csv. Round time is the median over rounds without an
evaluation; peak RSS is the run's whole process (data, model, client state).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
ALGOS = {  # only the cohort computes: Fed-α-NormEC's participants-only memory update, and FedAvg
    "fed_normec": ["algo=fed_normec", "algo.memory_update=participants_only"],
    "fedavg": ["algo=fedavg", "algo.bounding=none"],
}


def run(algo: str, model: str, clients: int, cohort: int, rounds: int, threads: int, out: Path) -> dict:
    cmd = [sys.executable, str(REPO / "train.py"), *ALGOS[algo], f"model={model}", "dataset=fashion_mnist",
           "partition=sampled_shards", f"clients={clients}", "algo.participation=cohort",
           f"algo.cohort_size={cohort}", "algo.gamma=0.1", "algo.beta=0.1", f"rounds={rounds}",
           f"eval_every={rounds}", f"threads={threads}", "progress=false", f"hydra.run.dir={out}"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}\n{done.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    m = pd.read_csv(out / "metrics.csv")
    dt = m["wall_time"].diff()[m["test_acc"].isna()]           # rounds without an evaluation
    return {"algo": algo, "model": model, "clients": clients, "cohort": cohort, "p": cohort / clients,
            "dim": summary["dim"], "s_per_round": dt.median(), "peak_rss_mb": summary["peak_rss_mb"],
            "client_state_mb": clients * summary["dim"] * 4 / 2**20 if algo == "fed_normec" else 0.0,
            "final_test_acc": summary["final_test_acc"], "status": summary["status"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[1000, 10_000, 100_000])
    ap.add_argument("--cohort", type=int, default=100)
    ap.add_argument("--model", nargs="+", default=["logreg", "mlp"])
    ap.add_argument("--algo", nargs="+", default=list(ALGOS), choices=list(ALGOS))
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=REPO / "outputs" / "bench" / "scale.csv")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.model:
            for algo in args.algo:
                for n in args.clients:
                    out = Path(tmp) / f"{algo}-{model}-{n}"
                    rows.append(run(algo, model, n, args.cohort, args.rounds, args.threads, out))
                    print(f"  {algo} {model} {n} clients: {rows[-1]['s_per_round']:.3f} s/round, "
                          f"{rows[-1]['peak_rss_mb']:.0f} MiB", file=sys.stderr)
    df = pd.DataFrame(rows)
    base = df.groupby(["algo", "model"])["s_per_round"].transform("first")
    df["time_vs_first"] = df["s_per_round"] / base                 # ratio to the smallest population
    args.out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out, index=False)
    print(df.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
