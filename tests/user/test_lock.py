"""constraints.txt (make lock) pins what `make test` and CI install: every dependency of the install
(the package, the extras make installs) at a version its pyproject.toml floor allows."""

import re
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def pins() -> dict[str, str]:
    out = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            out[canonicalize_name(name)] = version
    return out


def test_every_installed_requirement_is_pinned_within_its_floor():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    pinned = pins()
    for spec in [
        *project["dependencies"],
        *(s for e in ("dev", "slurm", "eval", "tensorboard", "wandb") for s in extras[e]),
    ]:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name in pinned, (
            f"constraints.txt lacks {req.name} (pyproject.toml: {spec}): run make lock"
        )
        assert req.specifier.contains(Version(pinned[name])), (
            f"constraints.txt: {name}=={pinned[name]} breaks {spec}"
        )


def test_the_gpu_extras_cupy_is_pinned_per_cuda_major_and_installed_with_the_pins():
    """make gpu-check installs the CuPy of torch's CUDA major: pinned in constraints.txt (make lock
    writes the newest of each), within the extra's floor, installed with -c constraints.txt."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    pinned = pins()
    for major in (12, 13):
        (spec,) = extras[f"gpu-cuda{major}"]
        req = Requirement(spec)
        assert canonicalize_name(req.name) == f"cupy-cuda{major}x" in pinned, (
            f"constraints.txt lacks {req.name}"
        )
        assert req.specifier.contains(Version(pinned[f"cupy-cuda{major}x"]))
    makefile = (ROOT / "Makefile").read_text()
    gpu_check = makefile.split("\ngpu-check:", 1)[1].split("\n\n", 1)[0]
    assert 'pip install -q -c constraints.txt -e ".[gpu-cuda$$major]"' in gpu_check
    lock = makefile.split("\nlock:", 1)[1].split("\n\n", 1)[0]
    assert "pip index versions $$c" in lock and "cupy-cuda12x cupy-cuda13x" in lock


def test_the_pins_hold_for_cpu_and_cuda_builds_alike():
    """No local version label (torch==2.13.0+cpu would not install on a GPU machine), no editable or
    URL line: a constraints file of plain pins."""
    text = (ROOT / "constraints.txt").read_text()
    assert not [
        line
        for line in text.splitlines()
        if line
        and not line.startswith("#")
        and not re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.]*", line)
    ]
    assert "torch==" in text
