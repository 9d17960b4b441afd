"""The papers' figures and tables that come from runs: which grid each one needs, how it is drawn,
how close to the paper counts as reproduced, and why it is not where it is not.

Each ID's runs are the grid of ``grids/<id>.yaml`` (``normec_t2`` for NORMEC-T2), which draws on the
papers' run groups (``conf/experiment/normec_np_sn.yaml``, ``nfa_t4_qtdl``, ...); IDs drawing the same
runs share them through the store. IDs that need no run (NORMEC-T1, EX1, APPC: unit tests; ALIDPFL-T1,
F2, F3 and NORMFEDAVG-T1: notation and diagrams) are in ``NO_RUNS``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from normfl.errors import ConfigError


@dataclass(frozen=True)
class Target:
    id: str                  # the figure's or table's ID, e.g. NORMEC-T2
    grid: str                # grids/<grid>.yaml: the runs it draws
    title: str
    kind: str                # how it is drawn: a function of normfl.reproduce.figures.KINDS
    tolerance: float         # |ours − paper| in points within which a number counts as reproduced
    why: str                 # the reason for that tolerance
    cause: str = ""          # why it deviates where it does (measured, not guessed)
    draw: dict = field(default_factory=dict)
    headline: str = ""       # the compared number the report leads with (a substring of its label)

    @property
    def slug(self) -> str:   # the make target
        return self.id.lower()


# Tolerances and the causes of the known deviations (each cause is backed by a measurement in the
# report or docs/measurements.md; the report states "deviates" only where a compared number exceeds the tolerance).
NORMEC_TOL = dict(tolerance=2.0, why="one seed (42) in the paper and here; CIFAR-10 from the JPEG copy")
A2_CAUSE = ("Reading A2 (docs/readings.md), text profile: a round read literally is one minibatch of 32 per client, "
            "so 300 rounds are about two epochs (four with FEDNORMEC's 20 clients); under this reading NORMEC-T2's "
            "best run reaches 59.40% (no SN, β = γ = 1), not 86%. The other reading, a round as one pass over each "
            "client's shard (140 minibatch steps with NORMEC's 10 clients, 70 with FEDNORMEC's 20), reaches the "
            "paper's magnitudes: 300 passes of α-NormEC at β = γ = 0.1 end at 85.5% with SN (Table 2: 85.43%) and "
            "83.4% without (86.09%), measured on an H100 by a stand-alone probe. That reading is now the paper "
            "profile's; its runs are GPU jobs (about 42,000 steps each) not yet made with normfl's own runner.")
NORMEC_CAUSE = (A2_CAUSE + " DP runs: with the noise rule of reading A1 each unit-norm message gets noise of std "
                "sqrt(K ln(1/δ))/ε ≈ 7.35 per coordinate, which keeps them near chance: DP-α-NormEC with SN at "
                "β = γ = 0.1 ends at 10.54% (best 12.54%) after 300 text rounds, the same run without noise at "
                "55.70%. No other reading of the papers' noise formula lifts it above 14.78% (best over rounds: the "
                "noise on Δ_i itself, which certifies ε 378) (docs/reproduction/noise-readings-text.md, committed "
                "records; make noise-readings profile=text).")
FED_CAUSE = ("DP runs: reading A1's noise has std p·sqrt(K ln(1/δ))/ε per coordinate on each client's unit-norm Δ_i "
             "(7.35 at p = 1, 1.84 at p = 0.25), in d = 269,722 dimensions a vector of norm about 3,800 (950) "
             "against a message of norm 1: the 18 text-profile runs of FEDNORMEC-F1 (F-EC, committed records) end "
             "at 8.22-13.22% test accuracy (best over rounds 14.94%; chance is 10%). Without the noise the same "
             "run (p = 1, β = 0.01, γ = 0.1) reaches 26.96% after 300 rounds, still rising, so the rest of the gap "
             "is A2. Of the other readings of the papers' noise formula only the noise on Δ_i itself (std "
             "β·σ_mult, 0.0735 here) lets that run learn, to 25.08%, and it certifies ε 30,690; the rest end at "
             "8.48-9.42% (docs/reproduction/noise-readings-text.md, committed records; make noise-readings "
             "profile=text). " + A2_CAUSE)
FED_TOL = dict(tolerance=5.0, why="the paper's numbers are read off figures ('approximately 70%'); one seed")
ALI_TOL = dict(tolerance=2.0, why="one run per cell in the paper (seed not stated), one seed (0) here")
ALI_CAUSE = ("Checked against the authors' code, setting by setting, at R_c = 177 on Fashion-MNIST "
             "(docs/reproduction/alidpfl-readings.md; code profile: make alidpfl-t2 profile=code). The level "
             "moves only with what makes a clipped step (C = 0.1) do more: raw 0-255 pixels, as the MindSpore "
             "port trains, +14 points (72.81 against 58.77 at τ = 1); the code's divisor of 64 instead of "
             "q·|D_i| +2 (60.73), and 16 on the code's split +11 (68.84 against 57.84); the authors' "
             "Dirichlet split and 20% test subsets do not (57.84 together). The closest any stated or code "
             "setting comes is 79.15% (raw pixels, divisor 16); 82% is not reached. The τ ordering, over "
             "Table II's six Fashion-MNIST columns: the paper's accuracy falls 2.3-4.9 points from τ = 1 to 5 "
             "(Spearman ρ of τ against accuracy -0.9 to -1.0 in every column); the text reading's falls 0.0-0.5 "
             "(ρ -0.1 to -0.9: the direction, at a tenth of the size); the code reading's moves -1.7 to +0.1 "
             "(ρ -0.7 to +0.1), within its 20% test subsets' noise of about 0.8 points. No setting probed at "
             "R_c = 177 restores the paper's fall (each within 0.6 points from τ = 1 to 5). Fixed τ runs "
             "min(R_s, ⌊R_c/τ⌋) rounds (reading C-A13), so in both readings the R_s = 2R_c, ε = 1.75 column "
             "repeats the R_s = R_c one (to 0.01 point), where the paper's differs (τ = 5: 78.48 against "
             "79.64); the code has no budget stop, its round counts were set by hand. On CIFAR-10 (JPEG copy) "
             "the gap is as wide and the ordering as flat: ALI-DPFL (τ ≡ 1, as the paper says) ends at "
             "16.78-28.85 against the paper's 39.82-56.76, and from τ = 1 to 5 each column moves -1.2 to +0.4 "
             "points where the paper's falls 4.2-13.0; raw pixels lift τ = 1 at R_c = 177 from 28.36 to 30.09, "
             "not by Fashion-MNIST's 14 points (docs/measurements.md).")
ALI_COND2_CAUSE = ALI_CAUSE + (" Under Condition II the code profile takes the code's closed-form τ rule, which "
                               "holds τ at 3-4 and adds 2.1-9.2 points over the paper's G(τ) rule on the same "
                               "setup, still 14-23 points below the paper; in each of Table IV's columns a fixed τ "
                               "beats it, the best by 1.7-4.2 points (docs/reproduction/alidpfl-readings.md, "
                               "'Condition II'). On CIFAR-10 (Table III's 18 cells, paper profile) ALI-DPFL ends at "
                               "28.44-30.38 against 51.92-55.17: the paper's G(τ) rule keeps τ* at 1 or 2, so the "
                               "R_s rounds end with 69-81% of the budget spent (414 of R_c = 598 steps at ε = 2.5), "
                               "and every fixed τ from 2 to 5 beats it in each column, by 0.5-1.6 points, where the "
                               "paper has ALI-DPFL best in each. Under Table IV's R_s = R_c/5 (CIFAR-10, paper "
                               "profile, all 18 cells) it ends at 27.92-30.37 against 55.54-57.25: τ* is 2-5 in 68 "
                               "of its first 80 rounds and 1 after, so the R_s rounds end with 29-37% of the "
                               "budget spent (447 of R_c = 1538 steps at ε = 3.75); τ = 1 is level with it at ε = "
                               "2.75 and 1.5-1.8 points below at ε = 3.25 and 3.75, and every fixed τ from 3 to 9 "
                               "beats it in every column, by 1.85-3.86 points, where the paper has ALI-DPFL best in "
                               "each.")
NFA_TOL = dict(tolerance=1.0, why="3 seeds (paper std ≤ 0.15); unstated details (batch order, the "
               "sampler's dropped tail) move the mean by a few tenths")
NFA_BIN_CAUSE = ("All three seeds of the Binomial column train better than the paper's, by 1.28 points on the "
                 "mean (19.54 ± 0.37 vs 20.82 ± 0.04; seeds 19.11, 19.77, 19.73; seed 0's run of 2026-11-23, now "
                 "in docs/reproduction/archive/, gave the same 19.11). Its N = 2,843,701 and t = 23 are what "
                 "reading C-N7 derives (t as in Table 4; tests/test_qtdl.py), so the gap is in training, not in "
                 "the mechanism's parameters (its formula agrees term by term with public transcriptions of cpSGD "
                 "Theorem 1). Nor is it the noise's size: with N 1.97 times larger (privacy.epsilon=7, std 0.289 "
                 "against 0.206; a larger N is what t = 23 allows if eq. 7's m is the noise's half-width) seed 0 "
                 "ends at 19.12 (docs/readings.md, C-N7). Both QTDL columns are within the tolerance on three "
                 "seeds (s = 2^12: 18.04 ± 0.24 vs 17.31; s = 2^6: 17.98 ± 0.32 vs 17.24), so F3's claim, QTDL "
                 "3.5 points below the Binomial, reads 1.56 here. Not resolved.")
NFA_T5_CAUSE = ("Aggregate-level noise is read as each client's own draw for sensitivities Δ/r (the paper's "
                "per-client m_i, α_i; noise_at=client_aggregate, reading C-N6): one server draw on the mean "
                "(noise_at=server) has 5 times the std there and made every run diverge within 5 rounds. With it "
                "DP-NormFedAvg and Clipping(C = 0.5) train; Clipping(C = 0.1, 0.25) diverged when their clipped update "
                "went on the quantizer's grid as it is: the same noise (NFA Sec. 6(ii), App. G(iii)) with β_0 = 10 "
                "and 4 (App. H), 10 and 4 times DP-NormFedAvg's noise on the model each round. The grid now takes "
                "Clip_C(u)/C and the server steps β·C (reading C-N16), the same noise on the model for every C; "
                "not yet run that way.")
NFA_CIFAR_TOL = dict(tolerance=2.0, why="3 seeds; CIFAR-10 from the JPEG copy")

# Line colours and styles the captions state (NORMEC-F1: β = 0.01 blue, 0.1 green, 1.0 orange, 10
# red; α = 0.01 solid, 0.1 dashed, 1.0 dotted), reused for the other non-private NORMEC curves.
NO_FIGURE = {"figure": False}      # the NFA tables: their figures are the F IDs drawn from the same runs
NP_COLORS = {0.01: "C0", 0.1: "C2", 1.0: "C1", 10.0: "C3"}
SOLID_DASHED = {"normec_sn": "-", "normec_no_sn": "--"}

TARGETS = {t.id: t for t in (
    Target("NORMEC-F1", "normec_f1", "non-private α-NormEC (SN), loss and accuracy per α, β (tuned γ)",
           "curves", **NORMEC_TOL, cause=NORMEC_CAUSE,
           draw={"style": "alpha", "by": ("beta", "alpha"), "colors": NP_COLORS,
                 "styles": {0.01: "-", 0.1: "--", 1.0: ":"}}),
    Target("NORMEC-F2", "normec_f2", "highest test accuracy of α-NormEC over α × β (max over γ)",
           "heatmap", **NORMEC_TOL, cause=NORMEC_CAUSE, draw={"rows": "beta", "cols": "alpha"},
           headline="beta=0.1 alpha=0.1"),
    Target("NORMEC-F3", "normec_f3", "α-NormEC without SN vs DP-SGD with smoothed normalization, non-private",
           "curves", **NORMEC_TOL, cause=NORMEC_CAUSE,
           draw={"colors": NP_COLORS, "styles": {"dpsgd_norm": "-", "normec_no_sn": "--"}}),
    Target("NORMEC-F4", "normec_f4", "DP-α-NormEC with / without SN, highest test accuracy over β × γ",
           "heatmap", **NORMEC_TOL, cause=NORMEC_CAUSE,
           draw={"methods": ["normec_sn", "normec_no_sn"], "difference": True}, headline="normec_no_sn peak"),
    Target("NORMEC-F5", "normec_f5", "DP-Clip21, highest test accuracy over β × γ", "heatmap",
           **NORMEC_TOL, cause=NORMEC_CAUSE),
    Target("NORMEC-F6", "normec_f6", "DP-Clip21 vs DP-α-NormEC with / without SN (tuned γ)", "curves",
           **NORMEC_TOL, cause=NORMEC_CAUSE, draw={"styles": {"clip21": "-", "normec_sn": ":", "normec_no_sn": "--"}}),
    Target("NORMEC-F7", "normec_f7", "α-NormEC (SN): min / final train loss and final accuracy over α × β",
           "heatmap", **NORMEC_TOL, cause=NORMEC_CAUSE,
           draw={"rows": "alpha", "cols": "beta", "panels": [
               ("minimal train loss", "normec_sn", "min_loss", "min"),
               ("final train loss", "normec_sn", "final_loss", "min"),
               ("final test accuracy (%)", "normec_sn", "final_acc", "max")]}),
    Target("NORMEC-F8", "normec_f8", "best configurations: α-NormEC without SN vs DP-SGD (2)", "best_table",
           **NORMEC_TOL, cause=NORMEC_CAUSE, headline="normec_no_sn β=0.1 "),
    Target("NORMEC-F9", "normec_f9", "α-NormEC with vs without SN, non-private (tuned γ)", "curves",
           **NORMEC_TOL, cause=NORMEC_CAUSE, draw={"colors": NP_COLORS, "styles": SOLID_DASHED}),
    Target("NORMEC-T2", "normec_t2", "best configurations of α-NormEC with and without SN", "best_table",
           **NORMEC_TOL, cause=NORMEC_CAUSE, headline="normec_no_sn β=0.1 "),
    Target("NORMEC-F10", "normec_f10", "Clip21 vs α-NormEC without SN, non-private (tuned γ)", "curves",
           **NORMEC_TOL, cause=NORMEC_CAUSE,
           draw={"colors": NP_COLORS, "styles": {"clip21": "-", "normec_no_sn": "--"}}),
    Target("NORMEC-F11", "normec_f11", "best configurations: Clip21 vs α-NormEC without SN", "best_table",
           **NORMEC_TOL, cause=NORMEC_CAUSE, headline="normec_no_sn β=0.1 "),
    Target("NORMEC-F12", "normec_f12", "DP-α-NormEC over 150 rounds, best test accuracy over β × γ", "heatmap",
           **NORMEC_TOL, cause=NORMEC_CAUSE, headline="beta=0.01 gamma=0.1"),
    Target("NORMEC-F13", "normec_f13", "DP-α-NormEC over 150 rounds, curves per β (tuned γ)", "curves",
           **NORMEC_TOL, cause=NORMEC_CAUSE),
    Target("FEDNORMEC-F1", "fednormec_f1", "DP-Fed-α-NormEC, full vs partial (p = 0.25) participation",
           "curves", **FED_TOL, cause=FED_CAUSE,
           draw={"style": "p", "by": ("p", "beta"), "styles": {1.0: "-", 0.25: ":"}}, headline="p=1.0 beta=0.01"),
    Target("FEDNORMEC-F2", "fednormec_f2", "DP-Fed-α-NormEC against total transmissions (β = 0.01)",
           "transmissions", **FED_TOL, cause=FED_CAUSE, headline="p=0.25"),
    Target("FEDNORMEC-F3", "fednormec_f3", "DP-Fed-α-NormEC vs DP-FedAvg (tuned γ)", "curves", **FED_TOL,
           cause=FED_CAUSE, draw={"styles": {"fed_normec": "-", "fedavg": "--"}}),
    Target("FEDNORMEC-F4", "fednormec_f4", "DP-FedAvg, highest test accuracy over β × γ", "heatmap", **FED_TOL,
           cause=FED_CAUSE, draw={"methods": ["fedavg"]}),
    Target("FEDNORMEC-F5", "fednormec_f5", "training loss against transmissions (companion of F2; "
           "F1's companion is the left panel of FEDNORMEC-F1)", "transmissions", **FED_TOL, cause=FED_CAUSE,
           headline="p=0.25"),
    Target("ALIDPFL-T2", "alidpfl_t2", "Condition I (R_s ≥ R_c): ALI-DPFL vs fixed τ", "ali_table", **ALI_TOL,
           cause=ALI_CAUSE, headline="ε=1.75 ali_dpfl"),
    Target("ALIDPFL-T3", "alidpfl_t3", "Condition II (R_s = R_c/2): ALI-DPFL vs fixed τ", "ali_table", **ALI_TOL,
           cause=ALI_COND2_CAUSE, headline="ε=2.0 ali_dpfl"),
    Target("ALIDPFL-T4", "alidpfl_t4", "Condition II (R_s = R_c/5): ALI-DPFL vs fixed τ", "ali_table", **ALI_TOL,
           cause=ALI_COND2_CAUSE, headline="ε=2.75 ali_dpfl"),
    Target("ALIDPFL-F1", "alidpfl_f1", "final accuracy against fixed τ", "acc_vs_tau", **ALI_TOL, cause=ALI_CAUSE),
    Target("ALIDPFL-F6", "alidpfl_f6", "τ chosen by ALI-DPFL per round (Condition II)", "tau_lists", **ALI_TOL,
           cause=ALI_COND2_CAUSE),
    Target("NORMFEDAVG-T2", "normfedavg_t2", "CIFAR-10: Binomial vs QTDL, bits and last-5 test error",
           "seeds_table", **NFA_CIFAR_TOL, draw=NO_FIGURE, headline="qtdl_s=2^20"),
    Target("NORMFEDAVG-F1", "normfedavg_f1", "CIFAR-10: Binomial vs QTDL, curves", "seeds_table", **NFA_CIFAR_TOL),
    Target("NORMFEDAVG-T3", "normfedavg_t3", "FMNIST: DP-NormFedAvg vs clipping, last-5 test error",
           "seeds_table", **NFA_TOL, draw=NO_FIGURE, headline="dp_normfedavg"),
    Target("NORMFEDAVG-F2", "normfedavg_f2", "FMNIST: DP-NormFedAvg vs clipping, curves", "seeds_table", **NFA_TOL),
    Target("NORMFEDAVG-T4", "normfedavg_t4", "FMNIST: Binomial vs QTDL, bits and last-5 test error",
           "seeds_table", **NFA_TOL, cause=NFA_BIN_CAUSE, draw=NO_FIGURE, headline="qtdl_s=2^12"),
    Target("NORMFEDAVG-F3", "normfedavg_f3", "FMNIST: Binomial vs QTDL, curves", "seeds_table", **NFA_TOL,
           cause=NFA_BIN_CAUSE),
    Target("NORMFEDAVG-T5", "normfedavg_t5", "CIFAR-10, aggregate-level DP: DP-NormFedAvg vs clipping",
           "seeds_table", **NFA_CIFAR_TOL, cause=NFA_T5_CAUSE, draw=NO_FIGURE, headline="dp_normfedavg"),
    Target("NORMFEDAVG-F4", "normfedavg_f4", "CIFAR-10, aggregate-level DP: curves", "seeds_table", **NFA_CIFAR_TOL,
           cause=NFA_T5_CAUSE),
    Target("NORMFEDAVG-T6", "normfedavg_t6", "NormFedAvg vs FedAvg, last-5 test error", "seeds_table", **NFA_TOL,
           draw=NO_FIGURE, headline="fashion_mnist normfedavg"),
    Target("NORMFEDAVG-F5", "normfedavg_f5", "NormFedAvg vs FedAvg, curves", "seeds_table", **NFA_TOL),
)}

# IDs with nothing to run: where each is reproduced instead.
NO_RUNS = {
    "NORMEC-T1": "unit tests: tests/test_ops.py (Norm_α and clipping properties of Table 1)",
    "NORMEC-EX1": "unit test: tests/test_algorithms.py::test_example1_normalized_dpsgd_stalls_but_normec_moves",
    "NORMEC-APPC": "unit test: tests/test_ops.py::test_appc_ef21_memory_recursion",
    "ALIDPFL-T1": "notation table; documentation only",
    "ALIDPFL-F2": "schematic of intervals; no data",
    "ALIDPFL-F3": "system diagram; no data",
    "NORMFEDAVG-T1": "qualitative comparison of related work; no data",
}


def get(name: str) -> Target:
    key = name.upper().replace("_", "-")
    if key not in TARGETS:
        raise ConfigError("id", name, " | ".join(t.slug for t in TARGETS.values()))
    return TARGETS[key]
