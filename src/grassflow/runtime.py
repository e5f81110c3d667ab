"""Process-wide torch settings and a description of the device, shared by train and bench."""

from __future__ import annotations

import os
import platform
from contextlib import nullcontext

import torch

from grassflow import gpu_slots


def configure_torch(deterministic: bool = False) -> None:
    # Denormal floats appear in the 30,522-way softmax gradient and make CPU GEMMs up to ~5× slower
    # (measured: 27 s vs 2.9 s for one N=6 step); flushing them changes values only below 1.2e-38.
    torch.set_flush_denormal(True)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)


# Device type -> the autocast its training, evaluation and benchmark steps run under: bf16 on CUDA,
# none on the CPU (fp32 throughout). One table, so that the tests can put under "cpu" a rehearsal of
# CUDA's bf16 policy (tests/helpers/cuda_autocast.py) or the real CPU bf16 autocast and run the very
# code a GPU runs.
AUTOCAST = {"cuda": lambda **kw: torch.autocast("cuda", dtype=torch.bfloat16, **kw)}


def autocast(device: torch.device, cache: bool = True):
    """The device's autocast; cache=False in a CUDA graph capture (its cast cache must not outlive
    the capture, torch.cuda.graphs says)."""
    factory = AUTOCAST.get(device.type)
    if factory is None:
        return nullcontext()
    return factory() if cache else factory(cache_enabled=False)


def claim_device(name: str, log: bool = False, exclusive: bool = False) -> torch.device:
    """The device a job runs on: `auto` | `cpu` | `cuda` (config key train.device). On a GPU it
    claims a GPU slot held until the process exits (grassflow.gpu_slots). With log=True, one line
    says what was picked (stdout: a job's log holds it first, and stderr keeps to the one `error:`
    line of a failure), so that an `auto` run that fell to the CPU is visible in its log. A job on a
    GPU (or under the GRASSFLOW_GPUS stand-in) first takes a GPU slot (grassflow.gpu_slots;
    exclusive: every slot of its GPU, for a job that times the device)."""
    if name not in ("auto", "cpu", "cuda"):
        raise ValueError(f"train.device must be auto, cpu or cuda, got {name!r}")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "train.device: 'cuda' requested but no CUDA device is available "
            f"(torch {torch.__version__}, built for CUDA {torch.version.cuda})"
        )
    device = torch.device(
        "cuda" if name == "cuda" or (name == "auto" and torch.cuda.is_available()) else "cpu"
    )
    if device.type == "cuda" or os.environ.get(gpu_slots.OVERRIDE):
        slot = gpu_slots.claim(exclusive=exclusive)
        if log and slot:
            print(
                f"[grassflow] GPU slot: GPU {slot['gpu']} ({slot['name']}), slot {slot['slot']} of "
                f"{slot['runs_per_gpu']}",
                flush=True,
            )
    if log:
        why = (
            " (no CUDA device visible: this run is on the CPU)"
            if name == "auto" and device.type == "cpu"
            else ""
        )
        print(
            f"[grassflow] train.device={name} -> {device.type}: {device_name(device)}{why}",
            flush=True,
        )
    return device


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
