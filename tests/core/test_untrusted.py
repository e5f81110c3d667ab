"""What is read from a results tree or a cache is data, never code: checkpoints load with
weights_only=True (a crafted pickle is refused, its code never runs), and compiled CPU kernels are
loaded only from a private cache whose bytes match what was built. The pipeline-level checks
(snakemake evaluate/aggregate and a resumed train over crafted files) are in
tests/pipeline/test_robustness.py."""

from __future__ import annotations

import hashlib
import io
import os
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from grassflow.checkpoint import MAGIC, CheckpointError, load_checkpoint, rng_state, set_rng_state
from grassflow.ops.plucker import cpu_kernel
from grassflow.runs import open_for_evaluation
from helpers.payload import crafted_last, crafted_weights


def test_crafted_weights_are_refused_before_anything_runs(tmp_path):
    """A run's weights are read by safetensors, which never unpickles: a pickle in their place is an
    error naming the file, its code never runs."""
    marker = tmp_path / "marker"
    crafted_weights(tmp_path / "model.safetensors", marker, header={"spec": {"run_id": "x"}})
    (tmp_path / "run.json").write_text('{"status": {"state": "completed"}}')
    with pytest.raises(
        CheckpointError, match=r"model\.safetensors: not a readable safetensors file"
    ):
        open_for_evaluation(
            tmp_path / "model.safetensors", tmp_path / "run.json", tmp_path / "eval.json"
        )
    assert not marker.exists() and not (tmp_path / "eval.json").exists()


def test_weights_that_are_not_their_configs_are_refused(tmp_path):
    """Weights swapped for other valid ones (another run's): refused, naming the file."""
    from grassflow.checkpoint import save_weights

    save_weights(tmp_path / "model.safetensors", {"w": torch.ones(2)})
    (tmp_path / "config.json").write_text(
        '{"spec": {"run_id": "x"}, "epoch": 1, "weights_sha256": "ab"}'
    )
    (tmp_path / "run.json").write_text('{"status": {"state": "completed"}}')
    with pytest.raises(
        CheckpointError, match=r"model\.safetensors: its weights' sha256 is not .*config\.json"
    ):
        open_for_evaluation(
            tmp_path / "model.safetensors", tmp_path / "run.json", tmp_path / "eval.json"
        )


def test_crafted_last_pt_with_a_valid_checksum_is_refused(tmp_path):
    marker = tmp_path / "marker"
    crafted_last(tmp_path / "last.pt", marker)
    with pytest.raises(CheckpointError, match=r"last\.pt: refused"):
        load_checkpoint(tmp_path / "last.pt")
    assert not marker.exists()


def test_a_last_pt_of_the_previous_format_is_refused_with_how_to_recover(tmp_path):
    """Before: RNG states as NumPy's tuple with an ndarray (a pickle global). Decided: refuse,
    naming the file; deleting it restarts the run from scratch."""
    state = {
        "spec_hash": "h",
        "rng": {
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "numpy": np.random.get_state(),
        },
    }
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    (tmp_path / "last.pt").write_bytes(
        MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload
    )
    with pytest.raises(CheckpointError, match=r"last\.pt: refused.*delete it and rerun") as err:
        load_checkpoint(tmp_path / "last.pt")
    assert "\n" not in str(err.value)  # one line, for the job's `error:` line


def test_rng_states_round_trip_as_data(tmp_path):
    torch.manual_seed(1)
    random.seed(2)
    np.random.seed(3)
    np.random.normal()  # a cached Gaussian in NumPy's state
    buf = io.BytesIO()
    torch.save(rng_state(), buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    want = (torch.rand(3), random.random(), np.random.normal(), np.random.randint(1 << 30))
    set_rng_state(saved)
    assert torch.equal(torch.rand(3), want[0]) and random.random() == want[1]
    assert np.random.normal() == want[2] and np.random.randint(1 << 30) == want[3]


# --- the compiled-kernel cache ----------------------------------------------------------------
PLANT = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen("%s", "w"); if (f) fclose(f); }
"""


def _planted_library(tmp_path, marker):
    """A shared library that creates `marker` the moment it is loaded."""
    src = tmp_path / "plant.c"
    src.write_text(PLANT % marker)
    out = tmp_path / "plant.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
    return out


def _swap(src, dst):
    """Put src at dst as a new file: the library this process loaded from dst is mapped from its old
    inode, which an in-place overwrite would truncate under it (SIGBUS)."""
    tmp = dst.with_name(dst.name + ".new")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One build of the kernel into a private cache (the compiler's ~20 s, once for the file): an
    entry holding lib.so and the sha256 of its bytes."""
    root = tmp_path_factory.mktemp("built") / "cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRASSFLOW_CACHE", str(root))
        cpu_kernel._library.cache_clear()
        cpu_kernel._library()
        cpu_kernel._library.cache_clear()
    (entry,) = [p for p in (root / "kernel-cpu").iterdir() if p.name.startswith("plucker_cpu_")]
    assert (entry / "lib.so.sha256").read_text().strip() == hashlib.sha256(
        (entry / "lib.so").read_bytes()
    ).hexdigest()
    return root


@pytest.fixture
def cache(built, tmp_path, monkeypatch):
    """A private cache of each test's own holding that build (copied: modes kept), which _library()
    loads rather than builds."""
    root = shutil.copytree(built, tmp_path / "cache")
    monkeypatch.setenv("GRASSFLOW_CACHE", str(root))
    cpu_kernel._library.cache_clear()
    yield root / "kernel-cpu"
    cpu_kernel._library.cache_clear()


def _entry(cache):
    (entry,) = [p for p in cache.iterdir() if p.name.startswith("plucker_cpu_")]
    return entry


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_a_swapped_library_is_refused_and_never_loaded(cache, tmp_path):
    cpu_kernel._library()  # the private entry's library loads
    cpu_kernel._library.cache_clear()
    entry = _entry(cache)
    marker = tmp_path / "loaded"
    _swap(_planted_library(tmp_path, marker), entry / "lib.so")
    with pytest.raises(
        cpu_kernel.UnsafeKernelCache, match=r"lib\.so: its bytes do not match.*Delete"
    ):
        cpu_kernel._library()
    assert not marker.exists()
    # the planted library is a working one: loading it would have run it
    subprocess.run(
        [sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(entry / 'lib.so')!r})"], check=True
    )
    assert marker.exists()


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
@pytest.mark.parametrize("where", ["cache", "entry", "ancestor"])
def test_a_cache_others_can_write_is_refused(cache, tmp_path, where):
    cpu_kernel._library()
    cpu_kernel._library.cache_clear()
    entry = _entry(cache)
    marker = tmp_path / "loaded"
    _swap(_planted_library(tmp_path, marker), entry / "lib.so")
    (entry / "lib.so.sha256").write_text(
        hashlib.sha256((entry / "lib.so").read_bytes()).hexdigest() + "\n"
    )
    target = {"cache": cache, "entry": entry, "ancestor": cache.parent}[where]
    os.chmod(target, 0o777 if where == "ancestor" else 0o770)  # an ancestor: others, not sticky
    with pytest.raises(cpu_kernel.UnsafeKernelCache, match=r"is writable by .*not private"):
        cpu_kernel._library()
    assert not marker.exists()
    os.chmod(target, 0o700)


def test_a_sticky_shared_ancestor_is_accepted(cache, tmp_path):
    """/tmp-like: everyone may write it, but nobody can rename what is ours inside it."""
    os.chmod(cache.parent.parent, 0o1777)
    try:
        cpu_kernel._library()
    finally:
        os.chmod(cache.parent.parent, 0o700)


@pytest.mark.parametrize("version", ["2.9.1+cu128", "2.5.1", "1.13.0"])
def test_checkpoints_are_not_opened_on_an_unsafe_torch(version, tmp_path, monkeypatch):
    """torch < 2.10: one error naming the file, the CVEs and the fix; torch.load is never called."""
    from grassflow import checkpoint

    path = tmp_path / "best.pt"
    torch.save({"model": {"w": torch.zeros(2)}}, path)
    monkeypatch.setattr(checkpoint.torch, "__version__", version)
    monkeypatch.setattr(
        checkpoint.torch, "load", lambda *a, **k: pytest.fail("torch.load was called")
    )
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.load_data(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: not opened: torch {version}") and "CVE-2025-32434" in msg
    assert "CVE-2026-24747" in msg and "pip install 'torch>=2.10'" in msg and "\n" not in msg


def test_the_floor_admits_this_torch_and_pyproject_says_it():
    from pathlib import Path

    import tomllib

    from grassflow import checkpoint

    assert checkpoint._torch_version(torch.__version__) >= checkpoint.SAFE_TORCH
    deps = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"][
        "dependencies"
    ]
    assert "torch>=2.10" in deps and "pyarrow>=14.0.1" in deps
