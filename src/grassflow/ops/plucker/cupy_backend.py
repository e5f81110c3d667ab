"""`cupy` backend: kernels/plucker.cu compiled by CuPy (NVRTC) once per device and launched on
PyTorch's current CUDA stream.

The kernels are extern "C" (plucker_<stage>_<suffix>), so the module is compiled without
`name_expressions` and CuPy keeps the binary in its on-disk cache ($CUPY_CACHE_DIR, default
~/.cupy/kernel_cache): a new process loads it instead of recompiling.

CuPy compiles the module and looks each kernel up once; the launches go straight to the driver with
raw pointers (CupyStages). Contracts with torch and CuPy, each rehearsed on the CPU by
tests/helpers/fake_cupy.py:
  - kernel arguments are NumPy scalars of the parameter's exact type (kernel_abi), pointers
    are the tensors' data pointers (no CuPy array: CuPy has no bfloat16, and torch's
    `__cuda_array_interface__` refuses tensors that require grad).
  - kernels launch on torch's current stream (a CUDA graph's capture stream while capturing);
    CuPy allocates nothing.
  - a CuPy wheel needs NVRTC at its first compile, which a driver-only node lacks: `usable()`
    compiles once per device; `auto` then falls back to `fast` with one warning line, and an
    explicit `cupy` fails with the cause.
  - CuPy must be built for torch's CUDA major (cupy-cuda12x beside a CUDA 12 torch, cupy-cuda13x
    beside CUDA 13's): otherwise the same, the message naming the extra to install.
"""

from __future__ import annotations

import ctypes
import sys
from contextlib import nullcontext
from functools import cache

import torch

from grassflow.kernel_sources import kernels_dir
from grassflow.ops.plucker import kernel_abi
from grassflow.ops.plucker.kernel_stages import BLOCK, KernelStages, grid_for


class TorchCuda:
    """What the backend asks of torch about CUDA devices. The tests swap in an object that answers
    for CPU tensors, to run this backend end to end against a CuPy stand-in."""

    @staticmethod
    def available() -> bool:
        return torch.cuda.is_available()

    @staticmethod
    def is_cuda(device: torch.device) -> bool:
        return device.type == "cuda"

    @staticmethod
    def index(device: torch.device) -> int:
        return device.index if device.index is not None else torch.cuda.current_device()

    @staticmethod
    def stream(device: torch.device) -> int:
        return torch.cuda.current_stream(device).cuda_stream

    @staticmethod
    def current(index: int):
        """A context making device `index` current, where it is not (a launch needs its context)."""
        return nullcontext() if torch.cuda.current_device() == index else torch.cuda.device(index)

    @staticmethod
    def major() -> int | None:
        """The CUDA major torch was built for (None: a CPU build)."""
        return int(torch.version.cuda.split(".")[0]) if torch.version.cuda else None


CUDA = TorchCuda()


def extra(major: int | None) -> str:
    """The install that gives CuPy for torch's CUDA major (pyproject.toml's gpu-cuda<major>
    extras)."""
    return (
        f"pip install 'grassflow[gpu-cuda{major}]'"
        if major in (12, 13)
        else f"no grassflow extra for CUDA {major}: install torch built for CUDA 12 or 13"
    )


MISMATCH = "CuPy and torch are built for different CUDA majors"


def _cupy_major() -> int:
    import cupy

    # CUDA 12.4 → 12040 (the CUDA CuPy was built for)
    return cupy.cuda.runtime.runtimeGetVersion() // 1000


def cupy_installed() -> bool:
    try:
        import cupy  # noqa: F401
    except Exception:
        return False
    return True


# what NVRTC compiles, under kernels/ (read by grassflow.planning.staleness)
KERNEL_SOURCES = ("plucker.cu",)


@cache
def _module(device_index: int):
    import cupy

    src = (kernels_dir() / KERNEL_SOURCES[0]).read_text()
    with cupy.cuda.Device(device_index):
        mod = cupy.RawModule(code=src, options=("-std=c++17",))
        mod.compile()
    return mod


COMPILE_FAILED = "CuPy cannot compile kernels/plucker.cu"


@cache
def _compile_error(device_index: int) -> str | None:
    """None if the kernels compile on this device, else why not (asked once per process)."""
    try:
        _module(device_index)
    except Exception as e:  # NVRTC missing (RuntimeError/OSError), CompileException, driver errors
        first = (str(e).strip().splitlines() or [""])[0]
        return f"{COMPILE_FAILED} ({type(e).__name__}: {first})"
    return None


def why_not(device: torch.device) -> str | None:
    """None if the backend can run on `device`, else why not."""
    if not CUDA.is_cuda(device):
        return f"needs CUDA tensors, got a tensor on {device}"
    if not CUDA.available():
        return "no CUDA device is available"
    if not cupy_installed():
        return f"needs CuPy: {extra(CUDA.major())}"
    if _cupy_major() != CUDA.major():  # its kernels would not load beside torch's CUDA libraries
        return (
            f"{MISMATCH}: CuPy for CUDA {_cupy_major()}, torch for CUDA {CUDA.major()}: "
            f"pip uninstall cupy-cuda{_cupy_major()}x; {extra(CUDA.major())}"
        )
    return _compile_error(CUDA.index(device))


@cache
def _warn_fallback(why: str) -> None:
    print(
        f"[grassflow] warning: {why}; plucker_backend 'auto' uses 'fast' instead", file=sys.stderr
    )


def usable(device: torch.device, *, warn: bool = True) -> bool:
    """CuPy installed for torch's CUDA major, a CUDA device, and the kernels compile on it. A CuPy
    that is there but cannot run (another CUDA major, a failed compile) is worth a warning line
    where `auto` falls back; the preflight's record says the same (fallback)."""
    why = why_not(device)
    if why is not None and warn and why.startswith((COMPILE_FAILED, MISMATCH)):
        _warn_fallback(why)
    return why is None


def require(device: torch.device) -> None:
    """Raise, naming the cause, unless the backend can run on `device`."""
    why = why_not(device)
    if why is not None:
        raise RuntimeError(f"plucker_backend 'cupy': {why}")


def cupy_available() -> bool:
    """True where `auto` would pick CuPy on the current CUDA device."""
    return usable(torch.device("cuda"), warn=False)


@cache
def _function(device_index: int, name: str) -> int:
    """The CUfunction of kernel `name` on a device, looked up once per process."""
    import cupy

    with cupy.cuda.Device(device_index):
        return _module(device_index).get_function(name).kernel.ptr


class CupyStages(KernelStages):
    """Launches through the driver (cuLaunchKernel) on torch's current stream, with CUDA's argument
    array of raw pointers and NumPy scalars (kernel_abi.pack, as the CPU shim takes it): no CuPy
    array, stream or device object per launch, and nothing allocated by CuPy, so the op is safe to
    capture in a CUDA graph."""

    name = "cupy"

    def _run(self, name, params, n_threads, *args):
        import cupy

        dev = args[0].device
        idx = CUDA.index(dev)
        kernel_abi.check_once(name, params, args, _tensor_info)
        packed, _keep = kernel_abi.pack(params, args, lambda t: t.data_ptr())
        with CUDA.current(idx):
            cupy.cuda.driver.launchKernel(
                _function(idx, name),
                grid_for(n_threads),
                1,
                1,
                BLOCK,
                1,
                1,
                0,
                CUDA.stream(dev),
                ctypes.addressof(packed),
                0,
            )


def _tensor_info(x):
    return (x.dtype, x.is_contiguous()) if isinstance(x, torch.Tensor) else None
