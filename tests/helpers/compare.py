"""Two runs compared: to a tolerance, or to the bit after a resume; and a markdown table read back."""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from .runs import ended, trained

METRICS = ["train_loss", "test_loss", "test_acc"]


def outputs(run_dir: Path):
    return pd.read_csv(run_dir / "metrics.csv"), np.load(run_dir / "params.npy")


def assert_same_run(a: Path, b: Path, rtol=1e-4):
    """Metrics equal to ``rtol``; the parameter vectors within ``rtol`` of each other in norm."""
    (ma, pa), (mb, pb) = outputs(a), outputs(b)
    assert list(ma["round"]) == list(mb["round"])
    for col in METRICS:
        np.testing.assert_allclose(mb[col], ma[col], rtol=rtol, atol=1e-6, err_msg=col)
    assert np.linalg.norm(pb - pa) <= rtol * np.linalg.norm(pa)


def same(a, b, where="") -> None:
    """Equal to the bit: tensors, arrays, numbers, and containers and objects of them (by their attributes)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu()), where
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b), where
    elif isinstance(a, np.random.Generator):
        same(a.bit_generator.state, b.bit_generator.state, where)
    elif isinstance(a, torch.Generator):
        same(a.get_state(), b.get_state(), where)
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (u, v) in enumerate(zip(a, b, strict=True)):
            same(u, v, f"{where}[{i}]")
    elif hasattr(a, "__dict__") and not isinstance(a, type):
        assert type(a) is type(b), where
        same(vars(a), vars(b), where)
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), where
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


NOT_COMPARED = ("wall_time_s", "training_time_s", "seconds_per_round", "peak_rss_mb",
           "resumed_at_round",                  # a resumed run says where it was taken up
           "data_source")                       # says whether this run copied the offline data (the first does)


def resumed_equals_whole(cfg, tmp_path, kill_at=None):
    """Train ``cfg`` whole, and again stopped after ``kill_at`` steps (default: two rounds past its last
    checkpoint, lost as in a kill; with checkpoint_every=0, a checkpoint saved right there, as Ctrl-C does)
    and continued from a fresh build; compare everything (metrics, x, buffers, the algorithm's state, batch
    streams, canary scores, summary). Returns the resumed run's summary."""
    from normfl import checkpoint
    from normfl.run import start

    whole, whole_summary = ended(trained(start(cfg, tmp_path / "whole")))
    killed = tmp_path / "killed"
    t = start(cfg, killed)
    every = cfg.checkpoint_every
    trained(t, kill_at if kill_at is not None else 6 * t.setup.steps_per_round)
    if not every:
        t.save()                                        # Ctrl-C: a checkpoint where it stands
    saved_at = checkpoint.load(killed, t.key)["step"]
    assert 0 < saved_at < whole.step and t.active, (saved_at, whole.step)
    t.rundir.release()                                  # the process ends: what it did since the checkpoint is lost
    t = start(cfg, killed)
    assert t.step == saved_at
    resumed, summary = ended(trained(t))
    a, b = (pd.read_csv(d / "metrics.csv").drop(columns="wall_time") for d in (tmp_path / "whole", killed))
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    same(whole.x, resumed.x, "x")
    same(whole.setup.flat.buffers(), resumed.setup.flat.buffers(), "buffers")
    same(whole.algo.state_dict(), resumed.algo.state_dict(), "algo")
    same(whole.clients.data.state_dict(), resumed.clients.data.state_dict(), "data")
    if whole.audit is not None:                         # its bounds may be 0 either way at a few canaries: the scores
        same(whole.audit.state_dict(), resumed.audit.state_dict(), "audit")
    strip = lambda s: {k: v for k, v in s.items() if k not in NOT_COMPARED}   # noqa: E731
    same(strip(whole_summary), strip(summary), "summary")
    assert np.array_equal(np.load(tmp_path / "whole" / "params.npy"), np.load(killed / "params.npy"))
    assert not (killed / "checkpoint.pt").exists()
    return summary


def rows(markdown: str) -> list[dict]:
    """A markdown table's rows as {column: cell}."""
    header, _, *body = [[c.strip() for c in line.strip("|").split("|")] for line in markdown.strip().splitlines()]
    return [dict(zip(header, r, strict=True)) for r in body]
