"""Per-round client time of each backend, in one process: medians and the vmap/sequential ratio.

    .venv/bin/python scripts/bench_backends.py                      # ResNet20 on CIFAR-10, 10 x 32
    .venv/bin/python scripts/bench_backends.py model=logreg dataset=fashion_mnist clients=100

Takes the same overrides as train.py. Times only the clients' gradient computation of a round
(the algorithm's own vector work and evaluation are excluded), alternating backends so that
machine noise hits both alike.
"""

import statistics
import sys
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
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
    x, engines = flat.vector(), {b: ClientEngine(flat, b) for b in ("sequential", "vmap")}
    times = {b: [] for b in engines}
    for rep in range(reps + 1):
        batches = data.next_batches()
        for name, eng in engines.items():
            t = time.perf_counter()
            eng.grads(x, batches)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if rep:                                    # rep 0 is warm-up
                times[name].append(time.perf_counter() - t)
    med = {b: statistics.median(v) for b, v in times.items()}
    print(f"{type(flat.module).__name__} d={flat.dim} clients={cfg.clients} batch={cfg.batch_size} "
          f"oracle={cfg.oracle} device={device} threads={torch.get_num_threads()} reps={reps}")
    for b, m in med.items():
        print(f"  {b:10s} median {m * 1000:8.1f} ms/round")
    print(f"  ratio vmap/sequential = {med['vmap'] / med['sequential']:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
