"""A run's key: a stable hash of what it computes, naming its folder in a run store and checked against a
checkpoint or a finished run found there."""

from __future__ import annotations

import hashlib
import json

from omegaconf import DictConfig, OmegaConf

# What does not change what a run computes: left out of its key (the run store's folder names, and
# the check that a checkpoint or a finished run in a folder belongs to the config asking for it).
NOT_IN_KEY = ("hydra", "threads", "progress", "backend", "device", "logger", "data_root", "offline_data",
              "save_params", "checkpoint_every", "resume", "deterministic", "capture", "audit", "memory_format")

KEY_DEFAULTS = {"precision": "fp32", "reading": "text", "privacy.K": "rounds", "eval_subset": None,
                "algo.divisor": None, "dataset.scale": "unit", "partition.capped": False, "algo.scale_to_unit": False,
                "algo_seed": None}
# A fixed-τ DPFL run never chooses τ: it accepts these options unread (an experiment sets them for its ALI-DPFL
# runs, as experiment=alidpfl_authors_code does the τ rule) and its key holds them at their defaults
ADAPTIVE_ONLY = {"algo.tau_rule": "g_bound_v1", "algo.T_mode": "static", "algo.tau_cap": 100,
                 "algo.lambda_const": None, "algo.omega_const": None}
# Raw pixels (dataset.scale=raw) are not normalised: such a run accepts the mean and std unread (an experiment sets
# them for its normalised input, as the ALI-DPFL ones do) and its key leaves them out
RAW_UNREAD = ("dataset.mean", "dataset.std")
# Where the data lives is not what a run computes: the key holds these paths as the defaults' text whatever
# they resolve to ($NORMFL_DATA, data_root=..., a GPU box's copy), so keys made before this stand
KEY_PATHS = {"dataset.root": "data", "dataset.offline_dir": "../shared/data"}


def _holder(data: dict, key: str) -> tuple[dict | None, str]:
    """The dict that holds dotted ``key`` in ``data`` and the key's last part (None if no dict holds it)."""
    *path, last = key.split(".")
    for part in path:
        data = data.get(part) if isinstance(data, dict) else None
    return (data, last) if isinstance(data, dict) and last in data else (None, last)


def unread(data: dict) -> list[str]:
    """The dotted keys a run with config ``data`` (a plain container) takes but does not read: the τ rule's in a
    fixed-τ DPFL run (``ADAPTIVE_ONLY``), the mean and std on raw pixels (``RAW_UNREAD``). Its key holds the first
    at their defaults and leaves the second out; ``normfl.table`` neither shows them nor counts them as differing."""
    algo, dataset = data.get("algo") or {}, data.get("dataset") or {}
    return [*(ADAPTIVE_ONLY if algo.get("adaptive") is False else ()),
            *(RAW_UNREAD if dataset.get("scale") == "raw" else ())]


def config_key(cfg: DictConfig) -> str:
    """A stable hash of what a run computes: the resolved config without NOT_IN_KEY (an in-band or release
    audit, which changes what the run computes, stays in)."""
    whole = OmegaConf.to_container(cfg, resolve=True)
    data = {k: v for k, v in whole.items() if k not in NOT_IN_KEY}
    for key, default in KEY_DEFAULTS.items():  # keys added later: absent at their default, so older keys stand
        node, last = _holder(data, key)
        if node is not None and node[last] == default:
            del node[last]
    for key in unread(data):
        node, last = _holder(data, key)
        if node is not None and key in ADAPTIVE_ONLY:
            node[last] = ADAPTIVE_ONLY[key]
        elif node is not None:
            del node[last]
    for key, text in KEY_PATHS.items():
        node, last = _holder(data, key)
        if node is not None:
            node[last] = text
    audit = whole.get("audit") or {}
    if audit.get("mode") in ("inband", "release") and audit.get("canaries"):   # canaries in the run's own draws, or
        data["audit"] = {"mode": audit["mode"], "canaries": audit["canaries"]}   # its own clients
    text = json.dumps(data, sort_keys=True, default=str)
    return f"{cfg.algo.name}-{hashlib.sha1(text.encode()).hexdigest()[:12]}"
