"""Privacy invariants, property-based: what leaves a client is bounded as the accountant assumes, on
adversarial inputs; the noise has the configured std; ε grows with rounds and shrinks with noise; and
only scalars are ever logged."""

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from normfl import models
from normfl.algorithms import Clip21, DPSGDNorm, FedAvg, FedNormEC, NormEC
from normfl.engine import ClientEngine, FlatModel
from normfl.ops import clip, normalize
from normfl.privacy import Privacy
from normfl.privacy.accounting import GaussianRelease, Ledger
from normfl.privacy.mechanisms import Gaussian
from normfl.privacy.qtdl import QTDL, Binomial
from normfl.results import Recorder
from tests.helpers import Quadratic

MAGNITUDES = [0.0, 1e-30, 1e-6, 1.0, 1e6, 1e30]        # zero, tiny, ordinary and huge; never NaN or inf
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def extreme_stacks(draw, n=4, d=6):
    """A [n, d] float32 stack mixing zero, tiny, ordinary and huge entries of both signs."""
    mags = draw(st.lists(st.sampled_from(MAGNITUDES), min_size=n * d, max_size=n * d))
    signs = draw(st.lists(st.sampled_from([-1.0, 1.0]), min_size=n * d, max_size=n * d))
    return torch.tensor(np.multiply(mags, signs).reshape(n, d), dtype=torch.float32)


ALGOS = {
    "normec": lambda b: NormEC(0.1, b, 0.01),
    "normec_alpha0": lambda b: NormEC(0.1, b, 0.0),
    "clip21": lambda b: Clip21(0.1, b),
    "fed_normec": lambda b: FedNormEC(0.1, b, 0.01, p=0.5, local_steps=2),
    "fedavg_norm": lambda b: FedAvg(0.1, b, 0.01, bounding="norm"),
    "fedavg_clip": lambda b: FedAvg(0.1, b, 0.0, bounding="clip", p=0.5),
    "dpsgd_norm": lambda b: DPSGDNorm(0.1, b, 0.01),
}


@SETTINGS
@given(centers=extreme_stacks(), x0=extreme_stacks(n=1), beta=st.sampled_from([1e-3, 0.1, 10.0]),
       algo=st.sampled_from(sorted(ALGOS)))
def test_every_released_vector_respects_the_upload_bound(centers, x0, beta, algo):
    """Each vector handed to the privatizer (a client's Δ_i / Ψ(U_i), or the server's aggregate) has
    norm <= Ψ's bound, the sensitivity the noise is calibrated to, over three rounds."""
    a = ALGOS[algo](beta)
    released = []

    def spy(v, k):
        released.append(v.clone())
        return v

    a.setup(x0[0], 4, 3, Privacy(), seed=0)
    a.privatize = spy
    x = x0[0]
    for k in range(3):
        x, _ = a.round(k, x, Quadratic(centers))
    assert released
    for v in released:
        norms = torch.linalg.vector_norm(v.double(), dim=-1)
        assert float(norms.max()) <= a.bounding.bound * (1 + 1e-5), (algo, float(norms.max()), a.bounding.bound)


@pytest.mark.slow
@SETTINGS
@given(data=extreme_stacks(n=5, d=8), clip=st.sampled_from([1e-3, 0.1, 1.0]),
       way=st.sampled_from(["layer norms", "vmap", "stacked"]))
def test_clipped_per_sample_sums_are_bounded(data, clip, way):
    """DP-SGD: each of B samples contributes at most C, so a client's sum has norm <= B C, whatever the
    inputs (every way of computing per-sample norms; stacked: beside a client with fewer samples)."""
    torch.manual_seed(0)
    flat = FlatModel(models.logreg((8,), 3), torch.device("cpu"))
    engine = ClientEngine(flat, "stacked" if way == "stacked" else "sequential")
    if way == "vmap":
        engine.norm_layers = None
    y = torch.tensor([0, 1, 2, 0, 1])
    sums, _ = engine.clipped_sums(flat.vector(), [(data, y, 1.0), (data[:2], y[:2], 1.0)], clip)
    assert float(torch.linalg.vector_norm(sums[0].double())) <= 5 * clip * (1 + 1e-5)
    assert float(torch.linalg.vector_norm(sums[1].double())) <= 2 * clip * (1 + 1e-5)


@SETTINGS
@given(u=extreme_stacks(n=3, d=16), s=st.sampled_from([2**6, 2**12]), m=st.sampled_from([1, 9, 413]))
def test_nfa_messages_stay_on_their_grid(u, s, m):
    """NormFedAvg uploads unit(·) or a clipped update, then M(u) = Q(u) + η on the 1/s grid: every
    coordinate is an integer level in [-(s + m), s + m], what t = ceil(log2(2(s+m)+1)) bits carry."""


    gen = torch.Generator().manual_seed(0)
    for v in (normalize(u), clip(u, 1.0)):
        assert float(torch.linalg.vector_norm(v.double(), dim=-1).max()) <= 1 + 1e-6
        for mech in (QTDL(s, m, 0.3), Binomial(s, m)):
            levels = mech(v.double(), gen) * s
            grid = 2 * levels if isinstance(mech, Binomial) and mech.trials % 2 else levels   # odd N: half levels
            assert torch.equal(grid, grid.round())
            assert float(levels.abs().max()) <= s + m


def test_noise_has_the_configured_std():
    """Gaussian, TDL and Binomial noise: sample std within 5 standard errors of the configured one
    (the std of a sample std of N draws is about std / sqrt(2N) for these light-tailed laws)."""
    n = 400_000
    gen = torch.Generator().manual_seed(1)
    z = Gaussian(1.0, 0.37)(torch.zeros(4, n // 4), gen)
    samples = {0.37: z, QTDL(64, 9, 0.3).std: QTDL(64, 9, 0.3).noise((n,), gen, dtype=torch.float64),
               Binomial(64, 101).std: Binomial(64, 101).noise((n,), gen, dtype=torch.float64)}
    for std, sample in samples.items():
        assert abs(sample.double().std().item() - std) <= 5 * std / math.sqrt(2 * n), std


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(z=st.floats(0.5, 8.0), q=st.sampled_from([1.0, 0.25, 0.01]), k=st.integers(1, 400),
       more=st.integers(1, 400), factor=st.floats(1.05, 3.0))
def test_epsilon_grows_with_rounds_and_shrinks_with_noise(z, q, k, more, factor):
    mech = lambda z: GaussianRelease(z, sampling=q, amplification=True)    # noqa: E731
    eps = Ledger(mech(z), 1e-5)
    assert eps.spent(k)["rdp"] <= eps.spent(k + more)["rdp"]
    assert Ledger(mech(z * factor), 1e-5).spent(k)["rdp"] <= eps.spent(k)["rdp"]


def test_only_scalars_are_logged(tmp_path):
    """Metrics (and so W&B) take scalars only: a client's update or data can never be logged by accident."""
    rec = Recorder(tmp_path)
    rec.add({"round": 1, "train_loss": 0.5, "eps_rdp": None})
    for bad in (torch.zeros(3), np.zeros(3), [0.1, 0.2]):
        with pytest.raises(TypeError, match="scalar"):
            rec.add({"round": 2, "train_loss": bad})
