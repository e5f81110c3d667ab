"""The CUDA sources compile under NVRTC, the compiler CuPy calls on a GPU, here on the CPU (NVRTC
needs no GPU): a construct g++ takes through the CPU shim but NVRTC refuses, or a kernel the
launches look up that the module does not export, fails here instead of on a lease."""

from __future__ import annotations

import platform

import pytest

from grassflow.bench import nvrtc
from grassflow.kernel_sources import kernels_dir
from grassflow.ops.plucker import kernel_abi

LIB = nvrtc.library()
# the dev extra installs NVRTC where its wheel exists: there this test must run, not skip
pytestmark = pytest.mark.skipif(
    LIB is None and not (platform.system() == "Linux" and platform.machine() == "x86_64"),
    reason="no NVRTC wheel for this platform",
)


def test_the_sources_are_those_cupy_compiles():
    from grassflow.ops.linear_ce import fused
    from grassflow.ops.plucker import cupy_backend

    assert nvrtc.KERNEL_SOURCES == (cupy_backend.KERNEL_SOURCES[0], fused.KERNEL_SOURCES[0])


@pytest.mark.parametrize("source", nvrtc.KERNEL_SOURCES)
def test_each_source_compiles_and_exports_every_kernel(source):
    assert LIB is not None, "NVRTC missing: pip install -e '.[dev]' (nvidia-cuda-nvrtc-cu12)"
    ptx, _ = nvrtc.compile_source(LIB, kernels_dir() / source, "compute_90")
    assert nvrtc.entries(ptx) == set(kernel_abi.signatures(kernels_dir() / source))


def test_a_source_nvrtc_refuses_is_reported_with_its_log(tmp_path):
    assert LIB is not None
    bad = tmp_path / "bad.cu"
    bad.write_text('extern "C" __global__ void k(float* x) { x[0] = undeclared_function(1.0f); }\n')
    with pytest.raises(
        RuntimeError,
        match="(?s)NVRTC cannot compile kernels/bad.cu for compute_90:.*undeclared_function",
    ):
        nvrtc.compile_source(LIB, bad, "compute_90")
