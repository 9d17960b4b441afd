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
  with the privatizer's sampling rate by the clients' own rule (``ops.poisson_sample``), is clipped by the
  run's clipping rule to the privatizer's clip, and the sum gets the run's noise. Observed: every noisy step;
  score: the sampled Gaussian's likelihood ratio Σ_t log(1 - q + q·exp((y_t/C - ½)/σ²)) at the claimed q and σ.

Thresholds are fixed from the claim before any score is seen: quantiles of scores simulated under the
claimed mechanism. The canaries draw from a random stream of their own (``AUDIT``) and stay out of the
model, so a run's parameters are the same bits with and without its audit. What the audit does not see:
anything that never reaches the privatized vector through these paths (BatchNorm statistics: the summary's
``privacy.not_covered``; a sampler that keeps each sample's rate but is not Poisson, since the canaries share
the sampling rule, ``ops.poisson_sample``, not the clients' shards).

The canaries observe every release the run's ledger counts (``algo.releases``: one a communication step, or
each DP-SGD step), after the step beside the run (``sidecar``), or inside the run's own privatizer call
(``inband``: ``_Joined``, the canaries' block joined to the run's vector and split off again).
"""

from __future__ import annotations

import functools
import math
import os

import numpy as np
import torch
from dp_accounting.pld import privacy_loss_distribution as plds

from normfl import ops
from normfl.engine import clipping
from normfl.errors import ConfigError
from normfl.ops import AUDIT, Streams, round_generator, round_seed
from normfl.privacy.accounting import GaussianRelease
from normfl.privacy.audit.stats import bonferroni, curve_eps_lower, eps_lower, gdp_epsilon, mu_lower

ALPHA = 0.05                   # the verdict holds with probability 1 - ALPHA: each of its two routes gets ALPHA / 2
OVERSIZE = 1e6                 # a canary's raw update or gradient, far beyond any bound: Ψ and clipping must act
PAIRED_SHRINK = 1 / math.sqrt(2)   # a score on the difference of two noisy rows: the signal over √2 noise
SIMULATED = 4000               # canaries a side simulated under the claim to fix the thresholds
FPR_LEVELS = (0.3, 0.1, 0.03, 0.01, 3e-3, 1e-3, 3e-4)      # thresholds at these simulated false-positive rates


class Canaries:
    """What every family shares: N canaries, the first half "in", their scores, the releases observed, and the
    summary's ``audit`` block. ``observe(step)`` after each communication step, ``result`` at the end. A family
    says what a release of its canaries is (``make``), how it is scored (``take``), where its block joins the
    run's vector in-band (``joins``), and what the certificate claims (``claimed``, ``simulate``)."""

    family: str
    observer: str
    scores_kept: tuple[str, ...] = ("own",)
    joins: int                                       # the axis along which the block joins the run's vector

    def __init__(self, algo, n: int, seed: int, device: torch.device, inband: bool = False):
        self.algo, self.n, self.seed, self.device, self.inband = algo, n, seed, device, inband
        self.streams = Streams(seed)                 # the canaries' generator, reseeded for each release
        self.is_in = torch.arange(n, device=device) < n // 2
        self.scores = torch.zeros(len(self.scores_kept), n, device=device, dtype=torch.float64)
        self.steps = 0                               # releases observed
        self.mech = algo.mech                        # the run's privatizer
        if inband:                                   # the canaries ride on its calls
            algo.mech = _Joined(self)

    def round(self, k: int, x: torch.Tensor, clients):
        """The algorithm's round (in-band, the canaries ride on its privatizer calls)."""
        return self.algo.round(k, x, clients)

    def state_dict(self) -> tuple:
        return self.scores, self.steps

    def load_state_dict(self, state: tuple) -> None:
        self.scores, self.steps = state[0].to(self.device), state[1]

    def sign(self, step: int) -> int:
        """Canaries alternate their sign from release to release: a correct privatizer's scores keep their law,
        and noise reused across releases cancels out of the score instead of piling up in it."""
        return 1 if step % 2 else -1

    def observe(self, step: int) -> None:
        """Communication step ``step`` has been taken (steps count from 1): beside the run, each release it made
        is matched by one of the canaries' block through the run's privatizer, with draws of their own."""
        while not self.inband and self.steps < self.algo.releases(step):
            block = self.begin()
            self.take(self.mech(block, self.gen))

    def begin(self) -> torch.Tensor:
        """The next release's block of canaries (who takes part drawn from the canaries' stream, ``gen``)."""
        self.gen = self.streams(AUDIT, self.steps + 1, self.device)
        return self.make(self.sign(self.steps + 1))

    def make(self, sign: int) -> torch.Tensor:
        raise NotImplementedError

    def take(self, y: torch.Tensor) -> None:
        """Score the privatized block ``y`` of the release under way, and count it."""
        self.scores += self.score(y, self.sign(self.steps + 1) / self.mech.std)
        self.steps += 1

    def score(self, y: torch.Tensor, unit: float) -> torch.Tensor:
        """Each kind of score of one release, from its block ``y``; ``unit * y`` is the block in the noise's std
        units with the sign undone (a family whose score is linear applies it to the score: a client block is
        as large as the model)."""
        raise NotImplementedError

    # -- what the certificate claims, and what a canary's score would be under it --------------------------
    def claimed(self) -> GaussianRelease:
        """The release the certificate composes (once per release observed)."""
        return self.mech.release()

    def simulate(self, rng: np.random.Generator, inside: bool, m: int, shrink: float) -> np.ndarray:
        """``m`` canaries' scores as the claimed mechanism would make them, with the signal shrunk by
        ``shrink`` (1, or 1/√2 for a score on the difference of two rows, whose noise is √2 times larger)."""
        raise NotImplementedError

    def thresholds(self, shrink: float) -> np.ndarray:
        """Fixed by the claim alone (a seeded simulation), before any score is seen (``thresholds_from``)."""
        rng = np.random.default_rng(self.seed)
        out, inside = (self.simulate(rng, b, SIMULATED, shrink) for b in (False, True))
        return thresholds_from(out, inside)

    def result(self, eps_certified: float | None, delta: float) -> dict:
        """The summary's ``audit`` block: the assumption-free (ε, δ) bound, the test against the certified
        trade-off curve (Gaussian DP where the claim is exactly that, the accountant's PLD curve otherwise),
        and the verdict; each score kept and each route gets an equal share of ALPHA."""
        release, k = self.claimed(), self.steps
        alpha = bonferroni(ALPHA, 2 * len(self.scores_kept))      # two routes for each score kept
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
        return {"family": self.family, "observer": self.observer, "mode": "inband" if self.inband else "sidecar",
                "canaries": self.n, "in": int(inside.sum()),
                "steps_observed": self.steps, "eps_lower": best["eps_lower"], "eps_lower_curve": curve,
                "curve": "PLD" if release.sampled else "GDP", "confidence": 1 - ALPHA, "scores": found,
                "eps_certified": eps_certified, "delta": delta,
                "verdict": "refutes the certificate" if refutes else "consistent with the certificate"}


class _Joined:
    """In-band: the run's privatizer, with the canaries' block joined to the run's vector in its own call (its
    own draws) and split off again before the algorithm uses the result. Everything else is the privatizer's."""

    def __init__(self, canaries: Canaries):
        self.canaries = canaries

    def __getattr__(self, name):
        return getattr(self.canaries.mech, name)

    def __call__(self, v: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        c, dim = self.canaries, self.canaries.joins
        block = c.begin().to(v.dtype)
        y = c.mech(torch.cat([v, block], dim), gen)
        c.take(y.narrow(dim, v.shape[dim], block.shape[dim]))
        return y.narrow(dim, 0, v.shape[dim])


def thresholds_from(out: np.ndarray, inside: np.ndarray) -> np.ndarray:
    """Thresholds from scores simulated under the claim: the "out" scores' upper quantiles, which make the
    tightest tests of a correct privatizer, and points between the "out" and "in" means, where a privatizer
    with too little noise separates them."""
    between = out.mean() + (inside.mean() - out.mean()) * np.array([0.25, 0.5, 0.75])
    return np.unique(np.concatenate([np.quantile(out, 1 - np.asarray(FPR_LEVELS)), between]))


def simulated_sums(rng: np.random.Generator, k: int, p: float, mu: float, inside: bool, m: int) -> np.ndarray:
    """Linear scores of m canaries over k releases, each taken part in w.p. p: a sum of N(±μ·inside, 1) over
    the releases taken part in (signs undone)."""
    taken = rng.binomial(k, p, m)
    return taken * mu * inside + np.sqrt(taken) * rng.standard_normal(m)


def simulated_llrs(rng: np.random.Generator, k: int, q: float, mu: float, inside: bool, m: int) -> np.ndarray:
    """Sampled-Gaussian likelihood-ratio scores of m canaries over k releases, each present w.p. q."""
    b = rng.random((m, k)) < q
    return sampled_llr(b * mu * inside + rng.standard_normal((m, k)), q, mu).sum(1)


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
    joins = 0                                                      # rows beside the clients'

    def __init__(self, algo, n: int, d: int, seed: int, device: torch.device, dtype: torch.dtype,
                 inband: bool = False):
        super().__init__(algo, n, seed, device, inband)
        gen = round_generator(seed, AUDIT, 0, "cpu")              # the directions: draw 0; release k's: draw k
        u = torch.randn(n, d, generator=gen, dtype=torch.float64)
        self.u = (u / torch.linalg.vector_norm(u, dim=1, keepdim=True)).to(device, dtype)
        at_bound = algo.bounding(self.u * OVERSIZE)               # Ψ(u_c) at its bound, through the run's Ψ
        self.release = torch.cat([at_bound * self.is_in[:, None], torch.zeros_like(at_bound)])

    def make(self, sign: int) -> torch.Tensor:
        self.takes_part = torch.rand(self.n, generator=self.gen, device=self.device) < self.algo.p
        return sign * self.release

    def score(self, y: torch.Tensor, unit: float) -> torch.Tensor:
        own, blank = ((rows * self.u).sum(1, dtype=torch.float64) * unit for rows in (y[:self.n], y[self.n:]))
        return self.takes_part * torch.stack([own, (own - blank) * PAIRED_SHRINK])

    def simulate(self, rng, inside, m, shrink):
        return simulated_sums(rng, self.steps, self.algo.p, shrink / self.claimed().noise_multiplier, inside, m)


class CentralCanaries(Canaries):
    """Central noise: one canary client per dummy coordinate of the noised vector (one draw on the aggregate:
    there is nothing shared to pair against)."""

    family = "Gaussian noise added by the server to the aggregate"
    joins = -1                                                     # coordinates after the aggregate's

    def __init__(self, algo, n: int, seed: int, device: torch.device, dtype: torch.dtype, inband: bool = False):
        super().__init__(algo, n, seed, device, inband)
        mech, bounding = algo.mech, algo.bounding
        raw = OVERSIZE * torch.eye(n, device=device, dtype=dtype)             # canary c's update: R·e_c
        bounded = bounding(raw).diagonal() * (mech.sensitivity / bounding.bound)  # through Ψ, at the sensitivity
        self.contribution = bounded * self.is_in
        self.hidden = mech.release().sampled        # amplification claimed: the observer must not see who took part
        self.observer = ("the noised aggregate's canary coordinates, every round, not knowing who took part"
                         if self.hidden else "the noised aggregate's canary coordinates, every round it takes part")

    def make(self, sign: int) -> torch.Tensor:
        self.takes_part = torch.rand(self.n, generator=self.gen, device=self.device) < self.algo.p
        return sign * self.contribution * self.takes_part

    def score(self, y: torch.Tensor, unit: float) -> torch.Tensor:
        y = unit * y.double()
        if self.hidden:
            return sampled_llr(y, self.algo.p, self.mech.sensitivity / self.mech.std)[None]
        return (self.takes_part * y)[None]

    def simulate(self, rng, inside, m, shrink):
        mu = shrink / self.claimed().noise_multiplier
        simulated = simulated_llrs if self.hidden else simulated_sums
        return simulated(rng, self.steps, self.algo.p, mu, inside, m)


class SampleCanaries(Canaries):
    """DP-SGD clients: canary c is a sample of client c mod n on dummy coordinate c. Scores: ``own``, that
    coordinate of its client's noisy sum; ``paired``, less the same coordinate of the next client's sum (no
    canary there), which cancels a noise draw shared by the clients."""

    family = "DP-SGD on each client: Poisson-sampled Gaussian, sample level"
    observer = "every noisy DP-SGD step of the canary's client"
    scores_kept = ("own", "paired")
    joins = 1                                                      # coordinates after each client's sum

    def __init__(self, algo, clients: int, n: int, seed: int, device: torch.device, dtype: torch.dtype,
                 inband: bool = False):
        super().__init__(algo, n, seed, device, inband)
        if clients < 2:
            raise ValueError("a DP-SGD audit pairs each client's noisy sum with another client's: it needs 2 clients")
        coords = torch.arange(n, device=device)
        self.own, self.other = (coords % clients, coords), ((coords + 1) % clients, coords)   # (client, coordinate)
        self.rows, self.dtype = clients, dtype

    def make(self, sign: int) -> torch.Tensor:
        """Each "in" canary sampled at the privatizer's rate by the clients' own sampler (``poisson_sample``, its
        draws from the canaries' stream), its gradient ±R·e_c clipped to its clip by the run's rule, in its
        client's row: the canaries' coordinates of each client's clipped sum."""
        mech = self.mech
        rng = np.random.default_rng(round_seed(self.seed, AUDIT, self.steps + 1))
        sampled = torch.from_numpy(ops.poisson_sample(rng, self.n, mech.rate)).to(self.device) & self.is_in
        grad = torch.full((self.n,), sign * OVERSIZE, device=self.device, dtype=self.dtype)
        clipped = grad * clipping.clip_factors(grad.double() ** 2, mech.clip).to(self.dtype)
        sums = torch.zeros(self.rows, self.n, device=self.device, dtype=self.dtype)
        sums[self.own] = clipped * sampled
        return sums

    def score(self, y: torch.Tensor, unit: float) -> torch.Tensor:
        q, sigma = self.algo.ledger.q, self.algo.ledger.sigma
        y = unit * y.double()
        own, other = y[self.own], y[self.other]
        return torch.stack([sampled_llr(own, q, 1 / sigma),
                            sampled_llr((own - other) * PAIRED_SHRINK, q, PAIRED_SHRINK / sigma)])

    def claimed(self) -> GaussianRelease:
        """The sampling rate and noise multiplier the run's certificate was computed with (its ledger's)."""
        return GaussianRelease(self.algo.ledger.sigma, self.algo.ledger.q, amplification=True)

    def simulate(self, rng, inside, m, shrink):
        claim = self.claimed()
        return simulated_llrs(rng, self.steps, claim.sampling, shrink / claim.noise_multiplier, inside, m)


CLIENT_BYTES = 32          # a client canary's peak bytes a coordinate: its float64 draw and unit direction, the
                           # run's dtype copy and its bounded release with the blanks'


def canaries_for(algo, clients, n: int, d: int, seed: int, device: torch.device, dtype: torch.dtype,
                 mode: str = "sidecar") -> Canaries:
    """The audit of ``algo``'s mechanism family (those that declare ``canaries``), beside the
    run (``sidecar``) or in its privatizer calls (``inband``)."""
    inband = mode == "inband"
    if algo.mech.unit == "sample":
        return SampleCanaries(algo, len(clients.data.parts), n, seed, device, dtype, inband)
    if algo.mech.who == "server":
        return CentralCanaries(algo, n, seed, device, dtype, inband)
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else math.inf
    if CLIENT_BYTES * n * d > memory / 2:       # 100,000 of 7,850 coordinates were killed at 20 GB
        most = int(memory / 2 / (CLIENT_BYTES * d)) // 2 * 2
        raise ConfigError("audit.canaries", n, f"an even integer <= {most} here: {n} canary directions of {d} "
                          f"coordinates take about {CLIENT_BYTES * n * d / 2**30:.0f} GiB, over half this machine's "
                          f"{memory / 2**30:.0f} GiB")
    return ClientCanaries(algo, n, d, seed, device, dtype, inband)
