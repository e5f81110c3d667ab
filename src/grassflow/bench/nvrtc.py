"""The CUDA kernels compiled by NVRTC on this machine, no GPU needed: does each source CuPy compiles
on a GPU (ops/plucker/cupy_backend.py, ops/linear_ce/fused.py) compile, does it export every extern
"C" kernel the launches look up, and how long does a cold compile take (what a fresh GPU machine
pays before its first step; CuPy caches the binary on disk after it).

    python -m grassflow.bench.nvrtc [--arch sm_90] [--out reports/bench]

NVRTC is the library CuPy calls (libnvrtc.so.12): from the `nvidia-cuda-nvrtc-cu12` wheel, or
$GRASSFLOW_NVRTC naming the library. Options as CuPy passes them (-std=c++17, the architecture).
"""

from __future__ import annotations

import ctypes
import os
import platform
import re
import time
from pathlib import Path

from grassflow import markdown
from grassflow.job import ArgumentParser
from grassflow.kernel_sources import kernels_dir

# What NVRTC compiles on a GPU: the cupy backend's and the fused head's sources
# (tests/gpu/test_nvrtc.py holds them equal)
KERNEL_SOURCES = ("plucker.cu", "cross_entropy.cu")


def library() -> ctypes.CDLL | None:
    """libnvrtc, or None where it is not installed."""
    path = os.environ.get("GRASSFLOW_NVRTC")
    if not path:
        try:
            import nvidia.cuda_nvrtc as wheel
        except ImportError:
            return None
        path = str(Path(next(iter(wheel.__path__))) / "lib" / "libnvrtc.so.12")
    return ctypes.CDLL(path)


def compile_source(lib: ctypes.CDLL, source: Path, arch: str) -> tuple[str, float]:
    """(PTX, seconds) of one cold compile, as CuPy's RawModule does it; raises with NVRTC's log."""
    prog = ctypes.c_void_p()
    _ok(
        lib,
        lib.nvrtcCreateProgram(
            ctypes.byref(prog), source.read_bytes(), source.name.encode(), 0, None, None
        ),
    )
    opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17"]
    t = time.perf_counter()
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    seconds = time.perf_counter() - t
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        raise RuntimeError(
            f"NVRTC cannot compile kernels/{source.name} for {arch}:\n{log.value.decode()}"
        )
    ptx = ""
    if not arch.startswith("sm_"):  # a virtual architecture: PTX, whose entries name the kernels
        _ok(lib, lib.nvrtcGetPTXSize(prog, ctypes.byref(n)))
        buf = ctypes.create_string_buffer(n.value)
        _ok(lib, lib.nvrtcGetPTX(prog, buf))
        ptx = buf.value.decode()
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return ptx, seconds


def entries(ptx: str) -> set[str]:
    """The kernels a PTX module exports."""
    return set(re.findall(r"\.entry\s+(\w+)\s*\(", ptx))


def _ok(lib, rc: int) -> None:
    if rc != 0:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise RuntimeError(f"NVRTC: {lib.nvrtcGetErrorString(rc).decode()}")


def main(argv=None) -> int:
    ap = ArgumentParser(prog="python -m grassflow.bench.nvrtc", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--arch", default="sm_90", help="what to compile for (sm_90: an H100's or H200's binary)"
    )
    ap.add_argument("--out", default="reports/bench", help="directory for nvrtc-compile.md")
    a = ap.parse_args(argv)
    lib = library()
    if lib is None:
        ap.error(
            "needs NVRTC: pip install nvidia-cuda-nvrtc-cu12, or set GRASSFLOW_NVRTC to "
            "libnvrtc.so.12"
        )
    version = (ctypes.c_int(), ctypes.c_int())
    lib.nvrtcVersion(ctypes.byref(version[0]), ctypes.byref(version[1]))
    rows = []
    for s in KERNEL_SOURCES:
        _, seconds = compile_source(lib, kernels_dir() / s, a.arch)
        rows.append([f"kernels/{s}", f"{seconds:.2f}"])
        print(f"kernels/{s}: {seconds:.2f} s", flush=True)
    md = "\n".join(
        [
            f"# Cold NVRTC compile of the CUDA kernels ({a.arch})",
            "",
            f"NVRTC {version[0].value}.{version[1].value} on "
            f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, no GPU: one "
            "cold compile per source, as CuPy's first use on a fresh machine pays it (`python -m "
            "grassflow.bench.nvrtc`).",
            "",
            *markdown.table(["source", "seconds"], rows),
            "",
        ]
    )
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "nvrtc-compile.md").write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
