"""Per-round client time of each backend, in one process: medians and the vmap/sequential ratio.

    .venv/bin/python scripts/bench_backends.py                      # ResNet20 on CIFAR-10, 10 x 32
    .venv/bin/python scripts/bench_backends.py model=logreg dataset=fashion_mnist clients=100
    .venv/bin/python scripts/bench_backends.py experiment=nfa_t4_qtdl    # 25 of 50 clients, MLP, 256
    .venv/bin/python scripts/bench_backends.py experiment=alidpfl_fmnist # DP-SGD: per-sample clipping paths

Takes the same overrides as train.py. Times only the clients' gradient computation of one step
(the algorithm's own vector work and evaluation are excluded), alternating backends so that
machine noise hits both alike. Algorithms with a cohort (``algo.cohort_size``) time that many
clients; with local steps (``algo.local_steps`` > 1) each client sits at its own point, as it does
after its first local step. DP-SGD algorithms (``algo.sample_rate``) instead compare the two ways
of summing clipped per-sample gradients on Poisson batches: from layer norms, and vmap over samples.
"""

import statistics
import sys
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from normfl import engine as eng_module  # noqa: E402
from normfl.engine import ClientData, ClientEngine, FlatModel, Preprocess, pick_device  # noqa: E402
from normfl.run import build_data  # noqa: E402


def main(overrides, reps=7):
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = pick_device(cfg.device.name)
    ds, parts = build_data(cfg)
    torch.manual_seed(cfg.seed)
    flat = FlatModel(instantiate(cfg.model, in_shape=tuple(ds.x_train.shape[1:]), num_classes=ds.num_classes),
                     device)
    data = ClientData(ds.x_train, ds.y_train, parts, cfg.batch_size, cfg.seed, Preprocess(ds.mean, ds.std, device),
                      augment=bool(cfg.dataset.augment), oracle=cfg.oracle)
    if cfg.algo.get("sample_rate"):
        return bench_clipping(cfg, flat, data, reps)
    ids = list(range(cfg.algo.cohort_size)) if cfg.algo.get("cohort_size") else None
    x, engines = flat.vector(), {b: ClientEngine(flat, b) for b in ("sequential", "vmap")}
    own = (cfg.algo.get("local_steps") or 1) > 1
    if own:                                            # one point per client
        n = len(ids) if ids else cfg.clients
        x = x + 1e-3 * torch.randn(n, flat.dim, generator=torch.Generator().manual_seed(0)).to(device)
    med = interleaved({b: (lambda batches, e=eng: e.grads(x, batches)) for b, eng in engines.items()},
                      lambda: data.next_batches(ids), reps, device)
    print(f"{type(flat.module).__name__} d={flat.dim} clients={len(ids) if ids else cfg.clients} of {cfg.clients} "
          f"batch={cfg.batch_size} points={'per-client' if own else 'shared'} oracle={cfg.oracle} device={device} "
          f"threads={torch.get_num_threads()} reps={reps}")
    report(med, "vmap", "sequential")


def bench_clipping(cfg, flat, data, reps):
    """One DP-SGD step of every client: clipped per-sample gradient sums by both paths, interleaved."""
    x, engine = flat.vector(), ClientEngine(flat)
    if engine.norm_layers is None:
        print("this model has parameters outside Linear/Conv2d layers: only vmap applies")
        return
    paths = {"layer norms": eng_module._clipped_by_norms, "vmap": eng_module._clipped_by_vmap}

    def step(fn):
        return lambda batches: [fn(flat, x, xb, yb, cfg.algo.clip, engine.norm_layers) for xb, yb, _ in batches]

    med = interleaved({p: step(fn) for p, fn in paths.items()},
                      lambda: data.poisson_batches(cfg.algo.sample_rate), reps, flat.device)
    print(f"{type(flat.module).__name__} d={flat.dim} clients={cfg.clients} DP-SGD q={cfg.algo.sample_rate} "
          f"threads={torch.get_num_threads()} reps={reps}")
    report(med, "vmap", "layer norms")


def interleaved(variants: dict, draw, reps: int, device) -> dict[str, float]:
    """Median seconds of each variant on the same fresh input per repetition (the first is warm-up),
    variants taking turns so that machine drift hits all alike."""
    times = {name: [] for name in variants}
    for rep in range(reps + 1):
        batches = draw()
        for name, fn in variants.items():
            t = time.perf_counter()
            fn(batches)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if rep:
                times[name].append(time.perf_counter() - t)
    return {name: statistics.median(v) for name, v in times.items()}


def report(med: dict[str, float], num: str, den: str) -> None:
    for name, m in med.items():
        print(f"  {name:12s} median {m * 1000:8.1f} ms/step")
    print(f"  ratio {num}/{den} = {med[num] / med[den]:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
