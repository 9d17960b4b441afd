"""The papers' DP noise, reading by reading (docs/readings.md, A1, A12, A13): DP-α-NormEC with server
normalization and DP-Fed-α-NormEC under the pass reading (A2), each reading of the noise trained for a
short screen, as one stacked grid; beside each, the ε that the same noise would certify for the papers'
whole run (300 passes). NORMEC §6.2 reports a peak of 72.21% with SN; FEDNORMEC §5 "approximately 70%"
at p = 1, β = 0.01. A GPU job: 42 runs of 30 passes by default (117,600 run-steps of NORMEC and
29,400 of FEDNORMEC), 16 side by side; on a CPU, a pass of ResNet20 takes minutes.

    python scripts/noise_readings.py run [--passes 30] [--stack 16] [--dry-run] [--extra device=cuda ...]
    python scripts/noise_readings.py table [--passes 30]

Every reading is applied as the noise multiplier it gives for the whole paper run (K = 300 passes), so a
screen shorter than that trains with the papers' noise, not with the noise of a 30-round run. The runs go
through the reproduction driver (``normfl.reproduce``): its store (``--store``), its stacking, and the
committed records it adds finished runs to.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
from pathlib import Path

from normfl.config import config_key
from normfl.privacy import Privacy, calibrate, certified
from normfl.privacy.accounting import GaussianRelease, Ledger
from normfl.reproduce import jobs, records, store

PAPER_PASSES = 300
EPSILON, DELTA = 8.0, 1e-5
# algorithm: (its setup, the (β, γ) cells screened, steps a pass makes, the paper's number)
ALGORITHMS = {
    "DP-α-NormEC (SN)": ("experiment=normec_p_sn", [(0.01, 0.01), (0.01, 0.1), (0.1, 0.01), (0.1, 0.1)], 140,
                         "72.21 (NORMEC §6.2, peak over β × γ, SN)"),
    "DP-Fed-α-NormEC, p = 1": ("experiment=fednormec_f_ec p=1.0", [(0.01, 0.01), (0.01, 0.1)], 70,
                               "≈ 70 (FEDNORMEC §5, β = 0.01)"),
}
# reading: (what it reads, the Privacy knobs that give its multiplier, overrides besides the multiplier).
# K + 1 for K (A13) is left out: it moves σ by 0.17%, which no screen can tell apart.
READINGS = {
    "standard deviation": ("σ_mult = sqrt(K ln(1/δ))/ε on the β-weighted term (normfl's reading)", {}, ""),
    "on Δ_i": ("the same std on Δ_i itself: β²·σ_mult on the weighted term", {}, "privacy.noise_on=raw_delta"),
    "log10": ("log10(1/δ) for ln(1/δ)", {"log_base": "10"}, ""),
    "log outside root": ("sqrt(K)·ln(1/δ)/ε (FEDNORMEC §5 as typeset)", {"sqrt_covers_log": False}, ""),
    "variance": ("the formula as the weighted term's variance, β·σ_mult: std sqrt(β·σ_mult)", {}, ""),
    "K = releases": ("K counts every noisy upload (300 passes × steps a pass)", {"K": "releases"}, ""),
    "PLD ε = 8": ("σ that dp-accounting's PLD certifies ε = 8 with, over every upload", None, ""),
}


def multiplier(reading: str, beta: float, steps: int) -> float:
    """The noise multiplier (std over the weighted term's sensitivity β) the reading gives the whole paper run;
    ``on Δ_i`` adds its factor β in the run itself (``privacy.noise_on=raw_delta``)."""
    releases = PAPER_PASSES * steps
    knobs = READINGS[reading][1]
    if knobs is None:
        return calibrate(EPSILON, DELTA, releases, "pld")
    sigma = Privacy(EPSILON, DELTA, releases_per_round=steps, **knobs).noise_multiplier(releases)
    return math.sqrt(beta * sigma) / beta if reading == "variance" else sigma


def effective(reading: str, beta: float, steps: int) -> float:
    """The multiplier the β-weighted term actually carries."""
    z = multiplier(reading, beta, steps)
    return z * beta if reading == "on Δ_i" else z


def grid(passes: int, extra: list[str]) -> list[tuple[str, str, float, float, jobs.Job]]:
    """(algorithm, reading, β, γ, job) for every run of the screen."""
    out = []
    for algo, (setup, cells, steps, _) in ALGORITHMS.items():
        for reading, (_, _, more) in READINGS.items():
            for beta, gamma in cells:
                overrides = [*setup.split(), *more.split(), "reading=pass", "eval_every=1", f"rounds={passes}",
                             f"algo.beta={beta}", f"algo.gamma={gamma}",
                             f"privacy.noise_multiplier_override={multiplier(reading, beta, steps):.6g}", *extra]
                cfg = jobs.compose(tuple(overrides))
                out.append((algo, reading, beta, gamma, jobs.Job({}, overrides, config_key(cfg), cfg)))
    return out


@functools.cache                         # one noise serves every (β, γ) cell of a reading: composed once
def eps_paper_run(z: float, steps: int) -> float | None:
    """ε (δ = 1e-5) certified by 300 passes of uploads with multiplier z (the tighter of PLD and RDP; RDP only
    for z < 0.5, where a PLD of 42,000 compositions is too large to build)."""
    which = ("rdp", "pld") if z >= 0.5 else ("rdp",)
    return certified(Ledger(GaussianRelease(z), DELTA).spent(PAPER_PASSES * steps, which))[0]


def table(runs, store_dir: Path, passes: int) -> str:
    devices, data = set(), set()
    lines = ["| algorithm | reading | β | γ | multiplier on the weighted term | ε of 300 passes | best acc. (%) | "
             "final acc. (%) |", "|---|---|---|---|---|---|---|---|"]
    for algo, reading, beta, gamma, job in runs:
        steps = ALGORITHMS[algo][2]
        z = effective(reading, beta, steps)
        eps = eps_paper_run(z, steps)
        summary = records.locate(job.key, store_dir) / "summary.json"
        s = json.loads(summary.read_text()) if summary.is_file() else {}
        acc = {k: ("–" if s.get(k) is None else f"{100 * s[k]:.2f}") for k in ("best_test_acc", "final_test_acc")}
        devices.add(s.get("device_name"))
        data.add(f"{s.get('data')}, {job.cfg.model._target_.rsplit('.', 1)[-1]}" if s else None)
        status = s.get("status")
        if status not in (None, "completed"):
            acc = {k: status for k in acc}
        lines.append(f"| {algo} | {reading} | {beta:g} | {gamma:g} | {z:.4g} | "
                     f"{'–' if eps is None else f'{eps:.4g}'} | {acc['best_test_acc']} | {acc['final_test_acc']} |")
    papers = "; ".join(f"{a}: {p}" for a, (_, _, _, p) in ALGORITHMS.items())
    readings = "\n".join(f"- **{r}**: {what}" for r, (what, _, _) in READINGS.items())
    on, what = (", ".join(sorted(x for x in xs if x)) or "no run trained yet" for xs in (devices, data))
    return (f"# The papers' DP noise, reading by reading\n\nGenerated by `make noise-readings` "
            f"(`scripts/noise_readings.py`) on {time.strftime('%Y-%m-%d', time.gmtime())}: {what}, the pass reading, "
            f"{passes} passes a run; trained on {on}. The accuracies are the runs' "
            f"best and final test accuracy after {passes} passes; the ε is what the same noise certifies over "
            f"the papers' 300 passes (δ = 1e-5, add/remove one client, no amplification).\n\n{readings}\n\n"
            f"The papers, after 300 passes: {papers}.\n\n" + "\n".join(lines) + "\n")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("run", "table"))
    ap.add_argument("--passes", type=int, default=30, help="passes each run trains (the papers': 300)")
    ap.add_argument("--stack", type=int, default=None, help="runs side by side (default: 16 on a GPU, else 1)")
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--store", type=Path, default=None, help="the run store (default: as normfl.reproduce's)")
    ap.add_argument("--extra", nargs="*", default=[], help="overrides added to every run (device=cuda ...)")
    ap.add_argument("--dry-run", action="store_true", help="list the runs and their noise, train nothing")
    args = ap.parse_args(argv)
    from normfl.reproduce.__main__ import store_dir

    where = store_dir(args.store)
    runs = grid(args.passes, args.extra)
    if args.what == "run" and not args.dry_run:
        stack = args.stack or store.default_stack()
        store.run_missing([r[-1] for r in runs], where, args.parallel, stack=stack,
                          log=lambda line: print(line, file=sys.stderr, flush=True))
    print(table(runs, where, args.passes), end="")


if __name__ == "__main__":
    main()
