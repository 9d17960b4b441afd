"""Server-side choice of the local-iteration count τ* for ALI-DPFL (ALI Sec. III-D, IV; readings C-A1..C-A5).

Pure numbers-in, numbers-out helpers; no model code. An ALI-DPFL server calls, once per round after aggregation,
:func:`weighted_estimates` (Alg. 2 lines 17-18) and then :meth:`TauSelector.update` (Alg. 2 line 19).

The bound (ALI Theorem 2, eq. 13; App. A, B)::

    h(x)  = ((ξ + δn)/β)·((1 + ηβ)^x − 1) − η(ξ + δn)·x          eq. 11, second term corrected (reading C-A16)
    δn    = 2·√d·σ·C / B                                         Lemma 3
    D(τ)  = η·φ − ρ·h(τ)/(τ·λ²),   φ = ω·(1 − βη/2)               Theorem 2, conditions 2 and φ
    G(τ)  = 1/(T·D(τ)) + √3/3      (+inf where D(τ) ≤ 0 or T ≤ 0)   eq. 13

**Why Condition I (R_s ≥ R_c) gives τ* ≡ 1** (ALI Sec. VI-B; reading C-A2). h(1) = 0 and h(τ)/τ is increasing,
so D(τ) is largest at τ = 1; G decreases in T·D, hence with T the same for every τ the minimiser is τ = 1. A larger τ
can only win when it buys a larger T. With T(τ) = min(R_s·τ, R_c) (reading C-A2) and R_s ≥ R_c, already T(1) = R_c,
so T is the same for every τ and τ* = 1 (the ``remaining`` T mode agrees: with τ ≡ 1, R_s − k ≥ R_c − T_used). The
selector therefore skips the search when R_s ≥ R_c (``adaptive`` is False), as the authors' code does.

Rules (``TauSelector.rule``):

- ``g_bound_v1`` (default, faithful to the text): τ* = argmin_{τ ∈ 1..τ_m} G(τ), τ_m = min(2τ*, tau_cap, R_c − used)
  (Sec. IV-B), with normfl's readings of the quantities the paper never estimates (C-A1, C-A3): F* = 0,
  λ = clip(running min of the global loss, 1e-8, 1 − 1e-6), ω = running min of (||ĝ||/L̂)². If every G(τ) is +inf
  (e.g. ηβ ≥ 2 so φ ≤ 0), τ* is kept and ``infeasible_rounds`` counts it.
- ``closed_form_code``: the authors' later public code, not the paper's text (reading C-A1)::

      B̂ = ⌊q·min_i |D_i|⌋;  T = min(R_s·τ*_prev, R_c);  N_σ = σ²C²d/B̂²
      τ_raw = sqrt(1 + (4/μ̂² + 3C² + 2·Γ̂·T·μ̂ + N_σ) / ((2 + 2/T)·(C² + N_σ) + 1e-6))
      τ* = clamp(⌊τ_raw + 0.5⌋, 1, 100)

  with μ̂, Γ̂ from :func:`code_estimates` (``T_mode=remaining`` swaps in that mode's T at τ*_prev; the default
  ``static`` is the code's T). As in that code it is not limited to doubling nor to R_c − used; the
  caller's τ_k = min(τ*, R_c − T_used) (reading C-A13) keeps the budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

TAU_RULES = ("g_bound_v1", "closed_form_code")
T_MODES = ("static", "remaining")

SQRT3_OVER_3 = math.sqrt(3.0) / 3.0
LAMBDA_FLOOR = 1e-8
LAMBDA_CEIL = 1.0 - 1e-6


# ----------------------------------------------------------------------------------------------------------------------
# eq. 11, Lemma 3, eq. 13
# ----------------------------------------------------------------------------------------------------------------------


def _expm1_minus_x(y: float) -> float:
    """e^y − 1 − y with full relative precision for small |y| (Taylor series), direct otherwise."""
    if abs(y) >= 1.0:
        return math.expm1(y) - y
    term = y * y / 2.0
    total = term
    k = 2
    while abs(term) > 1e-18 * abs(total):
        k += 1
        term *= y / k
        total += term
    return total


def _log1p_minus_x(c: float) -> float:
    """log(1 + c) − c (≤ 0) with full relative precision for small |c| (series), direct otherwise."""
    if abs(c) >= 0.5:
        return math.log1p(c) - c
    power = c * c
    total = -power / 2.0
    k = 2
    while True:
        k += 1
        power *= -c
        term = -power / k
        total += term
        if abs(term) <= 1e-18 * abs(total):
            return total


def h(x: float, eta: float, beta: float, xi: float, noise: float) -> float:
    """ALI eq. 11 (= eq. 24) with the corrected second term (ALI App. A; reading C-A16).

    ``h(x) = ((ξ + δn)/β)·((1 + ηβ)^x − 1) − η·(ξ + δn)·x`` with ``noise`` = δn (:func:`noise_constant`).

    Evaluated as ``η(ξ+δn)/c · [(e^y − 1 − y) + x·(log1p(c) − c)]`` with c = ηβ and y = x·log1p(c): both brackets
    are computed without cancellation, so the result keeps its relative precision for tiny ηβ (where the direct
    formula subtracts two nearly equal numbers). h(0) = h(1) = 0 exactly; h ≥ 0 for x ≥ 1 (Bernoulli); the limit
    β → 0 is 0. Returns +inf on overflow (huge x·ηβ).
    """
    if x < 0:
        raise ValueError(f"h is defined for x >= 0, got {x}")
    if eta < 0 or beta < 0:
        raise ValueError(f"h needs eta >= 0 and beta >= 0, got eta={eta}, beta={beta}")
    a = xi + noise
    c = eta * beta
    if x == 0 or x == 1 or a == 0 or c == 0:
        return 0.0
    lc = math.log1p(c)
    y = x * lc
    try:
        bracket = _expm1_minus_x(y) + x * _log1p_minus_x(c)
    except OverflowError:
        return math.inf
    return eta * a * (bracket / c)


def noise_constant(d: int, sigma: float, clip: float, batch: float) -> float:
    """δn = 2·√d·σ·C / B, the bound on E||g̃ − g|| of ALI Lemma 3; B is the expected batch q·|D_i|."""
    if batch <= 0:
        raise ValueError(f"batch must be > 0, got {batch}")
    return 2.0 * math.sqrt(d) * sigma * clip / batch


def bound_G(tau: int, T: float, eta: float, phi: float, rho: float, lam: float, beta: float, xi: float,
            noise: float) -> float:
    """ALI eq. 13: G(τ) = 1/(T·D) + √3/3 with D = ηφ − ρ·h(τ)/(τ·λ²); +inf where D ≤ 0 or T ≤ 0 (readings C-A1, C-A4).

    +inf also when D is not a finite number (e.g. h overflowed or an estimate is NaN).
    """
    if tau < 1:
        raise ValueError(f"tau must be >= 1, got {tau}")
    if lam <= 0:
        raise ValueError(f"lambda must be > 0, got {lam}")
    if not T > 0:
        return math.inf
    D = eta * phi - rho * h(tau, eta, beta, xi, noise) / (tau * lam * lam)
    if not (math.isfinite(D) and D > 0):
        return math.inf
    return 1.0 / (T * D) + SQRT3_OVER_3


def total_iterations(tau: int, R_s: int, R_c: int, mode: str = "static", rounds_done: int = 0, used: int = 0) -> int:
    """T(τ) in G (reading C-A2): the total local iterations the run will have if τ is used from now on.

    - ``static`` (the authors' code): T(τ) = min(R_s·τ, R_c).
    - ``remaining``: T(τ) = used + min((R_s − rounds_done)·τ, R_c − used), floored at ``used``.
    """
    if mode == "static":
        return min(R_s * tau, R_c)
    if mode == "remaining":
        return used + max(0, min((R_s - rounds_done) * tau, R_c - used))
    raise ValueError(f"unknown T mode {mode!r}; expected one of {T_MODES}")


def argmin_G(tau_max: int, T_of_tau: Callable[[int], float], eta: float, phi: float, rho: float, lam: float,
             beta: float, xi: float, noise: float) -> tuple[int | None, list[float]]:
    """Traverse τ = 1..tau_max and minimise eq. 13 (Alg. 2 line 19). Ties go to the smallest τ.

    Returns (τ*, [G(1), ..., G(tau_max)]); τ* is None when every G is +inf (the bound is infeasible).
    """
    values = [bound_G(t, T_of_tau(t), eta, phi, rho, lam, beta, xi, noise) for t in range(1, tau_max + 1)]
    best: int | None = None
    best_value = math.inf
    for t, value in enumerate(values, start=1):
        if value < best_value:
            best, best_value = t, value
    return best, values


# ----------------------------------------------------------------------------------------------------------------------
# Estimates (Alg. 2 lines 4, 14, 17-18; Sec. IV-B "Perform Estimate"; reading C-A5)
# ----------------------------------------------------------------------------------------------------------------------


@dataclass
class Estimates:
    """One round's server-side quantities, p-weighted over clients (Alg. 2 line 18; reading C-A5).

    ``rho, beta, xi, loss, grad_norm`` feed ``g_bound_v1``; ``mu, gamma`` (μ̂, Γ̂ of :func:`code_estimates`) feed
    ``closed_form_code``. Fields a rule does not use may stay NaN/None.
    """

    rho: float = math.nan
    beta: float = math.nan
    xi: float = math.nan
    loss: float = math.nan
    grad_norm: float = math.nan
    mu: float | None = None
    gamma: float | None = None


def _probabilities(weights: Sequence[float]) -> np.ndarray:
    p = np.asarray(weights, dtype=np.float64).reshape(-1)
    if p.size == 0 or np.any(p < 0) or not p.sum() > 0:
        raise ValueError("weights must be non-negative with a positive sum")
    return p / p.sum()


def _as_numpy(g: Any) -> np.ndarray:
    """A float64 numpy copy of a numpy array or a torch tensor (without importing torch)."""
    if hasattr(g, "detach"):
        g = g.detach().cpu().double().numpy()
    return np.asarray(g, dtype=np.float64)


def _as_matrix(grads: Any, n: int) -> np.ndarray:
    """(n, d) float64 matrix from a list of 1-D vectors or one (n, d) array/tensor."""
    if hasattr(grads, "detach") or isinstance(grads, np.ndarray):
        return _as_numpy(grads).reshape(n, -1)
    return np.stack([_as_numpy(g).reshape(-1) for g in grads])


def weighted_estimates(weights: Sequence[float], rho_i: Sequence[float], beta_i: Sequence[float],
                       grads_global_i: Sequence[Any], loss_i: Sequence[float]) -> Estimates:
    """Alg. 2 lines 17-18 with the server quantities of reading C-A5. ``weights`` are normalised to p_i = w_i/Σw.

    ``grads_global_i`` holds ∇F_i at the new global model (a list of 1-D numpy arrays or torch tensors, or one
    (N, d) array/tensor) and ``loss_i[i]`` is F_i there, both on client i's estimation data (reading C-A5).
    Returns ρ = Σp_iρ_i, β = Σp_iβ_i, ξ = Σp_i||g_i − ĝ|| with ĝ = Σp_ig_i (eq. 9, Def. 2), loss = Σp_iL_i and
    grad_norm = ||ĝ||.
    """
    p = _probabilities(weights)
    n = p.size
    if not (len(rho_i) == len(beta_i) == len(grads_global_i) == len(loss_i) == n):
        raise ValueError("weights, rho_i, beta_i, grads_global_i and loss_i must have one entry per client")
    grads = _as_matrix(grads_global_i, n)
    g_hat = p @ grads
    xi_i = np.linalg.norm(grads - g_hat, axis=1)
    return Estimates(
        rho=float(p @ np.asarray(rho_i, dtype=np.float64)),
        beta=float(p @ np.asarray(beta_i, dtype=np.float64)),
        xi=float(p @ xi_i),
        loss=float(p @ np.asarray(loss_i, dtype=np.float64)),
        grad_norm=float(np.linalg.norm(g_hat)),
    )


def code_estimates(weights: Sequence[float], step_norms: Sequence[float], model_diff_norms: Sequence[float],
                   loss_diffs: Sequence[float]) -> tuple[float, float]:
    """(μ̂, Γ̂) of the ``closed_form_code`` rule (reading C-A1: the authors' code, not the paper); ``weights`` are
    normalised to p_i.

    - μ̂ = Σ_i p_i·||Δw_i|| / (||w_i − w_new|| + 1e-6)  (the code's "strong-convexity" estimate, ``compute_mu``);
    - Γ̂ = |Σ_i p_i·ΔF_i|.

    What the authors' code computes (XinpengLing/ALI-DPFL): on client i's last batch of the round,
    ΔF_i = F_i(after) − F_i(before), "before"/"after" being the local model before/after the last local step
    (clientalidpfl.py lines 77-103). Its ``grad_diff`` is not a gradient difference: ``sub_model`` subtracts the
    two copies' parameters (serveralidpfl.py lines 66-75, called at line 250), so ||Δw_i|| = ||w_after − w_before||,
    the length of that last step. ||w_i − w_new|| is the distance of the client's model to the new global model.
    """
    p = _probabilities(weights)
    gd = np.asarray(step_norms, dtype=np.float64)
    md = np.asarray(model_diff_norms, dtype=np.float64)
    ld = np.asarray(loss_diffs, dtype=np.float64)
    if not (gd.size == md.size == ld.size == p.size):
        raise ValueError("weights, step_norms, model_diff_norms and loss_diffs must have one entry per client")
    mu = float(p @ (gd / (md + 1e-6)))
    gamma = float(abs(p @ ld))
    return mu, gamma


def closed_form_tau(mu: float, gamma: float, clip: float, sigma: float, dim: int, batch_hat: int, T: float,
                    tau_cap: int = 100) -> tuple[int, float]:
    """The authors' code rule (``closed_form_code``, reading C-A1; not in the paper); returns (τ*, τ_raw).

    N_σ = σ²C²d/B̂²; τ_raw = sqrt(1 + (4/μ̂² + 3C² + 2Γ̂Tμ̂ + N_σ) / ((2 + 2/T)(C² + N_σ) + 1e-6));
    τ* = clamp(⌊τ_raw + 0.5⌋, 1, tau_cap) (the code's cap is 100). μ̂ must be > 0 and T > 0.
    """
    if not (mu > 0 and math.isfinite(mu)):
        raise ValueError(f"mu must be a finite positive number, got {mu}")
    if not T > 0:
        raise ValueError(f"T must be > 0, got {T}")
    if batch_hat <= 0:
        raise ValueError(f"batch_hat must be > 0, got {batch_hat}")
    n_sigma = sigma ** 2 * clip ** 2 * dim / batch_hat ** 2
    numerator = 4.0 / mu ** 2 + 3.0 * clip ** 2 + 2.0 * gamma * T * mu + n_sigma
    denominator = (2.0 + 2.0 / T) * (clip ** 2 + n_sigma)
    tau_raw = math.sqrt(1.0 + numerator / (denominator + 1e-6))
    return min(max(1, int(tau_raw + 0.5)), tau_cap), tau_raw


# ----------------------------------------------------------------------------------------------------------------------
# The selector (Alg. 2 line 19; readings C-A1-C-A4)
# ----------------------------------------------------------------------------------------------------------------------


@dataclass
class TauSelector:
    """Server-side τ* choice of ALI-DPFL Algorithm 2 (line 19), with normfl's readings as options.

    Arguments: ``eta`` (η), ``noise`` (δn of :func:`noise_constant`), ``R_s``, ``R_c`` (rounds / DP-SGD iterations
    the budgets allow), ``rule`` (:data:`TAU_RULES`), ``T_mode`` (:data:`T_MODES`, reading C-A2), ``tau_cap`` (100 in
    the paper), ``lambda_const`` / ``omega_const`` (reading C-A1: overrides of the running λ, ω). ``closed_form_code``
    also needs ``clip`` (C), ``sigma`` (σ), ``dim`` (d) and ``batch_hat`` (B̂ = ⌊q·min_i|D_i|⌋), and per round
    ``est.mu`` and ``est.gamma``.

    State: ``tau`` (current τ*; Alg. 2 line 1 starts it at 1, the default), ``history`` (τ* returned by each
    :meth:`update`), ``infeasible_rounds`` (rounds whose τ* was kept because no τ was feasible or the estimates
    were unusable; the caller should warn), ``last_G`` (G(1..τ_m) of the last search), ``lam``/``omega``/``phi``
    (the values last used).

    When R_s ≥ R_c (Condition I) ``adaptive`` is False and τ* ≡ 1 (see the module docstring).
    """

    eta: float
    noise: float
    R_s: int
    R_c: int
    rule: str = "g_bound_v1"
    T_mode: str = "static"
    tau_cap: int = 100
    lambda_const: float | None = None
    omega_const: float | None = None
    clip: float | None = None
    sigma: float | None = None
    dim: int | None = None
    batch_hat: int | None = None
    tau: int = 1
    history: list[int] = field(default_factory=list, init=False)
    infeasible_rounds: int = field(default=0, init=False)
    last_G: list[float] = field(default_factory=list, init=False, repr=False)
    lam: float = field(default=math.nan, init=False)
    omega: float = field(default=math.nan, init=False)
    phi: float = field(default=math.nan, init=False)
    _loss_min: float = field(default=math.inf, init=False, repr=False)
    _omega_min: float = field(default=math.inf, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.rule not in TAU_RULES:
            raise ValueError(f"unknown tau rule {self.rule!r}; expected one of {TAU_RULES}")
        if self.T_mode not in T_MODES:
            raise ValueError(f"unknown T mode {self.T_mode!r}; expected one of {T_MODES}")
        if self.tau_cap < 1:
            raise ValueError(f"tau_cap must be >= 1, got {self.tau_cap}")
        if self.tau < 1:
            raise ValueError(f"the initial tau must be >= 1, got {self.tau}")
        if self.rule == "closed_form_code":
            missing = [k for k in ("clip", "sigma", "dim", "batch_hat") if getattr(self, k) is None]
            if missing:
                raise ValueError(f"tau rule closed_form_code needs {missing}")

    @property
    def adaptive(self) -> bool:
        """Condition I (R_s ≥ R_c) switches the adaptation off: τ* ≡ 1 (ALI Sec. VI-B; reading C-A2)."""
        return self.R_s < self.R_c

    def T_of(self, tau: int, rounds_done: int, used: int) -> int:
        """T(τ) of eq. 13 under this selector's ``T_mode`` (reading C-A2)."""
        return total_iterations(tau, self.R_s, self.R_c, self.T_mode, rounds_done, used)

    def update(self, est: Estimates, rounds_done: int, used: int) -> int:
        """Choose τ* for the next round, after ``rounds_done`` rounds that used ``used`` DP-SGD iterations.

        Returns the new τ* (also stored in ``tau`` and appended to ``history``).
        """
        if not self.adaptive:
            self.tau = 1
        elif self.rule == "g_bound_v1":
            self._update_g_bound(est, rounds_done, used)
        else:
            self._update_closed_form(est, rounds_done, used)
        self.history.append(self.tau)
        return self.tau

    def _update_g_bound(self, est: Estimates, rounds_done: int, used: int) -> None:
        # Running λ and ω (readings C-A1, C-A3), updated from every usable estimate even if a constant overrides them.
        if math.isfinite(est.loss):
            self._loss_min = min(self._loss_min, est.loss)
        if math.isfinite(est.loss) and est.loss > 0 and math.isfinite(est.grad_norm):
            self._omega_min = min(self._omega_min, (est.grad_norm / est.loss) ** 2)
        lam = self.lambda_const if self.lambda_const is not None else self._loss_min
        omega = self.omega_const if self.omega_const is not None else self._omega_min
        self.lam = min(max(lam, LAMBDA_FLOOR), LAMBDA_CEIL) if math.isfinite(lam) else math.nan
        self.omega = omega
        self.phi = omega * (1.0 - est.beta * self.eta / 2.0)
        self.last_G = []
        tau_m = min(2 * self.tau, self.tau_cap, self.R_c - used)
        if tau_m < 1:  # budget spent: nothing to choose
            return
        usable = all(math.isfinite(v) for v in (est.rho, est.beta, est.xi, self.lam, self.omega, self.phi))
        if not usable:
            self.infeasible_rounds += 1
            return
        best, self.last_G = argmin_G(tau_m, lambda t: self.T_of(t, rounds_done, used), self.eta, self.phi, est.rho,
                                     self.lam, est.beta, est.xi, self.noise)
        if best is None:
            self.infeasible_rounds += 1
        else:
            self.tau = best

    def _update_closed_form(self, est: Estimates, rounds_done: int, used: int) -> None:
        if est.mu is None or est.gamma is None or not (est.mu > 0 and math.isfinite(est.mu)) \
                or not math.isfinite(est.gamma):
            self.infeasible_rounds += 1
            return
        T = self.T_of(self.tau, rounds_done, used)  # the code's T = min(R_s·τ*_prev, R_c) in the static mode
        if not T > 0:
            self.infeasible_rounds += 1
            return
        assert self.clip is not None and self.sigma is not None and self.dim is not None and self.batch_hat is not None
        self.tau, _ = closed_form_tau(est.mu, est.gamma, self.clip, self.sigma, self.dim, self.batch_hat, T,
                                      self.tau_cap)
