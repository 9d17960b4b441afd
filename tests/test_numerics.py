"""Numerics a run states rather than inherits (issue 29, items 6-7): precision=fp32 is full fp32 (TF32 off),
tf32 turns TF32 on, cuDNN's autotuner runs unless the run must repeat every bit, the memory format of the
activations is chosen, the summary says so; and an algorithm's state read from a checkpoint lands on the
run's device, whatever device wrote it."""

from __future__ import annotations

import json

import pytest
import torch

from normfl import models
from normfl.algorithms import NormEC
from normfl.algorithms.base import on_device
from normfl.algorithms.memory import ClientMemory
from normfl.engine.flat import FlatModel, memory_format, numerics, set_numerics
from normfl.run import run
from tests.helpers import MODELS, assert_same_run, config


@pytest.mark.parametrize(("precision", "deterministic", "want"), [
    ("fp32", False, {"tf32": False, "cudnn_benchmark": True, "deterministic": False}),
    ("fp32", True, {"tf32": False, "cudnn_benchmark": False, "deterministic": True}),
])
def test_precision_and_determinism_set_the_flags_and_the_summary_names_them(precision, deterministic, want, tmp_path,
                                                                           data_root):
    torch.backends.cuda.matmul.allow_tf32 = not want["tf32"]            # whatever came before
    summary = run(config(data_root, "model=logreg", "rounds=1", f"precision={precision}",
                         f"deterministic={str(deterministic).lower()}", "memory_format=channels_last"), tmp_path)
    assert summary["numerics"] == want and summary["precision"] == precision
    assert summary["memory_format"] == "contiguous"                     # logreg has no convolution to lay out
    assert json.loads((tmp_path / "summary.json").read_text())["numerics"] == want
    set_numerics("tf32", False)                  # a run asks for it on CUDA alone (config refuses it elsewhere)
    assert numerics() == {"tf32": True, "cudnn_benchmark": True, "deterministic": False}
    set_numerics("fp32", False)
    assert numerics() == {"tf32": False, "cudnn_benchmark": True, "deterministic": False}


@pytest.mark.slow
@pytest.mark.parametrize("model", ["resnet20-group fed_normec", "cnn dpfl"])
@pytest.mark.parametrize("backend", ["sequential", "stacked"])
def test_a_run_in_either_memory_format_is_the_same_run(model, backend, tmp_path, data_root):
    """memory_format changes how activations lie in memory, not what the run computes (equal up to float
    rounding), and the summary names the format. (With BatchNorm, the eval-mode test loss of a three-round
    ResNet20 magnifies rounding past 1e-3: see test_stacked_equals_sequential.)"""
    for fmt in ("channels_last", "contiguous"):
        summary = run(config(data_root, *MODELS[model], f"backend={backend}", f"memory_format={fmt}"), tmp_path / fmt)
        assert summary["memory_format"] == fmt
    assert_same_run(tmp_path / "contiguous", tmp_path / "channels_last")


def test_auto_lays_out_channels_last_where_it_measured_faster():
    """auto: on a CPU the model's own passes and evaluation, not the stacked pass; on CUDA the stacked pass in
    bf16 only; elsewhere neither (until measured there); a model without a convolution has nothing to lay out."""
    assert memory_format("auto", torch.device("cpu")) == memory_format("auto", torch.device("cpu"), "bf16") == \
        (True, False)
    assert memory_format("auto", torch.device("cuda"), "bf16") == (False, True)
    assert memory_format("auto", torch.device("cuda")) == (False, False)
    assert memory_format("auto", torch.device("mps"), "bf16") == (False, False)
    assert memory_format("channels_last", torch.device("cuda")) == (True, True)
    assert memory_format("contiguous", torch.device("cpu")) == (False, False)
    assert FlatModel(models.cnn((1, 28, 28), 10), torch.device("cpu"), layout="auto").memory_format == \
        "channels_last (stacked pass: contiguous)"
    assert FlatModel(models.mlp((1, 28, 28), 10), torch.device("cpu"), layout="channels_last").memory_format == \
        "contiguous"


def test_a_checkpointed_state_lands_on_the_runs_device():
    """Checkpoints are read on the CPU; load_state_dict moves every tensor of the state to the run's device
    (the meta device stands in for a GPU here; tests/test_gpu.py resumes on CUDA)."""
    meta = torch.device("meta")
    mem = ClientMemory(3, 4, "cpu", torch.float32)
    algo = NormEC(0.1, 0.1, 0.01)
    algo.state = ("g", "ghat", "v", "extra")
    algo.load_state_dict({"g": torch.zeros(3, 4), "ghat": torch.zeros(4), "v": mem,
                          "extra": {"a": [torch.ones(2), 3], "b": "text"}}, meta)
    assert algo.g.device == meta and algo.ghat.device == meta and algo.extra["a"][0].device == meta
    assert algo.v.device == meta and algo.v.rows.device == meta and algo.extra["a"][1] == 3
    assert on_device(torch.ones(1), None).device.type == "cpu"
