"""A CuPy stand-in that runs the `cupy` backend end to end on the CPU, holding it to the real
contracts, which the CPU paths otherwise never meet:

  RawModule             compiles nothing here, but knows exactly the kernels a real compile of
                        kernels/plucker.cu (or cross_entropy.cu, the fused LM head's) exports:
                        its extern "C" __global__ functions;
                        get_function of any other name (a template's, say) fails as CUDA's
                        module lookup does (CUDA_ERROR_NOT_FOUND). Other sources and
                        name_expressions are refused: the backend uses neither. A kernel's
                        `.kernel.ptr` is its CUfunction handle, valid on the device it was
                        looked up on while its module lives: a module collected after the
                        lookup is unloaded, and a launch of its function fails as on a GPU.
  driver.launchKernel   cuLaunchKernel(f, grid, block, shared, stream, kernel_params, extra):
                        f must be a handle get_function gave, the launch 1-D, the stream
                        torch's current one (every launch is recorded with it); the argument
                        array, read as CUDA reads it, runs the kernel through the CPU shim
                        (kernels/cpu_shim/), so the numbers are the GPU kernels' own arithmetic
  nvrtc_missing=True    the first compile raises as a CuPy wheel does on a driver-only node
  cupy_cuda, torch_cuda the CUDA majors CuPy and torch are built for (12, 12): unequal, the backend
                        must refuse (explicit cupy) or fall back with a warning (auto)
  capturing()           a CUDA graph capture on stream CAPTURE (torch.cuda.graph's side
                        stream): torch's current stream is then CAPTURE, a launch on any
                        other stream is refused (on a GPU it would silently be missing from
                        the graph), and so are a compile and a CuPy allocation (cupy.empty,
                        cupy.zeros: its pool is not the capture's), which a capture forbids

`install(monkeypatch)` puts it in sys.modules and tells the backend that CPU tensors are CUDA
tensors (cupy_backend.CUDA).
"""

from __future__ import annotations

import sys
import types
import weakref
from contextlib import contextmanager, nullcontext

import numpy as np
import torch

from grassflow.bench import kernels as bench_kernels
from grassflow.kernel_sources import kernels_dir
from grassflow.ops.linear_ce import fused
from grassflow.ops.plucker import cpu_kernel, cupy_backend, kernel_abi

# The sources a module may be compiled from, and the shim launcher of each one's kernels
SOURCES = {
    "plucker.cu": cpu_kernel.launch_packed_on_cpu,
    "cross_entropy.cu": fused.launch_packed_on_cpu,
    bench_kernels.BASELINE: bench_kernels.launch_packed_on_cpu,
}

STREAM = 0x5EED  # the stream handle "torch" reports; every launch must be on it
CAPTURE = 0xCA97  # torch's current stream while a CUDA graph is being captured


class CUDADriverError(RuntimeError):
    pass


class _State:
    def __init__(self):
        self.device = None
        self.launches = []  # (kernel name, grid, block, stream)
        self.compiles = 0
        self.functions = {}  # CUfunction handle -> Function
        self.nvrtc_missing = False
        self.cupy_cuda = self.torch_cuda = 12
        self.capturing = False
        self.allocations = 0


STATE = _State()


class Device:
    """cupy.cuda.Device(index) as a context: the current device while inside."""

    def __init__(self, index=0):
        self.index = index

    def __enter__(self):
        self._prev, STATE.device = STATE.device, self.index
        return self

    def __exit__(self, *exc):
        STATE.device = self._prev


class Function:
    """A CUfunction: what RawKernel.kernel gives, for the device current at the lookup."""

    def __init__(self, name: str, device, launch, module):
        self.name, self.device, self.launch, self.module = name, device, launch, weakref.ref(module)
        self.ptr = 0xF000 + len(STATE.functions)
        STATE.functions[self.ptr] = self


class RawKernel:
    def __init__(self, name, launch, module):
        # a kernel object keeps its module
        self.name, self.launch, self.module = (
            name,
            launch,
            module,
        )

    @property
    def kernel(self):
        if STATE.device is None:
            raise RuntimeError(f"{self.name}: looked up outside a Device context")
        return Function(self.name, STATE.device, self.launch, self.module)

    def __call__(self, *args, **kwargs):
        raise NotImplementedError("stand-in: the backend launches through driver.launchKernel")


def launch_kernel(f, gx, gy, gz, bx, by, bz, shared_mem, stream, kernel_params, extra):
    fn = STATE.functions.get(f)
    if fn is None:
        raise CUDADriverError(
            f"CUDA_ERROR_INVALID_HANDLE: {f:#x} is no function of a loaded module"
        )
    if fn.module() is None:
        raise CUDADriverError(
            f"CUDA_ERROR_INVALID_CONTEXT: {fn.name}: its module was collected after the lookup "
            "(and unloaded): keep the module for as long as its functions are launched"
        )
    if not all(
        type(v) is int for v in (gx, gy, gz, bx, by, bz, shared_mem, stream, kernel_params, extra)
    ):
        raise TypeError("launchKernel takes integers (handles and pointers as int)")
    if (gy, gz, by, bz) != (1, 1, 1, 1):
        raise ValueError(
            f"{fn.name}: our kernels are 1-D, got grid ({gx}, {gy}, {gz}), block ({bx}, {by}, {bz})"
        )
    if shared_mem or extra:
        raise ValueError(f"{fn.name}: no shared memory and no `extra` launch options expected")
    current = CpuAsCuda.stream(None)
    if stream != current:
        raise RuntimeError(
            f"{fn.name}: launched on stream {stream:#x}, torch's current stream is {current:#x}"
            + (": it would be missing from the graph" if STATE.capturing else "")
        )
    STATE.launches.append((fn.name, gx, bx, stream))
    fn.launch(fn.name, gx, bx, kernel_params)


class RawModule:
    def __init__(self, code=None, options=(), name_expressions=None, **kwargs):
        if kwargs or name_expressions is not None:
            raise NotImplementedError(
                f"stand-in RawModule: unsupported {sorted(kwargs) or 'name_expressions'}"
            )
        self.source = next((s for s in SOURCES if code == (kernels_dir() / s).read_text()), None)
        if self.source is None:
            raise NotImplementedError(
                f"stand-in RawModule: models kernels/{' and kernels/'.join(SOURCES)} only"
            )
        self.options = tuple(options)
        self._compiled = None

    def compile(self, log_stream=None):
        if self._compiled is None:
            if STATE.capturing:
                raise RuntimeError(
                    "cudaErrorStreamCaptureUnsupported: a module compiled and loaded during a "
                    "capture"
                )
            if STATE.nvrtc_missing:
                raise RuntimeError(
                    "CuPy failed to load libnvrtc.so.12: OSError: libnvrtc.so.12: "
                    "cannot open shared object file: No such file or directory"
                )
            STATE.compiles += 1
            self._compiled = kernel_abi.signatures(kernels_dir() / self.source)  # its exports
        return self

    def get_function(self, name):
        self.compile()
        if name not in self._compiled:
            raise CUDADriverError(f"CUDA_ERROR_NOT_FOUND: named symbol not found ({name!r})")
        return RawKernel(name, SOURCES[self.source], self)


def _allocate(shape, dtype=np.float32):
    if STATE.capturing:
        raise RuntimeError(
            "cudaErrorStreamCaptureUnsupported: CuPy's memory pool allocates during a capture"
        )
    STATE.allocations += 1
    return torch.zeros(shape, dtype=getattr(torch, np.dtype(dtype).name))


def _module():
    cupy = types.ModuleType("cupy")
    cupy.empty = cupy.zeros = _allocate
    cupy.__version__ = "14.0-standin"
    cupy.RawModule, cupy.RawKernel = RawModule, RawKernel
    cuda = types.SimpleNamespace(Device=Device)
    cuda.runtime = types.SimpleNamespace(runtimeGetVersion=lambda: STATE.cupy_cuda * 1000 + 40)
    cuda.nvrtc = types.SimpleNamespace(getVersion=_nvrtc_version)
    cuda.driver = types.SimpleNamespace(CUDADriverError=CUDADriverError, launchKernel=launch_kernel)
    cupy.cuda = cuda
    return cupy


def _nvrtc_version():
    if STATE.nvrtc_missing:
        raise RuntimeError(f"CuPy failed to load libnvrtc.so.{STATE.cupy_cuda}")
    return (STATE.cupy_cuda, 4)


class CpuAsCuda(cupy_backend.TorchCuda):
    """Tells the backend that CPU tensors live on CUDA device 0 with stream STREAM."""

    @staticmethod
    def available():
        return True

    @staticmethod
    def is_cuda(device):
        return True

    @staticmethod
    def index(device):
        return 0

    @staticmethod
    def stream(device):
        return CAPTURE if STATE.capturing else STREAM

    @staticmethod
    def current(index):
        return nullcontext()

    @staticmethod
    def major():
        return STATE.torch_cuda


@contextmanager
def capturing():
    """Inside: a CUDA graph capture (see the module's docstring)."""
    STATE.capturing = True
    try:
        yield STATE
    finally:
        STATE.capturing = False


def _clear_caches():
    cupy_backend._module.cache_clear()
    cupy_backend._function.cache_clear()
    cupy_backend._compile_error.cache_clear()
    cupy_backend._warn_fallback.cache_clear()
    fused._module.cache_clear()
    fused._function.cache_clear()


@contextmanager
def installed(monkeypatch, nvrtc_missing=False, cupy_cuda=12, torch_cuda=12):
    """The stand-in as `cupy` (built for CUDA `cupy_cuda`), CPU tensors as CUDA tensors of a torch
    built for CUDA `torch_cuda`; yields its state."""
    global STATE
    STATE = _State()
    STATE.nvrtc_missing = nvrtc_missing
    STATE.cupy_cuda, STATE.torch_cuda = cupy_cuda, torch_cuda
    monkeypatch.setitem(sys.modules, "cupy", _module())
    monkeypatch.setattr(cupy_backend, "CUDA", CpuAsCuda())
    _clear_caches()
    try:
        yield STATE
    finally:
        _clear_caches()
