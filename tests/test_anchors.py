"""Absolute anchors: each algorithm family and each model family against values computed here by hand, not against
another run of the same code (the equality tests, stacked against sequential, resumed against whole, side by side
against alone, compare two runs that a bug shared by both passes).

- Algorithms: the first rounds of a real run (logistic regression, every client's whole shard a step, so each
  gradient is the closed form below) are the rounds written out here from the papers' boxes: EF21 (α-NormEC, with
  and without server normalisation, Clip21), the DP-SGD baseline, Fed-α-NormEC and FedAvg with local steps, and
  NormFedAvg's local SGD with momentum and weight decay. (ALI-DPFL and fixed-τ DPFL are private only; their round is
  anchored on stand-in clients in tests/test_alidpfl.py, their accounting in tests/test_sgm.py.)
- Models: with its last layer zeroed every model's logits are 0, so its loss is ln 10 exactly, its accuracy the share
  of class 0 (ties go to the first class), and the gradient of the last bias 1/10 minus each class's share of the
  batch, whatever the layers before it: logistic regression, the MLP, the CNN and ResNet20 (BatchNorm and GroupNorm),
  through the real engine's backends and the model's evaluation."""

import math

import pytest
import torch

from normfl.run import start
from normfl.run.setup import build
from tests.helpers import composed, trained

SMALL = ["dataset=fashion_mnist", "dataset.train_limit=300", "dataset.test_limit=100", "clients=3", "oracle=full",
         "progress=false", "checkpoint_every=0", "eval_every=5"]


def shards(setup) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each client's whole shard as the model sees it (features flattened, float64) and its labels."""
    out = []
    for pieces in setup.clients.data.next_batches():
        out.append((torch.cat([p[0] for p in pieces]).flatten(1).double(), torch.cat([p[1] for p in pieces])))
    return out


def logreg_grad(x: torch.Tensor, X: torch.Tensor, y: torch.Tensor, classes: int = 10) -> torch.Tensor:
    """∇ of the mean cross-entropy of logistic regression x = (W by rows, b) on (X, y): ((P - Y)ᵀX, P - Y) / m."""
    d = X.shape[1]
    W, b = x[:d * classes].view(classes, d), x[d * classes:]
    E = torch.softmax(X @ W.T + b, 1) - torch.nn.functional.one_hot(y, classes).double()
    return torch.cat([(E.T @ X).flatten(), E.sum(0)]) / len(y)


def norm_alpha(v, alpha):
    return v / (alpha + v.norm())


def clip(v, beta):
    return v * min(1.0, beta / v.norm().item())


def ef21(a, x, data, rounds):
    """NORMEC Alg. 1 / Clip21: Δ_i = Ψ(∇f_i(x) - g_i), g_i += wΔ_i, ĝ += w mean Δ_i, x -= γ ĝ (/||ĝ||)."""
    normec = a.name == "normec"
    g, ghat = [torch.zeros_like(x) for _ in data], torch.zeros_like(x)
    for _ in range(rounds):
        deltas = [norm_alpha(logreg_grad(x, X, y) - gi, a.alpha) if normec else clip(logreg_grad(x, X, y) - gi, a.beta)
                  for (X, y), gi in zip(data, g, strict=True)]
        w = a.beta if normec else 1.0
        g = [gi + w * di for gi, di in zip(g, deltas, strict=True)]
        ghat = ghat + w * sum(deltas) / len(data)
        x = x - a.gamma * (ghat / ghat.norm() if normec and a.server_norm else ghat)
    return x


def dpsgd(a, x, data, rounds):
    """NORMEC eq. 2 without noise: x -= γ mean_i β Norm_α(∇f_i(x))."""
    for _ in range(rounds):
        x = x - a.gamma * sum(a.beta * norm_alpha(logreg_grad(x, X, y), a.alpha) for X, y in data) / len(data)
    return x


def federated(a, x, data, rounds):
    """FEDNORMEC Alg. 1 at p = 1 (and FedAvg): T GD steps of γ/T give U_i = (x - T_i(x))/γ; Fed-α-NormEC steps
    x -= η v̂ with v̂ += β mean Norm_α(U_i - v_i), FedAvg x -= η mean Ψ(U_i)."""
    v, vhat, eta = [torch.zeros_like(x) for _ in data], torch.zeros_like(x), a.eta or a.gamma
    for _ in range(rounds):
        U = []
        for X, y in data:
            w = x.clone()
            for _ in range(a.local_steps):
                w = w - a.gamma / a.local_steps * logreg_grad(w, X, y)
            U.append((x - w) / a.gamma)
        if a.name == "fed_normec":
            deltas = [norm_alpha(u - vi, a.alpha) for u, vi in zip(U, v, strict=True)]
            v = [vi + a.beta * di for vi, di in zip(v, deltas, strict=True)]
            vhat = vhat + a.beta * sum(deltas) / len(data)
            x = x - eta * vhat
        else:
            psi = [clip(u, a.beta) if a.bounding == "clip" else a.beta * norm_alpha(u, a.alpha) for u in U]
            x = x - eta * sum(psi) / len(data)
    return x


def normfedavg(a, x, data, rounds):
    """NFA Alg. 2, every client: E steps of PyTorch SGD (d = ∇f + λw, b = μb + d, w -= η_k b) at η_k = η_0 decay^k,
    then x -= β_k mean unit(x - w_i), β_k = (β/η) η_k."""
    for k in range(rounds):
        lr, units = a.eta0 * a.lr_decay ** k, []
        for X, y in data:
            w, buf = x.clone(), None
            for _ in range(a.local_steps):
                d = logreg_grad(w, X, y) + a.weight_decay * w
                buf = d if buf is None else a.momentum * buf + d
                w = w - lr * buf
            units.append((x - w) / (x - w).norm())
        x = x - a.beta_over_eta * lr * sum(units) / len(data)
    return x


ALGORITHMS = {
    "normec": (["algo=normec"], ef21),
    "normec, no server normalisation, stacked": (["algo=normec", "algo.server_norm=false", "algo.beta=0.5",
                                                  "backend=stacked"], ef21),
    "clip21 (clipping)": (["algo=clip21", "algo.beta=0.05"], ef21),
    "dpsgd_norm": (["algo=dpsgd_norm", "algo.gamma=0.1", "algo.alpha=0.1"], dpsgd),
    "fed_normec, 2 local steps": (["algo=fed_normec", "algo.local_steps=2", "algo.beta=0.5"], federated),
    "fedavg, clipping, 3 local steps, stacked": (["algo=fedavg", "algo.bounding=clip", "algo.beta=0.05",
                                                  "algo.local_steps=3", "backend=stacked"], federated),
    "normfedavg": (["algo=normfedavg", "algo.local_steps=3", "algo.lr_decay=0.9"], normfedavg),
}


@pytest.mark.parametrize("case", ALGORITHMS)
def test_a_runs_first_rounds_are_the_rounds_written_out_by_hand(case, tmp_path, data_root):
    """Three rounds of a real run (data, engine, algorithm, the run's loop) end at the model the paper's box gives
    from the same start, computed here in float64 from the closed-form gradients (to float32 rounding)."""
    overrides, by_hand = ALGORITHMS[case]
    cfg = composed(*SMALL, "model=logreg", "rounds=3", f"data_root={data_root}", *overrides)
    t = start(cfg, tmp_path / "run")
    try:
        x0, data = t.x.double().clone(), shards(t.setup)
        trained(t)
        expected = by_hand(cfg.algo, x0, data, 3)
        moved = (expected - x0).norm()
        assert moved > 1e-3 and (t.x.double() - expected).norm() <= 1e-4 * moved, case
    finally:
        t.rundir.release()


MODELS = {
    "logreg": ["model=logreg"],
    "mlp": ["model=mlp"],
    "cnn": ["model=cnn", "model.hidden=32"],
    "resnet20 (BatchNorm)": ["dataset=cifar10", "model=resnet20"],
    "resnet20 (GroupNorm)": ["dataset=cifar10", "model=resnet20", "model.norm=group"],
}
SLOW = pytest.mark.slow                                   # ResNet20's passes: over a second each


@pytest.mark.parametrize("backend", ["sequential", "stacked"])
@pytest.mark.parametrize("model", [pytest.param(m, marks=SLOW) if "resnet" in m else m for m in MODELS])
def test_a_model_with_its_last_layer_zeroed_gives_the_known_loss_gradient_and_accuracy(model, backend, data_root):
    """Each client's loss is ln 10 and its last bias's gradient 1/10 minus its shard's class shares, through each
    backend; the evaluation's loss is ln 10 and its accuracy the test split's share of class 0. A backend that sums
    where it averages, weights a client's pieces wrongly or mixes clients' batches, or an evaluation that divides by
    the wrong count, is off these values."""
    cfg = composed(*SMALL, "dataset.train_limit=48", "dataset.test_limit=40", f"backend={backend}",
                   f"data_root={data_root}", *MODELS[model])
    s = build(cfg)
    names = s.flat.names
    assert names[-2].endswith("weight") and names[-1].endswith("bias")
    x = s.x.clone()
    x[-(s.flat.sizes[-2] + s.flat.sizes[-1]):] = 0                   # the last layer: its weight and bias
    G, loss = s.clients.grads(x)
    assert loss.tolist() == pytest.approx([math.log(10)] * 3, rel=1e-6)
    for i, pieces in enumerate(s.clients.data.next_batches()):
        labels = torch.cat([p[1] for p in pieces])
        share = torch.bincount(labels, minlength=10).double() / len(labels)
        assert G[i, -10:].double().tolist() == pytest.approx((0.1 - share).tolist(), abs=1e-6), (model, i)
    test_loss, acc = s.flat.evaluate(x, s.x_test, s.y_test)
    assert test_loss == pytest.approx(math.log(10), rel=1e-6) and acc == (s.y_test == 0).double().mean().item()
