"""`kernel-cpu` backend: kernels/plucker.cu compiled with g++ through the CUDA-on-CPU shim
(kernels/cpu_shim/) and launched with ctypes, grid, block and CUDA's argument array, every argument
checked against the kernel's signature (kernel_abi). Slow (one "thread" at a time); it exists so the
GPU kernels' arithmetic and calling convention are tested without a GPU."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch

from grassflow.kernel_sources import kernels_dir
from grassflow.ops.plucker import kernel_abi
from grassflow.ops.plucker.kernel_stages import BLOCK, KernelStages, grid_for


def _cache_dir() -> Path:
    root = os.environ.get("GRASSFLOW_CACHE") or Path.home() / ".cache" / "grassflow"
    return Path(root) / "kernel-cpu"


class UnsafeKernelCache(RuntimeError):
    """A compiled kernel that someone other than this user could have written: never loaded."""


def check_private(path: Path, *, ancestors: bool = True) -> None:
    """Raise UnsafeKernelCache unless `path` belongs to this user (or root) and no one else can
    write it; with ancestors, the same for every directory above it, except that a directory others
    may write is accepted if it is sticky (as /tmp: they cannot rename what is ours). As ssh checks
    the files it trusts: whoever can write there could plant a library we load."""
    uid = os.getuid()
    real = Path(os.path.realpath(path))
    for i, p in enumerate([real, *real.parents] if ancestors else [real]):
        st = os.stat(p)
        if st.st_uid not in (uid, 0):
            raise UnsafeKernelCache(
                f"{p} belongs to uid {st.st_uid}, not to this user ({uid}): the kernel cache "
                f"{path} is not private; set GRASSFLOW_CACHE to a directory of your own"
            )
        writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if writable and not (i > 0 and st.st_mode & stat.S_ISVTX):
            raise UnsafeKernelCache(
                f"{p} is writable by {'others' if st.st_mode & stat.S_IWOTH else 'its group'} "
                f"(mode {stat.filemode(st.st_mode)}): the kernel cache {path} is not private; "
                f"chmod go-w {p}, or set GRASSFLOW_CACHE to a directory of your own"
            )


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_library(main: Path, extra: list[Path], flags: list[str]) -> ctypes.CDLL:
    """Compile `main` (which includes `extra`) into a shared library once per source hash, compiler
    and flags, cached under $GRASSFLOW_CACHE (or ~/.cache/grassflow), and load it.

    A cache entry is a directory holding lib.so and the sha256 of its bytes, written when it was
    built and renamed into place whole (a concurrent build never sees half of one). It is loaded
    only from a private cache (check_private) and only if its bytes still match."""
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        raise RuntimeError(f"{main.name}: needs a C++ compiler ({cxx!r} not on PATH)")
    sources = [main, *extra]
    key = hashlib.sha256(
        b"".join(p.read_bytes() for p in sources) + " ".join([cxx, *flags]).encode()
    ).hexdigest()
    cache = _cache_dir()
    entry = cache / f"{main.stem}_{key[:16]}"
    lib, digest = entry / "lib.so", entry / "lib.so.sha256"
    cache.mkdir(parents=True, exist_ok=True, mode=0o700)
    check_private(cache)
    if not entry.exists():
        tmp = Path(tempfile.mkdtemp(dir=cache, prefix=f".{entry.name}."))  # mode 0700
        try:
            cmd = [
                cxx,
                *flags,
                "-std=c++17",
                "-shared",
                "-fPIC",
                "-Wall",
                "-Werror",
                "-o",
                str(tmp / "lib.so"),
                str(main),
            ]
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0:
                raise RuntimeError(f"compiling {main} failed:\n{res.stderr}")
            (tmp / "lib.so.sha256").write_text(_sha256(tmp / "lib.so") + "\n")
            try:
                tmp.rename(entry)
            except OSError:  # another process renamed its build into place first: use that one
                pass
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    for p in (entry, lib, digest):
        check_private(p, ancestors=False)
    if not digest.is_file() or digest.read_text().strip() != _sha256(lib):
        raise UnsafeKernelCache(
            f"{lib}: its bytes do not match the sha256 recorded when it was built; not "
            f"loading it. Delete {entry} to rebuild it"
        )
    return ctypes.CDLL(str(lib))


# What this backend builds, under kernels/: the source compiled first, then what it includes. Read
# (without importing) by grassflow.planning.staleness: an edit to any of them reruns what runs this.
KERNEL_SOURCES = ("cpu_shim/plucker_cpu.cpp", "plucker.cu", "cpu_shim/cuda_cpu_shim.h")


@cache
def _library() -> ctypes.CDLL:
    main, *deps = (kernels_dir() / s for s in KERNEL_SOURCES)
    return build_library(main, deps, ["-O2"])


def launch_on_cpu(name: str, grid: int, block: int, args: tuple, array_info, pointer_of) -> None:
    """Launch extern "C" kernel `name` of plucker.cu through the shim, as CUDA would: the arguments
    checked against its signature, then packed into CUDA's argument array."""
    params = kernel_abi.signatures(kernels_dir() / "plucker.cu")[name]
    kernel_abi.check(name, params, args, array_info)
    packed, _keep = kernel_abi.pack(params, args, pointer_of)
    launch_packed_on_cpu(name, grid, block, ctypes.addressof(packed))


def launch_packed_on_cpu(name: str, grid: int, block: int, kernel_params: int) -> None:
    """Launch `name` through the shim with CUDA's argument array at address `kernel_params` (what
    cuLaunchKernel takes)."""
    fn = getattr(_library(), f"launch_{name}")
    fn.restype = None
    fn(ctypes.c_uint(grid), ctypes.c_uint(block), ctypes.c_void_p(kernel_params))


def _tensor_info(x):
    return (x.dtype, x.is_contiguous()) if isinstance(x, torch.Tensor) else None


class CpuKernelStages(KernelStages):
    name = "kernel-cpu"

    def _run(self, name, params, n_threads, *args):
        if any(isinstance(a, torch.Tensor) and a.device.type != "cpu" for a in args):
            raise ValueError("kernel-cpu backend runs on CPU tensors only")
        launch_on_cpu(name, grid_for(n_threads), BLOCK, args, _tensor_info, lambda t: t.data_ptr())
