"""Provenance: where a number came from (code commit, data hashes, software, machine)."""

from __future__ import annotations

import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

PACKAGES = ("torch", "numpy", "tokenizers", "transformers", "datasets", "pyarrow", "pandas", "snakemake")
# import names whose distribution depends on the build installed (CuPy: cupy-cuda12x, cupy-cuda13x, cupy)
BY_IMPORT = ("cupy",)


def git_state(cwd=None) -> dict:
    cwd = cwd or Path.cwd()

    def git(*args):
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=20)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return {"commit": None, "dirty": None}
        status = git("status", "--porcelain", "--untracked-files=no")
        return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.TimeoutExpired):
        return {"commit": None, "dirty": None}


def package_versions() -> dict:
    """The versions of the packages a number depends on, each under its installed distribution's name."""
    provided = metadata.packages_distributions()
    out = {"python": sys.version.split()[0]}
    for name in (*PACKAGES, *(d for m in BY_IMPORT for d in provided.get(m, []))):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def machine() -> dict:
    return {"platform": platform.platform(), "hostname": platform.node()}
