"""ALI-DPFL on Fashion-MNIST at R_c = 177 DP-SGD steps (budget=e175_r177: ε = 1.75, R_s = R_c): the
paper's text against the authors' code, one setting at a time and all together (issue 19).

    python scripts/ali_readings.py run outputs/ali-readings [--parallel 2] [--only code_t1 ...]
    python scripts/ali_readings.py table outputs/ali-readings
    python scripts/ali_readings.py gradnorm

``run`` trains each run below that has no finished summary in OUT/<name> (one CPU thread per process);
``table`` prints the final (and, for the code reading, best-round) test accuracy of each; ``gradnorm``
the per-sample gradient norms of the initial CNN under both input scales.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT = "experiment=alidpfl_fmnist eval_every=25"
CODE = "experiment=alidpfl_authors_code"
# setting: (what it is, its overrides); each runs with ALI-DPFL ("ali") and fixed τ ("t1".."t5")
SETTINGS = {
    "text": ("the paper's text (experiment=alidpfl_fmnist)", TEXT),
    "div64": ("text, the noisy sum divided by 64 (algo.divisor=64)", f"{TEXT} algo.divisor=64"),
    "raw": ("text, raw 0-255 pixels (dataset.scale=raw)", f"{TEXT} dataset.scale=raw"),
    "split": ("text, the authors' split: Dirichlet(1) over the merged 70k, 75/25 per client",
              f"{CODE} algo.divisor=null eval_subset=null eval_every=25"),
    "code": ("the authors' code: split, divisor 64, a fresh 20% of the test set every round", CODE),
    "coderaw": ("the code with raw pixels (the MindSpore port)", f"{CODE} dataset.scale=raw"),
    "code_div16": ("the code with divisor 16 (the -lbs of its examples.sh)", f"{CODE} algo.divisor=16"),
    "coderaw_div16": ("the code with raw pixels and divisor 16", f"{CODE} dataset.scale=raw algo.divisor=16"),
}
METHODS = {"ali": "", **{f"t{t}": f"algo=dpfl algo.tau={t}" for t in range(1, 6)}}
RUNS = {  # name: overrides; the settings and methods measured (docs/reproduction/alidpfl-readings.md)
    f"{s}_{m}": f"{SETTINGS[s][1]} {METHODS[m]}".strip()
    for s, ms in {"text": ["t1", "t3", "t5"], "div64": ["t1", "t5"], "raw": ["t1", "t5"], "split": ["t1", "t5"],
                  "code": list(METHODS), "coderaw": ["t1", "t5"], "code_div16": ["t1"],
                  "coderaw_div16": ["t1"]}.items() for m in ms
}


def finished(out: Path) -> dict[str, dict]:
    """The finished runs under ``out`` (normfl.collect's rows), by name."""
    from normfl.collect import collect
    from normfl.results import FINISHED

    rows = collect(out).to_dict("records") if out.is_dir() else []
    return {Path(r["run"]).name: r for r in rows if r["status"] in FINISHED}


def paper(m: str) -> float:
    """ALI Table II, Fashion-MNIST, R_s = R_c, ε = 1.75 (normfl/reproduce/paper_numbers.csv)."""
    from normfl.reproduce.paper import paper_value

    return paper_value("ALIDPFL-T2", dataset="fashion_mnist", block="R_s=R_c", column="epsilon=1.75",
                       row="ali_dpfl" if m == "ali" else f"tau={m[1]}")


def run_one(out: Path, name: str) -> str:
    cmd = [sys.executable, "train.py", *RUNS[name].split(), "budget=e175_r177", "threads=1", "progress=false",
           f"hydra.run.dir={out / name}"]
    with open(out / f"{name}.log", "w") as log:
        rc = subprocess.call(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    return f"{name}: exit {rc}"


def table(out: Path) -> str:
    done = finished(out)

    def cell(setting, m, key="final_test_acc"):
        value = done.get(f"{setting}_{m}", {}).get(key)
        return "–" if value is None else f"{100 * value:.2f}"

    lines = ["| setting | " + " | ".join("ALI-DPFL" if m == "ali" else f"τ = {m[1]}" for m in METHODS) + " |",
             "|---|" + "---|" * len(METHODS),
             "| paper, Table II | " + " | ".join(f"{paper(m):.2f}" for m in METHODS) + " |"]
    for s, (what, _) in SETTINGS.items():
        lines.append(f"| {what} | " + " | ".join(cell(s, m) for m in METHODS) + " |")
        if s.startswith("code"):
            lines.append("| … best round | " + " | ".join(cell(s, m, "best_test_acc") for m in METHODS) + " |")
    return "\n".join(lines)


def gradnorm(n: int = 256) -> str:
    """Median per-sample gradient norm of the initial CNN (seed 0) on the first n Fashion-MNIST training
    images, and conv1's median share of its square, with inputs (x/255 - 0.5)/0.5 and raw 0-255."""
    import torch
    import torch.nn.functional as F
    from torch.func import functional_call, grad, vmap

    from normfl.data import load_fashion_mnist, normalize
    from normfl.models import cnn

    ds = load_fashion_mnist(os.environ.get("NORMFL_DATA", "data"),             # as conf/config.yaml finds them
                            os.environ.get("NORMFL_OFFLINE_DATA", "../shared/data"), download=False)
    x, y = ds.x_train[:n], ds.y_train[:n]
    torch.manual_seed(0)
    model = cnn((1, 28, 28), 10)
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, xb, yb):
        return F.cross_entropy(functional_call(model, p, (xb[None],)), yb[None])

    out = []
    for scale in ("unit", "raw"):
        g = vmap(grad(loss), in_dims=(None, 0, 0))(params, normalize(x, (0.5,), (0.5,), scale), y)
        sq = {k: v.flatten(1).pow(2).sum(1) for k, v in g.items()}
        total = sum(sq.values())
        conv1 = (sq["0.weight"] + sq["0.bias"]) / total
        out.append(f"{scale}: median per-sample gradient norm {total.sqrt().median():.3g}, "
                   f"conv1's share of its square {conv1.median():.3f}")
    return "\n".join(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("run", "table", "gradnorm"))
    ap.add_argument("out", type=Path, nargs="?", default=Path("outputs/ali-readings"))
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--only", nargs="*", choices=sorted(RUNS), default=None)
    args = ap.parse_args(argv)
    out = args.out.resolve()
    if args.what == "gradnorm":
        print(gradnorm())
        return
    if args.what == "table":
        print(table(out))
        return
    out.mkdir(parents=True, exist_ok=True)
    done = finished(out)
    todo = [n for n in (args.only or RUNS) if n not in done]
    with ThreadPoolExecutor(args.parallel) as pool:
        for line in pool.map(lambda n: run_one(out, n), todo):
            print(line, flush=True)


if __name__ == "__main__":
    main()
