"""Old vs new Plücker kernels through the same interface: the op's forward + backward
(PluckerMixFunction, the projections by W as torch GEMMs) with the stages run by the kernels of
441a7fd (kernels/baseline/: a thread per token for coeff and lag_bwd, r at run time) and by today's
kernels/plucker.cu, at the step sizes of the paper's tables. On a GPU through CuPy and the driver;
on the CPU through the CUDA-on-CPU shim (serial: it times the kernels' work, not a GPU)."""

from __future__ import annotations

import ctypes
from functools import cache

import torch

from grassflow.bench.common import LAGS, timeit
from grassflow.bench.shapes import TABLE1
from grassflow.kernel_sources import kernels_dir
from grassflow.ops.plucker import cupy_backend, kernel_abi
from grassflow.ops.plucker.cpu_kernel import CpuKernelStages, build_library
from grassflow.ops.plucker.function import PluckerMixFunction
from grassflow.ops.plucker.kernel_stages import (
    BLOCK,
    KERNEL_TYPES,
    KernelStages,
    grid_for,
    signature,
)
from grassflow.runtime import autocast

# What the baseline builds, under kernels/ (read by grassflow.planning.staleness, as the backends'
# lists)
KERNEL_SOURCES = (
    "baseline/plucker_441a7fd_cpu.cpp",
    "baseline/plucker_441a7fd.cu",
    "cpu_shim/cuda_cpu_shim.h",
)
BASELINE = KERNEL_SOURCES[1]
PER_TOKEN = ("plucker_coeff", "plucker_lag_bwd")  # the stages the baseline ran a thread per token


class BaselineStages(KernelStages):
    """441a7fd's kernels, launched as then: names plucker_<stage>_<type>, a thread per token for
    coeff and lag_bwd (the new stages launch one per token and component)."""

    name = "baseline-441a7fd"

    def __init__(self, device):
        self.device = device

    def _launch(self, kernel, dtype, r, n_threads, *args):
        threads = n_threads // r if kernel in PER_TOKEN else n_threads
        name = f"{kernel}_{KERNEL_TYPES[dtype][1]}"
        # torch's CUDA as the cupy backend asks it (the tests' stand-in answers for CPU tensors)
        cuda = cupy_backend.CUDA
        if cuda.is_cuda(self.device):  # parameters as today's kernels of the same stage
            packed, _keep = kernel_abi.pack(signature(kernel, dtype), args, lambda t: t.data_ptr())
            cupy = __import__("cupy")
            cupy.cuda.driver.launchKernel(
                _cuda_function(cuda.index(self.device), name),
                grid_for(threads),
                1,
                1,
                BLOCK,
                1,
                1,
                0,
                cuda.stream(self.device),
                ctypes.addressof(packed),
                0,
            )
        else:
            params = kernel_abi.signatures(kernels_dir() / BASELINE)[name]
            kernel_abi.check(name, params, args, _info)
            packed, _keep = kernel_abi.pack(params, args, lambda t: t.data_ptr())
            launch_packed_on_cpu(name, grid_for(threads), BLOCK, ctypes.addressof(packed))


def launch_packed_on_cpu(name: str, grid: int, block: int, kernel_params: int) -> None:
    """Run the baseline's kernel `name` through the shim with CUDA's argument array at
    `kernel_params`."""
    fn = getattr(_cpu_library(), f"launch_{name}")
    fn.restype = None
    fn(ctypes.c_uint(grid), ctypes.c_uint(block), ctypes.c_void_p(kernel_params))


def _info(x):
    return (x.dtype, x.is_contiguous()) if isinstance(x, torch.Tensor) else None


@cache
def _cpu_library():
    main, *deps = (kernels_dir() / s for s in KERNEL_SOURCES)
    return build_library(main, deps, ["-O2"])


@cache
def _cuda_module(index: int):
    """The baseline's module, kept for the process: a CUfunction's pointer outlives nothing of its
    module (a module collected after the lookup unloads it, and the first launch then failed with
    CUDA_ERROR_INVALID_CONTEXT on an H200)."""
    import cupy

    with cupy.cuda.Device(index):
        return cupy.RawModule(code=(kernels_dir() / BASELINE).read_text(), options=("-std=c++17",))


@cache
def _cuda_function(index: int, name: str) -> int:
    import cupy

    with cupy.cuda.Device(index):
        return _cuda_module(index).get_function(name).kernel.ptr


def new_stages(device):
    """Today's kernels on `device`: the cupy backend on a GPU, the shim's on the CPU."""
    return cupy_backend.CupyStages() if cupy_backend.CUDA.is_cuda(device) else CpuKernelStages()


def bench_kernels(device, token_counts, T=TABLE1["L"], r=TABLE1["r"], d=TABLE1["d"]) -> list[dict]:
    """Forward + backward of the op at each token count (B = tokens / T), old and new kernels, same
    inputs; bf16 under autocast on a GPU (as training), fp32 on the CPU."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = []
    for tokens in token_counts:
        B = max(1, tokens // T)
        gen = torch.Generator(device=device).manual_seed(0)
        z = torch.randn(B, T, r, device=device, generator=gen, dtype=dtype, requires_grad=True)
        W = (torch.randn(d, r * (r - 1) // 2, device=device, generator=gen) / 20).requires_grad_()
        b = torch.zeros(d, device=device, requires_grad=True)
        times = {}
        for label, stages in (("441a7fd", BaselineStages(device)), ("new", new_stages(device))):

            def step(stages=stages, z=z, W=W, b=b):
                with autocast(device):
                    g = PluckerMixFunction.apply(z, W, b, LAGS, 1e-6, "zero", stages)
                g.backward(torch.ones_like(g))

            times[label] = timeit(step, device, repeat=5 if device.type == "cuda" else 1, best=True)
        rows.append(
            {
                "tokens": B * T,
                "B": B,
                "T": T,
                "r": r,
                "d": d,
                "dtype": str(dtype).removeprefix("torch."),
                "old_s": times["441a7fd"],
                "new_s": times["new"],
                "speedup": times["441a7fd"] / times["new"],
            }
        )
        print(
            (
                f"kernels {B * T:6d} tokens: old {times['441a7fd'] * 1e3:.2f} ms, new "
                f"{times['new'] * 1e3:.2f} ms"
            ),
            flush=True,
        )
    return rows
