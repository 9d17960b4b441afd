"""ALI-DPFL (ALI Algorithm 2) and fixed-τ DPFL (ALI Algorithm 1); readings C-A1-C-A18 in docs/readings.md.

Every round all N clients start from the global model ŵ(k) and run τ DP-SGD steps on their own
data (Poisson batches at rate q, per-sample clipping to C, Gaussian noise σC on the sum, step η;
``local.local_dpsgd``). The server averages the local models with weights |D_i|/|D| (line 16).

The sum of clipped noisy gradients is divided by client i's expected batch q·|D_i| (ALI Sec. III-C; reading C-A18), or
by ``divisor`` for every client when set: the authors' code divides by its ``batch_size`` argument
(default 64), which Poisson sampling otherwise leaves unused (XinpengLing/ALI-DPFL,
system/flcore/clients/clientdpfl.py line 33 passes it as ``minibatch_size``;
system/flcore/optimizers/dp_optimizer.py line 107 scales the sum by 1/minibatch_size). The step is
then η·q|D_i|/divisor times the text's.

Budgets (ALI Alg. 2, Sec. V; readings C-A9, C-A13): the server has R_s = ``rounds`` rounds; each client's privacy
budget (``privacy.epsilon``, ``privacy.delta``) supports R_c DP-SGD steps by the paper's
accountant. All clients take the same number of steps, so T_used, the steps taken so far, is each
client's privacy spent. A run stops after R_s rounds or when the budget is used up:

- fixed τ (``adaptive=false``, Alg. 1): min(R_s, ⌊R_c/τ⌋) rounds of τ steps;
- ALI-DPFL (``adaptive=true``, Alg. 2): round k takes τ_k = min(τ*, R_c - T_used) steps, and after
  aggregating the server picks the next τ* (line 19, ``tau.TauSelector``) from the estimates of
  lines 4, 17 and 18, which the clients compute on their last batch of the round (reading C-A5). Those
  estimates use the clients' data without noise and are not accounted for, as in the paper, so such a run's ε
  is a claim (``not_certified``). Under Condition I (R_s ≥ R_c) τ* ≡ 1 and nothing is estimated.
"""

from __future__ import annotations

import logging

import torch

from normfl.algorithms.base import Algorithm, Clients
from normfl.algorithms.local import local_dpsgd
from normfl.algorithms.tau import (
    T_MODES,
    TAU_RULES,
    Estimates,
    TauSelector,
    code_estimates,
    noise_constant,
    weighted_estimates,
)
from normfl.errors import ConfigError
from normfl.ops import DPSGD, average
from normfl.privacy.mechanisms import SampledGaussian
from normfl.privacy.sgm import METHODS as RC_METHODS
from normfl.privacy.sgm import ClientAccountant

log = logging.getLogger(__name__)


class DPFL(Algorithm):
    """Each client's DP-SGD noise is ``mech`` (``SampledGaussian``); ``ledger``, the paper's accountant of its
    steps (``sgm.ClientAccountant``), stops the run."""

    state = ("used", "tau_next", "selector", "weights", "batch")
    own_noise = "its noise is algo.sigma, and its budget R_c comes from its own accountant"
    own_round = "its paper defines its round: DP-SGD steps charged to a privacy budget"
    canaries = poisson_batches = True

    @classmethod
    def adds_noise(cls, node) -> bool:
        return True                                          # DP-SGD is always private

    @classmethod
    def title(cls, node) -> str:
        return "ALI-DPFL" if node.get("adaptive") else "DPFL"     # τ chosen each round, or fixed

    @classmethod
    def check(cls, cfg, rules) -> None:
        for key in ("lr", "sigma", "clip"):
            rules.number(cfg, f"algo.{key}", lambda v: v > 0, "a number > 0")
        rules.number(cfg, "algo.sample_rate", lambda v: 0 < v <= 1, "a number in (0, 1]")
        rules.number(cfg, "algo.tau", lambda v: v >= 1, "an integer >= 1", integer=True)
        rules.number(cfg, "algo.tau_cap", lambda v: v >= 1, "an integer >= 1", integer=True)
        rules.number(cfg, "algo.rc_override", lambda v: v >= 1, "null or an integer >= 1", integer=True,
                     optional=True)
        rules.number(cfg, "algo.divisor", lambda v: v > 0,
                     "null (each client's expected batch q·|D_i|) or a number > 0", optional=True)
        rules.number(cfg, "algo.lambda_const", lambda v: 0 < v < 1, "null or a number in (0, 1)", optional=True)
        rules.number(cfg, "algo.omega_const", lambda v: v > 0, "null or a number > 0", optional=True)
        rules.choice(cfg, "algo.rc_method", RC_METHODS, optional=False)
        rules.choice(cfg, "algo.tau_rule", TAU_RULES, optional=False)
        rules.choice(cfg, "algo.T_mode", T_MODES, optional=False)
        if cfg.algo.adaptive:
            rules.unread(cfg, "algo.tau", f"with algo.adaptive=true ({cfg.algo.name} chooses τ each round; "
                         "algo=dpfl fixes it)", default=1)
        if cfg.oracle != "minibatch":
            raise ConfigError("oracle", cfg.oracle, f"minibatch with algo={cfg.algo.name} (its batches are Poisson "
                              "samples at algo.sample_rate)")
        if cfg.model.get("norm") == "batch":
            raise ConfigError("model.norm", "batch", "group (DP-SGD's per-sample gradients are undefined with "
                              "BatchNorm)")

    def __init__(self, lr=0.5, sigma=1.1, clip=0.1, sample_rate=0.015, tau=1, adaptive=False,
                 rc_method="bisect_tol", rc_override=None, tau_rule="g_bound_v1", T_mode="static", tau_cap=100,
                 lambda_const=None, omega_const=None, divisor=None, name="dpfl"):
        super().__init__(private=True, name=name)
        self.lr, self.mech = float(lr), SampledGaussian(float(clip), float(sigma), float(sample_rate))
        self.tau, self.adaptive = int(tau), bool(adaptive)
        self.divisor = None if divisor is None else float(divisor)
        self.rc_method, self.rc_override = rc_method, rc_override
        self.selector_args = {"rule": tau_rule, "T_mode": T_mode, "tau_cap": int(tau_cap),
                              "lambda_const": lambda_const, "omega_const": omega_const}

    def setup(self, x0, num_clients, rounds, privacy, seed):
        super().setup(x0, num_clients, rounds, privacy, seed)
        self.R_s = rounds
        m = self.mech
        self.ledger = ClientAccountant(m.rate, m.sigma, privacy.delta, privacy.epsilon)
        self.R_c = int(self.rc_override) if self.rc_override is not None else self.ledger.budget_steps(self.rc_method)
        if self.R_c < (1 if self.adaptive else self.tau):
            raise ConfigError("privacy.epsilon", privacy.epsilon, f"a budget that supports at least "
                              f"{1 if self.adaptive else self.tau} DP-SGD steps (it supports R_c = {self.R_c})")
        self.dim, self.used, self.tau_next, self.selector = x0.numel(), 0, (1 if self.adaptive else self.tau), None

    def _start(self, clients: Clients, device, dtype) -> None:
        """What needs the clients' shard sizes: the weights |D_i|/|D|, the divisors and the selector."""
        counts = [len(p) for p in clients.data.parts]
        sizes = torch.tensor(counts, dtype=dtype, device=device)
        self.weights = sizes / sizes.sum()
        m = self.mech
        self.batch = m.rate * sizes if self.divisor is None else torch.full_like(sizes, self.divisor)
        if self.adaptive:
            noise = noise_constant(self.dim, m.sigma, m.clip, float(self.batch.min()))
            hat_b = int(m.rate * min(counts))                                   # B̂ = ⌊q·min|D_i|⌋, divisor or not
            self.selector = TauSelector(self.lr, noise, self.R_s, self.R_c, clip=m.clip, sigma=m.sigma, dim=self.dim,
                                        batch_hat=hat_b, **self.selector_args)

    def round(self, k: int, x: torch.Tensor, clients: Clients):
        if k == 0:
            self._start(clients, x.device, x.dtype)
        tau = min(self.tau_next, self.R_c - self.used)                               # never overspend (reading C-A13)
        gen = self.generator(DPSGD, k, x.device)
        W, loss, last, before = local_dpsgd(x, clients, tau, self.lr, self.mech, self.batch, gen)   # 6-11
        x_new = average(W, self.weights)                                             # 16: Σ |D_i|/|D| ŵ_i
        self.used += tau
        if self.selector is not None and self.selector.adaptive and self.used < self.R_c:   # Condition I: τ* ≡ 1
            self.tau_next = self._select(W, x_new, last, before, clients, k + 1)     # 17-19
        done = self.used >= self.R_c if self.adaptive else self.R_c - self.used < self.tau
        if (done or k + 1 == self.R_s) and self.selector is not None and self.selector.infeasible_rounds:
            log.warning("no τ could be chosen from the estimates in %d of the %d rounds that chose τ*, where τ* "
                        "stayed as it was (see \"When τ* cannot be chosen\" in docs/algorithms.md; "
                        "hydra.verbose=%s logs each such round)", self.selector.infeasible_rounds,
                        len(self.selector.history), __name__)
        return x_new, {"loss": self.weights @ loss, "uploads": self.num_clients, "tau": tau,
                       "steps_total": self.used, "done": done}

    def _select(self, W, x_new, last, before, clients: Clients, rounds_done: int) -> int:
        """Lines 4, 17-19 on each client's last batch S_i (clients with an empty S_i sit out).

        ``g_bound_v1``: ρ_i, β_i from the local model against the new global model, and ∇F_i, F_i at
        the new global model. ``closed_form_code``: μ̂ from the last local step's length against the
        distance to the new global model, Γ̂ from the loss before and after that step."""
        keep = [i for i, b in enumerate(last) if len(b[1]) > 0]
        pieces = [[last[i]] for i in keep]
        w = (self.weights[keep] / self.weights[keep].sum()).tolist()
        dist = torch.linalg.vector_norm(W[keep] - x_new, dim=1).clamp_min(1e-12)
        g_local, l_local = clients.grads(W[keep], pieces)
        if self.selector.rule == "closed_form_code":
            start = before[keep] if before.dim() == 2 else before
            _, l_prev = clients.grads(start, pieces)
            mu, gamma = code_estimates(w, torch.linalg.vector_norm(W[keep] - start, dim=1).tolist(),
                                       dist.tolist(), (l_local - l_prev).tolist())
            est = Estimates(mu=mu, gamma=gamma)
        else:
            g_new, l_new = clients.grads(x_new, pieces)
            est = weighted_estimates(w, ((l_local - l_new).abs() / dist).tolist(),
                                     (torch.linalg.vector_norm(g_local - g_new, dim=1) / dist).tolist(),
                                     g_new, l_new.tolist())
        before = self.selector.infeasible_rounds
        tau = self.selector.update(est, rounds_done, self.used)
        if self.selector.infeasible_rounds > before:      # the un-noised estimates: only when asked (DEBUG)
            log.debug("round %d: no τ could be chosen from the estimates (%s); τ* stays %d", rounds_done, est, tau)
        return tau

    # -- privacy: every client has taken T_used DP-SGD steps ----------------------------------
    def releases(self, steps: int) -> int:
        return self.used

    def planned_releases(self, steps: int) -> int:
        return self.R_c                                      # the budget stops every client there

    def noise_target(self):
        b = getattr(self, "batch", None)                     # B_i, set when the first round starts
        div = f"B = {self.divisor:g}" if self.divisor is not None else "B_i = q·|D_i|"
        text = (f"each DP-SGD step's Σ_s Clip_C(∇ℓ(w; s)) over a Poisson batch, each term of norm ≤ C = "
                f"{self.mech.clip:g}; the step divides it by {div}")
        if b is None:
            return text, None
        text += "" if self.divisor is not None else f" (std_in_update: at the smallest, B_i = {float(b.min()):g})"
        return text, 1 / float(b.min())

    def not_certified(self) -> list[str]:
        """ALI-DPFL under Condition II (R_s < R_c) chooses each τ from estimates on the clients' data without
        noise, which no accountant charges; fixed τ and Condition I (τ* ≡ 1, nothing estimated) release the
        DP-SGD steps only."""
        why = super().not_certified()
        if self.adaptive and self.R_s < self.R_c:
            why.append("ALI-DPFL chooses each round's τ from estimates computed on the clients' data without noise "
                       "(ALI Algorithm 2, lines 17-19), which the accountant of the DP-SGD steps does not charge")
        return why

    def privacy_extra(self, steps: int) -> dict:
        return {
            "R_c": self.R_c, "R_c_method": "override" if self.rc_override is not None else self.rc_method,
            "R_s": self.R_s, "steps_taken": self.used,
            **({"tau_infeasible_rounds": self.selector.infeasible_rounds} if self.selector is not None else {}),
            "assumptions": "the paper's accountant (integer-order RDP of the sampled Gaussian, Mironov's "
                           "conversion) stops each client; dp-accounting's RDP and PLD under add/remove-one "
                           "are reported beside it. ALI-DPFL's estimates of ρ, β, ξ use the clients' data "
                           "without noise and are not accounted (as in the paper)",
        }
