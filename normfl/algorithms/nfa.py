"""DP-NormFedAvg and its relatives (NFA; readings C-N1-C-N15 in docs/readings.md).

One round of NFA Algorithm 2 (line numbers in comments):

-  3: the server sends w_k to r of the n clients, drawn uniformly without replacement;
-  5-8: each runs E local steps from w_k: the experiments' optimizer, PyTorch SGD on minibatches
   with momentum and weight decay, at η_k = η_0 · decay^k (NFA Sec. 6, App. H; reading C-N2);
-  9: and sends g_i = M(Ψ(w_k - w_{k,E}^(i)));
- 11: w_{k+1} = w_k - (β_k / r) Σ_i g_i.

The upload Ψ and the privatizer M give the paper's algorithms:

| algorithm                                   | upload   | mechanism  |
|---------------------------------------------|----------|------------|
| NormFedAvg (Remark 3)                       | unit     | none       |
| DP-NormFedAvg (Alg. 2, QTDL of Alg. 1)      | unit     | qtdl       |
| Binomial baseline (Sec. 6(i), cpSGD)        | unit     | binomial   |
| Clipping baseline (Sec. 6(ii))              | clip     | qtdl       |
| FedAvg (Alg. 3: w_{k+1} = mean_i w_{k,E})   | update   | none, β=1  |

``scale_to_unit`` (reading C-N16) sends the clipped update as Clip_C(u)/C, so that its coordinates use the
quantizer's whole unit grid and the noise does not grow as C shrinks, and steps β_k·C: the paper's step sizes
keep β_k·C the same for every C (App. H).

Aggregate-level privacy (App. G(iii); reading C-N6) divides the sensitivities by r, so that only the mean of the r
messages is private: with ``noise_at=client_aggregate`` each client adds its own TDL draw with those
parameters (the paper's per-client m_i, α_i); with ``noise_at=server`` clients send Q(Ψ(.)) and a
trusted aggregator adds one draw to their mean (r times the noise std on the mean).

Privacy (NFA Sec. 5, Theorems 1-2, App. C). ``scope=per_round``: each message is (ε, 2^-d)-DP by Theorem 1 (QTDL), or
(ε, δ)-DP by cpSGD's Theorem 1 (Binomial), with ε = ``privacy.epsilon``. ``scope=all_rounds``:
``privacy.epsilon`` and ``privacy.delta`` are the whole run's target, reached as in Theorem 2
(each message ε_0-DP, advanced composition over the rounds, amplification by sampling r of n).
Either way the run reports the whole-training ε that this composition gives after k rounds.
With ``sensitivity=heuristic`` (eq. 6, as in the experiments) these are not worst-case guarantees.

Theorem 1's δ = 2^-d does not hold for d >= 2: its proof counts only outputs with every coordinate
outside the other input's support, but one coordinate suffices. The parameters (α, m) are the
paper's, so its runs are reproduced; the summary also reports the exact per-message δ of the
mechanism (``privacy.qtdl.tdl_delta``), which is close to 1 at the paper's settings.
"""

from __future__ import annotations

import math

import torch
from omegaconf import ListConfig

from normfl.algorithms.base import Algorithm, Clients
from normfl.algorithms.local import local_sgd
from normfl.errors import ConfigError
from normfl.ops import NOISE, Bounding, Participation, server_step
from normfl.privacy.qtdl import (
    QTDL,
    Binomial,
    heuristic_sensitivity,
    per_message_epsilon,
    theorem2_epsilon,
    worst_case_sensitivity,
)

UPLOADS = ("unit", "clip", "update")
MECHANISMS = ("none", "qtdl", "binomial")
SCOPES = ("per_round", "all_rounds")
SENSITIVITIES = ("heuristic", "worst_case")
NOISE_AT = ("client", "client_aggregate", "server")


class NormFedAvg(Algorithm):
    """NFA Algorithm 2 and the variants in the table above. η_k = η_0 · decay^k is the local step; the
    server step β_k is a piecewise-constant ``beta`` schedule [[k_start, value], ...] or
    ``beta_over_eta`` · η_k."""

    own_noise = "its noise comes from NFA Theorem 1 (QTDL) or cpSGD (Binomial)"
    own_round = "its paper defines its round: local steps"

    @classmethod
    def adds_noise(cls, node) -> bool:
        return node.get("mechanism", "none") != "none"

    @classmethod
    def check(cls, cfg, rules) -> None:
        rules.number(cfg, "algo.eta0", lambda v: v > 0, "a number > 0")
        rules.number(cfg, "algo.lr_decay", lambda v: 0 < v <= 1, "a number in (0, 1]")
        rules.number(cfg, "algo.local_steps", lambda v: v >= 1, "an integer >= 1", integer=True)
        rules.number(cfg, "algo.momentum", lambda v: 0 <= v < 1, "a number in [0, 1)")
        rules.number(cfg, "algo.weight_decay", lambda v: v >= 0, "a number >= 0")
        rules.number(cfg, "algo.cohort_size", lambda v: 1 <= v <= (cfg.clients or math.inf),
                     f"null (all) or an integer in [1, clients={cfg.clients}]", integer=True, optional=True)
        for key, options in (("upload", UPLOADS), ("mechanism", MECHANISMS), ("scope", SCOPES),
                             ("sensitivity", SENSITIVITIES), ("noise_at", NOISE_AT)):
            rules.choice(cfg, f"algo.{key}", options, optional=False)
        rules.number(cfg, "algo.s", lambda v: v >= 1, "an integer >= 1", integer=True)
        rules.number(cfg, "algo.mu", lambda v: v > 0, "a number > 0")
        a = cfg.algo
        schedule = ("a list of [k_start, value] pairs, distinct integers k_start >= 0 with 0 among them, finite "
                    "values > 0")
        if (a.beta is None) == (a.beta_over_eta is None):
            raise ConfigError("algo.beta", a.beta, f"{schedule}, or null with algo.beta_over_eta set (exactly one)")
        if a.beta is not None:
            pairs = list(a.beta) if not isinstance(a.beta, (int, float, str)) else None
            ok = pairs and all(isinstance(p, ListConfig) and len(p) == 2 and isinstance(p[0], int)
                               and not isinstance(p[1], bool) and isinstance(p[1], (int, float))
                               and 0 < p[1] < math.inf for p in pairs)
            ok = ok and min(p[0] for p in pairs) == 0 and len({p[0] for p in pairs}) == len(pairs)
            if not ok:
                raise ConfigError("algo.beta", a.beta, schedule)
        else:
            rules.number(cfg, "algo.beta_over_eta", lambda v: v > 0, "a number > 0")
        quantized = a.mechanism != "none"
        rules.number(cfg, "algo.clip", lambda v: v > 0 and (v <= 1 or not quantized),
                     "a number in (0, 1] (the quantizer needs |coordinates| <= 1)" if quantized else "a number > 0")
        if a.get("scale_to_unit") and a.upload != "clip":
            raise ConfigError("algo.scale_to_unit", True, f"false with algo.upload={a.upload} (it scales a clipped "
                              "update)")
        if quantized and a.upload == "update":
            raise ConfigError("algo.upload", "update", "unit or clip with a quantizing mechanism (|coordinates| <= 1)")
        if a.mechanism == "binomial" and a.scope != "per_round":
            raise ConfigError("algo.scope", a.scope, "per_round with mechanism=binomial (cpSGD's per-round guarantee)")
        if a.noise_at == "server" and a.mechanism != "qtdl":
            raise ConfigError("algo.noise_at", "server", "client unless mechanism=qtdl (the aggregate-level variant)")
        if a.mechanism == "none":
            for key in ("s", "mu", "scope", "sensitivity", "noise_at"):
                rules.unread(cfg, f"algo.{key}", f"with algo.mechanism=none (algo={a.name} quantizes nothing and "
                             "adds no noise)")
        elif a.sensitivity == "worst_case":
            rules.unread(cfg, "algo.mu", "with algo.sensitivity=worst_case (μ is eq. 6's heuristic's)")
        if a.upload != "clip":
            rules.unread(cfg, "algo.clip", f"with algo.upload={a.upload} (the clipping bound of algo.upload=clip)")

    def __init__(self, eta0, beta=None, beta_over_eta=None, lr_decay=0.99, local_steps=20, momentum=0.9,
                 weight_decay=1e-4, cohort_size=None, upload="unit", clip=1.0, scale_to_unit=False, mechanism="none",
                 s=4096, scope="per_round", sensitivity="heuristic", mu=0.1, noise_at="client", name="normfedavg"):
        super().__init__(private=mechanism != "none", name=name)
        self.eta0, self.lr_decay = float(eta0), float(lr_decay)
        self.schedule = sorted((int(k), float(v)) for k, v in beta) if beta is not None else None
        self.beta_over_eta = beta_over_eta
        self.local = {"steps": int(local_steps), "momentum": float(momentum), "weight_decay": float(weight_decay)}
        self.r, self.upload = cohort_size, upload
        kind = "unit_clip" if scale_to_unit and upload == "clip" else {"update": "none"}.get(upload, upload)
        self.bounding = Bounding(kind, float(clip))                    # unit_clip: Clip_C(u)/C, weighted by C (C-N16)
        self.mechanism, self.s, self.scope = mechanism, int(s), scope
        self.sensitivity, self.mu = sensitivity, float(mu)
        self.noise_at = noise_at

    # -- schedules -------------------------------------------------------------------------------
    def eta(self, k: int) -> float:
        return self.eta0 * self.lr_decay ** k

    def step(self, k: int) -> float:
        """β_k."""
        if self.schedule is None:
            return float(self.beta_over_eta) * self.eta(k)
        return [v for start, v in self.schedule if start <= k][-1]

    # -- set-up: the privatizer's parameters from the paper's theorems ----------------------------
    def setup(self, x0, num_clients, rounds, privacy, seed):
        super().setup(x0, num_clients, rounds, privacy, seed)
        self.r = num_clients if self.r is None else int(self.r)
        if self.r > num_clients:
            raise ConfigError("algo.cohort_size", self.r, f"at most clients={num_clients}")
        self.sampling = Participation.of("cohort", num_clients, seed, size=self.r)
        if self.mechanism == "none":
            return
        d = x0.numel()
        scale = 1.0 if self.noise_at == "client" else 1.0 / self.r        # aggregate-level: Δ / r
        sens = (heuristic_sensitivity(d, self.s, self.mu, scale) if self.sensitivity == "heuristic"
                else worst_case_sensitivity(d, self.s, scale))
        if self.scope == "per_round":
            eps_msg = float(privacy.epsilon)
        else:
            eps = theorem2_epsilon(privacy.epsilon, privacy.delta, self.r, num_clients)
            if not (eps < 6 and privacy.delta < math.exp(-9 / 4)):
                raise ConfigError("privacy.epsilon", privacy.epsilon, "a whole-run target whose Theorem 2 ε is "
                                  f"< 6 (got {eps:.4g}) with privacy.delta < e^(-9/4)")
            eps_msg = per_message_epsilon(eps, privacy.delta, rounds)
        who = "server" if self.noise_at == "server" else "client"
        if self.mechanism == "qtdl":
            try:
                self.mech = QTDL.calibrated(self.s, eps_msg, sens, d, who)    # Theorem 1
            except ValueError as err:
                raise ConfigError("privacy.epsilon", privacy.epsilon, str(err)) from None
        else:
            self.mech = Binomial.calibrated(self.s, eps_msg, privacy.delta, sens, d, who)   # cpSGD Theorem 1
        self.bits_per_coord = self.mech.bits

    # -- one round (NFA Algorithm 2) ------------------------------------------------------------
    def psi(self, update: torch.Tensor) -> torch.Tensor:
        """What a client privatizes: the unit vector of its update, the clipped update, or the update."""
        u = self.bounding(update)                                   # unit(0) = 0: M(0)
        return u if self.upload == "update" else u.clamp(-1.0, 1.0)   # |u_i| <= 1 exactly, whatever the rounding

    def round(self, k: int, x: torch.Tensor, clients: Clients):
        ids = self.sampling.cohort(k)                                                  # 3: S_k (host ids)
        W, loss = local_sgd(x, clients, ids, lr=self.eta(k), **self.local)             # 5-8: w_{k,E}^(i)
        u = self.psi(x - W)                                                            # 9: Ψ(w_k - w_{k,E})
        g = u.mean(0) if self.mech is None else self.mech.mean(u, self.generator(NOISE, k, x.device))
        x = server_step(x, g, self.step(k) * self.bounding.weight)                    # 9, 11: (1/r) Σ M(.)
        return x, {"loss": loss.mean(), "uploads": len(ids)}

    # -- privacy report ------------------------------------------------------------------------
    def noise_target(self):
        psi = ("u/||u||" if self.upload == "unit" else f"Clip_C(u), C = {self.bounding.beta:g}"
               + (" divided by C (the server steps β_k·C)" if self.bounding.weight != 1.0 else ""))
        msg = f"Q(Ψ(u)) on the 1/s grid, u = w_k - w_(k,E), Ψ(u) = {psi}, |coordinates| ≤ 1"
        if self.noise_at == "server":
            return f"the mean of the r = {self.r} clients' {msg}; one draw by the server, weight 1", 1.0
        return f"each client's {msg}; the server averages the r = {self.r} messages, weight 1", 1.0

    def not_certified(self) -> list[str]:
        """NFA Theorems 1-2 state ε for the sensitivities and the noise they are given; where those are not a
        worst case, or the noise on what the server sees is smaller than calibrated, the ε is a claim."""
        why = []
        if self.sensitivity == "heuristic":
            why.append(f"the sensitivities are NFA eq. 6's heuristic (mu = {self.mu:g}), not worst-case bounds")
        if self.noise_at == "client_aggregate":
            why.append(f"each client's noise is sized for sensitivities over r, so the mean of the r = {self.r} "
                       f"messages carries sqrt(r) = {math.sqrt(self.r):.3g} times less noise than calibrated")
        exact = getattr(self.mech, "delta_exact", None)
        if exact is not None and exact > self.privacy.delta:
            why.append(f"the TDL noise's exact per-message delta is {exact:.3g}, not the 2^-d Theorem 1 states")
        return why

    def privacy_extra(self, steps: int) -> dict:
        sens = (f"heuristic: NFA eq. 6 with mu={self.mu:g}, not a worst-case bound"
                if self.sensitivity == "heuristic" else "worst case: Definition 1's trivial bounds")
        who = {"client": "each client privatizes its own message; the server sees every message",
               "client_aggregate": "each client adds noise calibrated to sensitivities divided by r, so only "
                                   "the average of the r messages is private (aggregate-level privacy)",
               "server": "a trusted aggregator adds one draw to the average of the clients' quantized "
                         "messages (aggregate-level privacy)"}[self.noise_at]
        return {
            "scope": self.scope, "sensitivity": {**self.mech.describe()["sensitivity"], "kind": sens},
            "delta_composed": self.ledger.composed(self.releases(steps))[1], "sampling_rate": self.p,
            "assumptions": f"one sample of a client's data is the privacy unit; {who}; rounds compose by "
                           "basic or advanced composition, whichever is smaller, and amplification by "
                           "sampling r of n (factor 2r/n) is claimed when the composed ε < 1 (NFA Theorem 2)",
        }
