"""What every algorithm shares: the round interface, its privatizer and what that privatizer costs."""

from __future__ import annotations

import functools
from typing import Protocol

import torch

from normfl.ops import NOISE, Participation, Streams
from normfl.privacy import Privacy, Privatizer, ledger


def on_device(value, device: torch.device | None):
    """``value`` with its tensors on ``device``: a tensor, the tensors in a dict, list or tuple, or an object
    with a ``to(device)`` method (``ClientMemory``); anything else as it is."""
    if device is None:
        return value
    if isinstance(value, torch.Tensor) or hasattr(value, "to") and callable(value.to):
        return value.to(device)
    if isinstance(value, dict):
        return {k: on_device(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(on_device(v, device) for v in value)
    return value


class Clients(Protocol):
    """The clients as an algorithm sees them (``normfl.engine.Clients`` is the real one)."""

    side_by_side: bool
    """Whether the clients are computed together (then local steps are best taken by all clients at once)."""

    data: object
    """The clients' data (``normfl.data.ClientData``); ``data.parts[i]`` holds client i's sample indices."""

    def grads(self, x: torch.Tensor, batches=None, ids=None) -> tuple[torch.Tensor, torch.Tensor]:
        """x (``[d]`` or ``[n, d]``) -> (per-client gradients ``[n, d]``, losses ``[n]``) on the clients'
        next batches (or on ``batches``); with ``ids`` only those clients, one row each."""

    def cyclic_pass(self, batch_size: int) -> list:
        """Each client's local data in a fixed order, as a list of steps of per-client batches."""

    def clipped_grad_sums(self, x: torch.Tensor, rate: float, clip: float) -> tuple[torch.Tensor, torch.Tensor, list]:
        """Each client's Poisson batch at ``rate``, its per-sample gradients at x (``[n, d]`` or one ``[d]``)
        clipped to ``clip`` and summed: (sums ``[n, d]``, mean losses ``[n]``, the batches)."""


class Algorithm:
    """One communication round maps the global model x^k to x^{k+1}.

    ``setup`` builds the run's privatizer ``mech`` (``normfl.privacy.mechanisms``; None for a
    non-private run), from which the noise column, ``spent`` and the summary's privacy block all come.

    What the rest of normfl knows of an algorithm it reads from the declarations below, each with a default a
    subclass overrides (docs/own-algorithm.md); nothing outside ``normfl/algorithms`` names an algorithm.
    """

    # -- round state: what a checkpoint keeps (``checkpoint.StateWatch`` stops a run in its first rounds if a
    # round changes an attribute named in neither)
    state: tuple[str, ...] = ()                    # the attributes a round changes: saved and restored exactly
    scratch: tuple[str, ...] = ("generator",)      # changed but remade (Streams: reseeded from (seed, stream, round))
    # -- read from the class, before a run is built (the config's checks)
    own_noise: str | None = None       # why it sizes its noise itself (then a run reads privacy.epsilon and delta
                                       # alone); None: the privacy node's calibration sizes it
    own_round: str | None = None       # why its paper's round is not a step (then reading=pass is refused)
    canaries: bool = False             # whether its privatizer has a canary audit (normfl.privacy.audit.canaries;
                                       # needs ``mech`` a Gaussian and ``bounding``, the Ψ its releases go through)
    poisson_batches: bool = False      # whether its clients draw Poisson batches instead of batch_size minibatches
    # -- read from a built run
    scalars: dict[str, int] | None = None   # the attributes runs may differ in and still take their rounds as one
    # (``run.vectorized``: each becomes a column, rank 2 ([R, 1, 1]) where it meets the clients' rows [R, n, d], 1
    # ([R, 1]) where it meets a model [R, d]; Ψ's β and α come along); None: its runs step alone
    captures_round: bool = False       # its round is one ``clients.grads(x)`` then tensor work with no host
    # sync: on static buffers it is replayed whole from a CUDA graph (``engine.capture.CapturedRound``)
    sampling: Participation | None = None   # who takes part in a round (None: every client, every round)
    bits_per_coord: int | None = None    # bits per uploaded coordinate (None: the model's float width)
    # -- read from the class, for a reader
    paper_name: str | None = None      # what its paper calls it ("α-NormEC"), a figure's name for its runs (``title``);
                                       # None: the class's own name

    @classmethod
    def adds_noise(cls, node) -> bool:
        """Whether a run of this ``algo`` config node adds noise (its ``private`` key by default)."""
        return bool(node.get("private"))

    @classmethod
    def title(cls, node) -> str:
        """What a reader calls a run of this ``algo`` config node (``normfl.collect``'s legends): ``paper_name``,
        "DP-" before it where the run adds noise (DP-α-NormEC)."""
        return "DP-" * cls.adds_noise(node) + (cls.paper_name or cls.__name__)

    @classmethod
    def check(cls, cfg, rules) -> None:
        """Refuse a bad value of this algorithm's keys before any work starts. ``rules`` is
        ``normfl.config.checks``: ``rules.number(cfg, "algo.KEY", ok, allowed)``, ``rules.choice`` and
        ``rules.unread`` raise ``ConfigError`` naming the key, its value and what is allowed."""

    def __init__(self, private: bool = False, name: str = ""):
        self.private, self.name = bool(private), name or type(self).__name__
        self.mech: Privatizer | None = None

    def setup(self, x0: torch.Tensor, num_clients: int, rounds: int, privacy: Privacy, seed: int) -> None:
        """Allocate state for ``num_clients`` clients and calibrate the noise for ``rounds`` calls of ``round``
        (communication steps: a run's rounds, or its passes times their steps under reading=pass)."""
        self.num_clients, self.seed, self.privacy = num_clients, seed, privacy
        self.generator = Streams(seed)       # generator(stream, k, device): round k's draws of a stream

    @property
    def p(self) -> float:
        """Each client's chance to take part in a round."""
        return 1.0 if self.sampling is None else self.sampling.p

    def round(self, k: int, x: torch.Tensor, clients: Clients) -> tuple[torch.Tensor, dict]:
        """Run round k from x; return x^{k+1} and {'loss': mean client loss at x^k, 'uploads': int}."""
        raise NotImplementedError

    def privatize(self, v: torch.Tensor, k: int) -> torch.Tensor:
        """v through the privatizer with round k's noise draws (v itself when not private)."""
        return v if self.mech is None else self.mech(v, self.generator(NOISE, k, v.device))

    # -- what the privacy costs ------------------------------------------------------------------------------
    @property
    def noise_std(self) -> float:
        """Per-coordinate std of the privacy noise on the vector it is added to."""
        return self.mech.std if self.mech is not None else 0.0

    def releases(self, steps: int) -> int:
        """How many releases each client has made after ``steps`` communication steps (at most one each)."""
        return steps

    def planned_releases(self, steps: int) -> int:
        """The releases each client will have made when a run of ``steps`` communication steps ends."""
        return steps

    @functools.cached_property
    def ledger(self):
        """The accountant of one client's releases (built on first use: a PLD is not free)."""
        return ledger(self.mech.release(), self.privacy.delta, self.p)

    def spent(self, steps: int) -> dict[str, float | None]:
        """Epsilon spent after ``steps`` communication steps, by column (``eps_rdp``, ``eps_pld``, ...)."""
        return {f"eps_{col}": v for col, v in self.ledger.spent(self.releases(steps)).items()}

    def privacy_report(self, steps: int) -> dict:
        """The summary's privacy block after ``steps`` steps: the privatizer, the target and epsilon spent."""
        std_on, weight = self.noise_target()
        return {**self.mech.describe(), "std_on": std_on,
                "std_in_update": None if weight is None else weight * self.mech.std,
                "target_epsilon": self.privacy.epsilon, "delta": self.privacy.delta,
                **{f"epsilon_{col.removeprefix('eps_')}": v for col, v in self.spent(steps).items()},
                **self.privacy_extra(steps)}

    def privacy_extra(self, steps: int) -> dict:
        """What this algorithm adds to its privacy block."""
        return {}

    def not_certified(self) -> list[str]:
        """Why the ε this run reports is not a certificate (empty where it is one): its privatizer's reasons."""
        why = getattr(self.mech, "not_certified", None)
        return why() if why else []

    def noise_target(self) -> tuple[str | None, float | None]:
        """The privacy block's ``std_on`` (the vector the noise of std ``std`` is added to, and its bound) and
        the weight w of that vector in the direction the server steps along (before the step size; per client,
        before the average over clients, when each client adds its own noise): ``std_in_update`` = w·std, the
        noise std one release puts into that direction, comparable across algorithms. Each private algorithm
        states its own."""
        return None, None

    # -- checkpoint ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The attributes named in ``state``; tensors copied (a run side by side holds views of its group's)."""
        return {name: (v.detach().clone() if isinstance(v, torch.Tensor) else v)
                for name in self.state if hasattr(self, name) for v in (getattr(self, name),)}

    def load_state_dict(self, state: dict, device: torch.device | None = None) -> None:
        """Put ``state_dict``'s attributes back, their tensors on ``device`` (a checkpoint is read on the CPU
        and may come from another device)."""
        vars(self).update({name: on_device(state[name], device) for name in self.state if name in state})

    def memory_gap(self) -> float | None:
        """||ĝ - mean_i g_i|| for error-feedback methods (0 without noise); None otherwise."""
        return None


class GaussianAlgorithm(Algorithm):
    """An algorithm of the NORMEC family: a local step γ, a weight β, the smoothing α, and, when private,
    a Gaussian privatizer on a release of norm at most ``bounding.bound``, calibrated by the ``privacy``
    config (the papers' rule or an accountant). ``noise_by``: who adds it; ``mean_of``: the noise goes on
    the mean of that many releases (the DP-SGD baseline's central noise)."""

    noise_by: str = "client"
    canaries = True                    # Gaussian noise added by each client or by the server

    @classmethod
    def check(cls, cfg, rules) -> None:
        rules.number(cfg, "algo.gamma", lambda v: v > 0, "a number > 0")
        rules.number(cfg, "algo.beta", lambda v: v > 0, "a number > 0")

    def __init__(self, gamma: float, beta: float, alpha: float = 0.0, private: bool = False, name: str = ""):
        super().__init__(private, name)
        self.gamma, self.beta, self.alpha = float(gamma), float(beta), float(alpha)

    def setup(self, x0, num_clients, rounds, privacy, seed, mean_of: int = 1):
        super().setup(x0, num_clients, rounds, privacy, seed)
        if self.private:
            self.mech = privacy.gaussian(self.bounding.bound, self.beta, rounds, self.p, self.noise_by, mean_of)

    @property
    def noise_multiplier(self) -> float:
        """Noise std over the sensitivity of the vector it is added to (what an accountant needs)."""
        return self.mech.noise_multiplier if self.mech is not None else 0.0

    def privacy_extra(self, steps: int) -> dict:
        pr = self.privacy
        return {"calibration": "paper formula" if pr.uses_formula else f"solved with {pr.accountant}"}
