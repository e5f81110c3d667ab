"""GPU slots: K runs share one GPU, and no more than K.

A GPU job takes a slot before it touches CUDA: slot s of a GPU is the file `<runtime dir>/gpu-<its
UUID>-slot<s>.lock` (a stand-in GPU's: `gpu<index>-slot<s>.lock`), held with an exclusive flock for
the life of the process, so the kernel frees it when the process ends however it ends (SIGKILL
included): no stale slot after a crash. A job that finds every slot taken waits for one. A job that
times the device (`bench`) takes every slot of its GPU, so no training run shares the GPU it is
timing. A slot is named by the GPU's UUID, not its index: on a SLURM node, each allocation sees its
own GPU as index 0 (CUDA_VISIBLE_DEVICES), and jobs of two allocations share the runtime directory.

  K            train.runs_per_gpu (an execution setting, handed to the job as
  GRASSFLOW_RUNS_PER_GPU;
               changing it reruns nothing)
  the GPUs     the CUDA devices torch sees, or GRASSFLOW_GPUS="0,1" (a stand-in list: jobs take
               slots on those indices but compute where train.device says, on a CPU machine the
               CPU) — what the tests and a reviewer without a GPU use to see the assignment work
  runtime dir  GRASSFLOW_SLOTS_DIR, else $XDG_RUNTIME_DIR/grassflow-slots, else
               /tmp/grassflow-slots-<uid>; created 0700 and refused if another user can write it

The job's record (run.json `gpu_slot`) says which GPU (index, name, UUID) and slot it ran on, and
when it took it.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import stat
import tempfile
import time
from pathlib import Path

OVERRIDE = "GRASSFLOW_GPUS"
RUNS_PER_GPU = "GRASSFLOW_RUNS_PER_GPU"
SLOTS_DIR = "GRASSFLOW_SLOTS_DIR"
_held: dict = {}  # the slot this process holds: {"record": ..., "fds": [...]}


class SlotError(RuntimeError):
    pass


def runtime_dir() -> Path:
    d = os.environ.get(SLOTS_DIR) or (
        Path(os.environ["XDG_RUNTIME_DIR"]) / "grassflow-slots"
        if os.environ.get("XDG_RUNTIME_DIR")
        else Path(tempfile.gettempdir()) / f"grassflow-slots-{os.getuid()}"
    )
    d = Path(d)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = d.stat()
    if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise SlotError(
            f"{d}: GPU slot directory owned by another user or writable by others; "
            f"set {SLOTS_DIR} to a private directory"
        )
    return d


def gpus() -> list[dict]:
    """The GPUs slots are taken on: the override's indices, else the CUDA devices torch sees."""
    if os.environ.get(OVERRIDE):
        try:
            idx = [int(x) for x in os.environ[OVERRIDE].split(",") if x.strip()]
        except ValueError:
            raise SlotError(
                f"{OVERRIDE}={os.environ[OVERRIDE]!r}: give GPU indices, e.g. 0,1"
            ) from None
        return [
            {
                "index": i,
                "name": f"stand-in GPU {i} ({OVERRIDE})",
                "uuid": None,
                "source": "override",
            }
            for i in idx
        ]
    import torch

    out = []
    for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        p = torch.cuda.get_device_properties(i)
        out.append(
            {
                "index": i,
                "name": p.name,
                "uuid": str(getattr(p, "uuid", "")) or None,
                "source": "cuda",
            }
        )
    return out


def runs_per_gpu() -> int:
    k = os.environ.get(RUNS_PER_GPU, "1")
    if not k.isdigit() or int(k) < 1:
        raise SlotError(f"{RUNS_PER_GPU}={k!r} (train.runs_per_gpu) must be a positive integer")
    return int(k)


def _try_lock(path: Path):
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:
        os.close(fd)
        return None


def claim(exclusive: bool = False, poll_s: float = 0.2) -> dict | None:
    """Take a slot (exclusive: every slot of one GPU) and make its GPU torch's current device; wait
    while none is free. None if there is no GPU to take a slot on. Held until exit."""
    if _held:
        return current()
    pool = gpus()
    if not pool:
        return None
    k, d = runs_per_gpu(), runtime_dir()
    # what may be taken together: one slot at a time, or all K of a GPU at once
    choices = [
        (g, "all", range(k)) if exclusive else (g, s, [s])
        for g in pool
        for s in ([None] if exclusive else range(k))
    ]
    for tries in itertools.count():
        for g, slot, members in choices:
            fds = []
            for s in members:
                fd = _try_lock(d / lock_name(g, s))
                if fd is None:
                    break
                fds.append(fd)
            else:
                return _hold(g, slot, k, fds)
            for fd in fds:  # part of an exclusive set: give it back
                os.close(fd)
        if not tries:  # once, in the job's log: why it has not started
            print(
                "[grassflow] waiting for a GPU slot: "
                f"{'no GPU is free of runs' if exclusive else 'all taken'} "
                f"({len(pool)} GPU(s), {k} slot(s) each)",
                flush=True,
            )
        time.sleep(poll_s)


def lock_name(g: dict, s: int) -> str:
    """Slot s of GPU g's lock file: by UUID where the GPU has one, else by index (stand-ins)."""
    return f"gpu-{g['uuid']}-slot{s}.lock" if g["uuid"] else f"gpu{g['index']}-slot{s}.lock"


def _hold(g: dict, slot, k: int, fds: list[int]) -> dict:
    if g["source"] == "cuda":
        import torch

        torch.cuda.set_device(g["index"])
    record = {
        "gpu": g["index"],
        "name": g["name"],
        "uuid": g["uuid"],
        "source": g["source"],
        "slot": slot,
        "runs_per_gpu": k,
        "pid": os.getpid(),
        "acquired_at": time.time(),
    }
    _held.update(record=record, fds=fds)
    return current()


def current() -> dict | None:
    """The slot this process holds (for its record), or None."""
    return dict(_held["record"]) if _held else None


def flag(k: int) -> str:
    """`--resources gpu=<GPUs × K>`: Snakemake's concurrency matching the slots (grassflow gpus);
    nothing on a machine without a GPU, where the GPU jobs run on the CPU unlimited by it."""
    n = len(gpus())
    return f"--resources gpu={n * k}" if n else ""
