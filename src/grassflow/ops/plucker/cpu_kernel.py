"""`kernel-cpu` backend: kernels/plucker.cu compiled with g++ through the CUDA-on-CPU shim
(kernels/cpu_shim/) and called with ctypes. Slow (one "thread" at a time); it exists so the
GPU kernels' arithmetic is tested on machines without a GPU."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import numpy as np
import torch

from grassflow.ops.plucker.kernel_stages import KERNEL_TYPES, KernelStages, kernels_dir


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


def _c_arg(x):
    if isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            raise ValueError("kernel-cpu backend runs on CPU tensors only")
        return ctypes.c_void_p(x.data_ptr())
    if isinstance(x, np.int32):
        return ctypes.c_int(int(x))
    if isinstance(x, np.int64):
        return ctypes.c_long(int(x))
    return ctypes.c_double(float(x))


class CpuKernelStages(KernelStages):
    name = "kernel-cpu"

    @staticmethod
    def _library() -> ctypes.CDLL:
        return _library()

    def _lead_args(self) -> tuple:
        return ()

    def _launch(self, kernel, dtype, n_threads, *args):
        if n_threads == 0:
            return
        fn = getattr(self._library(), f"{kernel.removeprefix('plucker_')}_{KERNEL_TYPES[dtype][1]}")
        fn.restype = None
        fn(*self._lead_args(), *(_c_arg(a) for a in args))
