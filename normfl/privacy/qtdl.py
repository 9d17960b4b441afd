"""QTDL: differentially private quantization of unit-norm vectors (NormFedAvg, NFA Sec. 4, Alg. 1).

Each coordinate u_i in [-1, 1] is stochastically rounded to the grid {-s..s}/s (unbiased, Alg. 1 line 3), then an
integer draw y from the truncated discrete Laplacian L~(m, alpha), P(y) ∝ exp(-alpha |y|) on {-m..m} (eq. 3), is
added as y/s (line 4). Theorem 1 sets alpha = eps/Delta_1 and m so that Z_{m,alpha} >= 1 + 2 Delta_inf, where
Delta_1 and Delta_inf are the sensitivities of s·Q(u) (eq. 6 heuristics or Definition 1 worst case), and claims
(eps, 2^-d)-DP. The eps part holds on the common support, but the 2^-d does not for d >= 2: ``tdl_delta`` gives the
exact delta (about 1/2 or more). A client message is d integers in {-(s+m)..s+m}, i.e.
t = ceil(log2(2(s+m)+1)) bits per coordinate (eq. 7).

The cpSGD baseline (NFA Sec. 6(i)) keeps the quantizer and adds centred Binomial(N, 1/2) noise instead, with N from
cpSGD Theorem 1. Theorem 2 helpers give the per-message epsilon for privacy over all rounds; the composition
used in its proof is ``accounting.composed``. ``QTDL`` and ``Binomial`` are privatizers (``mechanisms.Privatizer``):
``calibrated`` builds each from its theorem. Everything works on integer levels; values are levels / s, computed in
float64 since s can be 2^29.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from normfl.privacy.accounting import EpsDeltaRelease

Shape = Sequence[int] | torch.Size
Device = torch.device | str | None

UNIFORM_AM = 1e-12   # below this alpha·m the TDL magnitudes are drawn uniformly (reading C-N13)
SERIES_AM = 0.5      # below this alpha·m Lemma 1 is evaluated by a power series (the closed form cancels)


# ---------------------------------------------------------------------------------------------- sensitivities


@dataclass(frozen=True)
class Sensitivity:
    """Sensitivities of s·Q(u), in units of one quantization step."""

    l1: float
    linf: float
    l2: float


def heuristic_sensitivity(d: int, s: int, mu: float, scale: float = 1.0) -> Sensitivity:
    """NFA eq. 6 (the form of Theorem 3): Δ1 = 2d + μs√d, Δ∞ = 2 + μs, Δ2 = 2√d + μs, each times ``scale``."""
    root = math.sqrt(d)
    return Sensitivity(l1=scale * (2 * d + mu * s * root), linf=scale * (2 + mu * s), l2=scale * (2 * root + mu * s))


def worst_case_sensitivity(d: int, s: int, scale: float = 1.0) -> Sensitivity:
    """Definition 1's trivial bounds Δ∞ = 2s, Δ1 = 2ds, Δ2 = 2s√d, each times ``scale``.

    ``scale = 1/r`` gives the aggregate-level sensitivities of App. G(iii) (one client moves the mean of r).
    """
    return Sensitivity(l1=scale * 2 * d * s, linf=scale * 2 * s, l2=scale * 2 * s * math.sqrt(d))


# ---------------------------------------------------------------------------------------------- QTDL parameters


def qtdl_parameters(epsilon: float, sens: Sensitivity) -> tuple[float, int]:
    """Theorem 1: alpha = ε/Δ1 and m = ceil(-(Δ1/ε) log(1 - (e^{ε/Δ1} - 1) Δ∞)), claimed (ε, 2^-d)-DP.

    The smallest m with Z_{m,α} ≥ 1 + 2Δ∞ (App. B eq. 16); see ``tdl_delta`` for the δ this really gives.

    Evaluated with expm1/log1p: alpha can be ~1e-18, where the naive formula returns a wrong m.
    """
    if epsilon <= 0 or sens.l1 <= 0 or sens.linf <= 0:
        raise ValueError(f"epsilon and the sensitivities must be positive, got ε={epsilon}, {sens}")
    if epsilon >= math.exp(-1) * sens.l1 / sens.linf:
        raise ValueError(f"Theorem 1 needs ε < e^-1 Δ1/Δ∞ = {math.exp(-1) * sens.l1 / sens.linf:.6g}, got ε={epsilon}")
    alpha = epsilon / sens.l1
    x = math.expm1(alpha) * sens.linf
    if not x < 1:
        raise ValueError(f"log argument 1 - (e^(ε/Δ1) - 1)Δ∞ = {1 - x:.6g} is not positive (ε={epsilon}, {sens})")
    return alpha, math.ceil(-math.log1p(-x) / alpha)


def _tail_mass(m: int, alpha: float) -> float:
    """Σ_{j=1}^m e^{-αj}, stably (→ m as α → 0)."""
    if alpha == 0:
        return float(m)
    return -math.expm1(-alpha * m) / math.expm1(alpha)


def tdl_normaliser(m: int, alpha: float) -> float:
    """Z_{m,α} = Σ_{l=-m}^{m} e^{-α|l|} = 1 + 2(1 - e^{-αm})/(e^α - 1) (eq. 3)."""
    return 1.0 + 2.0 * _tail_mass(m, alpha)


def tdl_pmf(m: int, alpha: float) -> np.ndarray:
    """P(Y = y/s) for y = -m..m under L~(m, α) (eq. 3), as a float64 array of length 2m+1."""
    w = np.exp(-alpha * np.abs(np.arange(-m, m + 1, dtype=np.float64)))
    return w / w.sum()


def _power_sums(m: int, top: int) -> list[int]:
    """S_p = Σ_{j=1}^m j^p for p = 0..top, exactly, from (m+1)^{p+1} - 1 = Σ_{k≤p} C(p+1, k) S_k."""
    sums: list[int] = []
    for p in range(top + 1):
        rest = sum(math.comb(p + 1, k) * sums[k] for k in range(p))
        sums.append(((m + 1) ** (p + 1) - 1 - rest) // (p + 1))
    return sums


def tdl_variance(m: int, alpha: float, s: int) -> float:
    """E[Y²] of Y ~ L~(m, α) in value units (Y = y/s): the closed form of NFA Lemma 1 (≤ m²/s²).

    The closed form cancels catastrophically as α·m → 0, so below α·m = 0.5 the ratio
    Σ j² e^{-αj} / (1/2 + Σ e^{-αj}) is evaluated by its Taylor series in α with exact power sums
    (terms shrink like (αm)^k/k!); it tends to the uniform limit m(m+1)/(3s²). No 2m+1 array is built.
    """
    if m == 0:
        return 0.0
    if alpha * m < SERIES_AM:
        terms = 24
        sums = _power_sums(m, terms + 2)
        scale = float(m)

        def series(p: int) -> float:     # Σ_j j^p e^{-αj} / m^{p+1}, as a Taylor series in α
            return sum((-alpha * scale) ** k / math.factorial(k) * (sums[p + k] / scale ** (p + k + 1))
                       for k in range(terms))

        return 2 * series(2) * scale**2 / (1 / scale + 2 * series(0)) / s**2
    q = math.exp(-alpha)
    one_q = -math.expm1(-alpha)
    qm = math.exp(-alpha * m)
    num = 2 * q * (1 + q - qm * (m * one_q + 1) ** 2 - qm * q)
    den = s**2 * one_q**2 * (one_q + 2 * q * (-math.expm1(-alpha * m)))
    return num / den


def _band_mass(j: int, m: int, alpha: float) -> float:
    """P(y ≤ -m + j - 1) for y ~ L~(m, α): the mass a shift by j levels pushes off the other output's support."""
    if j <= 0:
        return 0.0
    if j > m + 1:
        return 1.0 - _band_mass(2 * m + 1 - j, m, alpha)
    tail = float(j) if alpha == 0 else math.exp(-alpha * (m - j)) * -math.expm1(-alpha * j) / math.expm1(alpha)
    return tail / tdl_normaliser(m, alpha)      # Σ_{i=m-j+1}^{m} e^{-αi} / Z


def tdl_delta(m: int, alpha: float, sens: Sensitivity, d: int) -> float:
    """The exact δ of the d-dimensional TDL mechanism, for any ε ≥ α·Δ1 (worst case over integer level shifts b
    with ||b||∞ ≤ Δ∞, ||b||1 ≤ Δ1): the probability that the output leaves the other input's support.

    Theorem 1's proof (App. B) bounds this by (Δ∞/Z)^d, counting only outputs with *every* coordinate in the
    non-overlapping band; but one coordinate there suffices. With T(j) the mass of j outermost levels, the worst
    shift puts k = min(d, ⌊Δ1⌋ // ⌊Δ∞⌋) coordinates at ⌊Δ∞⌋ and the remainder r on one more (the loss
    -log(1 - T(j)) is convex for j ≤ m + 1), so δ = 1 - (1 - T(⌊Δ∞⌋))^k (1 - T(r)) ≥ T(⌊Δ∞⌋) ≈ Δ∞/Z, which
    is about 1/2 with Theorem 1's m: above 2^-d for every d ≥ 2.
    """
    linf, l1 = int(math.floor(sens.linf)), int(math.floor(sens.l1))
    if linf > m + 1:
        raise ValueError(f"tdl_delta assumes ⌊Δ∞⌋ ≤ m + 1, got Δ∞={sens.linf}, m={m}")
    if linf == 0:
        return 0.0
    k = min(d, l1 // linf)
    rest = l1 - k * linf if k < d else 0
    keep = k * math.log1p(-_band_mass(linf, m, alpha)) + math.log1p(-_band_mass(rest, m, alpha))
    return -math.expm1(keep)


# ---------------------------------------------------------------------------------------------- Binomial, bits


def _cpsgd_ok(n: int, epsilon: float, delta: float, d: int, sens: Sensitivity, p: float) -> bool:
    """Both conditions of cpSGD Theorem 1 (NFA's [2]), with s_c = 1 (reading C-N7)."""
    var = n * p * (1 - p)
    if var < max(23 * math.log(10 * d / delta), 2 * sens.linf):
        return False
    b_p = 2 / 3 * (p**2 + (1 - p) ** 2) + 1 - 2 * p
    c_p = math.sqrt(2) * (3 * p**3 + 3 * (1 - p) ** 3 + 2 * p**2 + 2 * (1 - p) ** 2)
    d_p = 4 / 3 * (p**2 + (1 - p) ** 2)
    bound = (sens.l2 * math.sqrt(2 * math.log(1.25 / delta)) / math.sqrt(var)
             + (sens.l2 * c_p * math.sqrt(math.log(10 / delta)) + sens.l1 * b_p) / (var * (1 - delta / 10))
             + (2 / 3 * sens.linf * math.log(1.25 / delta) + sens.linf * d_p * math.log(20 * d / delta)
                * math.log(10 / delta)) / var)
    return epsilon >= bound


def binomial_trials(epsilon: float, delta: float, d: int, sens: Sensitivity, p: float = 0.5) -> int:
    """Smallest number of trials N meeting cpSGD Theorem 1 (reading C-N7) for (ε, δ)-DP; both conditions are
    monotone."""
    hi = 1
    while not _cpsgd_ok(hi, epsilon, delta, d, sens, p):
        hi *= 2
        if hi > 2**80:
            raise ValueError(f"no N ≤ 2^80 satisfies cpSGD Theorem 1 for ε={epsilon}, δ={delta}, {sens}")
    lo = hi // 2                        # fails (or is 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _cpsgd_ok(mid, epsilon, delta, d, sens, p):
            hi = mid
        else:
            lo = mid
    return hi


def bits_per_coordinate(s: int, m: int) -> int:
    """Eq. 7: t = ceil(log2(2(s+m)+1)), exactly: ceil(log2 x) = (x-1).bit_length() for an integer x ≥ 1."""
    return (2 * (int(s) + int(m))).bit_length()


# ---------------------------------------------------------------------------------------------- Theorem 2


def theorem2_epsilon(total: float, delta: float, r: int, n: int) -> float:
    """NFA Theorem 2: the ε with min(1, 2r/n)·(ε/8 + ε²/(256 log(1/δ))) = ``total`` (the positive root)."""
    c = total / min(1.0, 2 * r / n)
    log = math.log(1 / delta)
    return 16 * c / (1 + math.sqrt(1 + c / log))     # = 16 L (sqrt(1 + c/L) - 1), without the cancellation


def per_message_epsilon(epsilon: float, delta: float, rounds: int) -> float:
    """NFA Theorem 2: ε_0 = ε / (8 sqrt(2K log(1/δ))), the budget of each message (fed to Theorem 1)."""
    return epsilon / (8 * math.sqrt(2 * rounds * math.log(1 / delta)))


# ---------------------------------------------------------------------------------------------- samplers


def _rand(shape: Shape, gen: torch.Generator) -> torch.Tensor:
    return torch.rand(tuple(shape), generator=gen, device=gen.device, dtype=torch.float64)


def _quantize(u: torch.Tensor, s: int, gen: torch.Generator) -> torch.Tensor:
    """s·Q(u) as float64 integers (exact below 2^53), computed in place: the per-round hot path."""
    us = u.detach().to(torch.float64) * s                          # a new tensor, even for float64 u
    b = us.floor()
    up = _rand(us.shape, gen).to(us.device) < us.sub_(b)            # Bernoulli(us - b)
    return b.add_(up).clamp_(-s, s)


def quantize_levels(u: torch.Tensor, s: int, gen: torch.Generator) -> torch.Tensor:
    """Alg. 1 line 3: int64 levels s·Q(u) in {-s..s}, b = floor(us) plus Bernoulli(us - b); unbiased, E = us."""
    return _quantize(u, s, gen).to(torch.int64)


def _tdl(shape: Shape, m: int, alpha: float, gen: torch.Generator) -> torch.Tensor:
    """TDL draws as float64 integers on the generator's device (see ``tdl_levels``), with two uniforms per draw."""
    shape = tuple(shape)
    if m == 0:
        return torch.zeros(shape, dtype=torch.float64, device=gen.device)
    if alpha * m < UNIFORM_AM:
        mag = torch.randint(1, m + 1, shape, generator=gen, device=gen.device, dtype=torch.float64)
    else:
        tail = -math.expm1(-alpha * m)
        mag = _rand(shape, gen).mul_(-tail).log1p_().div_(-alpha).floor_().add_(1).clamp_(1, m)
    p0 = 1 / tdl_normaliser(m, alpha)            # V < p0: zero; p0 <= V < (1 + p0)/2: negative; else positive
    v = _rand(shape, gen)
    return mag.masked_fill_(v < p0, 0).mul_(torch.where(v < (1 + p0) / 2, -1.0, 1.0))


def tdl_levels(shape: Shape, m: int, alpha: float, gen: torch.Generator, device: Device = None) -> torch.Tensor:
    """Integer draws y in {-m..m} with P(y) ∝ exp(-α|y|) (eq. 3), i.i.d., as int64 on ``device``.

    y = 0 w.p. 1/Z; otherwise a random sign and a magnitude j from the exact inverse CDF of P(j) ∝ e^{-αj} on
    {1..m}: j = 1 + floor(-log1p(-U(1 - e^{-αm}))/α), clamped to [1, m]; uniform on {1..m} if αm < 1e-12.
    One uniform decides zero and sign together, another gives the magnitude.
    """
    return _tdl(shape, m, alpha, gen).to(device=device, dtype=torch.int64)


def centered_binomial_levels(shape: Shape, trials: int, gen: torch.Generator, device: Device = None,
                             p: float = 0.5) -> torch.Tensor:
    """float64 draws Z - N p with Z ~ Binomial(N, p) i.i.d. (cpSGD noise on the integer grid).

    torch.binomial takes float64 counts and, for a float64 tensor, samples with Hörmann's BTRS rejection algorithm
    in double precision, which is exact up to float64 rounding for counts of ~1e10 (integers below 2^53).
    """
    count = torch.full(tuple(shape), float(trials), dtype=torch.float64, device=gen.device)
    z = torch.binomial(count, torch.full_like(count, p), generator=gen)
    return (z - trials * p).to(device)


# ---------------------------------------------------------------------------------------------- mechanisms


class _Privatizer:
    """Shared part of both mechanisms: the Alg. 1 quantizer, integer noise levels, and values = levels / s.

    As a privatizer (``mechanisms.Privatizer``) it also carries what calibrated it: the per-message
    ``epsilon`` and ``delta``, the ``sensitivity`` of s·Q(u) and who adds the noise (``client``, or
    ``server`` on the mean of the quantized messages, App. G(iii)); ``calibrated`` builds it from them.
    The privacy unit is one sample of a client's data; neighbours differ in exactly one sample (NFA eq. 2).
    """

    name = "quantized"
    paper = "DP-NormFedAvg, arXiv:2106.07094"
    unit = "sample"
    neighbouring = "replace"
    alpha: float | None = None          # TDL's α (QTDL)
    trials: int | None = None           # the Binomial's N

    def __init__(self, s: int, m: int, epsilon: float | None = None, delta: float | None = None,
                 sensitivity: Sensitivity | None = None, who: str = "client"):
        self.s, self.m = int(s), int(m)
        self.epsilon, self.delta, self.sensitivity, self.who = epsilon, delta, sensitivity, who
        self.delta_label, self.delta_exact = delta, None       # the δ as the theorem states it; the exact δ

    @property
    def bits(self) -> int:
        """Bits per coordinate of the integer message (eq. 7)."""
        return bits_per_coordinate(self.s, self.m)

    def noise_levels(self, shape: Shape, gen: torch.Generator, device: Device) -> torch.Tensor:
        raise NotImplementedError

    def quantize(self, u: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """Q(u) = levels / s, in u's dtype."""
        return (quantize_levels(u, self.s, gen).to(torch.float64) / self.s).to(u.dtype)

    def noise(self, shape: Shape, gen: torch.Generator, device: Device = None,
              dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """η = noise levels / s."""
        return (self.noise_levels(shape, gen, device).to(torch.float64) / self.s).to(dtype)

    def __call__(self, u: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """M(u) = Q(u) + η (eq. 5), unbiased, in u's dtype and on u's device."""
        levels = quantize_levels(u, self.s, gen).to(torch.float64)
        levels = levels + self.noise_levels(u.shape, gen, u.device).to(torch.float64)
        return (levels / self.s).to(u.dtype)

    def mean(self, u: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """The mean of the messages of the rows of ``u`` as the server gets it: of M(u_i) when each client adds
        its noise, or of Q(u_i) plus one noise draw when the server adds it (App. G(iii))."""
        if self.who == "client":
            return self(u, gen).mean(0)
        return self.quantize(u, gen).mean(0) + self.noise(u.shape[1:], gen, u.device, u.dtype)

    def release(self) -> EpsDeltaRelease:
        """One message: (ε, δ)-DP by the theorem that calibrated it."""
        return EpsDeltaRelease(self.epsilon, self.delta)

    def describe(self) -> dict:
        sens = self.sensitivity
        return {"mechanism": self.name, "paper": self.paper, "noise_by": self.who, "s": self.s, "m": self.m,
                "std": self.std, "bits_per_coord": self.bits,
                "sensitivity": None if sens is None else {"l1": sens.l1, "linf": sens.linf, "l2": sens.l2},
                "alpha": self.alpha, "trials": self.trials,
                "per_message": {"epsilon": self.epsilon, "delta": self.delta_label, "delta_exact": self.delta_exact}}


class QTDL(_Privatizer):
    """Alg. 1: per-coordinate quantization to the 1/s grid plus truncated discrete Laplacian noise."""

    name = "qtdl"

    def __init__(self, s: int, m: int, alpha: float, **privacy):
        super().__init__(s, m, **privacy)
        self.alpha = float(alpha)

    @classmethod
    def calibrated(cls, s: int, epsilon: float, sens: Sensitivity, d: int, who: str = "client") -> QTDL:
        """Theorem 1's (α, m) for an ε-message of sensitivity ``sens``; its claimed δ = 2^-d is 0.0 in
        floats, and ``delta_exact`` is what the mechanism really gives (``tdl_delta``)."""
        alpha, m = qtdl_parameters(epsilon, sens)
        mech = cls(s, m, alpha, epsilon=epsilon, delta=2.0 ** -d, sensitivity=sens, who=who)
        mech.delta_label, mech.delta_exact = f"2^-{d}", tdl_delta(m, alpha, sens, d)
        return mech

    @property
    def std(self) -> float:
        """Noise std per coordinate in value units, sqrt(V(m, α)) (Lemma 1)."""
        return math.sqrt(tdl_variance(self.m, self.alpha, self.s))

    def noise_levels(self, shape: Shape, gen: torch.Generator, device: Device) -> torch.Tensor:
        return tdl_levels(shape, self.m, self.alpha, gen, device)


class Binomial(_Privatizer):
    """cpSGD baseline (NFA Sec. 6(i); Agarwal et al., arXiv:1805.10559): the same quantization plus centred
    Binomial(N, 1/2) noise on the integer grid.

    ``bits`` applies eq. 7 with m = N, as the paper's tables do (NFA Tables 2, 4; reading C-N7); an odd N gives
    half-integer levels.
    """

    name = "binomial"

    def __init__(self, s: int, trials: int, p: float = 0.5, **privacy):
        super().__init__(s, trials, **privacy)
        self.trials, self.p = int(trials), float(p)

    @classmethod
    def calibrated(cls, s: int, epsilon: float, delta: float, sens: Sensitivity, d: int,
                   who: str = "client") -> Binomial:
        """The fewest trials N that cpSGD Theorem 1 makes (ε, δ)-DP for a message of sensitivity ``sens``."""
        return cls(s, binomial_trials(epsilon, delta, d, sens), epsilon=epsilon, delta=delta, sensitivity=sens,
                   who=who)

    @property
    def std(self) -> float:
        """Noise std per coordinate in value units, sqrt(N p (1-p)) / s."""
        return math.sqrt(self.trials * self.p * (1 - self.p)) / self.s

    def noise_levels(self, shape: Shape, gen: torch.Generator, device: Device) -> torch.Tensor:
        return centered_binomial_levels(shape, self.trials, gen, device, self.p)
