"""GPU slots through the GRASSFLOW_GPUS stand-in: real processes hold real flocks. K runs per GPU
and never more, a distinct (GPU, slot) each; a killed holder's slot is free at once; a job that
times the device takes its GPU alone; a CPU job without the stand-in takes none."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from grassflow import gpu_slots

HOLD = """
import json, sys
from grassflow.runtime import claim_device
device = claim_device("cpu", exclusive=sys.argv[1] == "exclusive")
from grassflow import gpu_slots
print(json.dumps({"device": device.type, **(gpu_slots.current() or {})}), flush=True)
sys.stdin.read()  # hold the slot until the test closes stdin (or kills us)
"""


@pytest.fixture
def pool(tmp_path, monkeypatch):
    env = {
        **os.environ,
        gpu_slots.OVERRIDE: "0,1",
        gpu_slots.RUNS_PER_GPU: "2",
        gpu_slots.SLOTS_DIR: str(tmp_path / "slots"),
    }
    procs = []

    def start(mode="shared"):
        p = subprocess.Popen(
            [sys.executable, "-c", HOLD, mode],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()


def took(p) -> dict:
    return json.loads(p.stdout.readline())  # blocks until the holder has its slot


def waits(p) -> bool:
    """Whether the job's first word is that it waits for a slot (blocks until it says anything: it
    found none free in a full pass, rather than not having looked yet)."""
    return p.stdout.readline().startswith("[grassflow] waiting for a GPU slot")


def test_k_runs_per_gpu_each_on_its_own_slot_and_a_fifth_waits(pool):
    holders = [pool() for _ in range(4)]
    slots = [took(p) for p in holders]
    assert sorted((s["gpu"], s["slot"]) for s in slots) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(
        s["device"] == "cpu" and s["source"] == "override" and s["runs_per_gpu"] == 2 for s in slots
    )
    fifth = pool()
    assert waits(fifth)  # every slot taken
    holders[2].stdin.close()  # one run ends normally
    holders[2].wait()
    got = took(fifth)
    assert (got["gpu"], got["slot"]) == (slots[2]["gpu"], slots[2]["slot"])  # the freed slot


def test_a_killed_jobs_slot_is_free_again(pool):
    holders = [pool() for _ in range(4)]
    slots = [took(p) for p in holders]
    holders[1].send_signal(signal.SIGKILL)
    holders[1].wait()
    nxt = took(pool())
    assert (nxt["gpu"], nxt["slot"]) == (slots[1]["gpu"], slots[1]["slot"])


def test_a_job_that_times_the_device_takes_its_gpu_alone(pool):
    runs = [pool() for _ in range(3)]  # GPU 0 full, one run on GPU 1
    taken = [took(p) for p in runs]
    bench = pool("exclusive")
    # neither GPU is free of runs (a claim of one slot would take GPU 1's free one)
    assert waits(bench)
    on_1 = next(p for p, s in zip(runs, taken) if s["gpu"] == 1)
    on_1.stdin.close()
    on_1.wait()
    got = took(bench)
    assert got["gpu"] == 1 and got["slot"] == "all"
    late = pool()  # a run arriving now may not join the benchmark's GPU
    assert waits(late)
    bench.stdin.close()
    bench.wait()
    assert took(late)["gpu"] == 1


def test_no_slot_without_a_gpu_or_the_stand_in(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != gpu_slots.OVERRIDE}
    out = subprocess.run(
        [sys.executable, "-c", HOLD, "shared"], env=env, input="", capture_output=True, text=True
    )
    assert json.loads(out.stdout) == {"device": "cpu"}


def test_a_slot_directory_others_can_write_is_refused(tmp_path, monkeypatch):
    d = tmp_path / "shared-slots"
    d.mkdir(mode=0o777)
    d.chmod(0o777)
    monkeypatch.setenv(gpu_slots.SLOTS_DIR, str(d))
    with pytest.raises(gpu_slots.SlotError, match="writable by others"):
        gpu_slots.runtime_dir()
    monkeypatch.setenv(gpu_slots.RUNS_PER_GPU, "0")
    with pytest.raises(gpu_slots.SlotError, match="GRASSFLOW_RUNS_PER_GPU='0'"):
        gpu_slots.runs_per_gpu()
    monkeypatch.setenv(gpu_slots.OVERRIDE, "a,b")
    with pytest.raises(gpu_slots.SlotError, match="GRASSFLOW_GPUS='a,b'"):
        gpu_slots.gpus()


def test_a_cuda_slot_makes_its_gpu_torchs_current_device(tmp_path, monkeypatch):
    """The CUDA branch, rehearsed: with every slot of GPU 0 held elsewhere, the job takes GPU 1 and
    calls torch.cuda.set_device(1) before anything else touches CUDA; its record says so."""
    import torch

    monkeypatch.setenv(gpu_slots.SLOTS_DIR, str(tmp_path / "slots"))
    monkeypatch.setenv(gpu_slots.RUNS_PER_GPU, "1")
    monkeypatch.delenv(gpu_slots.OVERRIDE, raising=False)
    pool = [
        {"index": i, "name": f"H100 #{i}", "uuid": f"GPU-{i}", "source": "cuda"} for i in (0, 1)
    ]
    monkeypatch.setattr(gpu_slots, "gpus", lambda: pool)
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    monkeypatch.setattr(gpu_slots, "_held", {})
    held_elsewhere = gpu_slots._try_lock(gpu_slots.runtime_dir() / "gpu-GPU-0-slot0.lock")
    try:
        got = gpu_slots.claim()
    finally:
        os.close(held_elsewhere)
    assert calls == [1] and (got["gpu"], got["slot"], got["uuid"], got["source"]) == (
        1,
        0,
        "GPU-1",
        "cuda",
    )
    assert gpu_slots.claim() == got and calls == [1]  # held: a second ask changes nothing


def test_two_allocations_gpu_0_are_two_gpus(tmp_path, monkeypatch):
    """On a SLURM node each allocation sees its own GPU as index 0; jobs of both share the runtime
    directory. With K=1, a job of the second allocation takes its GPU's slot at once, while the
    first allocation's job holds the slot of its own GPU 0 (a slot named by index would make it
    wait)."""
    monkeypatch.setenv(gpu_slots.SLOTS_DIR, str(tmp_path / "slots"))
    monkeypatch.setenv(gpu_slots.RUNS_PER_GPU, "1")
    monkeypatch.delenv(gpu_slots.OVERRIDE, raising=False)
    import torch

    monkeypatch.setattr(torch.cuda, "set_device", lambda i: None)
    first = {"index": 0, "name": "H100", "uuid": "GPU-aaaa", "source": "cuda"}
    held_by_first = gpu_slots._try_lock(gpu_slots.runtime_dir() / gpu_slots.lock_name(first, 0))
    assert held_by_first is not None
    monkeypatch.setattr(gpu_slots, "gpus", lambda: [{**first, "uuid": "GPU-bbbb"}])
    monkeypatch.setattr(gpu_slots, "_held", {})
    monkeypatch.setattr(
        gpu_slots.time, "sleep", lambda s: pytest.fail("waited for another GPU's slot")
    )
    try:
        got = gpu_slots.claim()
    finally:
        os.close(held_by_first)
    assert (got["gpu"], got["slot"], got["uuid"]) == (0, 0, "GPU-bbbb")
