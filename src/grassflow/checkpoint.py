"""Weights and resume state on disk: a run's best weights as safetensors, self-checksummed
checkpoints, RNG states and the disk-space guard.

Every checkpoint is read as data only (`load_data`: torch.load with weights_only=True): tensors,
dicts, lists, tuples, numbers, strings. A results tree is shared between users, and unpickling
anything else runs code chosen by whoever wrote the file; such a file is refused with an error
naming it, and nothing in it runs. So everything we save is of those types (the RNG states included:
NumPy's as a tensor and numbers, see rng_state)."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import random
import re
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from grassflow.errors import CheckpointError, DiskSpaceError
from grassflow.io import atomic_path
from grassflow.io import spec_hash as hash_of

# raised here, defined in errors.py (the CLI catches them)
__all__ = [
    "CheckpointError",
    "DiskSpaceError",
]


def state_sha256(state: dict | None) -> str | None:
    """sha256 of weights themselves: every tensor's name and bytes, in key order. Equal weights give
    equal hashes wherever and under whatever file name they were saved (a checkpoint file's own hash
    also covers the archive name torch.save takes from the file it writes)."""
    if state is None:
        return None
    h = hashlib.sha256()
    for k, v in sorted(state.items()):
        h.update(
            k.encode()
            + b"\0"
            + v.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        )
    return h.hexdigest()


def check_disk(out: Path, n_params: int) -> None:
    """best_state.pt and model.safetensors (weights) and last.pt (weights + two AdamW moments), each
    written beside the file it replaces, in fp32: 2 · (1 + 1 + 3) · 4 bytes per parameter, +10 %."""
    need = int(2 * (1 + 1 + 3) * 4 * n_params * 1.1)
    free = shutil.disk_usage(out).free
    if free < need:
        raise DiskSpaceError(
            f"{out}: {free / 2**20:.0f} MiB free, but this run's checkpoints need "
            f"~{need / 2**20:.0f} MiB (model.safetensors, last.pt and their temporary copies); "
            "free space or move results/ before training"
        )


# a model directory's files, the Hugging Face layout
WEIGHTS, CONFIG = (
    "model.safetensors",
    "config.json",
)


def save_weights(path: Path, state: dict | None) -> None:
    """Weights as safetensors (tensors only: reading them runs nothing). A tensor that is another
    one (a head tied to the token embedding) is stored once, under the first name, and its own name
    kept in the metadata (`tied`), for load_weights to tie again. None (a run that diverged before
    its first validation has no weights): a file with no tensors."""
    from safetensors.torch import save_file

    kept, tied, by_storage = {}, {}, {}
    for k, v in (state or {}).items():
        same = by_storage.setdefault((v.device, v.data_ptr(), tuple(v.shape), v.stride()), k)
        if same == k:
            kept[k] = v.detach().cpu().contiguous()
        else:
            tied[k] = same
    with atomic_path(path) as tmp:
        save_file(kept, str(tmp), metadata={"format": "pt", "tied": json.dumps(tied)})


def load_weights(path) -> dict:
    """The weights save_weights wrote, ties restored; a file that is not such is a
    CheckpointError."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), "pt") as f:
            state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is no mapping)
            tied = json.loads((f.metadata() or {}).get("tied", "{}"))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(
            f"{path}: not a readable safetensors file ({e}); delete it and rerun the run "
            "that writes it"
        ) from None
    return {**state, **{k: state[same] for k, same in tied.items()}}


MAGIC = b"GFCKPT1\n"


def data_bytes(obj) -> bytes:
    """torch.save's bytes, made in memory: written with atomic_path, a full disk is a DiskSpaceError
    naming the file (torch's own file writer says it only as `basic_ios::clear: iostream error`)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def save_data(path: Path, obj) -> None:
    """A working file that load_data reads (best_state.pt): written whole or not at all."""
    payload = data_bytes(obj)
    with atomic_path(path) as tmp:
        tmp.write_bytes(payload)


def save_checkpoint(path: Path, state: dict) -> None:
    """One file: magic, sha256 of the payload, payload. Written to a temp file, fsynced and renamed,
    so a kill at any moment leaves either the previous checkpoint or the new one."""
    payload = data_bytes(state)
    with atomic_path(path) as tmp:
        tmp.write_bytes(MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)


def to_host(obj):
    """`obj` with every tensor copied to host memory and every dict, list and tuple rebuilt: a
    snapshot that the next training step (which updates the weights, moments and counters in place)
    leaves as it was. A tensor that is another (a head tied to the embedding) stays one copy. One
    call for every device (`.to("cpu", copy=True)`: on CUDA a copy after the step's kernels, on its
    stream), so the CPU's tests run the GPU's code."""
    copies = {}

    def copy(x):
        if isinstance(x, torch.Tensor):
            x = x.detach()
            key = (x.device, x.data_ptr(), x.dtype, tuple(x.shape), x.stride())
            if key not in copies:
                copies[key] = x.to("cpu", copy=True)
            return copies[key]
        if isinstance(x, dict):
            return {k: copy(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(copy(v) for v in x)
        return x

    return copy(obj)


class CheckpointWriter:
    """Checkpoints written beside training: `save(write, path, state)` snapshots the state to host
    memory (to_host: the one part the training thread waits for) and one worker thread serializes,
    checksums, writes, fsyncs and renames it (`write`: save_checkpoint, save_data), in the order
    saved, so each file is still whole or absent and a later save never lands before an earlier one.
    `wait()` returns once everything saved is on disk and raises the first write's failure (a full
    disk: the DiskSpaceError naming its file); a save raises one that happened before it. At most
    `ahead` saves wait at a time (each holds a snapshot in memory)."""

    def __init__(self, ahead: int = 2):
        self.pool, self.pending, self.ahead = None, [], ahead

    def save(self, write, path, state) -> None:
        self._raise_done()
        while len(self.pending) >= self.ahead:
            self.pending.pop(0).result()
        if self.pool is None:
            self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self.pending.append(self.pool.submit(write, path, to_host(state)))

    def _raise_done(self) -> None:
        while self.pending and self.pending[0].done():
            self.pending.pop(0).result()

    def wait(self) -> None:
        while self.pending:
            self.pending.pop(0).result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            if self.pool is not None:
                self.pool.shutdown(wait=True)
                self.pool = None


def load_checkpoint(path: Path):
    """The checkpoint, or None if absent; a truncated or corrupt one is an error, never loaded."""
    if not path.exists():
        return None
    raw = path.read_bytes()
    head = len(MAGIC) + 65
    if (
        raw[: len(MAGIC)] != MAGIC
        or hashlib.sha256(raw[head:]).hexdigest().encode() != raw[len(MAGIC) : head - 1]
    ):
        raise CheckpointError(
            f"{path}: checksum mismatch (truncated or corrupt checkpoint); "
            f"delete it to restart this run from scratch"
        )
    return load_data(io.BytesIO(raw[head:]), path)


def resume_hash(specs: list[dict]) -> str:
    """The spec hash a fit's resume state carries: its one run's spec, or a fused group's runs'."""
    return hash_of(specs[0]) if len(specs) == 1 else hash_of({"runs": specs})


def resume_state(path: Path, spec_hash: str, code: str | None = None) -> dict | None:
    """A fit's resume state (grassflow.loop: model, optimizer, rng, pos, members) from `path`, or
    None: absent, another spec's, or written by other code (its job's code fingerprint, `code`: a
    job Snakemake reruns because its code changed must compute anew, not finish the old computation)
    (said, and started afresh). One written before fused runs (one run's metrics, best_val and
    status at the top) is read as a fit of one member."""
    state = load_checkpoint(path)
    if state is not None and state["spec_hash"] != spec_hash:
        print(
            (
                f"[train] {path} belongs to another spec ({state['spec_hash']} ≠ {spec_hash}); "
                "starting fresh"
            ),
            file=sys.stderr,
        )
        return None
    if state is not None and state.get("code") != code:
        print(
            (
                f"[train] {path} was written by other code (fingerprint {state.get('code')} ≠ "
                f"{code}); starting fresh"
            ),
            file=sys.stderr,
        )
        return None
    if state is not None and "members" not in state:
        state["members"] = [
            {"metrics": state["metrics"], "best": state["best_val"], "status": state["status"]}
        ]
        state["pos"]["loss_sum"] = [state["pos"]["loss_sum"]]
    return state


# The oldest torch whose weights-only loader we trust with a results tree others can write to:
# before 2.6 torch.load(weights_only=True) could be made to run code (CVE-2025-32434), before
# 2.10 its unpickler could be made to corrupt memory (CVE-2026-24747).
SAFE_TORCH = (2, 10)


def _torch_version(v: str) -> tuple[int, int]:
    major, minor = re.match(r"(\d+)\.(\d+)", v).groups()
    return int(major), int(minor)


def load_data(source, path=None):
    """torch.load as data only (weights_only=True). What it refuses — a pickle that would build an
    object by running code, or a checkpoint of another format — is a CheckpointError naming the
    file, raised before anything in it has run; on a torch older than SAFE_TORCH it opens
    nothing."""
    path = path or source
    if _torch_version(torch.__version__) < SAFE_TORCH:
        raise CheckpointError(
            f"{path}: not opened: torch {torch.__version__} can be made to run code or corrupt "
            "memory while loading a checkpoint (CVE-2025-32434, CVE-2026-24747); "
            "upgrade: pip install 'torch>=2.10'"
        )
    try:
        return torch.load(source, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        lines = [x.strip() for x in str(e).splitlines() if x.strip()]
        # torch's own advice (load with weights_only=False) is the one thing not to do: keep only
        # the line that says what the file holds
        why = next(
            (x for x in lines if "nsupported" in x),
            "it holds objects other than tensors and plain data",
        )
        raise CheckpointError(
            f"{path}: refused: not a data-only checkpoint ({why}); nothing in it was run. "
            "A file written by grassflow before checkpoints became data-only, or by "
            "someone else: delete it and rerun the run that writes it"
        ) from None
    except (RuntimeError, EOFError, ValueError) as e:
        raise CheckpointError(
            f"{path}: not a readable checkpoint ({str(e).strip().splitlines()[0]}); "
            "delete it and rerun the run that writes it"
        ) from None


def rng_state() -> dict:
    """Every RNG's state as data: torch's (a uint8 tensor), Python's (a tuple of ints), NumPy's (its
    MT19937 key as a tensor, and numbers), CUDA's (uint8 tensors)."""
    kind, key, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "key": torch.from_numpy(key.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(gauss),
        },
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state(
        (
            n["kind"],
            n["key"].numpy().astype(np.uint32),
            n["pos"],
            n["has_gauss"],
            n["cached_gaussian"],
        )
    )
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
