"""A CuPy stand-in that runs the `cupy` backend end to end on the CPU, holding it to the real
contracts, which the CPU paths otherwise never meet:

  asarray(tensor)       goes through the tensor's array interface as CuPy does, and refuses
                        what torch's __cuda_array_interface__ refuses: a tensor that requires
                        grad (CuPy 13 then falls back to numpy.array(tensor), which fails with
                        "can't convert cuda:0 device type tensor to numpy"), and dtypes the
                        interface has no type string for (bfloat16)
  RawModule             compiles nothing here, but knows exactly the kernels a real compile of
                        kernels/plucker.cu exports: its extern "C" __global__ functions;
                        get_function of any other name (a template's, say) fails as CUDA's
                        module lookup does (CUDA_ERROR_NOT_FOUND). Other sources and
                        name_expressions are refused: the backend uses neither.
  kernel launch         (grid, block, args): args must be this module's arrays or NumPy
                        scalars whose types match the kernel's __global__ signature (parsed
                        from kernels/plucker.cu); a launch outside a Device and a stream
                        context is refused (the backend must use torch's current stream)
  streams               as CuPy 14 (`cupy_major=14`, the default): Stream.from_external takes an
                        object with __cuda_stream__ returning (0, ptr), and ExternalStream
                        warns DeprecationWarning; as CuPy 13: only ExternalStream(ptr)
  nvrtc_missing=True    the first compile raises as a CuPy wheel does on a driver-only node
  cupy_cuda, torch_cuda the CUDA majors CuPy and torch are built for (12, 12): unequal, the backend
                        must refuse (explicit cupy) or fall back with a warning (auto)
  capturing()           a CUDA graph capture on stream CAPTURE (torch.cuda.graph's side
                        stream): torch's current stream is then CAPTURE, a launch on any
                        other stream is refused (on a GPU it would silently be missing from
                        the graph), and so are a compile and a CuPy allocation (cupy.empty,
                        cupy.zeros: its pool is not the capture's), which a capture forbids

Launches run the kernels of kernels/plucker.cu through the CPU shim (kernels/cpu_shim/), so
the numbers are the GPU kernels' own arithmetic. `install(monkeypatch)` puts it in sys.modules
and tells the backend that CPU tensors are CUDA tensors (cupy_backend.CUDA).
"""

from __future__ import annotations

import sys
import types
import warnings
from contextlib import contextmanager

import numpy as np
import torch

from grassflow.ops.plucker import cupy_backend, kernel_abi
from grassflow.ops.plucker.cpu_kernel import launch_on_cpu
from grassflow.ops.plucker.kernel_stages import kernels_dir

STREAM = 0x5EED  # the stream handle "torch" reports; every launch must be on it
CAPTURE = 0xCA97  # torch's current stream while a CUDA graph is being captured
_TYPESTR = {torch.float16: "<f2", torch.float32: "<f4", torch.float64: "<f8", torch.int8: "|i1",
            torch.int16: "<i2", torch.int32: "<i4", torch.int64: "<i8", torch.uint8: "|u1", torch.bool: "|b1"}


class CUDADriverError(RuntimeError):
    pass


class CudaArrayInterfaceError(TypeError):
    pass


def cuda_array_interface(t: torch.Tensor) -> dict:
    """What torch's Tensor.__cuda_array_interface__ gives, with its refusals."""
    if t.requires_grad:
        raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad. "
                           "If gradients aren't required, use var.detach() to get Variable that doesn't require grad.")
    if t.dtype not in _TYPESTR:
        raise TypeError(f"dtype {t.dtype} is not supported by __cuda_array_interface__")
    item = t.element_size()
    return {"typestr": _TYPESTR[t.dtype], "shape": tuple(t.shape), "data": (t.data_ptr(), False),
            "strides": tuple(s * item for s in t.stride()), "version": 2}


class ndarray:
    """A device array over a tensor's memory (zero-copy, as cupy.asarray of a CUDA tensor)."""

    def __init__(self, tensor: torch.Tensor, iface: dict):
        self._tensor = tensor  # keeps the memory alive
        self.dtype = np.dtype(iface["typestr"])
        self.shape = iface["shape"]
        self.ptr = iface["data"][0]
        contiguous = 1
        self.flags_c_contiguous = True
        for n, stride in reversed(list(zip(self.shape, iface["strides"]))):
            if n > 1 and stride != contiguous * self.dtype.itemsize:
                self.flags_c_contiguous = False
            contiguous *= n


def asarray(obj):
    if isinstance(obj, ndarray):
        return obj
    if isinstance(obj, torch.Tensor):
        try:
            iface = cuda_array_interface(obj)
        except (RuntimeError, TypeError) as e:
            # CuPy 13 then tries numpy.array(obj), which a CUDA tensor refuses
            raise TypeError(f"can't convert cuda:0 device type tensor to numpy ({e})") from e
        return ndarray(obj, iface)
    raise TypeError(f"stand-in asarray takes tensors or arrays, got {type(obj).__name__}")


class _State:
    def __init__(self):
        self.device, self.stream = None, None
        self.launches = []  # (kernel name, grid, block, stream)
        self.compiles = 0
        self.nvrtc_missing = False
        self.cupy_major = 14
        self.cupy_cuda = self.torch_cuda = 12
        self.capturing = False
        self.allocations = 0


STATE = _State()


class _Current:
    """A context that sets one of STATE's current values (device, stream) and restores it."""

    attr = ""

    def __init__(self, value):
        self.value = value

    def __enter__(self):
        self._prev = getattr(STATE, self.attr)
        setattr(STATE, self.attr, self.value)
        return self

    def __exit__(self, *exc):
        setattr(STATE, self.attr, self._prev)


class Device(_Current):
    attr = "device"

    def __init__(self, index=0):
        super().__init__(index)


class ExternalStream(_Current):
    attr = "stream"

    def __init__(self, ptr, device_id=-1):
        if STATE.cupy_major >= 14:
            warnings.warn("ExternalStream is deprecated. Use Stream.from_external() instead to interoperate "
                          "with external streams that implement the CUDA stream protocol.",
                          DeprecationWarning, stacklevel=2)
        super().__init__(ptr)


class Stream(_Current):
    attr = "stream"

    @classmethod
    def from_external(cls, obj):
        proto = getattr(obj, "__cuda_stream__", None)
        if proto is None:
            raise TypeError(f"{type(obj).__name__} does not implement __cuda_stream__")
        got = proto()
        if not (isinstance(got, tuple) and len(got) == 2 and all(type(v) is int for v in got)) or got[0] != 0:
            raise TypeError(f"__cuda_stream__ must return (0, stream pointer), got {got!r}")
        return cls(got[1])


class RawKernel:
    def __init__(self, name, params):
        self.name, self.params = name, params

    def __call__(self, grid, block, args, **kwargs):
        if kwargs:
            raise TypeError(f"stand-in kernel call: unsupported {sorted(kwargs)}")
        if STATE.stream is None or STATE.device is None:
            raise RuntimeError(f"{self.name}: launched outside a Device and a stream context")
        if not (isinstance(grid, tuple) and isinstance(block, tuple) and isinstance(args, tuple)):
            raise TypeError("kernel call takes (grid tuple, block tuple, args tuple)")
        grid, block = (tuple(grid) + (1, 1))[:3], (tuple(block) + (1, 1))[:3]
        if grid[1:] != (1, 1) or block[1:] != (1, 1):
            raise ValueError(f"{self.name}: plucker kernels are 1-D, got grid {grid}, block {block}")
        info = lambda a: (a.dtype, a.flags_c_contiguous) if isinstance(a, ndarray) else None  # noqa: E731
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                raise TypeError(f"{self.name}: argument {i} is a torch.Tensor; CuPy launches take arrays")
        kernel_abi.check(self.name, self.params, args, info)
        if STATE.capturing and STATE.stream != CAPTURE:
            raise RuntimeError(f"{self.name}: launched on stream {STATE.stream:#x} during a capture on "
                               f"{CAPTURE:#x}: it would be missing from the graph")
        STATE.launches.append((self.name, grid[0], block[0], STATE.stream))
        launch_on_cpu(self.name, grid[0], block[0], args, info, lambda a: a.ptr)


class RawModule:
    def __init__(self, code=None, options=(), name_expressions=None, **kwargs):
        if kwargs or name_expressions is not None:
            raise NotImplementedError(f"stand-in RawModule: unsupported {sorted(kwargs) or 'name_expressions'}")
        if code != (kernels_dir() / "plucker.cu").read_text():
            raise NotImplementedError("stand-in RawModule: models kernels/plucker.cu only")
        self.options = tuple(options)
        self._compiled = None

    def compile(self, log_stream=None):
        if self._compiled is None:
            if STATE.capturing:
                raise RuntimeError("cudaErrorStreamCaptureUnsupported: a module compiled and loaded during a capture")
            if STATE.nvrtc_missing:
                raise RuntimeError("CuPy failed to load libnvrtc.so.12: OSError: libnvrtc.so.12: "
                                   "cannot open shared object file: No such file or directory")
            STATE.compiles += 1
            self._compiled = kernel_abi.signatures(kernels_dir() / "plucker.cu")  # its exports
        return self

    def get_function(self, name):
        self.compile()
        if name not in self._compiled:
            raise CUDADriverError(f"CUDA_ERROR_NOT_FOUND: named symbol not found ({name!r})")
        return RawKernel(name, self._compiled[name])


def _allocate(shape, dtype=np.float32):
    if STATE.capturing:
        raise RuntimeError("cudaErrorStreamCaptureUnsupported: CuPy's memory pool allocates during a capture")
    STATE.allocations += 1
    t = torch.zeros(shape, dtype=getattr(torch, np.dtype(dtype).name))
    return ndarray(t, cuda_array_interface(t))


def _module():
    cupy = types.ModuleType("cupy")
    cupy.empty = cupy.zeros = _allocate
    cupy.__version__ = f"{STATE.cupy_major}.0-standin"
    cupy.asarray, cupy.ndarray, cupy.RawModule, cupy.RawKernel = asarray, ndarray, RawModule, RawKernel
    cuda = types.SimpleNamespace(Device=Device, ExternalStream=ExternalStream)
    if STATE.cupy_major >= 14:
        cuda.Stream = Stream
    else:
        cuda.Stream = type("Stream", (), {})  # CuPy 13's Stream has no from_external
    cuda.runtime = types.SimpleNamespace(runtimeGetVersion=lambda: STATE.cupy_cuda * 1000 + 40)
    cuda.nvrtc = types.SimpleNamespace(getVersion=_nvrtc_version)
    cuda.driver = types.SimpleNamespace(CUDADriverError=CUDADriverError)
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
    cupy_backend._compile_error.cache_clear()
    cupy_backend._warn_fallback.cache_clear()


@contextmanager
def installed(monkeypatch, nvrtc_missing=False, cupy_major=14, cupy_cuda=12, torch_cuda=12):
    """The stand-in as `cupy` (CuPy `cupy_major`, built for CUDA `cupy_cuda`), CPU tensors as
    CUDA tensors of a torch built for CUDA `torch_cuda`; yields its state."""
    global STATE
    STATE = _State()
    STATE.nvrtc_missing, STATE.cupy_major = nvrtc_missing, cupy_major
    STATE.cupy_cuda, STATE.torch_cuda = cupy_cuda, torch_cuda
    monkeypatch.setitem(sys.modules, "cupy", _module())
    monkeypatch.setattr(cupy_backend, "CUDA", CpuAsCuda())
    _clear_caches()
    try:
        yield STATE
    finally:
        _clear_caches()
