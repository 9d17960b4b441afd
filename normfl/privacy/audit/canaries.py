"""Canary audits beside a private run (``audit.canaries=N``): an empirical lower bound on ε next to the
certified one, through the run's own bounding operator, privatizer and sampler.

This module makes the scores; ``stats`` turns them into bounds. Half the N canaries are "in", half "out";
each mechanism family has its canary, its observer (what the accountant assumes the adversary sees) and its
score:

- **client noise** (DP-α-NormEC, DP-Clip21, DP-Fed-α-NormEC, DP-FedAvg ``noise_by=client``): N canary
  clients beside the run's. An "in" canary releases Ψ(u_c) at Ψ's bound every round it takes part (u_c a
  fixed random direction, through the run's Ψ); an "out" canary releases nothing. Each takes part with the
  run's participation probability, and each release goes through the run's privatizer. Observed: each
  canary's noisy upload; score: Σ_k <y_c^k, u_c> over the rounds it took part (the Gaussian's likelihood
  ratio statistic). The server sees who uploads, so a claim of amplification by sampling is refuted here.
- **central noise** (DP-FedAvg ``noise_by=server``, the DP-SGD baseline): one canary client per appended
  dummy coordinate, its update R·e_c bounded by the run's Ψ and scaled to the privatizer's sensitivity
  (what one client can move the noised vector by). Observed: the dummy coordinates of the noised vector,
  every round; the noise is independent across coordinates, so the N scores are independent. Score: the
  sum over the rounds a canary took part, or, where amplification by sampling is claimed and the observer
  does not see who took part, the likelihood ratio of the sampled Gaussian over every round.
- **DP-SGD clients** (ALI-DPFL, DPFL): N canary samples spread over the clients, each a per-sample gradient
  R·e_c on a dummy coordinate of its own. Every DP-SGD step, each "in" canary enters its client's batch
  with the rate the run passes to its Poisson sampler, is clipped by the run's clipping rule with the run's
  clip, and the sum gets the run's noise. Observed: every noisy step; score: the sampled Gaussian's
  likelihood ratio Σ_t log(1 - q + q·exp((y_t/C - ½)/σ²)) at the claimed q and σ.

Thresholds are fixed from the claim before any score is seen: quantiles of scores simulated under the
claimed mechanism. The canaries draw from a random stream of their own (``AUDIT``) and stay out of the
model, so a run's parameters are the same bits with and without its audit. What the audit does not see:
anything that never reaches the privatized vector through these paths (BatchNorm statistics: the summary's
``privacy.not_covered``; a bug inside the Poisson sampler itself rather than in the rate passed to it).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from dp_accounting.pld import privacy_loss_distribution as plds

from normfl.engine import clipping
from normfl.ops import AUDIT, round_generator
from normfl.privacy.accounting import GaussianRelease
from normfl.privacy.audit.stats import curve_eps_lower, eps_lower, gdp_epsilon, mu_lower

ALPHA = 0.05                   # the verdict holds with probability 1 - ALPHA: each of its two routes gets ALPHA / 2
OVERSIZE = 1e6                 # a canary's raw update or gradient, far beyond any bound: Ψ and clipping must act
PAIRED_SHRINK = 1 / math.sqrt(2)   # a score on the difference of two noisy rows: the signal over √2 noise
SIMULATED = 4000               # canaries a side simulated under the claim to fix the thresholds
FPR_LEVELS = (0.3, 0.1, 0.03, 0.01, 3e-3, 1e-3, 3e-4)      # thresholds at these simulated false-positive rates


class Canaries:
    """What every family shares: N canaries, the first half "in", their scores, the steps observed, and the
    summary's ``audit`` block. ``observe(step)`` after each communication step, ``result`` at the end."""

    family: str
    observer: str

    scores_kept: tuple[str, ...] = ("own",)

    def __init__(self, algo, n: int, seed: int, device: torch.device, inband: bool = False):
        self.algo, self.n, self.seed, self.device, self.inband = algo, n, seed, device, inband
        self.is_in = torch.arange(n, device=device) < n // 2
        self.scores = torch.zeros(len(self.scores_kept), n, device=device, dtype=torch.float64)
        self.steps = 0

    def sign(self, step: int) -> int:
        """Canaries alternate their sign from step to step: a correct privatizer's scores keep their law, and
        noise reused across steps cancels out of the score instead of piling up in it."""
        return 1 if step % 2 else -1

    def observe(self, step: int) -> None:
        """Communication step ``step`` has been taken (steps count from 1): beside the run, the canaries'
        block goes through the run's privatizer with draws of their own."""
        if not self.inband:
            block = self.begin(step)
            self.take(step, self.algo.mech(block, self.gen))

    def begin(self, step: int) -> torch.Tensor:
        """Step ``step``'s block of canary releases (who takes part drawn from the canaries' stream, ``gen``)."""
        self.gen = round_generator(self.seed, AUDIT, step, self.device)
        return self.make(step)

    def make(self, step: int) -> torch.Tensor:
        raise NotImplementedError

    def take(self, step: int, y: torch.Tensor) -> None:
        """Score the privatized block ``y``."""
        raise NotImplementedError

    def join_privatize(self, dim: int) -> None:
        """In-band: the canaries' block joins the run's own vector in its privatizer call (rows for client
        noise, coordinates for central noise), with the run's noise draws; their part of the output is split
        off before the algorithm uses it. The very call is audited, and the run's draws shift."""
        real = self.algo.privatize

        def privatize(v: torch.Tensor, k: int) -> torch.Tensor:
            step = self.steps + 1
            block = self.begin(step)
            y = real(torch.cat([v, block], dim), k)
            self.take(step, y.narrow(dim, v.shape[dim], block.shape[dim]))
            return y.narrow(dim, 0, v.shape[dim])

        self.algo.privatize = privatize

    # -- what the certificate claims, and what a canary's score would be under it --------------------------
    def claim(self) -> tuple[GaussianRelease, int]:
        """The release the certificate composes, and how many times."""
        raise NotImplementedError

    def simulate(self, rng: np.random.Generator, inside: bool, m: int, shrink: float) -> np.ndarray:
        """``m`` canaries' scores as the claimed mechanism would make them, with the signal shrunk by
        ``shrink`` (1, or 1/√2 for a score on the difference of two rows, whose noise is √2 times larger)."""
        raise NotImplementedError

    def thresholds(self, shrink: float) -> np.ndarray:
        """Fixed by the claim alone (a seeded simulation), before any score is seen: the "out" scores' upper
        quantiles, which make the tightest tests of a correct privatizer, and points between the "out" and
        "in" means, where a privatizer with too little noise separates them."""
        rng = np.random.default_rng(self.seed)
        out, inside = (self.simulate(rng, b, SIMULATED, shrink) for b in (False, True))
        between = out.mean() + (inside.mean() - out.mean()) * np.array([0.25, 0.5, 0.75])
        return np.unique(np.concatenate([np.quantile(out, 1 - np.asarray(FPR_LEVELS)), between]))

    def result(self, eps_certified: float | None, delta: float) -> dict:
        """The summary's ``audit`` block: the assumption-free (ε, δ) bound, the test against the certified
        trade-off curve (Gaussian DP where the claim is exactly that, the accountant's PLD curve otherwise),
        and the verdict; each score kept and each route gets an equal share of ALPHA."""
        release, k = self.claim()
        alpha = ALPHA / (2 * len(self.scores_kept))
        inside, found = self.is_in.cpu().numpy(), []
        for kind, s in zip(self.scores_kept, self.scores.cpu().numpy(), strict=True):
            s_in, s_out, t = s[inside], s[~inside], self.thresholds(PAIRED_SHRINK if kind == "paired" else 1.0)
            cp = eps_lower(s_in, s_out, delta, t, alpha)
            if release.sampled:
                family = functools.partial(claimed_pld, release, k)          # the claim's shape, any noise
                curve = curve_eps_lower(s_in, s_out, t, family, delta, alpha)["eps_lower_curve"]
            else:
                curve = gdp_epsilon(mu_lower(s_in, s_out, t, alpha)["mu_lower"], delta)
            found.append({"score": kind, "eps_lower": cp["eps_lower"], "threshold": cp["threshold"],
                          "eps_lower_curve": curve})
        best = max(found, key=lambda f: f["eps_lower"])
        curve = max(f["eps_lower_curve"] for f in found)
        refutes = eps_certified is not None and max(best["eps_lower"], curve) > eps_certified
        return {"family": self.family, "observer": self.observer, "canaries": self.n, "in": int(inside.sum()),
                "steps_observed": self.steps, "eps_lower": best["eps_lower"], "eps_lower_curve": curve,
                "curve": "PLD" if release.sampled else "GDP", "confidence": 1 - ALPHA, "scores": found,
                "eps_certified": eps_certified, "delta": delta,
                "verdict": "refutes the certificate" if refutes else "consistent with the certificate"}


def claimed_pld(release: GaussianRelease, k: int, z: float, pessimistic: bool = True):
    """The certified privacy loss distribution of ``k`` releases like ``release`` at noise multiplier ``z``,
    coarsely discretised (``stats.curve_eps_lower`` tests with a pessimistic one, reads ε from an optimistic one)."""
    one = plds.from_gaussian_mechanism(z, sampling_prob=release.sampling if release.sampled else 1.0,
                                       value_discretization_interval=1e-2, pessimistic_estimate=pessimistic,
                                       use_connect_dots=pessimistic,
                                       neighboring_relation=release.relation("pld"))
    return one.self_compose(k)


def sampled_llr(y: np.ndarray | torch.Tensor, q: float, mu: float):
    """The likelihood ratio statistic of N(μ, 1) taken with probability q against N(0, 1), per observation y
    (in units of the noise's std): log(1 - q + q·exp(μy - μ²/2)), computed stably."""
    lib = torch if isinstance(y, torch.Tensor) else np
    a = mu * y - mu * mu / 2
    if q >= 1:
        return a
    return lib.logaddexp(lib.zeros_like(a) + math.log1p(-q), a + math.log(q))


class ClientCanaries(Canaries):
    """Client noise: N canary clients and N blank clients (nothing to release), all rows of one privatizer call
    as the run's clients are. Scores: ``own``, a canary's upload alone; ``paired``, its upload less its blank's,
    which cancels a noise draw shared by the rows (it costs the signal a factor √2)."""

    family = "client-level Gaussian, noise added by each client"
    observer = "each canary's noisy upload, every step it takes part"
    scores_kept = ("own", "paired")

    def __init__(self, algo, n: int, d: int, seed: int, device: torch.device, dtype: torch.dtype,
                 inband: bool = False):
        super().__init__(algo, n, seed, device, inband)
        gen = round_generator(seed, AUDIT, 0, "cpu")              # the directions: draw 0; step k's: draw k
        u = torch.randn(n, d, generator=gen, dtype=torch.float64)
        self.u = (u / torch.linalg.vector_norm(u, dim=1, keepdim=True)).to(device, dtype)
        at_bound = algo.bounding(self.u * OVERSIZE)               # Ψ(u_c) at its bound, through the run's Ψ
        self.release = torch.cat([at_bound * self.is_in[:, None], torch.zeros_like(at_bound)])
        if inband:
            self.join_privatize(0)

    def make(self, step: int) -> torch.Tensor:
        self.takes_part = torch.rand(self.n, generator=self.gen, device=self.device) < self.algo.p
        return self.sign(step) * self.release

    def take(self, step: int, y: torch.Tensor) -> None:
        own, blank = ((rows * self.u).sum(1, dtype=torch.float64) for rows in (y[:self.n], y[self.n:]))
        self.scores += (self.sign(step) * self.takes_part * torch.stack([own, (own - blank) * PAIRED_SHRINK])
                        / self.algo.mech.std)
        self.steps += 1

    def claim(self):
        return self.algo.mech.release(), self.algo.releases(self.steps)

    def simulate(self, rng, inside, m, shrink):
        release, _ = self.claim()
        mu = shrink / release.noise_multiplier                      # a release at the bound, in std units
        taken = rng.binomial(self.steps, self.algo.p, m)
        return taken * mu * inside + np.sqrt(taken) * rng.standard_normal(m)


class CentralCanaries(Canaries):
    """Central noise: one canary client per dummy coordinate of the noised vector (one draw on the aggregate:
    there is nothing shared to pair against)."""

    family = "Gaussian noise added by the server to the aggregate"

    def __init__(self, algo, n: int, seed: int, device: torch.device, dtype: torch.dtype, inband: bool = False):
        super().__init__(algo, n, seed, device, inband)
        mech, bounding = algo.mech, algo.bounding
        raw = OVERSIZE * torch.eye(n, device=device, dtype=dtype)             # canary c's update: R·e_c
        bounded = bounding(raw).diagonal() * (mech.sensitivity / bounding.bound)  # through Ψ, at the sensitivity
        self.contribution = bounded * self.is_in
        self.hidden = mech.release().sampled        # amplification claimed: the observer must not see who took part
        self.observer = ("the noised aggregate's canary coordinates, every round, not knowing who took part"
                         if self.hidden else "the noised aggregate's canary coordinates, every round it takes part")
        if inband:
            self.join_privatize(-1)

    def make(self, step: int) -> torch.Tensor:
        self.takes_part = torch.rand(self.n, generator=self.gen, device=self.device) < self.algo.p
        return self.sign(step) * self.contribution * self.takes_part

    def take(self, step: int, y: torch.Tensor) -> None:
        mech = self.algo.mech
        y = self.sign(step) * y.double() / mech.std                              # in std units
        if self.hidden:
            self.scores[0] += sampled_llr(y, self.algo.p, mech.sensitivity / mech.std)
        else:
            self.scores[0] += self.takes_part * y
        self.steps += 1

    def claim(self):
        return self.algo.mech.release(), self.algo.releases(self.steps)

    def simulate(self, rng, inside, m, shrink):
        release, k = self.claim()
        mu, p = shrink / release.noise_multiplier, self.algo.p
        if self.hidden:
            b = rng.random((m, k)) < p
            return sampled_llr(b * mu * inside + rng.standard_normal((m, k)), p, mu).sum(1)
        taken = rng.binomial(k, p, m)
        return taken * mu * inside + np.sqrt(taken) * rng.standard_normal(m)


class SampleCanaries(Canaries):
    """DP-SGD clients: canary c is a sample of client c mod n on dummy coordinate c. Scores: ``own``, that
    coordinate of its client's noisy sum; ``paired``, less the same coordinate of the next client's sum (no
    canary there), which cancels a noise draw shared by the clients."""

    family = "DP-SGD on each client: Poisson-sampled Gaussian, sample level"
    observer = "every noisy DP-SGD step of the canary's client"
    scores_kept = ("own", "paired")

    def __init__(self, algo, clients, n: int, seed: int, device: torch.device, dtype: torch.dtype,
                 inband: bool = False):
        super().__init__(algo, n, seed, device, inband)
        self.dtype, k = dtype, len(clients.data.parts)
        if k < 2:
            raise ValueError("a DP-SGD audit pairs each client's noisy sum with another client's: it needs 2 clients")
        coords = torch.arange(n, device=device)
        self.own, self.other = (coords % k, coords), ((coords + 1) % k, coords)   # (client, coordinate) of each
        self.rows = k
        real_sums, self.mech = clients.clipped_grad_sums, algo.mech

        def clipped_grad_sums(x, rate, clip):       # the run's step; the canaries' at its rate and clip
            out = real_sums(x, rate, clip)
            self.block = self.sample(rate, clip)
            if not inband:                          # beside the run: the run's privatizer, the canaries' draws
                self.take(self.steps + 1, self.mech(self.block, self.gen))
            return out

        clients.clipped_grad_sums = clipped_grad_sums
        if inband:                                  # in the run's own noise call: coordinates of each client's sum
            algo.mech = _Joined(self)

    def sample(self, rate: float, clip: float) -> torch.Tensor:
        """Each "in" canary sampled at ``rate``, its gradient ±R·e_c clipped to ``clip`` by the run's rule, in
        its client's row: the canaries' coordinates of each client's clipped sum."""
        step = self.steps + 1
        self.gen = round_generator(self.seed, AUDIT, step, self.device)
        sampled = (torch.rand(self.n, generator=self.gen, device=self.device) < rate) & self.is_in
        grad = torch.full((self.n,), self.sign(step) * OVERSIZE, device=self.device, dtype=self.dtype)
        clipped = grad * clipping.clip_factors(grad.double() ** 2, clip).to(self.dtype)
        sums = torch.zeros(self.rows, self.n, device=self.device, dtype=self.dtype)
        sums[self.own] = clipped * sampled
        return sums

    def take(self, step: int, y: torch.Tensor) -> None:
        y = self.sign(step) * y.double() / self.mech.std                       # each client's noisy sum
        q, sigma = self.claimed()
        own, other = y[self.own], y[self.other]
        self.scores += torch.stack([sampled_llr(own, q, 1 / sigma),
                                    sampled_llr((own - other) * PAIRED_SHRINK, q, PAIRED_SHRINK / sigma)])
        self.steps += 1

    def observe(self, step: int) -> None:
        """Nothing after a communication step: the canaries step with each DP-SGD step (``sample``)."""

    def claimed(self) -> tuple[float, float]:
        """The sampling rate and noise multiplier the run's certificate was computed with."""
        return self.algo.ledger.q, self.algo.ledger.sigma

    def claim(self):
        q, sigma = self.claimed()
        return GaussianRelease(sigma, q, amplification=True), self.steps

    def simulate(self, rng, inside, m, shrink):
        (q, sigma), k = self.claimed(), self.steps
        b = rng.random((m, k)) < q
        return sampled_llr(b * inside * shrink / sigma + rng.standard_normal((m, k)), q, shrink / sigma).sum(1)


class _Joined:
    """In-band DP-SGD: the run's privatizer with the canaries' coordinates appended to every client's clipped
    sum in its own call (its own draws), split off again before the step uses the sum."""

    def __init__(self, canaries: SampleCanaries):
        self.canaries = canaries

    def __getattr__(self, name):
        return getattr(self.canaries.mech, name)

    def __call__(self, sums: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        c = self.canaries
        y = c.mech(torch.cat([sums, c.block.to(sums.dtype)], 1), gen)
        c.take(c.steps + 1, y[:, sums.shape[1]:])
        return y[:, :sums.shape[1]]


def canaries_for(algo, clients, n: int, d: int, seed: int, device: torch.device, dtype: torch.dtype,
                 mode: str = "sidecar") -> Canaries:
    """The audit of ``algo``'s mechanism family (``config.AUDITED`` lists which algorithms have one), beside the
    run (``sidecar``) or in its privatizer calls (``inband``)."""
    inband = mode == "inband"
    if algo.mech.unit == "sample":
        return SampleCanaries(algo, clients, n, seed, device, dtype, inband)
    if algo.mech.who == "server":
        return CentralCanaries(algo, n, seed, device, dtype, inband)
    return ClientCanaries(algo, n, d, seed, device, dtype, inband)
