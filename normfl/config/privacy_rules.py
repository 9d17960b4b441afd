"""The privacy rules: ε, δ and the noise formula's keys; how the noise is calibrated and by which accountant;
a privacy key the run would not read is refused; which runs a canary audit can check."""

from __future__ import annotations

import functools

from omegaconf import DictConfig, OmegaConf

from normfl.config.checks import choice, number
from normfl.config.keys import CONF, algorithm, get, option_file
from normfl.errors import ConfigError
from normfl.privacy import ACCOUNTANTS, CALIBRATIONS, K_COUNTS, LOG_BASES, NOISE_ON, RELATIONS

EPSILON_MAX = 100.0                         # the largest privacy.epsilon a run takes
NOISE_MAX = 1e6                             # the largest noise multiplier (1e300 overflowed dp-accounting's RDP)


def validate_privacy(cfg: DictConfig) -> None:
    """The privacy node and the accountant."""
    number(cfg, "privacy.epsilon", lambda v: 0 < v <= EPSILON_MAX, f"a number in (0, {EPSILON_MAX:g}] (a larger "
           "ε certifies nothing, and its noise is too small to account: ε = 1,000 took 7 GiB and 7 minutes)")
    number(cfg, "privacy.delta", lambda v: 0 < v < 1, "a number in (0, 1)")
    number(cfg, "privacy.c", lambda v: 0 < v <= NOISE_MAX, f"a number in (0, {NOISE_MAX:g}]")
    number(cfg, "privacy.noise_multiplier_override", lambda v: 0 <= v <= NOISE_MAX,
           f"null or a number in [0, {NOISE_MAX:g}]", optional=True)
    choice(cfg, "privacy.log_base", LOG_BASES + (10,))
    choice(cfg, "privacy.noise_on", NOISE_ON)
    choice(cfg, "privacy.K", K_COUNTS)
    choice(cfg, "privacy.calibration", CALIBRATIONS, optional=False)
    choice(cfg, "privacy.neighbouring", RELATIONS, optional=False)
    choice(cfg, "accountant.name", ("paper",) + ACCOUNTANTS, optional=False)
    _validate_calibration(cfg)
    if (cfg.privacy.calibration != "paper" and cfg.accountant.name == "rdp" and cfg.privacy.neighbouring == "replace"
           and cfg.privacy.amplification):
        raise ConfigError("accountant", "rdp", "pld for Poisson sampling under replace-one (dp-accounting's RDP "
                          "does not support it)")
    if cfg.privacy.noise_on == "raw_delta" and cfg.privacy.calibration != "paper":
        raise ConfigError("privacy.noise_on", "raw_delta", "scaled_message when calibrating with an accountant")
    _validate_privacy_reads(cfg)


def _validate_calibration(cfg: DictConfig) -> None:
    """A certificate asked for half-way is refused, never replaced by the papers' formula: the noise is
    calibrated by an accountant only with both ``privacy.calibration=accountant`` and ``accountant=rdp|pld``."""
    calibration, accountant = cfg.privacy.calibration, cfg.accountant.name
    if (why := algorithm(cfg).own_noise) and (calibration, accountant) != ("paper", "paper"):
        raise ConfigError("privacy.calibration" if calibration != "paper" else "accountant",
                          calibration if calibration != "paper" else accountant,
                          f"paper (privacy.calibration=paper accountant=paper) with algo={cfg.algo.name}: {why}")
    if calibration == "accountant" and accountant == "paper":
        raise ConfigError("accountant", "paper", "rdp | pld with privacy.calibration=accountant (the accountant "
                          "that solves σ for privacy.epsilon and certifies it; `paper` is the papers' formula, "
                          "which certifies nothing)")
    if calibration == "paper" and accountant != "paper":
        raise ConfigError("privacy.calibration", "paper", f"accountant with accountant={accountant}, to calibrate "
                          f"the noise to privacy.epsilon with {accountant}; or accountant=paper to keep the papers' "
                          "formula (every private run reports the ε that RDP and PLD certify for it either way)")


@functools.cache
def private_algos() -> str:
    """normfl's algorithm options that add noise, as their classes declare it (``adds_noise``) of their files; an
    option whose noise is its ``private`` switch is named with it where no option of its class adds noise as it
    is (dpsgd_norm with algo.private=true; normec's is dp_normec)."""
    nodes = {path.stem: option_file("algo", path.stem) for path in sorted((CONF / "algo").glob("*.yaml"))}
    classes = {name: algorithm(OmegaConf.create({"algo": node})) for name, node in nodes.items()}
    noisy = {name for name, node in nodes.items() if classes[name].adds_noise(node)}
    switched = {name for name, node in nodes.items() if name not in noisy and "private" in node
                and classes[name].adds_noise({**node, "private": True})
                and not any(nodes[other].get("_target_") == node.get("_target_") for other in noisy)}
    return ", ".join(name + " with algo.private=true" * (name in switched) for name in nodes
                     if name in noisy | switched)


def no_noise(name: str) -> str:
    """Why a privacy key is refused in a run of ``name`` that adds no noise."""
    return f"with algo={name}, which adds no noise (the private algorithms: {private_algos()})"


FORMULA_KEYS = ("c", "log_base", "sqrt_covers_log", "K_plus_one", "K", "noise_on")   # the papers' noise formula's


def private(cfg: DictConfig) -> bool:
    """Whether the run adds noise, as its algorithm declares (``adds_noise``)."""
    return isinstance(node := get(cfg, "algo"), DictConfig) and algorithm(cfg).adds_noise(node)


def _validate_privacy_reads(cfg: DictConfig) -> None:
    """A privacy key the run does not read is refused, not ignored: every one without noise; all but ε and δ
    where the algorithm sizes its noise itself (``own_noise``); the papers' formula under an accountant;
    amplification where no client is sampled."""
    name = cfg.algo.name
    if not private(cfg):
        reads, why = (), None                       # (no_noise: read only to refuse)
        if cfg.accountant.name != "paper":
           raise ConfigError("accountant", cfg.accountant.name, f"paper {no_noise(name)}")
    elif algorithm(cfg).own_noise:
        reads, why = ("epsilon", "delta"), f"with algo={name}, whose mechanism reads privacy.epsilon and delta alone"
    elif cfg.privacy.calibration == "accountant":
        reads = [k for k in cfg.privacy if k not in FORMULA_KEYS]
        why = "with privacy.calibration=accountant (the accountant solves σ; this key is the papers' formula's)"
    else:
        reads, why = list(cfg.privacy), ""
    for key, default in option_file("privacy", "default").items():
        if key not in reads and get(cfg, f"privacy.{key}", default) != default:
           raise ConfigError(f"privacy.{key}", cfg.privacy[key], f"{default} {no_noise(name) if why is None else why}")
    if "amplification" in reads and cfg.privacy.amplification and get(cfg, "algo.p") in (None, 1, 1.0):
        raise ConfigError("privacy.amplification", True, f"false with algo={name} at p={get(cfg, 'algo.p', 1)}: "
                          "amplification by sampling needs clients sampled, p < 1")


AUDIT_MODES = ("sidecar", "inband", "release")


def validate_audit(cfg: DictConfig) -> None:
    number(cfg, "audit.canaries", lambda v: v >= 0 and v % 2 == 0, "an even integer >= 0 (0: no audit; half "
           "the canaries in, half out)", integer=True, optional=True)
    choice(cfg, "audit.mode", AUDIT_MODES)
    n = get(cfg, "audit.canaries")
    if not n:
        return
    if get(cfg, "audit.mode") == "release":   # canary clients through any client-level Gaussian algorithm's round
        if (why := algorithm(cfg).own_noise) is not None:
            raise ConfigError("audit.mode", "release", f"sidecar or inband with algo={cfg.algo.name}: the release "
                              f"audit's canaries are clients of a Gaussian the privacy node calibrates, and {why}")
    elif not algorithm(cfg).canaries:    # NormFedAvg's discrete mechanisms are audited a message at a time instead
        raise ConfigError("audit.canaries", n, "0 here: canaries audit the Gaussian mechanisms (dp_normec, "
                          "dp_clip21, dp_fed_normec, dp_fedavg, dpsgd_norm algo.private=true, dpfl, ali_dpfl); the "
                          "discrete mechanisms of dp_normfedavg are audited per message (make audit)")
    if not private(cfg):
        raise ConfigError("audit.canaries", n, "0 for a run without privacy (nothing to audit)")
