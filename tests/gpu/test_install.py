"""The GPU install path, checked without a GPU: the `gpu` extra's CuPy wheel and the CUDA toolkit
wheels torch's CUDA build pins load side by side, agree on the CUDA major, and NVRTC compiles
kernels/plucker.cu — none of which needs a driver (measured: `import cupy`, nvrtc.getVersion() and
nvrtc.compileProgram work on a machine without one; only device queries and module loads fail).
Builds a throwaway venv from PyPI: slow, and needs the index."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from grassflow.ops.plucker.kernel_stages import kernel_names
from helpers.procs import skip_or_fail_in_ci

ROOT = Path(__file__).resolve().parents[2]
# What torch==2.13.0's CUDA wheel on PyPI requires (its metadata: cuda-toolkit[..., nvrtc]==13.0.3);
# the CPU wheel CI installs has no such requirement to read it from.
TORCH_CUDA_TOOLKIT = "13.0.3"
TORCH_CUDA_MAJOR = 13

CHECK = r"""
import re
import sys
from cupy.cuda import nvrtc
major, minor = nvrtc.getVersion()
src = open(sys.argv[1]).read()
prog = nvrtc.createProgram(src, "plucker.cu", [], [])
nvrtc.compileProgram(prog, ["-std=c++17", "-arch=compute_90"])
ptx = nvrtc.getPTX(prog)
ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
print(major, minor, len(ptx), *sorted(re.findall(r"\.entry\s+(\w+)", ptx)))
"""


@pytest.mark.slow
def test_gpu_extra_pairs_cupy_with_torchs_cuda_major(tmp_path):
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    # `gpu`: torch's default wheel's major
    assert extras["gpu"] == [f"grassflow[gpu-cuda{TORCH_CUDA_MAJOR}]"]
    for major in (12, 13):
        assert [re.sub(r"\[.*?\]|>=.*", "", r) for r in extras[f"gpu-cuda{major}"]] == [
            f"cupy-cuda{major}x"
        ]
    cupy_req = extras[f"gpu-cuda{TORCH_CUDA_MAJOR}"][0]
    assert re.match(rf"cupy-cuda{TORCH_CUDA_MAJOR}x\b", cupy_req), (
        f"gpu extra {cupy_req!r}: not CUDA {TORCH_CUDA_MAJOR}"
    )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    # the extra's CuPy without [ctk] (its full toolkit is ~1 GB), beside the NVRTC torch pins
    res = subprocess.run(
        [
            str(py),
            "-m",
            "pip",
            "install",
            "-q",
            re.sub(r"\[.*?\]", "", cupy_req),
            f"cuda-toolkit[nvrtc,cudart]=={TORCH_CUDA_TOOLKIT}",
        ],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        skip_or_fail_in_ci(
            f"the gpu extra did not install (PyPI unreachable, or its wheels missing): "
            f"{res.stderr.strip().splitlines()[-1:]}"
        )
    res = subprocess.run(
        [str(py), "-c", CHECK, str(ROOT / "kernels" / "plucker.cu")], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr[-2000:]
    major, _minor, ptx_bytes, *entries = res.stdout.split()
    assert int(major) == TORCH_CUDA_MAJOR and int(ptx_bytes) > 0
    # every stage × r variant × (f32, f64, bf16), all extern "C"
    assert set(entries) == kernel_names()


@pytest.mark.parametrize("dist", ["cupy-cuda12x", "cupy-cuda13x", "cupy"])
def test_provenance_names_the_cupy_that_is_installed(dist, tmp_path, monkeypatch):
    """run.json's packages name CuPy's installed distribution, whichever build it is (a fake
    installed distribution providing the `cupy` import name)."""
    import importlib
    import sys

    info = tmp_path / f"{dist.replace('-', '_')}-14.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 14.0.1\n")
    (info / "top_level.txt").write_text("cupy\n")
    (info / "RECORD").write_text("cupy/__init__.py,,\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    from grassflow.provenance import package_versions

    versions = package_versions()
    assert versions[dist] == "14.0.1" and sys.version.split()[0] == versions["python"]
    assert not {"cupy-cuda12x", "cupy-cuda13x", "cupy"} - {dist} & set(versions)


# conda-forge → PyPI
CONDA_NAMES = {
    "pytorch": "torch",
    "matplotlib-base": "matplotlib",
    "cupy": "cupy-cuda13x",
}


def test_the_conda_envs_are_conda_forge_only_with_pyprojects_floors():
    """envs/*.yaml solve under strict channel priority (conda-forge alone: the pytorch channel
    stopped at torch 2.5) and hold pyproject.toml's floors, package by package (one source)."""
    import yaml

    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    floors = {}
    for req in [
        *project["dependencies"],
        *(r for extra in project["optional-dependencies"].values() for r in extra),
    ]:
        m = re.match(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?>=([\w.]+)", req)
        if m:
            floors[m.group(1).lower()] = m.group(2)
    for env in sorted((root / "envs").glob("*.yaml")):
        spec = yaml.safe_load(env.read_text())
        assert spec["channels"] == ["conda-forge"], env.name
        for dep in spec["dependencies"]:
            m = re.match(r"([A-Za-z0-9_.-]+)(?:\[version='>=([\w.]+)'.*\]|>=([\w.]+))?", dep)
            name, floor = m.group(1), m.group(2) or m.group(3)
            pypi = CONDA_NAMES.get(name, name)
            if pypi in floors:
                assert floor == floors[pypi], (
                    f"{env.name}: {dep} (pyproject.toml: {pypi}>={floors[pypi]})"
                )


@pytest.mark.parametrize("major", ["12", "13", ""])
def test_make_gpu_check_installs_the_extra_of_torchs_cuda_major(tmp_path, major):
    """`make gpu-check` reads torch.version.cuda's major and installs gpu-cuda<major>; a CPU build
    of torch stops it with one error line. A stand-in python answers for torch and logs every
    call."""
    import os
    import stat

    log, venv = tmp_path / "calls.log", tmp_path / "venv"
    fake = tmp_path / "python"
    fake.write_text(
        f'#!/bin/bash\necho "$*" >> {log}\n'
        f'case "$*" in *"torch.version.cuda"*) echo "{major}";; *"torch.__version__"*) echo '
        "2.13.0+cpu;; esac\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    (venv / "bin").mkdir(parents=True)
    (venv / ".installed").touch()  # newer than pyproject.toml and constraints.txt: no install
    res = subprocess.run(
        ["make", "-s", "-C", str(ROOT), "gpu-check", f"VENV={venv}", f"PY={fake}"],
        capture_output=True,
        text=True,
        env={**os.environ, "MAKEFLAGS": ""},
    )
    calls = log.read_text()
    if major:
        assert res.returncode == 0, res.stdout + res.stderr
        assert (
            f"-m pip install -q -c constraints.txt -e .[gpu-cuda{major}]" in calls
            and "-m pytest -q -p no:cacheprovider -m gpu" in calls
        )
    else:
        assert res.returncode != 0 and "torch 2.13.0+cpu is a CPU build" in res.stdout
        assert "pip install" not in calls
