"""What the bench's numbers were measured on: the device, its numerics, its peak memory, a CPU's bf16 units."""

from __future__ import annotations

import torch


def device_facts(device: torch.device) -> dict:
    """What the numbers were measured on: the device's name, the numerics flags, and the peak memory."""
    from normfl.engine.flat import device_name, numerics
    from normfl.run.provenance import peak_rss_mb

    peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else peak_rss_mb()
    return {"device_name": device_name(device), **numerics(), "peak_memory_mb": peak,
            "torch": torch.__version__, "cuda": torch.version.cuda if device.type == "cuda" else None,
            **(cpu_facts() if device.type == "cpu" else {})}


def cpu_facts() -> dict:
    """What decides a CPU's bf16 speed, which the model name does not say: the vector instructions torch
    dispatches to and the CPU's bf16 units (setting A's floor in bf16: 1.64x faster than fp32 on a host
    with AMX, 1.23x slower on one with AVX512-BF16 alone; docs/engine.md)."""
    from normfl.engine.flat import cpuinfo

    flags = (cpuinfo("flags") or "").split()
    return {"cpu_isa": torch.backends.cpu.get_cpu_capability(),
            "cpu_bf16": " ".join(f for f in ("avx512_bf16", "amx_bf16") if f in flags) or "none"}
