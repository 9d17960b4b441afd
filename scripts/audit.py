"""The audit table of the docs: every private algorithm audited with canaries beside a CPU-sized run (and, on the
client-level path, through its own round: the release audit), the discrete mechanisms audited per message, and the
power of the release audit's bounds, against the ε each certifies.

    .venv/bin/python scripts/audit.py > docs/audit.md        (or: make audit; --only NAME for one row)

Each run is ``train.py`` with ``audit.canaries=N`` on Fashion-MNIST and logistic regression (the canaries'
releases do not depend on the model: the certificate is about the privatizer, its noise and its steps), two
runs at a time, one thread each, into a fresh folder under outputs/audit/. The table reads their
summary.json: the certified ε (dp-accounting), the assumption-free lower bound (Clopper-Pearson beside the run,
Steinke et al.'s one-run bound for the release), the bound from the certified curve's family (Gaussian DP, or the
accountant's PLD where sampling is claimed), and the verdict. The release audit runs the same command with
``audit.mode=release``: N canary clients join the run and the models it broadcasts are scored. The power table
cuts the noise a private algorithm uses (it keeps a fraction of its privatizer's noise, as a one-line bug would)
and shows where the release audit's bounds alone refute it, at three numbers of canaries. The last table says how
many canaries the side-car bounds need, from scores drawn from the exact Gaussian law.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from scipy.optimize import brentq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from normfl.privacy.audit import messages  # noqa: E402
from normfl.privacy.audit.canaries import thresholds_from  # noqa: E402
from normfl.privacy.audit.stats import eps_lower, gdp_epsilon, mu_lower  # noqa: E402

BASE = ["dataset=fashion_mnist", "model=logreg", "dataset.train_limit=10000", "dataset.test_limit=2000",
        "clients=10", "progress=false", "threads=1", "device=cpu", "privacy.delta=1e-5"]
ACCOUNTED = ["privacy.calibration=accountant", "accountant=pld"]
RUNS = [  # (name, what it shows, canaries, overrides)
    ("DP-α-NormEC", "client noise", 2000, ["algo=dp_normec", "rounds=100", "privacy.epsilon=4", *ACCOUNTED]),
    ("DP-Clip21", "client noise", 2000, ["algo=dp_clip21", "rounds=100", "privacy.epsilon=4", *ACCOUNTED]),
    ("DP-Fed-α-NormEC, p = 0.5", "client noise, every round charged", 2000,
     ["algo=dp_fed_normec", "p=0.5", "rounds=100", "privacy.epsilon=4", *ACCOUNTED]),
    ("DP-FedAvg, client noise", "client noise", 2000,
     ["algo=dp_fedavg", "rounds=100", "privacy.epsilon=4", *ACCOUNTED]),
    ("DP-FedAvg, server noise", "central noise", 2000,
     ["algo=dp_fedavg", "algo.noise_by=server", "rounds=100", "privacy.epsilon=4", *ACCOUNTED]),
    ("DP-FedAvg, server noise, p = 0.5, amplification claimed", "central noise, participation hidden", 2000,
     ["algo=dp_fedavg", "algo.noise_by=server", "p=0.5", "privacy.amplification=true", "rounds=100",
      "privacy.epsilon=4", *ACCOUNTED]),
    ("DP-SGD baseline (smoothed normalization)", "central noise on the mean", 2000,
     ["algo=dpsgd_norm", "algo.private=true", "rounds=100", "privacy.epsilon=4", *ACCOUNTED]),
    ("DPFL, τ = 4", "DP-SGD, sample level", 2000,
     ["algo=dpfl", "algo.sample_rate=0.3", "algo.sigma=1.5", "algo.clip=0.1", "algo.tau=4", "rounds=8",
      "privacy.epsilon=8"]),
    ("ALI-DPFL", "DP-SGD, sample level", 2000,
     ["algo=ali_dpfl", "algo.sample_rate=0.3", "algo.sigma=1.5", "algo.clip=0.1", "rounds=16", "privacy.epsilon=8"]),
    ("DP-α-NormEC, the papers' \"ε = 8\" (σ by the papers' rule, 300 rounds)", "client noise", 1000,
     ["algo=dp_normec", "rounds=300", "privacy.epsilon=8", "privacy.calibration=paper"]),
    ("DP-Fed-α-NormEC, p = 0.1, amplification claimed by client noise", "threat model: uploads seen", 2000,
     ["algo=dp_fed_normec", "p=0.1", "privacy.amplification=true", "rounds=100", "privacy.epsilon=2", *ACCOUNTED]),
]
MESSAGES = [  # (name, audit)
    ("QTDL, d = 8, s = 4, ε₀ = 1, eq. 6 sensitivity", lambda: messages.audit_qtdl(8, 4, 1.0)),
    ("QTDL, d = 8, s = 4, ε₀ = 1, worst-case sensitivity", lambda: messages.audit_qtdl(8, 4, 1.0, "worst")),
    ("QTDL, d = 1, s = 16, ε₀ = 0.3", lambda: messages.audit_qtdl(1, 16, 0.3)),
    ("Binomial (cpSGD), d = 8, s = 4, (1, 1e-5)", lambda: messages.audit_binomial(8, 4, 1.0, 1e-5)),
]
NEEDED_EPS, NEEDED_N, DELTA = (1.0, 4.0, 8.0), (1_000, 10_000, 100_000), 1e-5
# the release audit's power: a private algorithm that keeps a fraction of its privatizer's noise, N canaries
POWER = [  # (name, overrides, fractions of the noise kept)
    ("DP-FedAvg, client noise", ["algo=dp_fedavg", "algo.local_steps=1"], (0.1, 0.03, 0.01, 0.003)),
    ("DP-FedAvg, server noise", ["algo=dp_fedavg", "algo.noise_by=server", "algo.local_steps=1"],
     (0.7, 0.5, 0.3, 0.1)),
]
POWER_N = (400, 1000, 4000)
POWER_SETTINGS = ["dataset.train_limit=2000", "rounds=50", "eval_every=50", "privacy.epsilon=2", *ACCOUNTED]


def power_cell(cell: tuple) -> dict:
    """One run of ``POWER`` in a worker process (which runs several, one after another): every algorithm's
    ``privatize`` keeps ``kept`` of the noise, v + kept·(privatize(v) - v), the one-line bug of a round that uses a
    value before its noise; its release audit."""
    name, n, kept, overrides, out = cell
    from hydra import compose, initialize_config_dir

    from normfl.algorithms.base import Algorithm
    from normfl.run import run

    os.chdir(REPO)
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[*BASE, *overrides, *POWER_SETTINGS, f"audit.canaries={n}",
                                           "audit.mode=release"])
    real = Algorithm.privatize                  # put back after the run: a worker process runs several cells, and
    Algorithm.privatize = lambda self, v, k: v + kept * (real(self, v, k) - v)   # the cuts would multiply
    try:
        t0 = time.perf_counter()
        return {"audit": run(cfg, out)["audit"], "seconds": time.perf_counter() - t0}
    finally:
        Algorithm.privatize = real


def value(overrides: list[str], key: str) -> str:
    """The value ``overrides`` give ``key``."""
    return next(o for o in overrides if o.startswith(f"{key}=")).split("=", 1)[1]


def train(name: str, canaries: int, overrides: list[str], root: Path, mode: str = "sidecar") -> dict:
    """One audited run; its summary's audit block, the certified ε, why the run calls its ε a claim (if it does)
    and the wall time."""
    slug = "-".join("".join(c if c.isascii() and c.isalnum() else " " for c in name.lower()).split())[:60]
    audit = [f"audit.canaries={canaries}", *([f"audit.mode={mode}"] if mode != "sidecar" else [])]
    cmd = [sys.executable, "train.py", *BASE, *overrides, *audit, f"eval_every={value(overrides, 'rounds')}",
           f"hydra.run.dir={root / mode / slug}"]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    found = {"seconds": time.perf_counter() - t0, "audit": None,
             "command": "python train.py " + " ".join([*overrides, *audit])}
    if done.returncode:                             # the table says so, and the other rows go on
        print(f"{name}: train.py failed:\n{done.stderr[-3000:]}", file=sys.stderr)
        return found
    summary = json.loads((root / mode / slug / "summary.json").read_text())
    return {**found, "audit": summary["audit"], "not_certified": (summary["privacy"] or {}).get("not_certified")}


def gdp_mu(eps: float, delta: float) -> float:
    """The μ of the Gaussian-DP mechanism whose ε at ``delta`` is ``eps``."""
    return brentq(lambda mu: gdp_epsilon(mu, delta) - eps, 1e-3, 50.0)


def needed() -> list[tuple]:
    """Median bounds over 5 draws for a correct μ-GDP mechanism at ε = 1, 4, 8, n canaries a side, thresholds
    fixed from the claim (the "out" law's upper quantiles and points between the means, as the run audits)."""
    rows = []
    for eps in NEEDED_EPS:
        mu = gdp_mu(eps, DELTA)
        rng = np.random.default_rng(0)                               # the claim's laws, simulated
        t = thresholds_from(rng.standard_normal(4000), mu + rng.standard_normal(4000))
        for n in NEEDED_N:
            cp, gdp = [], []
            for seed in range(5):
                rng = np.random.default_rng(seed)
                s_in, s_out = mu + rng.standard_normal(n), rng.standard_normal(n)
                cp.append(eps_lower(s_in, s_out, DELTA, t, 0.05)["eps_lower"])
                gdp.append(gdp_epsilon(mu_lower(s_in, s_out, t, 0.05)["mu_lower"], DELTA))
            rows.append((eps, n, float(np.median(cp)), float(np.median(gdp))))
    return rows


def fmt(v, digits=2):
    return "–" if v is None else f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2, help="runs at once (one thread each)")
    ap.add_argument("--only", help="only the rows whose name contains this text")
    args = ap.parse_args()
    t0 = time.perf_counter()
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d_%H-%M-%S")
    root = REPO / "outputs" / "audit" / stamp
    runs = [r for r in RUNS if not args.only or args.only in r[0]]
    client_level = [r for r in runs if "sample level" not in r[1]]
    power = [(name, n, kept, overrides, root / "power" / f"{i}")
             for i, (name, overrides, fractions) in enumerate(POWER) for n in POWER_N for kept in fractions
             if not args.only or args.only in name]
    with ThreadPoolExecutor(args.jobs) as pool:
        found = list(pool.map(lambda r: train(r[0], r[2], r[3], root), runs))
        released = list(pool.map(lambda r: train(r[0], r[2], r[3], root, "release"), client_level))
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        powered = list(pool.map(power_cell, [(*c[:4], c[4] / f"{c[1]}-{c[2]}") for c in power]))
    msgs = [(name, audit()) for name, audit in MESSAGES if not args.only or args.only in name]
    need = needed() if not args.only else []
    total = time.perf_counter() - t0

    print("# Privacy audits: empirical lower bounds beside the certified ε\n")
    print(" ".join(__doc__.split("\n\n")[2].split()) + "\n")
    print(f"Generated by `make audit` (`scripts/audit.py`) on {stamp} UTC, {platform.machine()} with "
          f"{os.cpu_count()} cores, {args.jobs} runs at once: {total / 60:.1f} min in all. Every bound holds "
          "with probability 0.95 (shared by its routes and scores); a verdict \"refutes\" on the bounds is a "
          "statistical proof that the run is less private than its certificate says; the release audit's data-flow "
          "and release-count findings are exact.\n")
    print("## Runs with canaries\n")
    print("| algorithm | family | canaries | steps | ε certified | ε lower (CP) | ε lower (curve) | curve | verdict "
          "| time |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (name, family, n, _), f in zip(runs, found, strict=True):
        a = f["audit"]
        if a is None:
            print(f"| {name} | {family} | {n} | failed (its error is on stderr) | | | | | | {f['seconds']:.0f} s |")
            continue
        mark = "*" if f.get("not_certified") else ""
        print(f"| {name} | {family} | {n} | {a['steps_observed']} | {fmt(a['eps_certified'])}{mark} | "
              f"{fmt(a['eps_lower'])} | {fmt(a['eps_lower_curve'])} | {a['curve']} | {a['verdict']} | "
              f"{f['seconds']:.0f} s |")
    for (name, *_), f in zip(runs, found, strict=True):
        if f.get("not_certified"):
            print(f"\n\\* {name}: the accountant's ε of the noisy steps the canaries audit; the run itself reports "
                  f"it as a claim, not a certificate: {'; '.join(f['not_certified'])}.")
    for (name, _, _, overrides), f in zip(runs, found, strict=True):
        a = f["audit"]
        target = float(value(overrides, "privacy.epsilon"))
        if a is None or a["eps_certified"] is None or a["eps_certified"] <= 1.01 * target:
            continue
        shown = max(a["eps_lower"], a["eps_lower_curve"])
        print(f"\n**{name}**: asked for ε = {target:g}, the run certifies {a['eps_certified']:.2f}. Against the "
              f"stated ε = {target:g} the audit's bounds, {a['eps_lower']:.2f} assumption-free and "
              f"{a['eps_lower_curve']:.2f} by the {a['curve']} route, "
              + (f"refute it: this noise is not ε = {target:g}-private as a {a['curve']}-shaped mechanism."
                 if shown > target else "do not refute it at this number of canaries."))
    print("\n## The release audit: canary clients through each algorithm's own round\n")
    print("The same commands with `audit.mode=release` (N canary clients join the run, n + N clients in all): the "
          "one-run bound from the models the server broadcasts (all iterates, and the final model alone), and the "
          "steps in which an un-noised value reached the broadcast model. Client noise: the models carry the noise "
          "of every upload, so the bounds are far below a certificate made for each upload (it takes a noise cut "
          "by about √(n + N) to show in them); central noise: the models show a canary as the certificate "
          "assumes.\n")
    print("| algorithm | family | canaries | steps | ε certified | ε lower (one run) | ε lower (curve) | steps with "
          "un-noised values | verdict | time |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (name, family, n, _), f in zip(client_level, released, strict=True):
        a = f["audit"]
        if a is None:
            print(f"| {name} | {family} | {n} | failed (its error is on stderr) | | | | | | {f['seconds']:.0f} s |")
            continue
        print(f"| {name} | {family} | {n} | {a['steps_observed']} | {fmt(a['eps_certified'])} | "
              f"{fmt(a['eps_lower'])} | {fmt(a['eps_lower_curve'])} | {a['leaks']} | {a['verdict']} | "
              f"{f['seconds']:.0f} s |")
    if power:
        print("\n## What the release audit's bounds can refute\n")
        print("An algorithm that keeps a fraction of its privatizer's noise (`v + kept·(privatize(v) - v)`: a round "
              "that uses a value before its noise). The data-flow check refutes every such run exactly, whatever "
              "the fraction; this table is the bounds alone, from the broadcast models: ε lower (the larger of the "
              "one-run bound and the curve's) against ε certified, refuted (✗) or not (·). Settings: "
              f"`{' '.join(POWER_SETTINGS[:3])}`, ε = 2 certified by PLD, the settings above otherwise.\n")
        for name, _, fractions in POWER:
            rows = [(n, [p for p in zip(power, powered, strict=True) if p[0][0] == name and p[0][1] == n])
                    for n in POWER_N]
            if not any(r for _, r in rows):
                continue
            print(f"**{name}** (noise kept →)\n")
            print("| canaries | " + " | ".join(f"{k:g}" for k in fractions) + " |")
            print("|---" * (len(fractions) + 1) + "|")
            for n, cells in rows:
                shown = []
                for _, f in cells:
                    a = f["audit"]
                    bound = None if a is None else max(a["eps_lower"], a["eps_lower_curve"])
                    shown.append("failed" if a is None else
                                 f"{bound:.2f} {'✗' if bound > a['eps_certified'] else '·'}")
                print(f"| {n:,} | " + " | ".join(shown) + " |")
            print()
    print("\nThe commands (each with the settings "
          f"`{' '.join(o for o in BASE if not o.startswith(('progress', 'threads', 'device')))}`):\n")
    for (name, *_), f in zip(runs, found, strict=True):
        print(f"- {name}: `{f['command']}`")
    if msgs:
        print("\n## One message of the discrete mechanisms\n")
        print("| mechanism | messages a side | claimed (ε₀, δ) | δ lower at ε₀ | exact δ (tdl_delta) | ε lower at the "
              "claimed δ | verdict |")
        print("|---|---|---|---|---|---|---|")
        for name, r in msgs:
            claim = f"({r['claimed']['epsilon']:g}, {r['claimed']['delta_label']})"
            print(f"| {name} | {r['messages_each']} | {claim} | {fmt(r['delta_lower'], 3)} | "
                  f"{fmt(r.get('delta_exact'), 3)} | {fmt(r['eps_lower'])} | {r['verdict']} |")
    if need:
        print("\n## Canaries a bound needs\n")
        print("A correct Gaussian mechanism certified at ε (δ = 1e-5), n canaries a side, median of 5 draws: what "
              "the assumption-free bound and the Gaussian-DP route can show.\n")
        print("| certified ε | n a side | ε lower (CP) | ε lower (GDP route) |\n|---|---|---|---|")
        for eps, n, cp, gdp in need:
            print(f"| {eps:g} | {n:,} | {cp:.2f} | {gdp:.2f} |")


if __name__ == "__main__":
    main()
