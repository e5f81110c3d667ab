"""Stage 3, train: one language-model run (model × experiment × seed) from its spec.

The loop, checkpoints and resume live in grassflow.loop; this module supplies the language
modelling task (random blocks of L+1 tokens, chunked validation perplexity) and the run's
provenance record. Outputs in the run directory: best.pt, metrics.jsonl, run.json, all written
when the run ends; working files: last.pt (resume state), best_state.pt (best so far).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from grassflow.checkpoint import CheckpointError, DiskSpaceError, seed_everything, state_sha256
from grassflow.config import spec_hash
from grassflow.data import DataError
from grassflow.data.tokenize import read_tokens
from grassflow.evaluate import chunked_nll
from grassflow.io import sha256_file, write_json
from grassflow.loop import batch_order, fit
from grassflow.models import ModelConfig, build_model
from grassflow.ops.plucker import resolve_backend
from grassflow.provenance import git_state, machine, package_versions
from grassflow.runtime import configure_torch, device_name, pick_device

__all__ = ["CheckpointError", "DiskSpaceError", "LanguageModelTask", "train", "run_record"]


class LanguageModelTask:
    """Next-token prediction on random non-overlapping blocks of L+1 tokens."""

    rate_key = "tokens_per_s"

    def __init__(self, train_ids, val_ids, L, B, seed, eval_batch_size, device, path):
        n_blocks = (len(train_ids) - 1) // L
        if n_blocks < B:
            raise RuntimeError(f"{path}: {len(train_ids)} tokens make {n_blocks} blocks of {L}, "
                               f"fewer than one batch of {B}")
        self.L, self.B, self.seed, self.device = L, B, seed, device
        self.n_blocks, self.val_ids, self.eval_batch_size = n_blocks, val_ids, eval_batch_size
        self.steps_per_epoch = n_blocks // B  # drop the last partial batch: every step is full
        self.items_per_step = B * L
        self.data = torch.as_tensor(train_ids[: n_blocks * L + 1], dtype=torch.long)
        self._order = (None, None)

    def batch(self, epoch, step):
        if self._order[0] != epoch:
            self._order = (epoch, batch_order(self.n_blocks, self.seed, epoch))
        idx = self._order[1][step * self.B : (step + 1) * self.B]
        rows = idx[:, None] * self.L + torch.arange(self.L + 1)[None, :]
        return self.data[rows[:, :-1]].to(self.device), self.data[rows[:, 1:]].to(self.device)

    def loss(self, model, batch):
        x, y = batch
        logits = model(x)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))

    def validate(self, model):
        nll, n = chunked_nll(model, self.val_ids, self.L, self.eval_batch_size, self.device)
        return {"val_loss": nll / n, "val_ppl": math.exp(nll / n)}

    def score(self, row):
        return row["val_loss"]


def run_record(spec, out, model, status, metrics, best, device, data, t_start, *, op_backend=None,
               preflight=None, **extra) -> dict:
    """run.json: what this run is, how it ended, and where every input came from; also the
    device asked for and the one used, the Plücker op backend that ran (what `auto` became)
    and the preflight record of the job's environment, if the pipeline made one."""
    record = {
        "run_id": spec["run_id"], "spec": spec, "spec_hash": spec_hash(spec), **extra,
        "n_params": model.num_params(), "status": status, "epochs_completed": len(metrics),
        "best_epoch": best["epoch"] if best else None,
        "git": git_state(Path(__file__).parent), "packages": package_versions(), "machine": machine(),
        "device": device_name(device), "device_requested": spec["train"]["device"],
        "device_type": device.type, "plucker_backend": op_backend,
        "preflight": json.loads(Path(preflight).read_text()) if preflight else None,
        "seed": spec["seed"], "data": data,
        "wall_seconds": time.time() - t_start,
        "weights_sha256": state_sha256(torch.load(Path(out) / "best.pt", map_location="cpu", weights_only=False)["model"]),
        "checkpoint_file_sha256": sha256_file(Path(out) / "best.pt"),
    }
    write_json(Path(out) / "run.json", record)
    return record


def token_file_record(path, meta) -> dict:
    return {"path": str(path), **meta, "file_sha256": sha256_file(path)}


def start_run(spec: dict, out_dir) -> tuple[float, Path, torch.device]:
    """(start time, run directory, device) of a training job, torch set up for it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    configure_torch(deterministic=True)
    return time.time(), out, pick_device(spec["train"]["device"], log=True)


def op_backend(kind: str, backend: str, device) -> str | None:
    """The Plücker op backend a Grassmann model runs with on `device` (None: no Plücker op)."""
    return resolve_backend(backend, device) if kind == "grassmann" else None


def read_train_val(read, train_tokens, val_tokens):
    """Both token files through `read`, checked to come from one tokenizer."""
    train, train_meta = read(train_tokens)
    val, val_meta = read(val_tokens, vocab_size=train_meta["vocab_size"])
    if train_meta["tokenizer_sha256"] != val_meta["tokenizer_sha256"]:
        raise DataError(f"{train_tokens} and {val_tokens} were made by different tokenizers")
    return train, train_meta, val, val_meta


def train(spec: dict, train_tokens, val_tokens, out_dir, preflight=None) -> dict:
    t_start, out, device = start_run(spec, out_dir)
    tcfg = spec["train"]
    train_ids, train_meta, val_ids, val_meta = read_train_val(read_tokens, train_tokens, val_tokens)
    mcfg = ModelConfig.from_dict({**spec["model"], "vocab_size": train_meta["vocab_size"]})
    task = LanguageModelTask(train_ids, val_ids, mcfg.context_len, tcfg["batch_size"], spec["seed"],
                             tcfg["eval_batch_size"], device, train_tokens)
    seed_everything(spec["seed"])
    model = build_model(spec["model_kind"], mcfg).to(device)
    status, metrics = fit(model, task, spec, out, device,
                          header={"spec": spec, "model_config": mcfg.to_dict()})
    best = min(metrics, key=lambda m: m["val_loss"]) if metrics else None
    data = {"train": token_file_record(train_tokens, train_meta),
            "validation": token_file_record(val_tokens, val_meta)}
    return run_record(spec, out, model, status, metrics, best, device, data, t_start,
                      op_backend=op_backend(spec["model_kind"], mcfg.plucker_backend, device),
                      preflight=preflight, model_config=mcfg.to_dict(),
                      best_val_ppl=best["val_ppl"] if best else None)
