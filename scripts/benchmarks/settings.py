"""The bench's paper settings, A to D (a title and the overrides that make each), and its repetition counts."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SETTINGS = {
    "A": ("NORMEC CIFAR-10 ResNet20, 10 clients x 1 gradient, batch 32",
          ["algo=normec", "algo.beta=0.1", "algo.gamma=0.1"]),
    "B": ("NormFedAvg FMNIST MLP, 25 of 50 clients x 20 steps, batch 256",
          ["experiment=nfa_t6_fmnist_normfedavg"]),
    "C": ("FEDNORMEC CIFAR-10 ResNet20, 20 clients, p = 0.25",
          ["experiment=fednormec_f_ec", "p=0.25", "algo.beta=0.01", "algo.gamma=0.01"]),
    "D": ("DPFL FMNIST CNN, per-sample DP-SGD, 10 clients",
          ["experiment=alidpfl_fmnist", "budget=e175_r177", "algo=dpfl", "algo.tau=1"]),
}


WARMUP_IN_A_ROW = 5       # rounds before ``in_a_row`` times any: a captured round records after three
PAPER_REPS = 5            # rounds the paper-style variant is timed on: its PIL DataLoader runs on the host, slowly
