"""`cupy` backend: kernels/plucker.cu compiled once per device by CuPy (NVRTC; CuPy also
caches the binary on disk) and launched on PyTorch's current CUDA stream."""

from __future__ import annotations

from functools import cache

import torch

from grassflow.ops.plucker.kernel_stages import KERNEL_TYPES, KERNELS, KernelStages, kernels_dir

BLOCK = 256


def cupy_available() -> bool:
    try:
        import cupy  # noqa: F401
    except Exception:
        return False
    return torch.cuda.is_available()


@cache
def _module(device_index: int):
    import cupy

    src = (kernels_dir() / "plucker.cu").read_text()
    names = [f"{k}<{ctype}>" for k in KERNELS for ctype, _ in KERNEL_TYPES.values()]
    with cupy.cuda.Device(device_index):
        mod = cupy.RawModule(code=src, options=("-std=c++17",), name_expressions=names)
        mod.compile()
    return mod


def _as_cupy(x):
    import cupy

    if isinstance(x, torch.Tensor):
        # CuPy has no bfloat16: hand it the same bytes as int16.
        return cupy.asarray(x.view(torch.int16) if x.dtype == torch.bfloat16 else x)
    return x


class CupyStages(KernelStages):
    name = "cupy"

    def _launch(self, kernel, dtype, n_threads, *args):
        import cupy

        if n_threads == 0:
            return
        dev = args[0].device
        fn = _module(dev.index).get_function(f"{kernel}<{KERNEL_TYPES[dtype][0]}>")
        stream = cupy.cuda.ExternalStream(torch.cuda.current_stream(dev).cuda_stream)
        with cupy.cuda.Device(dev.index), stream:
            fn(((n_threads + BLOCK - 1) // BLOCK,), (BLOCK,), tuple(_as_cupy(a) for a in args))
