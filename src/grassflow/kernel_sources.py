"""Where the kernel sources are (CUDA and C++): kernels/ of a source checkout, or the copy a wheel
carries as grassflow/_kernels. Read by the ops that compile them and by the code fingerprints, which
hash the sources a module declares (KERNEL_SOURCES: grassflow.planning.staleness). Imports nothing
of ours, nor torch: the Snakefile reads it on every start."""

from __future__ import annotations

from pathlib import Path

PKG = Path(__file__).resolve().parent  # src/grassflow, or the installed package


def kernels_dir(required: bool = True) -> Path:
    """The directory of the kernel sources; where there is none, an error (`required`: an op about
    to compile them), else the checkout's path (the fingerprints of a tree without them)."""
    for cand in (PKG / "_kernels", PKG.parents[1] / "kernels"):
        if (cand / "plucker.cu").is_file():
            return cand
    if not required:
        return PKG.parents[1] / "kernels"
    raise FileNotFoundError(
        f"kernels/plucker.cu not found near {PKG} (a checkout's kernels/, a wheel's _kernels/)"
    )
