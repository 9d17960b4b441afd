"""The papers' DP noise, reading by reading (docs/readings.md, A1, A12, A13): DP-α-NormEC with server
normalization and DP-Fed-α-NormEC, each reading of the noise trained as one grid; beside each, the ε that the
same noise would certify for the papers' whole run (K = 300 rounds). NORMEC §6.2 reports a peak of 72.21% with
SN; FEDNORMEC §5 "approximately 70%" at p = 1, β = 0.01. Two profiles, as the reproduction's (reading A2):

- ``paper``: a round as one pass over each client's shard; a 30-pass screen of 48 runs (134,400 run-steps of
  NORMEC and 33,600 of FEDNORMEC), 16 side by side. A GPU job: on a CPU, a pass of ResNet20 takes minutes.
- ``text``: a round as one minibatch step a client; each reading's whole 300-round run in one cell each (SN's
  best without noise at this reading, β = γ = 0.1; FEDNORMEC's β = 0.01 of the paper, γ = 0.1): 14 runs of
  4 to 9 minutes (73 minutes in all on a 2-core CPU, beside other runs). It ranks the readings by what their
  noise costs; it cannot reach the papers' numbers, which this reading misses without noise too (55.70% in
  the SN cell, 26.96% in FEDNORMEC's).

    python scripts/noise_readings.py run [--profile paper|text] [--rounds N] [--stack 16] [--only DP-Fed]
                                         [--dry-run] [--extra ...]
    python scripts/noise_readings.py table [--profile paper|text] [--rounds N]

Every reading is applied as the noise multiplier it gives for the whole run of K = 300 rounds, so a screen
shorter than that trains with the papers' noise, not with the noise of a 30-round run. The runs go through the
reproduction driver (``normfl.reproduce``): its store (``--store``), its stacking, and the committed records it
adds finished runs to.
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

K_ROUNDS = 300
EPSILON, DELTA = 8.0, 1e-5
# algorithm: (its setup, the (β, γ) cells screened, steps a pass makes (a test checks them against the data), the
# paper's number); the text profile screens only the first cell (see the docstring)
ALGORITHMS = {
    "DP-α-NormEC (SN)": ("experiment=normec_p_sn", [(0.1, 0.1), (0.01, 0.01), (0.01, 0.1), (0.1, 0.01)], 140,
                         "72.21 (NORMEC §6.2, peak over β × γ, SN)"),
    "DP-Fed-α-NormEC, p = 1": ("experiment=fednormec_f_ec p=1.0", [(0.01, 0.1), (0.01, 0.01)], 70,
                               "≈ 70 (FEDNORMEC §5, β = 0.01)"),
}
# reading: (what it reads, the Privacy knobs that give its multiplier, overrides besides the multiplier).
# K + 1 for K (A13) is left out: it moves σ by 0.17%, which no screen can tell apart.
READINGS = {
    "none": ("no noise: the same run's ceiling", {"noise_multiplier_override": 0.0}, ""),
    "standard deviation": ("σ_mult = sqrt(K ln(1/δ))/ε on the β-weighted term (normfl's reading)", {}, ""),
    "on Δ_i": ("the same std on Δ_i itself: β²·σ_mult on the weighted term", {}, "privacy.noise_on=raw_delta"),
    "log10": ("log10(1/δ) for ln(1/δ)", {"log_base": "10"}, ""),
    "log outside root": ("sqrt(K)·ln(1/δ)/ε (FEDNORMEC §5 as typeset)", {"sqrt_covers_log": False}, ""),
    "variance": ("the formula as the weighted term's variance, β·σ_mult: std sqrt(β·σ_mult)", {}, ""),
    "K = releases": ("K counts every noisy upload (300 rounds × uploads a round)", {"K": "releases"}, ""),
    "PLD ε = 8": ("σ that dp-accounting's PLD certifies ε = 8 with, over every upload", None, ""),
}


# profile: (overrides each run gets, rounds a screen run trains by default, how a round reads (A2), how many of
# each algorithm's cells it screens: None for all)
PROFILES = {
    "paper": ("reading=pass eval_every=1", 30, "pass", None),
    "text": ("eval_every=10", K_ROUNDS, "minibatch step", 1),
}


def steps_a_round(algo: str, profile: str) -> int:
    """Uploads a client makes a round: a pass's minibatch steps under the pass reading, else one."""
    return ALGORITHMS[algo][2] if PROFILES[profile][2] == "pass" else 1


def multiplier(reading: str, beta: float, steps: int) -> float:
    """The noise multiplier (std over the weighted term's sensitivity β) the reading gives the whole run of
    K = 300 rounds of ``steps`` uploads each; ``on Δ_i`` adds its factor β in the run itself
    (``privacy.noise_on=raw_delta``)."""
    releases = K_ROUNDS * steps
    knobs = READINGS[reading][1]
    if knobs is None:
        return calibrate(EPSILON, DELTA, releases, "pld")
    sigma = Privacy(EPSILON, DELTA, releases_per_round=steps, **knobs).noise_multiplier(releases)
    return math.sqrt(beta * sigma) / beta if reading == "variance" else sigma


def effective(reading: str, beta: float, steps: int) -> float:
    """The multiplier the β-weighted term actually carries."""
    z = multiplier(reading, beta, steps)
    return z * beta if reading == "on Δ_i" else z


def grid(profile: str, rounds: int, extra: list[str]) -> list[tuple[str, str, float, float, jobs.Job]]:
    """(algorithm, reading, β, γ, job) for every run of the screen. Two readings that give the same noise
    (K = releases under the text profile, one upload a round) share one run."""
    out, made = [], {}
    for algo, (setup, cells, _, _) in ALGORITHMS.items():
        steps = steps_a_round(algo, profile)
        for reading, (_, _, more) in READINGS.items():
            for beta, gamma in cells[:PROFILES[profile][3]]:
                overrides = [*setup.split(), *more.split(), *PROFILES[profile][0].split(), f"rounds={rounds}",
                             f"algo.beta={beta}", f"algo.gamma={gamma}",
                             f"privacy.noise_multiplier_override={multiplier(reading, beta, steps):.6g}", *extra]
                cfg = jobs.compose(tuple(overrides))
                key = config_key(cfg)
                made.setdefault(key, jobs.Job({}, overrides, key, cfg))
                out.append((algo, reading, beta, gamma, made[key]))
    return out


@functools.cache                         # one noise serves every (β, γ) cell of a reading: composed once
def eps_whole_run(z: float, steps: int) -> float | None:
    """ε (δ = 1e-5) certified by 300 rounds of ``steps`` uploads with multiplier z (the tighter of PLD and RDP;
    RDP only for z < 0.5, where a PLD of 42,000 compositions is too large to build)."""
    which = ("rdp", "pld") if z >= 0.5 else ("rdp",)
    return certified(Ledger(GaussianRelease(z), DELTA).spent(K_ROUNDS * steps, which))[0]


def table(runs, store_dir: Path, profile: str, rounds: int) -> str:
    devices, data = set(), set()
    lines = ["| algorithm | reading | β | γ | multiplier on the weighted term | ε of 300 rounds | best acc. (%) | "
             "final acc. (%) |", "|---|---|---|---|---|---|---|---|"]
    for algo, reading, beta, gamma, job in runs:
        steps = steps_a_round(algo, profile)
        z = effective(reading, beta, steps)
        eps = eps_whole_run(z, steps)
        summary = records.locate(job.key, store_dir) / "summary.json"
        s = json.loads(summary.read_text()) if summary.is_file() else {}
        acc = {k: ("–" if s.get(k) is None else f"{100 * s[k]:.2f}") for k in ("best_test_acc", "final_test_acc")}
        devices.add(s.get("device_name"))
        data.add(f"{s.get('data')}, {job.cfg.model._target_.rsplit('.', 1)[-1]}" if s else None)
        status = s.get("status")
        if status not in (None, "completed"):
            acc = {k: status for k in acc}
        eps = "–" if eps is None else "∞" if math.isinf(eps) else f"{eps:.4g}"
        lines.append(f"| {algo} | {reading} | {beta:g} | {gamma:g} | {z:.4g} | {eps} | {acc['best_test_acc']} | "
                     f"{acc['final_test_acc']} |")
    papers = "; ".join(f"{a}: {p}" for a, (_, _, _, p) in ALGORITHMS.items())
    readings = "\n".join(f"- **{r}**: {what}" for r, (what, _, _) in READINGS.items())
    on, what = (", ".join(sorted(x for x in xs if x)) or "no run trained yet" for xs in (devices, data))
    a_round = PROFILES[profile][2]
    return (f"# The papers' DP noise, reading by reading ({profile} profile)\n\nGenerated by "
            f"`make noise-readings profile={profile}` (`scripts/noise_readings.py`) on "
            f"{time.strftime('%Y-%m-%d', time.gmtime())}: {what}, a round read as one {a_round} a client "
            f"(reading A2), {rounds} rounds a run; trained on {on}. The accuracies are the runs' best and final "
            f"test accuracy after {rounds} rounds; the ε is what the same noise certifies over the papers' 300 "
            f"rounds of this reading (δ = 1e-5, add/remove one client, no amplification).\n\n{readings}\n\n"
            f"The papers, after 300 passes: {papers}.\n\n" + "\n".join(lines) + "\n")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("run", "table"))
    ap.add_argument("--profile", choices=PROFILES, default="paper", help="how a round reads (see above)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="rounds each run trains (default: 30 passes under paper, the whole 300 under text)")
    ap.add_argument("--stack", type=int, default=None, help="runs side by side (default: 16 on a GPU, else 1)")
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--store", type=Path, default=None, help="the run store (default: as normfl.reproduce's)")
    ap.add_argument("--extra", nargs="*", default=[], help="overrides added to every run (device=cuda ...)")
    ap.add_argument("--only", default="", help="train only the algorithms whose name holds this text "
                    "(DP-α-NormEC, DP-Fed): a screen in two jobs; the table shows every row")
    ap.add_argument("--dry-run", action="store_true", help="list the runs and their noise, train nothing")
    args = ap.parse_args(argv)
    from normfl.reproduce.__main__ import store_dir

    where = store_dir(args.store)
    rounds = args.rounds or PROFILES[args.profile][1]
    runs = grid(args.profile, rounds, args.extra)
    if args.what == "run" and not args.dry_run:
        stack = args.stack or store.default_stack()
        todo = {job.key: job for algo, *_, job in runs if args.only in algo}
        store.run_missing(list(todo.values()), where, args.parallel, stack=stack,
                          log=lambda line: print(line, file=sys.stderr, flush=True))
    print(table(runs, where, args.profile, rounds), end="")


if __name__ == "__main__":
    main()
