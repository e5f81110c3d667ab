"""`fused-cpu` backend: the elementwise stages as fused per-token C++ loops, parallel over tokens
(OpenMP), for training on CPUs (kernels/cpu_fused/plucker_fused.cpp, built with g++ on first use and
cached). Same formulas as `fast` and the CUDA kernels — coeff and lag_bwd are plucker.cu's own
kernels — but each stage is one pass over memory instead of dozens of PyTorch ops. float32 and
float64."""

from __future__ import annotations

import ctypes
from functools import cache

import numpy as np
import torch

from grassflow.kernel_sources import kernels_dir
from grassflow.ops.plucker.cpu_kernel import CpuKernelStages, build_library
from grassflow.ops.plucker.kernel_stages import KERNEL_TYPES

# What this backend builds, under kernels/ (read by grassflow.planning.staleness, as cpu_kernel's)
KERNEL_SOURCES = ("cpu_fused/plucker_fused.cpp", "plucker.cu", "cpu_shim/cuda_cpu_shim.h")


@cache
def _library() -> ctypes.CDLL:
    main, *deps = (kernels_dir() / s for s in KERNEL_SOURCES)
    return build_library(main, deps, ["-O3", "-fopenmp"])


class FusedCpuStages(CpuKernelStages):
    name = "fused-cpu"

    @staticmethod
    def _check(z, *others):
        if z.dtype not in (torch.float32, torch.float64):
            raise TypeError(f"fused-cpu backend takes float32 or float64, got {z.dtype}")
        CpuKernelStages._check(z, *others)

    def _launch(self, kernel, dtype, r, n_threads, *args):
        # entry points of plucker_fused.cpp: the stage's arguments after the thread count
        if n_threads == 0:
            return
        fn = getattr(_library(), f"{kernel.removeprefix('plucker_')}_{KERNEL_TYPES[dtype][1]}")
        fn.restype = None
        fn(ctypes.c_int(torch.get_num_threads()), *(_c_arg(a) for a in args))

    def coeff(self, z, lags, eps):
        return super().coeff(z.contiguous(), lags, eps)

    def wedge(self, z, c):
        self._check(z)
        return super().wedge(z, c)


def _c_arg(x):
    if isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            raise ValueError("fused-cpu backend runs on CPU tensors only")
        return ctypes.c_void_p(x.data_ptr())
    if isinstance(x, np.int32):
        return ctypes.c_int(int(x))
    if isinstance(x, np.int64):
        return ctypes.c_long(int(x))
    return ctypes.c_double(float(x))  # eps: the entry points take a double and narrow it
