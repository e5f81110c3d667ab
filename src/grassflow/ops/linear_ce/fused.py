"""The `fused` head's kernels: kernels/cross_entropy.cu, the loss of each row of a logits block and
its gradient written over the logits, in three barrier-free launches (see the source).

On CUDA they are compiled by CuPy (NVRTC) and launched through the driver on torch's current stream,
with the contracts of the Plücker op's `cupy` backend (ops/plucker/cupy_backend.py): raw pointers
and NumPy scalars of each parameter's exact type, nothing allocated by CuPy, so the head can be
captured in a CUDA graph. On the CPU the same source runs through the CUDA-on- CPU shim
(kernels/cpu_shim/), one thread at a time: slow, it exists so the GPU's arithmetic and calling
convention are tested without a GPU (tests/helpers/fake_cupy.py runs the CUDA path on it).
"""

from __future__ import annotations

import ctypes
from functools import cache

import numpy as np
import torch

from grassflow.kernel_sources import kernels_dir
from grassflow.ops.plucker import cupy_backend, kernel_abi
from grassflow.ops.plucker.cpu_kernel import build_library
from grassflow.ops.plucker.kernel_stages import BLOCK, grid_for

# What is compiled, under kernels/: NVRTC's source first, then the CPU shim's (read by
# grassflow.planning.staleness: an edit to any of them reruns what runs this).
KERNEL_SOURCES = ("cross_entropy.cu", "cpu_shim/cross_entropy_cpu.cpp", "cpu_shim/cuda_cpu_shim.h")
TYPES = {torch.float32: ("float", "f32"), torch.bfloat16: ("bf16_t", "bf16")}
# The kernels' parameters as cross_entropy.cu declares them (T: the logits' type), for the GPU
# launch, where no C++ compiler is assumed to read them; tests/ops/test_linear_ce.py holds them to
# the source.
PARAMS = {
    "ce_partial": ("T*", "long", "int", "int", "float*", "float*"),
    "ce_finish": (
        "T*",
        "int*",
        "float*",
        "float*",
        "long",
        "int",
        "int",
        "float*",
        "float*",
        "float*",
    ),
    "ce_grad": ("T*", "int*", "float*", "float*", "long", "int", "float"),
}
# threads per row in ce_partial: 4,096 rows make 4,096 blocks, and each thread reads V/256 logits
LANES = 256


def _launch(kernel: str, dtype: torch.dtype, n_threads: int, *args) -> None:
    t, suffix = TYPES[dtype]
    name, params = f"{kernel}_{suffix}", tuple(p.replace("T", t) for p in PARAMS[kernel])
    kernel_abi.check_once(name, params, args, _tensor_info)
    packed, _keep = kernel_abi.pack(params, args, lambda x: x.data_ptr())
    device = args[0].device
    if cupy_backend.CUDA.is_cuda(device):
        _launch_cuda(name, device, n_threads, packed)
    else:
        launch_packed_on_cpu(name, grid_for(n_threads), BLOCK, ctypes.addressof(packed))


def launch_packed_on_cpu(name: str, grid: int, block: int, kernel_params: int) -> None:
    """Run kernel `name` through the shim with CUDA's argument array at `kernel_params`."""
    fn = getattr(_cpu_library(), f"launch_{name}")
    fn.restype = None
    fn(ctypes.c_uint(grid), ctypes.c_uint(block), ctypes.c_void_p(kernel_params))


def softmax_cross_entropy_(
    logits: torch.Tensor, target: torch.Tensor, scale: float
) -> torch.Tensor:
    """Each row's cross-entropy (fp32, (N,)) of `logits` (N, V), float32 or bfloat16, contiguous,
    against `target` (N,); `logits` is overwritten by scale · (softmax − onehot), the gradient of
    scale · Σ loss. A target outside [0, V) gives its row a NaN loss (no host sync to check it)."""
    if logits.dtype not in TYPES or logits.dim() != 2 or not logits.is_contiguous():
        raise ValueError(
            f"softmax_cross_entropy_ takes contiguous (N, V) float32 or bfloat16 logits, "
            f"got {tuple(logits.shape)} {logits.dtype}"
        )
    N, V = logits.shape
    y = target.to(torch.int32).contiguous()
    f32 = dict(dtype=torch.float32, device=logits.device)
    part_max, part_sum = torch.empty(N, LANES, **f32), torch.empty(N, LANES, **f32)
    row_max, row_log_sum, loss = (torch.empty(N, **f32) for _ in range(3))
    n, v, lanes = np.int64(N), np.int32(V), np.int32(LANES)
    _launch("ce_partial", logits.dtype, N * LANES, logits, n, v, lanes, part_max, part_sum)
    _launch(
        "ce_finish",
        logits.dtype,
        N,
        logits,
        y,
        part_max,
        part_sum,
        n,
        v,
        lanes,
        row_max,
        row_log_sum,
        loss,
    )
    _launch(
        "ce_grad", logits.dtype, N * V, logits, y, row_max, row_log_sum, n, v, np.float32(scale)
    )
    return loss


def why_not(device: torch.device) -> str | None:
    """None if the kernels can run on `device`, else why not (CUDA: what the Plücker op's CuPy
    backend needs, then this source's own compile)."""
    if not cupy_backend.CUDA.is_cuda(device):
        return (
            None
            if device.type == "cpu"
            else f"runs on CUDA (CuPy) or the CPU (the shim), not {device}"
        )
    why = cupy_backend.why_not(device)
    if why is not None:
        return why
    try:
        _module(cupy_backend.CUDA.index(device))
    except Exception as e:  # NVRTC's CompileException, driver errors
        return (
            f"CuPy cannot compile kernels/{KERNEL_SOURCES[0]} ({type(e).__name__}: "
            f"{str(e).strip()[:200]})"
        )
    return None


@cache
def _cpu_library() -> ctypes.CDLL:
    main, *deps = (kernels_dir() / s for s in KERNEL_SOURCES[1:])
    return build_library(main, [kernels_dir() / KERNEL_SOURCES[0], *deps], ["-O2"])


@cache
def _module(device_index: int):
    """The compiled module, kept for the process: a CUfunction lives as long as its module."""
    import cupy

    with cupy.cuda.Device(device_index):
        mod = cupy.RawModule(
            code=(kernels_dir() / KERNEL_SOURCES[0]).read_text(), options=("-std=c++17",)
        )
        mod.compile()
    return mod


@cache
def _function(device_index: int, name: str) -> int:
    import cupy

    with cupy.cuda.Device(device_index):
        return _module(device_index).get_function(name).kernel.ptr


def _launch_cuda(name: str, device: torch.device, n_threads: int, packed) -> None:
    import cupy

    cuda = cupy_backend.CUDA
    idx = cuda.index(device)
    with cuda.current(idx):
        cupy.cuda.driver.launchKernel(
            _function(idx, name),
            grid_for(n_threads),
            1,
            1,
            BLOCK,
            1,
            1,
            0,
            cuda.stream(device),
            ctypes.addressof(packed),
            0,
        )


def _tensor_info(x):
    return (x.dtype, x.is_contiguous()) if isinstance(x, torch.Tensor) else None
