"""The op's backends by name, and which one runs on a device (`auto` resolved)."""

from __future__ import annotations

import torch

from grassflow.models.config import PLUCKER_BACKENDS
from grassflow.ops.plucker import cupy_backend
from grassflow.ops.plucker.cpu_kernel import CpuKernelStages
from grassflow.ops.plucker.cupy_backend import CupyStages
from grassflow.ops.plucker.fast import TorchStages
from grassflow.ops.plucker.fused_cpu import FusedCpuStages

# the one list (models.config): the config's checks and the schema read it
BACKENDS = PLUCKER_BACKENDS
_STAGES = {
    "fast": TorchStages(),
    "cupy": CupyStages(),
    "kernel-cpu": CpuKernelStages(),
    "fused-cpu": FusedCpuStages(),
}


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


def resolve_backend(backend: str, device) -> str:
    """The backend that runs on `device` (a torch.device or a tensor) when `backend` is asked for:
    `auto` becomes cupy or fast; an explicit cupy that cannot run there is an error."""
    check_backend(backend)
    device = device.device if isinstance(device, torch.Tensor) else torch.device(device)
    if backend == "auto":
        return "cupy" if cupy_backend.usable(device) else "fast"
    if backend == "cupy":
        cupy_backend.require(device)
    return backend


def stages_for(backend: str):
    """The stages object of a resolved backend (not `auto`, not `reference`)."""
    return _STAGES[backend]
