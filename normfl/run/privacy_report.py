"""What a private run says of its privacy besides its ε: the cautions before its first round (what its
certificate does not cover, a δ too large for the units it protects, why its ε is no certificate), the privacy
block of its summary, and the warning when it certifies (or claims) more than privacy.epsilon."""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from normfl.engine.batchnorm import tracked
from normfl.privacy import Ledger, certified

log = logging.getLogger("normfl")


def cautions(algo, module, parts: list) -> tuple[str | None, str | None, list[str]]:
    """A private run's (``uncovered``, ``weak_delta``, the algorithm's ``not_certified``), each said as a warning
    before its first round; (None, None, []) for a run without privacy."""
    if not algo.private:
        return None, None, []
    notes = uncovered(module), weak_delta(algo.mech.unit, algo.privacy.delta, parts), algo.not_certified()
    for caution in filter(None, notes[:2]):
        log.warning("privacy: %s", caution)
    for why in notes[2]:
        log.warning("privacy: the ε this run reports is not a certificate: %s", why)
    return notes


def uncovered(module) -> str | None:
    """What a private run's certificate does not cover in its model, or None: BatchNorm's running statistics,
    which the clients' batches update and the evaluated model carries, with no noise and no bound."""
    if not tracked(module):
        return None
    return ("the model's BatchNorm running statistics are updated from the clients' batches and enter the "
            "global model without noise: no certificate covers them, and a canary on the parameters cannot see "
            "them (model.norm=group avoids them)")


def weak_delta(unit: str, delta: float, parts: list) -> str | None:
    """A caution, or None, when δ is not small against the N units a certificate protects (the clients, or the
    samples of the smallest client's data): publishing each unit outright with probability δ is (0, δ)-DP, so
    with δ ≥ 1/N a certificate allows about δN ≥ 1 units published whole."""
    n = len(parts) if unit == "client" else min(map(len, parts))
    if delta * n < 1:
        return None
    units = f"{n} clients" if unit == "client" else f"{n} samples of the smallest client's data"
    return (f"privacy.delta={delta:g} is at least 1/N for the N = {units} it protects: publishing each of them "
            "whole with probability δ meets (ε, δ) for any ε, so the certificate allows that; choose δ well "
            "below 1/N")


def planned_spent(ledger, releases: int, target: float) -> dict:
    """ε after a run's ``releases`` by its ledger, for the warning before its first round. A dp-accounting
    ledger asks RDP first, and PLD (slow for small noise) only where it could decide whether the run exceeds
    ``target``: not where RDP certifies the target already, nor four times above it, a gap the two accountants
    do not show in practice (in docs/privacy-table.md PLD is 0.91-0.96 times RDP)."""
    if not isinstance(ledger, Ledger):
        return ledger.spent(releases)
    rdp = ledger.spent(releases, ("rdp",))
    return rdp if rdp["rdp"] is not None and not target < rdp["rdp"] < 4 * target else ledger.spent(releases)


def summary_block(algo, step: int, uncovered: str | None, weak_delta: str | None,
                  not_certified: list[str]) -> dict | None:
    """The privacy block of a run's summary after ``step`` steps, with its cautions (None without privacy)."""
    if not algo.private:
        return None
    return {**algo.privacy_report(step), "not_covered": uncovered,
            **({"weak_delta": weak_delta} if weak_delta else {}),
            **({"not_certified": not_certified} if not_certified else {})}


def warn_above_target(cfg: DictConfig, algo, not_certified: list[str], spent: dict, ahead: bool) -> None:
    """A warning, on the console and in the log, when the run certifies (or, ``not_certified``, claims)
    more than privacy.epsilon: ``ahead`` before its first round, else at its end."""
    verb = {(True, False): "will certify", (False, False): "certifies",
            (True, True): "will claim", (False, True): "claims"}[ahead, bool(not_certified)]
    eps, by = certified(spent)
    target = algo.privacy.epsilon
    if eps is None or eps <= target:
        return
    log.warning("privacy: this run %s ε = %.4g (%s, δ = %g), above privacy.epsilon = %g: %s", verb, eps, by,
                algo.privacy.delta, target, why_above(cfg, by))


def why_above(cfg: DictConfig, by: str) -> str:
    """Why a run's ε (``by`` the accountant that gave it) is above privacy.epsilon: the setting that made it so."""
    if cfg.privacy.get("noise_multiplier_override") is not None:
        return (f"privacy.noise_multiplier_override={cfg.privacy.noise_multiplier_override} sets the noise "
                "instead of privacy.epsilon (null: the noise privacy.calibration gives)")
    if cfg.algo.get("scope") == "per_round":
        return "algo.scope=per_round makes privacy.epsilon each message's ε, not the whole run's"
    if cfg.algo.get("rc_override") is not None:
        return (f"algo.rc_override={cfg.algo.rc_override} takes more DP-SGD steps than privacy.epsilon "
                "supports (null: the steps it supports)")
    if cfg.privacy.calibration == "paper" and by != "composed":
        return ("the papers' noise rule is a heuristic; privacy.calibration=accountant accountant=pld calibrates "
                "the noise to privacy.epsilon")
    return "see the privacy block of summary.json"
