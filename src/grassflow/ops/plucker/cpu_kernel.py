"""`kernel-cpu` backend: kernels/plucker.cu compiled with g++ through the CUDA-on-CPU shim
(kernels/cpu_shim/) and launched with ctypes, grid, block and CUDA's argument array, every
argument checked against the kernel's signature (kernel_abi). Slow (one "thread" at a time);
it exists so the GPU kernels' arithmetic and calling convention are tested without a GPU."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch

from grassflow.ops.plucker import kernel_abi
from grassflow.ops.plucker.kernel_stages import (
    BLOCK,
    KernelStages,
    grid_for,
    kernel_name,
    kernels_dir,
)


def _cache_dir() -> Path:
    root = os.environ.get("GRASSFLOW_CACHE") or Path.home() / ".cache" / "grassflow"
    return Path(root) / "kernel-cpu"


def build_library(main: Path, extra: list[Path], flags: list[str]) -> ctypes.CDLL:
    """Compile `main` (which includes `extra`) into a shared library once per source hash,
    compiler and flags, cached under $GRASSFLOW_CACHE (or ~/.cache/grassflow)."""
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        raise RuntimeError(f"{main.name}: needs a C++ compiler ({cxx!r} not on PATH)")
    sources = [main, *extra]
    key = hashlib.sha256(b"".join(p.read_bytes() for p in sources) + " ".join([cxx, *flags]).encode()).hexdigest()
    lib = _cache_dir() / f"{main.stem}_{key[:16]}.so"
    if not lib.exists():
        lib.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=lib.parent) as tmp:
            out = Path(tmp) / lib.name
            cmd = [cxx, *flags, "-std=c++17", "-shared", "-fPIC", "-Wall", "-Werror", "-o", str(out), str(main)]
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0:
                raise RuntimeError(f"compiling {main} failed:\n{res.stderr}")
            os.replace(out, lib)  # atomic: a concurrent build never sees a half-written .so
    return ctypes.CDLL(str(lib))


@cache
def _library() -> ctypes.CDLL:
    kdir = kernels_dir()
    return build_library(kdir / "cpu_shim" / "plucker_cpu.cpp",
                         [kdir / "plucker.cu", kdir / "cpu_shim" / "cuda_cpu_shim.h"], ["-O2"])


def launch_on_cpu(name: str, grid: int, block: int, args: tuple, array_info, pointer_of) -> None:
    """Launch extern "C" kernel `name` of plucker.cu through the shim, as CUDA would: the
    arguments checked against its signature, then packed into CUDA's argument array."""
    params = kernel_abi.signatures(kernels_dir() / "plucker.cu")[name]
    kernel_abi.check(name, params, args, array_info)
    packed, _keep = kernel_abi.pack(params, args, pointer_of)
    fn = getattr(_library(), f"launch_{name}")
    fn.restype = None
    fn(ctypes.c_uint(grid), ctypes.c_uint(block), packed)


def _tensor_info(x):
    return (x.dtype, x.is_contiguous()) if isinstance(x, torch.Tensor) else None


class CpuKernelStages(KernelStages):
    name = "kernel-cpu"

    def _run(self, kernel, dtype, n_threads, *args):
        if any(isinstance(a, torch.Tensor) and a.device.type != "cpu" for a in args):
            raise ValueError("kernel-cpu backend runs on CPU tensors only")
        launch_on_cpu(kernel_name(kernel, dtype), grid_for(n_threads), BLOCK, args, _tensor_info,
                      lambda t: t.data_ptr())
