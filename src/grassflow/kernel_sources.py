"""Where the kernel sources are (CUDA and C++): kernels/ of a source checkout, or the copy a wheel
carries as grassflow/_kernels. Read by the ops that compile them and by the code fingerprints, which
hash the sources a module declares (KERNEL_SOURCES: grassflow.pipeline.staleness). Imports nothing of
ours, nor torch: the Snakefile reads it on every start."""

from __future__ import annotations

from pathlib import Path

PKG = Path(__file__).resolve().parent  # src/grassflow, or the installed package


def kernels_dir() -> Path:
    for cand in (PKG / "_kernels", PKG.parents[1] / "kernels"):
        if (cand / "plucker.cu").is_file():
            return cand
    raise FileNotFoundError(f"kernels/plucker.cu not found near {PKG} (a checkout's kernels/, a wheel's _kernels/)")
