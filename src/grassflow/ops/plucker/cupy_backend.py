"""`cupy` backend: kernels/plucker.cu compiled by CuPy (NVRTC) once per device and launched on
PyTorch's current CUDA stream.

The kernels are extern "C" (plucker_<stage>_<suffix>), so the module is compiled without
`name_expressions` and CuPy keeps the binary in its on-disk cache ($CUPY_CACHE_DIR, default
~/.cupy/kernel_cache): a new process loads it instead of recompiling.

Contracts with torch and CuPy, each rehearsed on the CPU by tests/fake_cupy.py:
  - torch refuses `__cuda_array_interface__` for a tensor that requires grad (inside an
    autograd.Function the inputs and saved tensors still do): tensors are detached first.
  - CuPy has no bfloat16: a bf16 tensor is handed over as the same bytes in int16.
  - kernel arguments are NumPy scalars of the parameter's exact type (kernel_abi).
  - kernels launch on torch's current stream, handed to CuPy through the CUDA stream protocol
    (`Stream.from_external`, CuPy >= 14, which deprecates `ExternalStream`), else as a pointer.
  - a CuPy wheel needs NVRTC at its first compile, which a driver-only node lacks: `usable()`
    compiles once per device; `auto` then falls back to `fast` with one warning line, and an
    explicit `cupy` fails with the cause.
  - CuPy must be built for torch's CUDA major (cupy-cuda12x beside a CUDA 12 torch, cupy-cuda13x
    beside CUDA 13's): otherwise the same, the message naming the extra to install.
"""

from __future__ import annotations

import sys
from functools import cache

import torch

from grassflow.ops.plucker.kernel_stages import (
    BLOCK,
    KernelStages,
    grid_for,
    kernel_name,
    kernels_dir,
)


class TorchCuda:
    """What the backend asks of torch about CUDA devices. The tests swap in an object that
    answers for CPU tensors, to run this backend end to end against a CuPy stand-in."""

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
    def major() -> int | None:
        """The CUDA major torch was built for (None: a CPU build)."""
        return int(torch.version.cuda.split(".")[0]) if torch.version.cuda else None


CUDA = TorchCuda()


def extra(major: int | None) -> str:
    """The install that gives CuPy for torch's CUDA major (pyproject.toml's gpu-cuda<major> extras)."""
    return f"pip install 'grassflow[gpu-cuda{major}]'" if major in (12, 13) else \
        f"no grassflow extra for CUDA {major}: install torch built for CUDA 12 or 13"


MISMATCH = "CuPy and torch are built for different CUDA majors"


def _cupy_major() -> int:
    import cupy

    return cupy.cuda.runtime.runtimeGetVersion() // 1000  # CUDA 12.4 → 12040 (the CUDA CuPy was built for)


def cupy_installed() -> bool:
    try:
        import cupy  # noqa: F401
    except Exception:
        return False
    return True


KERNEL_SOURCES = ("plucker.cu",)  # what NVRTC compiles, under kernels/ (read by grassflow.staleness)


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
        return (f"{MISMATCH}: CuPy for CUDA {_cupy_major()}, torch for CUDA {CUDA.major()}: "
                f"pip uninstall cupy-cuda{_cupy_major()}x; {extra(CUDA.major())}")
    return _compile_error(CUDA.index(device))


@cache
def _warn_fallback(why: str) -> None:
    print(f"[grassflow] warning: {why}; plucker_backend 'auto' uses 'fast' instead", file=sys.stderr)


def usable(device: torch.device, *, warn: bool = True) -> bool:
    """CuPy installed for torch's CUDA major, a CUDA device, and the kernels compile on it. A
    CuPy that is there but cannot run (another CUDA major, a failed compile) is worth a warning
    line where `auto` falls back; the preflight's record says the same (fallback)."""
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


class _StreamRef:
    """A raw cudaStream_t under the CUDA stream protocol (version 0)."""

    def __init__(self, ptr: int):
        self.ptr = ptr

    def __cuda_stream__(self):
        return (0, self.ptr)


def _cupy_stream(cupy, ptr: int):
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    return from_external(_StreamRef(ptr)) if from_external else cupy.cuda.ExternalStream(ptr)


def _as_cupy(x):
    import cupy

    if isinstance(x, torch.Tensor):
        x = x.detach()  # torch's __cuda_array_interface__ refuses tensors that require grad
        return cupy.asarray(x.view(torch.int16) if x.dtype == torch.bfloat16 else x)
    return x


class CupyStages(KernelStages):
    name = "cupy"

    def _run(self, kernel, dtype, n_threads, *args):
        import cupy

        dev = args[0].device
        idx = CUDA.index(dev)
        fn = _module(idx).get_function(kernel_name(kernel, dtype))
        with cupy.cuda.Device(idx), _cupy_stream(cupy, CUDA.stream(dev)):
            fn((grid_for(n_threads),), (BLOCK,), tuple(_as_cupy(a) for a in args))
