"""The release audit (``audit.mode=release``): canary clients join the run, go through the algorithm's own round,
and what the server broadcasts is observed.

The side-car and in-band canaries (``canaries``) observe the privatizer's output, so they check the noise, not what
the algorithm does with it: a server that steps with the clients' values before their noise, a client memory the
server reads built from un-noised values, or a release the accountant does not count goes unseen. Here nothing of
the algorithm is assumed but its privatizer (``algo.mech``, a client-level Gaussian) and its ``releases``:

- **Canaries.** N canary clients join the n real ones (ids n, ..., n + N - 1), so the run, its participation draws
  and its noise are those of n + N clients, and the certificate is computed for that run. Each canary is "in" with
  probability 1/2 from the audit's own stream: its ``clients.grads`` row is R·u_c, a fixed direction far beyond any
  bound (R = ``canaries.OVERSIZE``), so that the algorithm's own Ψ, memories, local steps, privatizer and server
  step act on it as on any client; an "out" canary is a client without data (its rows are zero): the population,
  and every weight and draw that depends on its size, is the same whichever canaries are in. The directions have
  disjoint supports (a random partition of the model's coordinates into blocks of d // N, random signs), so no
  canary's pull shows on another's coordinates, however the algorithm weights coordinates.
- **Observed.** The model x^k broadcast after every step (every client receives it: the all-iterates threat model
  of DP-FL), and the final model alone.
- **Scores.** Final model: <x^0 - x^K, u_c>, the canary's pull summed over the run (a server steps against the
  clients' gradients, and a canary's is R·u_c). All iterates: the same sum with
  each coordinate weighted by 1 / (its noise's variance as the broadcast models show it: the mean squared second
  difference of that coordinate over the steps, which cancels a pull constant from step to step, as FedAvg's, or
  growing linearly, as error feedback's). For a correct algorithm, whose noise is the same on every coordinate,
  this is the plain projection; where part of the broadcast carries less noise than the rest (a value used before
  its noise, noise on half the vector), those coordinates dominate.
- **Bounds.** From each score, guesses fixed in advance (the k highest "in", the k lowest "out", for k in
  ``FRACTIONS`` of N) and Steinke, Nasr and Jagielski's one-run bound (``stats.one_run_p``), which assumes nothing of
  the algorithm: an assumption-free (ε, δ) lower bound, and a test of the accountant's certified trade-off curve
  (every (ε, δ(ε)) it certifies at once: Gaussian DP where no sampling is claimed, its PLD otherwise), reported as
  the ε of the least private member of the claim's family it refutes. The verdict is wrong with probability at
  most ``canaries.ALPHA``, shared by the scores, routes and guesses.
- **Data flow.** The canaries' rows are leaves of torch's autograd and the privatizer's input is cut from them:
  its output may carry a canary on, its input may not. A released model still attached to a canary's rows used a
  value that never went through the noise (``leaks``, every step). State a round carries (memories) keeps the mark
  from step to step. Marks follow values, not a choice a value made (a branch, a number taken out of torch), and
  not a round that turns autograd off; so steps 1, 2 and every tenth are also taken again from the state they
  started in, every canary out and every privatizer output and real client's row as it was (``changes``): the
  release of a round that reads the clients only through its privatizer cannot change. Both are exact, not
  statistical.
- **Releases.** The privatizer's calls a step are counted against what the accountant charges for it
  (``algo.releases``): a second noisy release the ledger does not count is seen where its noise would hide it.

What it cannot see: a noise whose size is wrong by less than the aggregate hides (client noise: the mean of M
clients' uploads carries √M times the noise of one, so the models of a correct run are far more private than the
certificate of each upload, and a noise cut by less than about √M leaves them within it); a leak through something
other than the model (a metric, a log); a choice made from un-noised values. The side-car audit checks the
privatizer itself, the release audit what the algorithm does with it.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch

from normfl.errors import ConfigError
from normfl.ops import AUDIT, round_generator
from normfl.privacy.accounting import GaussianRelease
from normfl.privacy.audit.canaries import ALPHA, OVERSIZE, claimed_pld
from normfl.privacy.audit.stats import bonferroni, gdp_epsilon, guessed, one_run_curve_lower, one_run_eps_lower
from normfl.privacy.mechanisms import Gaussian

FRACTIONS = (0.02, 0.08, 0.2, 0.35)     # k / N: the guesses tried, k "in" and k "out" each
SCORES = ("all iterates", "final model")
FLOOR = 1e-6                            # a coordinate's variance is at least this fraction of the median's
REPLAYED, REPLAY_EVERY = (1, 2), 10     # steps taken again with every canary out: these, and every tenth


class _Canary:
    """Canary ``c`` where a list of batches holds a client's (``cyclic_pass``): its row is its direction."""

    __slots__ = ("c",)

    def __init__(self, c: int):
        self.c = c


class CanaryClients:
    """The clients as the audited algorithm sees them: the n real ones, then the N canaries. A canary's gradient, at
    any point and on any batch, is its row: R·u_c when "in", zero when "out" (``Release``)."""

    def __init__(self, clients, audit: Release):
        self.real, self.audit = clients, audit
        self.n = len(clients.data.parts)

    def __getattr__(self, name):                  # data, engine, side_by_side, peek: the real clients'
        return getattr(self.real, name)

    def grads(self, x: torch.Tensor, batches=None, ids=None):
        """As ``Clients.grads``: every client's row (or those of ``ids``, or one per entry of ``batches``)."""
        if batches is not None:
            canary = [isinstance(b, _Canary) for b in batches]
            which = [b.c for b in batches if isinstance(b, _Canary)]
            mine = [b for b in batches if not isinstance(b, _Canary)]
            return self._rows(x, torch.tensor(canary, dtype=torch.bool), which,
                              lambda xr: self.real.grads(xr, batches=mine))
        who = torch.arange(self.n + self.audit.n) if ids is None else torch.as_tensor(ids).reshape(-1).cpu()
        canary = who >= self.n
        real = None if ids is None else who[~canary]                   # every real client when ids is None
        return self._rows(x, canary, (who[canary] - self.n).tolist(), lambda xr: self.real.grads(xr, ids=real))

    def _rows(self, x, canary: torch.Tensor, which: list[int], call):
        """One row per entry of ``canary``: the real clients' from ``call`` at their points of x, canary ``which``'s
        where it is True; a canary's loss is the mean of the real clients' (so the round's mean loss is theirs)."""
        reals = int((~canary).sum())
        g = lr = None
        if reals:
            real = (~canary).to(x.device)
            g, lr = self.audit.tape.play("grads") if self.audit.tape.playing else \
                self.audit.tape.keep("grads", call(x.detach() if x.dim() == 1 else x.detach()[real]))
            g, lr = g.to(x.dtype), lr.to(x.dtype)
        rows = self.audit.rows(which, x.dtype)                           # marked: keeps their mark
        mean = lr.mean() if reals else x.new_zeros(())
        if not canary[:reals].any():                                     # the real clients first, as ids sort them
            return (torch.cat([g, rows]) if reals else rows), \
                (torch.cat([lr, mean.expand(len(which))]) if reals else mean.expand(len(which)).clone())
        G, loss = x.new_zeros(len(canary), x.shape[-1]), x.new_zeros(len(canary))
        at = canary.to(x.device)
        G[~at], loss[~at] = g, lr
        loss[at] = mean
        return G.index_put((at.nonzero().squeeze(1),), rows), loss

    def cyclic_pass(self, batch_size: int):
        """The real clients' steps of one pass, each with the canaries' markers after them."""
        return [[*step, *map(_Canary, range(self.audit.n))] for step in self.real.cyclic_pass(batch_size)]

    def clipped_grad_sums(self, *args):
        raise ConfigError("audit.mode", "release", "sidecar or inband for DP-SGD's sample-level noise (the release "
                          "audit's canaries are clients)")


class _Cut:
    """The run's privatizer, its input cut from the canaries' marks (its output may carry a canary on, its input may
    not), its calls a step counted."""

    def __init__(self, mech, audit: Release):
        self.mech, self.audit = mech, audit

    def __getattr__(self, name):
        return getattr(self.mech, name)

    def __call__(self, v: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        tape = self.audit.tape
        if tape.playing:                            # the step replayed: the same output, whatever the input
            out = tape.play("noised")
            if out.shape != v.shape:
                raise Replayed("the privatizer was handed another shape")
            return out
        self.audit.calls += v.numel() > 0
        self.audit.marked += v.requires_grad
        return tape.keep("noised", self.mech(v.detach(), gen))


class Replayed(Exception):
    """A replayed step took another path than the step it replays (a choice made from the canaries' values)."""


class Tape:
    """What a step's real clients computed and its privatizer released, kept to replay the step (``Release.replay``):
    ``keep`` while recording, ``play`` while replaying, in the order the step asked for them."""

    def __init__(self):
        self.kept: dict[str, list] | None = None
        self.playing = False

    def record(self) -> None:
        self.kept, self.playing = {"grads": [], "noised": []}, False

    def keep(self, kind: str, value):
        if self.kept is not None:
            self.kept[kind].append(value)
        return value

    def play(self, kind: str):
        if not self.kept[kind]:
            raise Replayed(f"the step asked for more {kind} than it did")
        return self.kept[kind].pop(0)

    def stop(self) -> None:
        self.kept, self.playing = None, False


def _carried(value):
    """A round's state with the canaries' mark kept and its history dropped: a tensor attached to their rows becomes
    one attached to a fresh mark (a memory built from un-noised values stays marked from step to step, without a
    graph growing over the run); an object holding such tensors (``ClientMemory``) has them replaced."""
    if isinstance(value, torch.Tensor):
        return value.detach().requires_grad_().clone() if value.requires_grad else value
    for name, v in list(getattr(value, "__dict__", {}).items()):
        if isinstance(v, torch.Tensor) and v.requires_grad:
            setattr(value, name, _carried(v))
    return value


class Release:
    """The release audit of one run (module docstring): ``clients`` are what its algorithm's round takes, ``round``
    runs it, ``result`` is the summary's ``audit`` block."""

    family = "client-level Gaussian, through the algorithm's own round"
    observer = "the model the server broadcasts after every step, and the final model alone"
    inband = True                                 # the canaries are in the run: it steps alone, its key holds them

    def __init__(self, algo, clients, n: int, x0: torch.Tensor, seed: int):
        mech, d = algo.mech, x0.numel()
        if not isinstance(mech, Gaussian) or mech.unit != "client":
            raise ConfigError("audit.mode", "release", f"sidecar or inband with algo={algo.name}: the release audit's "
                              "canaries are clients, and its privatizer is not a client-level Gaussian")
        if n > d:
            raise ConfigError("audit.canaries", n, f"an even integer <= {d // 2 * 2}, the model's {d} coordinates "
                              "(each canary's direction has coordinates of its own)")
        self.algo, self.n, self.dim, self.device = algo, n, d, x0.device
        gen = round_generator(seed, AUDIT, 0, "cpu")
        size = d // n
        self.idx = torch.randperm(d, generator=gen)[: n * size].reshape(n, size).to(x0.device)
        self.sign = ((torch.randint(0, 2, (n, size), generator=gen) * 2 - 1) / math.sqrt(size)).double().to(x0.device)
        self.is_in = (torch.rand(n, generator=gen) < 0.5).to(x0.device)
        # the canaries' un-noised values, marked: a leaf of autograd (the out ones' zeros too)
        self.values = (OVERSIZE * self.sign * self.is_in[:, None]).float().requires_grad_()
        self.block = None                          # their rows, [N, d], made on first use
        self.clients = CanaryClients(clients, self)
        algo.mech = _Cut(mech, self)
        self.x0 = x0.detach()[self.idx].double()
        self.last, self.step_before = self.x0.clone(), None
        self.sumsq = torch.zeros_like(self.x0)
        self.steps = self.pairs = self.calls = self.marked = 0
        self.traced = 0                            # steps whose privatizer received a canary's mark
        self.tape, self.replayed = Tape(), []      # steps replayed with every canary out, and where that changed x
        self.leaks: list[int] = []                 # steps whose released model used an un-noised value
        self.over: list[tuple[int, int, int]] = []   # (step, calls, releases charged) where calls exceed the charge

    def rows(self, canaries: list[int], dtype: torch.dtype) -> torch.Tensor:
        """The gradient rows of ``canaries``, marked (zero while a step is replayed: every canary out); every
        canary's are one block, made once (a fresh selection of it when some take part)."""
        if self.tape.playing:
            return torch.zeros(len(canaries), self.dim, dtype=dtype, device=self.device)
        if self.block is None or self.block.dtype != dtype:
            with torch.enable_grad():
                self.block = torch.zeros(self.n, self.dim, dtype=dtype, device=self.device).scatter(
                    1, self.idx, self.values.to(dtype))
        if len(canaries) == self.n and canaries == list(range(self.n)):
            return self.block
        return self.block[torch.tensor(canaries, dtype=torch.long, device=self.device)]

    def round(self, k: int, x: torch.Tensor, clients=None):
        """Step ``k`` of the algorithm on the clients with the canaries (``clients``: the real ones as this step
        serves them, a lockstep's among runs side by side), then its release observed."""
        if clients is not None:
            self.clients.real = clients
        self.calls = self.marked = 0
        replay = k + 1 in REPLAYED or (k + 1) % REPLAY_EVERY == 0
        if replay:
            before, rng, start = copy.deepcopy(self.algo.state_dict()), torch.get_rng_state(), x.clone()
            self.tape.record()
        with torch.enable_grad():                  # the marks need autograd on (a round may still turn it off)
            x, info = self.algo.round(k, x, self.clients)
        if replay and self.changes(k, start, x.detach(), before, rng):
            self.replayed.append(k + 1)
        self.traced += self.marked > 0
        charged = self.algo.releases(k + 1) - self.algo.releases(k)
        if self.calls > charged:
            self.over.append((k + 1, self.calls, charged))
        if x.requires_grad:
            self.leaks.append(k + 1)
        x = x.detach()
        for name in self.algo.state:               # memories keep their mark, not their history
            if hasattr(self.algo, name):
                setattr(self.algo, name, _carried(getattr(self.algo, name)))
        self.see(x)
        return x, info

    def changes(self, k: int, x: torch.Tensor, released: torch.Tensor, before: dict, rng: torch.Tensor) -> bool:
        """Step ``k`` taken again from the state it started in, every canary out (zero rows), the real clients' rows
        and every privatizer output as they were: whether the model it releases differs. It cannot for a round
        whose release depends on the clients only through its privatizer; it does for a value used before its
        noise, a choice made from one, or another path through the step. The run then goes on from the step as
        taken (its state, and the random streams of torch, put back)."""
        if not torch.isfinite(released).all():      # a diverged step: nothing to compare
            return False
        live, after = {name: getattr(self.algo, name) for name in self.algo.state if hasattr(self.algo, name)}, \
            torch.get_rng_state()
        self.algo.load_state_dict(before, x.device)
        torch.set_rng_state(rng)
        self.tape.playing = True
        try:
            with torch.no_grad():
                again, _ = self.algo.round(k, x, self.clients)
            kept = self.tape.kept
            return bool(kept["grads"] or kept["noised"]) or \
                not bool((again - released).abs().max() <= 1e-6 * released.abs().max())
        except Replayed:
            return True
        finally:
            self.tape.stop()
            vars(self.algo).update(live)
            torch.set_rng_state(after)

    def see(self, x: torch.Tensor) -> None:
        """One broadcast model: its canary coordinates, and the second differences that show each one's noise."""
        now = x[self.idx].double()
        if not torch.isfinite(now).all():          # a diverged run: it ends here, its last finite model stands
            return
        step = now - self.last
        if self.step_before is not None:
            self.sumsq += (step - self.step_before) ** 2
            self.pairs += 1
        self.last, self.step_before, self.steps = now, step, self.steps + 1

    def observe(self, step: int) -> None:
        """Nothing: the release is observed as ``round`` returns it."""

    # -- a checkpoint ----------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"last": self.last, "step_before": self.step_before, "sumsq": self.sumsq, "steps": self.steps,
                "pairs": self.pairs, "leaks": list(self.leaks), "over": list(self.over), "traced": self.traced,
                "replayed": list(self.replayed)}

    def load_state_dict(self, state: dict) -> None:
        on = lambda v: None if v is None else v.to(self.device)   # noqa: E731
        self.last, self.step_before, self.sumsq = on(state["last"]), on(state["step_before"]), on(state["sumsq"])
        self.steps, self.pairs, self.leaks, self.over = state["steps"], state["pairs"], state["leaks"], state["over"]
        self.traced, self.replayed = state["traced"], state["replayed"]

    # -- the scores and the bounds ---------------------------------------------------------------------------
    def scores(self) -> dict[str, np.ndarray]:
        pull = self.x0 - self.last          # x^0 - x^K on each canary's coordinates: a server steps against a gradient
        if self.pairs:
            noise = self.sumsq / self.pairs
            noise = torch.clamp(noise, min=FLOOR * float(noise.median()) + 1e-300)
        else:                                                          # one step: no second difference yet
            noise = torch.ones_like(pull)
        return {"all iterates": (self.sign * pull / noise).sum(1).cpu().numpy(),
                "final model": (self.sign * pull).sum(1).cpu().numpy()}

    def claimed(self) -> tuple[GaussianRelease, int]:
        """The release the certificate composes, and how many of them it charges for the steps observed."""
        return self.algo.mech.release(), self.algo.releases(self.steps)

    def claim_family(self, delta: float):
        """The claim's family: (δ(ε) curve of noise multiplier z, the ε at ``delta`` of z), its sampling, relation
        and number of releases fixed; Gaussian DP in closed form where no sampling is claimed, else dp-accounting's
        PLD (pessimistic for the test, optimistic for the ε read)."""
        release, k = self.claimed()
        if not release.sampled:
            shift = 2.0 if release.relation("pld").name == "REPLACE_ONE" else 1.0
            mu = lambda z: shift * math.sqrt(k) / z             # noqa: E731
            return (lambda z: gdp_curve(mu(z))), (lambda z: gdp_epsilon(mu(z), delta)), "GDP"
        curve = lambda z: claimed_pld(release, k, z, True).get_delta_for_epsilon    # noqa: E731
        eps = lambda z: float(claimed_pld(release, k, z, False).get_epsilon_for_delta(delta))   # noqa: E731
        return (lambda z: (lambda e: np.asarray(curve(z)(e), dtype=float))), eps, "PLD"

    def result(self, eps_certified: float | None, delta: float) -> dict:
        inside = self.is_in.cpu().numpy()
        m = self.n
        ks = sorted({max(1, int(f * m)) for f in FRACTIONS})
        fail = bonferroni(ALPHA, 2 * len(SCORES) * len(ks))          # two routes a score, each k its share
        family, eps_of, shape = self.claim_family(delta)
        found = []
        for name, s in self.scores().items():
            tests = [guessed(s, inside, k) for k in ks]
            lower, best = max((one_run_eps_lower(m, g, delta, fail), g) for g in tests)
            curve = one_run_curve_lower(m, tests, family, fail, eps_of)
            found.append({"observer": name, "eps_lower": lower, "eps_lower_curve": curve["eps_lower_curve"],
                          "guesses": best.guesses, "correct": best.correct})
        eps_lower = max(f["eps_lower"] for f in found)
        eps_curve = max(f["eps_lower_curve"] for f in found)
        why = []
        if self.leaks:
            why.append(f"un-noised values reached the released model in {len(self.leaks)} of {self.steps} steps "
                       f"(first: step {self.leaks[0]}): the round used a value that never went through its privatizer")
        if self.replayed:
            why.append(f"the released model changed when a step was taken again with every canary out and every "
                       f"privatizer output as it was (steps {', '.join(map(str, self.replayed))}): it depends on the "
                       "clients' values other than through the noise")
        if self.over:
            step, calls, charged = self.over[0]
            why.append(f"the privatizer released {calls} times in step {step} where the accountant charges {charged} "
                       f"({len(self.over)} such steps)")
        traced = ("every step" if self.traced == self.steps else
                  f"{self.traced} of {self.steps} steps" + ("" if self.traced else ": not traced (the privatizer never "
                  "received a value marked by the canaries: the round turns autograd off, or takes its values out of "
                  "torch; a leak would be seen by the bounds alone)"))
        if eps_certified is not None and max(eps_lower, eps_curve) > eps_certified:
            why.append(f"the canaries' bound {max(eps_lower, eps_curve):.2f} exceeds the certified ε "
                       f"{eps_certified:.2f}")
        return {"family": self.family, "observer": self.observer, "mode": "release", "canaries": m,
                "in": int(inside.sum()), "clients_audited": self.clients.n + m, "steps_observed": self.steps,
                "eps_lower": eps_lower, "eps_lower_curve": eps_curve, "curve": shape, "confidence": 1 - ALPHA,
                "scores": found, "data_flow_traced": traced, "leaks": len(self.leaks),
                "first_leak": self.leaks[0] if self.leaks else None, "replays_changed": len(self.replayed),
                "releases_over": len(self.over), "eps_certified": eps_certified, "delta": delta,
                "audited": f"a run of {self.clients.n} clients and {m} canary clients: its model is not the run's "
                           "without them, and its certificate is this run's",
                "why": why, "verdict": "refutes the certificate" if why else "consistent with the certificate"}


def gdp_curve(mu: float):
    """δ(ε) of μ-GDP on an array of ε (``stats.gdp_delta``, vectorized)."""
    from scipy.stats import norm

    def delta(eps):
        eps = np.asarray(eps, dtype=float)
        if mu <= 0:
            return np.zeros_like(eps)
        return norm.cdf(-eps / mu + mu / 2) - np.exp(eps + norm.logcdf(-eps / mu - mu / 2))
    return delta
