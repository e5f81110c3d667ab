"""The calling convention of kernels/plucker.cu's extern "C" kernels, read off the source.

A CUDA kernel is launched with an array of pointers to its arguments' values, and nothing on the way
checks those values against the parameters: CuPy passes a Python int as 8 bytes and a float as a
double, so an `int` or `float` parameter silently reads garbage. Here every argument is checked
against the `__global__` signature, parsed from the preprocessed source, before it is packed: the
`kernel-cpu` backend and the CuPy stand-in of the tests launch through `pack`, so a launch that
would be wrong on a GPU fails on the CPU first.
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
from functools import cache
from pathlib import Path

import numpy as np

# C scalar parameter type -> the NumPy scalar type a caller must pass (LP64: long is 8 bytes)
SCALARS = {"int": np.int32, "long": np.int64, "float": np.float32, "double": np.float64}
_CTYPES = {
    "int": ctypes.c_int32,
    "long": ctypes.c_int64,
    "float": ctypes.c_float,
    "double": ctypes.c_double,
}
# C pointee type -> (element kind, element size) of the arrays it accepts; bf16_t is raw bits
POINTEES = {"float": ("f", 4), "double": ("f", 8), "int": ("i", 4), "bf16_t": ("bits", 2)}

_KERNEL = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)')


class KernelArgumentError(TypeError):
    pass


def _param_type(decl: str) -> str:
    """'const float* __restrict__ z' -> 'float*';  'long n_tokens' -> 'long'."""
    words = decl.replace("*", " * ").split()
    words = [w for w in words[:-1] if w not in ("const", "__restrict__", "volatile")]
    base = "".join(w for w in words if w != "*")
    return base + "*" * words.count("*")


def parse_signatures(preprocessed: str) -> dict[str, tuple[str, ...]]:
    """{kernel name: parameter types} of every extern "C" __global__ in a preprocessed source."""
    return {
        m.group(1): tuple(_param_type(p) for p in m.group(2).split(","))
        for m in _KERNEL.finditer(preprocessed)
    }


@cache
def signatures(source: Path) -> dict[str, tuple[str, ...]]:
    """The kernels' signatures, preprocessed once per process (as the library is built once)."""
    cxx = os.environ.get("CXX", "g++")
    res = subprocess.run(
        [cxx, "-E", "-P", "-x", "c++", "-std=c++17", str(source)], capture_output=True, text=True
    )
    if res.returncode != 0:
        raise RuntimeError(f"preprocessing {source} failed:\n{res.stderr}")
    sigs = parse_signatures(res.stdout)
    if not sigs:
        raise RuntimeError(f'{source}: no extern "C" __global__ kernels found')
    return sigs


def element_kind(dtype) -> tuple[str, int]:
    """(kind, itemsize) of a torch or NumPy dtype, as POINTEES spells them."""
    dt = str(dtype).removeprefix("torch.")
    if dt == "bfloat16":
        return "bits", 2
    npdt = np.dtype(dt)
    if npdt.kind in "iu" and npdt.itemsize == 2:  # CuPy has no bfloat16: its bits as int16
        return "bits", 2
    return ("f" if npdt.kind == "f" else "i" if npdt.kind in "iu" else npdt.kind), npdt.itemsize


def check(name: str, params: tuple[str, ...], args: tuple, array_info) -> None:
    """Raise KernelArgumentError unless `args` fit `params`. array_info(arg) gives (element dtype,
    contiguous) for an array argument, or None for anything else."""
    if len(args) != len(params):
        raise KernelArgumentError(
            f"{name}: {len(args)} arguments for {len(params)} parameters {params}"
        )
    for i, (param, arg) in enumerate(zip(params, args)):
        info = array_info(arg)
        if param.endswith("*"):
            want = POINTEES[param[:-1]]
            if info is None:
                raise KernelArgumentError(
                    f"{name}: argument {i} ({param}) must be an array, got {type(arg).__name__}"
                )
            dtype, contiguous = info
            if element_kind(dtype) != want:
                raise KernelArgumentError(f"{name}: argument {i} ({param}) got an array of {dtype}")
            if not contiguous:
                raise KernelArgumentError(f"{name}: argument {i} ({param}) is not contiguous")
        else:
            want = SCALARS[param]
            if info is not None or type(arg) is not want:
                got = type(arg).__name__ + (
                    " (CuPy passes a Python int as 64 bits, a float as a double)"
                    if isinstance(arg, (int, float))
                    else ""
                )
                raise KernelArgumentError(
                    f"{name}: argument {i} ({param}) must be numpy.{want.__name__}, got {got}"
                )


_CHECKED: set = set()


def check_once(name: str, params: tuple[str, ...], args: tuple, array_info) -> None:
    """check(), once per kernel and argument types: a launch in a training step's loop costs no more
    than packing its arguments."""
    key = (name, params, tuple(array_info(a) or type(a) for a in args))
    if key not in _CHECKED:
        check(name, params, args, array_info)
        _CHECKED.add(key)


def pack(params: tuple[str, ...], args: tuple, pointer_of) -> tuple[ctypes.Array, list]:
    """CUDA's kernel-argument array for checked args: (void*[n], values to keep alive)."""
    values = [
        ctypes.c_void_p(pointer_of(a)) if p.endswith("*") else _CTYPES[p](a.item())
        for p, a in zip(params, args)
    ]
    array = (ctypes.c_void_p * len(values))(
        *(ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values)
    )
    return array, values
