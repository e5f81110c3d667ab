"""Process-wide torch settings and a description of the device, shared by train and bench."""

from __future__ import annotations

import platform
from contextlib import nullcontext

import torch


def configure_torch(deterministic: bool = False) -> None:
    # Denormal floats appear in the 30,522-way softmax gradient and make CPU GEMMs up to
    # ~5× slower (measured: 27 s vs 2.9 s for one N=6 step); flushing them changes values
    # only below 1.2e-38.
    torch.set_flush_denormal(True)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)


def autocast(device: torch.device):
    """bf16 autocast on CUDA; nothing on the CPU (fp32 throughout)."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


def pick_device(name: str) -> torch.device:
    """`auto` | `cpu` | `cuda` (config key train.device)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("train.device: 'cuda' requested but no CUDA device is available")
    return torch.device(name)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU: {cpu}, {torch.get_num_threads()} threads"
