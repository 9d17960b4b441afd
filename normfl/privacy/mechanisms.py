"""Privatizers: the noise a private release gets, who adds it, and what it costs.

Every noisy release in normfl goes through one privatizer ``m``:

- ``m(v, gen)``: v privatized with draws from ``gen`` (a row-wise stack ``[n, d]`` or one vector);
- ``m.sensitivity``: how far one neighbouring change can move v (an l2 norm, or ``qtdl.Sensitivity``);
- ``m.std``: the per-coordinate standard deviation of the noise on v;
- ``m.who``: ``client`` (each client on its own upload) or ``server`` (one draw on the aggregate);
- ``m.unit``: the privacy unit, ``client`` (all of a client's data) or ``sample`` (one of its samples),
  and ``m.neighbouring``: neighbouring data differ by adding/removing or by replacing that unit;
- ``m.not_certified()``: why the ε its releases compose to is not a certificate against everyone who sees
  them, in short sentences (empty where it is one; a privatizer without it has none to give);
- ``m.release()``: one release as the accountant reads it (``accounting.GaussianRelease`` for the
  Gaussians, composed by dp-accounting; ``accounting.EpsDeltaRelease`` for QTDL and the Binomial,
  composed by NFA Theorem 2's proof); ``m.describe()``: the same facts for ``summary.json``.

The draws are the caller's: an algorithm passes the generator of its (seed, stream, round)
(``ops.round_generator``), so a run is reproducible and every round gets fresh noise.

A Gaussian privatizer on clients' own uploads checks, on the CPU, that each upload is within its sensitivity
before it adds the noise (``within``): an algorithm that forgot to clip or normalize (one's own, in one file)
stops with a ``PrivacyError`` instead of reporting an ε its releases do not have. On a GPU the check would make
the host wait each round; the canary audits and the CPU runs a new algorithm is tried on catch it there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

from normfl.errors import PrivacyError
from normfl.privacy.accounting import EpsDeltaRelease, GaussianRelease
from normfl.privacy.qtdl import QTDL, Binomial, Sensitivity

WHO = ("client", "server")
UNITS = {"client": "one client (all its data)", "sample": "one sample of a client's data (each client separately)"}
RELATIONS_TEXT = {"add_remove": "adding or removing one client", "replace": "replacing one client's data"}

__all__ = ["Privatizer", "Gaussian", "SampledGaussian", "QTDL", "Binomial", "WHO", "UNITS"]


class Privatizer(Protocol):
    name: str
    paper: str
    who: str
    unit: str
    neighbouring: str
    sensitivity: float | Sensitivity
    std: float

    def __call__(self, v: torch.Tensor, gen: torch.Generator) -> torch.Tensor: ...

    def release(self) -> GaussianRelease | EpsDeltaRelease: ...

    def describe(self) -> dict: ...


def within(v: torch.Tensor, bound: float, name: str) -> None:
    """Raise ``PrivacyError`` unless each row of ``v`` (each client's upload) has l2 norm at most ``bound``, to
    the rounding of ``v``'s precision. On the CPU only, where reading the norms back makes nothing wait."""
    if v.device.type != "cpu" or not 0 < bound < math.inf or v.numel() == 0:
        return
    from normfl.syncs import reading

    with reading():
        norms = torch.linalg.vector_norm(v.float(), dim=-1).reshape(-1)
        worst = int(norms.argmax())
        norm = float(norms[worst])
    if not norm <= bound * (1 + max(1e-4, 8 * torch.finfo(v.dtype).eps)):      # NaN fails too
        raise PrivacyError(f"privacy: an upload handed to the {name} privatizer has l2 norm {norm:.6g} (row {worst}), "
                           f"above the sensitivity {bound:.6g} its noise is calibrated to, so its release would not "
                           "be as private as the run reports; the algorithm must bound each upload (clip or "
                           "normalize it to that norm) before privatizing it")


def _gaussian(v: torch.Tensor, std: float, gen: torch.Generator) -> torch.Tensor:
    return v + std * torch.randn(v.shape, generator=gen, device=v.device, dtype=v.dtype)


@dataclass(frozen=True)
class Gaussian:
    """The Gaussian mechanism on a vector of l2 sensitivity S: v + N(0, std² I), noise multiplier std/S.

    Per client (``who=client``), each client privatizes its own bounded upload, as DP-α-NormEC
    (arXiv:2502.13482, Alg. 1 line 8), DP-Clip21 (arXiv:2305.18929) and DP-Fed-α-NormEC do; central
    (``who=server``), the server adds one draw to the aggregate, as DP-FedAvg (McMahan et al.,
    arXiv:1710.06963) and the DP-SGD baseline of α-NormEC (eq. 2). Its noise comes from
    ``Privacy.gaussian``: the papers' rule std = S·σ_mult, or a multiplier an accountant solved.
    ``sampling`` is each client's chance to take part in a release; amplification by it is claimed
    only when ``amplification`` is set.
    """

    sensitivity: float
    std: float
    who: str = "client"
    sampling: float = 1.0
    amplification: bool = False
    neighbouring: str = "add_remove"
    name: ClassVar[str] = "gaussian"
    unit: ClassVar[str] = "client"
    paper: ClassVar[str] = "Gaussian mechanism; client-level DP-FL as in arXiv:1710.06963"

    @property
    def noise_multiplier(self) -> float:
        """std / S, what an accountant needs (0 for an unbounded, noiseless upload)."""
        return self.std / self.sensitivity if 0 < self.sensitivity < math.inf else 0.0

    def __call__(self, v: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        if self.who == "client":                   # rows are the clients' own uploads (the server's sum is not)
            within(v, self.sensitivity, self.name)
        return v if self.std == 0.0 else _gaussian(v, self.std, gen)

    def release(self) -> GaussianRelease:
        return GaussianRelease(self.noise_multiplier, self.sampling, self.amplification, self.neighbouring)

    def not_certified(self) -> list[str]:
        """Amplification by sampling needs who took part kept secret; the server sees every client's own upload."""
        if self.who == "client" and self.amplification and self.sampling < 1:
            return [f"the server sees who uploads, so amplification by sampling at q={self.sampling:g} does not "
                    "hold against it (only against an observer of the models)"]
        return []

    def describe(self) -> dict:
        who = ("each client adds its own noise and the server sees every upload" if self.who == "client"
               else "a trusted server adds one noise draw to the aggregate")
        amp = (f"amplification by Poisson sampling at q={self.sampling:g} is claimed (participation must stay "
               "secret)" if self.amplification and self.sampling < 1 else
               "no amplification by sampling is claimed: every round is charged")
        return {"mechanism": self.name, "paper": self.paper, "noise_by": self.who, "sensitivity": self.sensitivity,
                "std": self.std, "noise_multiplier": self.noise_multiplier, "sampling_rate": self.sampling,
                "neighbouring": self.neighbouring, "amplification_claimed": self.amplification and self.sampling < 1,
                "assumptions": f"client-level DP, neighbouring runs differ by {RELATIONS_TEXT[self.neighbouring]}; "
                               f"{who}; {amp}"}


@dataclass(frozen=True)
class SampledGaussian:
    """DP-SGD's noise (Abadi et al., arXiv:1607.00133), as each ALI-DPFL client adds it
    (arXiv:2308.10457, Alg. 1 lines 6-11): the per-sample gradients of a Poisson batch at rate q,
    each clipped to C, are summed and N(0, σ²C² I) is added to the sum. One step is one
    Poisson-sampled Gaussian release of noise multiplier σ about one sample of the client's data."""

    clip: float
    sigma: float
    rate: float
    who: ClassVar[str] = "client"
    unit: ClassVar[str] = "sample"
    neighbouring: ClassVar[str] = "add_remove"
    name: ClassVar[str] = "sampled_gaussian"
    paper: ClassVar[str] = "DP-SGD, arXiv:1607.00133"

    @property
    def sensitivity(self) -> float:
        return self.clip

    @property
    def std(self) -> float:
        return self.sigma * self.clip

    def __call__(self, clipped_sum: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        return _gaussian(clipped_sum, self.std, gen)

    def release(self) -> GaussianRelease:
        return GaussianRelease(self.sigma, self.rate, amplification=True)

    def describe(self) -> dict:
        return {"mechanism": self.name, "paper": self.paper, "noise_by": self.who, "unit": UNITS[self.unit],
                "sensitivity": self.sensitivity, "std": self.std, "noise_multiplier": self.sigma,
                "clip": self.clip, "sampling_rate": self.rate}
