"""Crafted files that would run code if loaded the unsafe way: a pickle whose object, when
unpickled, creates a marker file (os.system), written where our checkpoints live."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import torch

from grassflow.checkpoint import MAGIC


class Payload:
    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def crafted_weights(path: Path, marker: Path, header: dict | None = None) -> None:
    """A run's model.safetensors replaced by a pickle that would run `touch marker` if it were
    unpickled, beside a config.json that says it holds weights."""
    torch.save({"model": Payload(marker)}, path)
    (path.parent / "config.json").write_text(
        json.dumps({**(header or {}), "epoch": 1, "val_loss": 1.0, "weights_sha256": "0" * 64})
    )


def crafted_last(path: Path, marker: Path, spec_hash: str = "x") -> None:
    """A last.pt with the payload and a valid checksum (anyone can recompute one)."""
    buf = io.BytesIO()
    torch.save({"spec_hash": spec_hash, "model": Payload(marker)}, buf)
    payload = buf.getvalue()
    path.write_bytes(MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
