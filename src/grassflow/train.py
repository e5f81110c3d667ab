"""Stage 3, train: one run (model × experiment × seed) from its spec.

AdamW, linear warmup then cosine decay (a pure function of the step, so nothing but the step
needs restoring), gradient clipping, bf16 autocast on CUDA, per-epoch validation (chunked
perplexity), the best-validation weights in best.pt. Every epoch (and every
`checkpoint_every` steps) the full state — model, optimizer, epoch, position in the epoch,
RNG states, metrics so far — goes atomically to last.pt, and a restarted job resumes from it.
The epoch's batch order is a function of (seed, epoch), so resuming mid-epoch replays exactly
the batches an uninterrupted run would have seen.

Outputs in the run directory: best.pt, metrics.jsonl, run.json (the provenance record), all
written when the run ends; working files: last.pt (resume state), best_state.pt (best so far).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import random
import shutil
import signal
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from grassflow.config import spec_hash
from grassflow.data.tokenize import read_tokens
from grassflow.evaluate import chunked_nll
from grassflow.io import atomic_path, sha256_file, write_json, write_text
from grassflow.models import ModelConfig, build_model
from grassflow.provenance import git_state, machine, package_versions
from grassflow.runtime import configure_torch, device_name, pick_device


def lr_at(step: int, total: int, cfg: dict) -> float:
    warmup = max(1, int(cfg["warmup_frac"] * total))
    if step < warmup:
        return cfg["lr"] * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    floor = cfg["min_lr_frac"] * cfg["lr"]
    return floor + (cfg["lr"] - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def batch_order(n_blocks: int, seed: int, epoch: int) -> torch.Tensor:
    return torch.randperm(n_blocks, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be trusted; the message names the file."""


class DiskSpaceError(RuntimeError):
    """Too little free disk for the checkpoints a run will write."""


def check_disk(out: Path, n_params: int) -> None:
    """best_state.pt and best.pt (weights) and last.pt (weights + two AdamW moments), each
    written beside the file it replaces, in fp32: 2 · (1 + 1 + 3) · 4 bytes per parameter, +10 %."""
    need = int(2 * (1 + 1 + 3) * 4 * n_params * 1.1)
    free = shutil.disk_usage(out).free
    if free < need:
        raise DiskSpaceError(f"{out}: {free / 2**20:.0f} MiB free, but this run's checkpoints need "
                             f"~{need / 2**20:.0f} MiB (best.pt, last.pt and their temporary copies); "
                             "free space or move results/ before training")


MAGIC = b"GFCKPT1\n"


def save_checkpoint(path: Path, state: dict) -> None:
    """One file: magic, sha256 of the payload, payload. Written to a temp file, fsynced and
    renamed, so a kill at any moment leaves either the previous checkpoint or the new one."""
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    with atomic_path(path) as tmp:
        tmp.write_bytes(MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)


def load_checkpoint(path: Path):
    """The checkpoint, or None if absent; a truncated or corrupt one is an error, never loaded."""
    if not path.exists():
        return None
    raw = path.read_bytes()
    head = len(MAGIC) + 65
    if raw[: len(MAGIC)] != MAGIC or hashlib.sha256(raw[head:]).hexdigest().encode() != raw[len(MAGIC) : head - 1]:
        raise CheckpointError(f"{path}: checksum mismatch (truncated or corrupt checkpoint); "
                              f"delete it to restart this run from scratch")
    return torch.load(io.BytesIO(raw[head:]), map_location="cpu", weights_only=False)


class StopRequest:
    """SIGTERM/SIGUSR1 (preemption, time limit) set a flag; the loop checkpoints at the next
    step boundary and exits with 75 (EX_TEMPFAIL), so a retry resumes exactly there."""

    def __init__(self):
        self.signal = None

    def __call__(self, signum, frame):
        self.signal = signal.Signals(signum).name


def train(spec: dict, train_tokens, val_tokens, out_dir) -> dict:
    t_start = time.time()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tcfg = spec["train"]
    configure_torch(deterministic=True)
    device = pick_device(tcfg["device"])
    seed = spec["seed"]

    train_ids, train_meta = read_tokens(train_tokens)
    val_ids, val_meta = read_tokens(val_tokens, vocab_size=train_meta["vocab_size"])
    if train_meta["tokenizer_sha256"] != val_meta["tokenizer_sha256"]:
        raise RuntimeError(f"{train_tokens} and {val_tokens} were made by different tokenizers")
    vocab = train_meta["vocab_size"]
    mcfg = ModelConfig.from_dict({**spec["model"], "vocab_size": vocab})
    L, B = mcfg.context_len, tcfg["batch_size"]
    n_blocks = (len(train_ids) - 1) // L
    if n_blocks < B:
        raise RuntimeError(f"{train_tokens}: {len(train_ids)} tokens make {n_blocks} blocks of {L}, "
                           f"fewer than one batch of {B}")
    steps_per_epoch = n_blocks // B  # drop the last partial batch: every step is full
    total_steps = steps_per_epoch * tcfg["epochs"]
    data = torch.as_tensor(train_ids[: n_blocks * L + 1], dtype=torch.long)

    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    model = build_model(spec["model_kind"], mcfg).to(device)
    check_disk(out, model.num_params())
    for stray in out.glob(".*.tmp"):  # left by a write that was killed; never a checkpoint
        stray.unlink()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tcfg["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=tcfg["lr"], betas=tuple(tcfg["betas"]))
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext())

    h = spec_hash(spec)
    last = out / "last.pt"  # resume state; best_state.pt: best weights so far (both working files)
    best_state = out / "best_state.pt"
    state = load_checkpoint(last)
    if state is not None and state["spec_hash"] != h:
        print(f"[train] {last} belongs to another spec ({state['spec_hash']} ≠ {h}); starting fresh",
              file=sys.stderr)
        state = None
    if state is None:
        best_state.unlink(missing_ok=True)  # weights of an abandoned attempt are not this run's best
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        set_rng_state(state["rng"])
        pos, metrics, best_val, status = state["pos"], state["metrics"], state["best_val"], state["status"]
        print(f"[train] resuming {spec['run_id']} at epoch {pos['epoch'] + 1}, step {pos['step']}",
              file=sys.stderr)
    else:
        pos = {"epoch": 0, "step": 0, "loss_sum": 0.0, "loss_n": 0, "seconds": 0.0}
        metrics, best_val, status = [], math.inf, {"state": "running"}

    def checkpoint():
        save_checkpoint(last, {"spec_hash": h, "model": model.state_dict(), "optimizer": opt.state_dict(),
                               "rng": rng_state(), "pos": pos, "metrics": metrics, "best_val": best_val,
                               "status": status})

    def diverged(loss_mean):
        return {"state": "diverged", "epoch": pos["epoch"] + 1, "step": pos["step"],
                "last_finite_loss": loss_mean}

    stop = StopRequest()
    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGUSR1)}
    every = tcfg.get("checkpoint_every") or 0
    try:
        while pos["epoch"] < tcfg["epochs"] and status["state"] == "running":
            model.train()
            order = batch_order(n_blocks, seed, pos["epoch"])
            t0 = time.perf_counter() - pos["seconds"]
            bar = tqdm(total=steps_per_epoch, initial=pos["step"], unit="step", mininterval=5,
                       desc=f"{spec['run_id']} epoch {pos['epoch'] + 1}", file=sys.stderr)
            while pos["step"] < steps_per_epoch:
                if stop.signal:
                    pos["seconds"] = time.perf_counter() - t0
                    checkpoint()
                    print(f"[train] {stop.signal}: checkpointed at epoch {pos['epoch'] + 1}, step "
                          f"{pos['step']}; rerun to resume", file=sys.stderr)
                    raise SystemExit(75)
                step = pos["epoch"] * steps_per_epoch + pos["step"]
                idx = order[pos["step"] * B : (pos["step"] + 1) * B]
                rows = idx[:, None] * L + torch.arange(L + 1)[None, :]
                x, y = data[rows[:, :-1]].to(device), data[rows[:, 1:]].to(device)
                for g in opt.param_groups:
                    g["lr"] = lr_at(step, total_steps, tcfg)
                with autocast:
                    logits = model(x)
                loss = F.cross_entropy(logits.float().reshape(-1, vocab), y.reshape(-1))
                if not torch.isfinite(loss):
                    prev = metrics[-1]["train_loss"] if metrics else None
                    status = diverged(pos["loss_sum"] / pos["loss_n"] if pos["loss_n"] else prev)
                    break
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg["grad_clip"])
                opt.step()
                pos["loss_sum"] += loss.item()
                pos["loss_n"] += 1
                pos["step"] += 1
                bar.update()
                bar.set_postfix(loss=f"{loss.item():.3f}",
                                tok_s=f"{pos['loss_n'] * B * L / (time.perf_counter() - t0):.0f}", refresh=False)
                if every and pos["step"] % every == 0 and pos["step"] < steps_per_epoch:
                    pos["seconds"] = time.perf_counter() - t0
                    checkpoint()
            bar.close()
            if status["state"] != "running":
                break
            train_loss = pos["loss_sum"] / max(1, pos["loss_n"])
            val_nll, val_n = chunked_nll(model, val_ids, L, tcfg["eval_batch_size"], device)
            val_loss = val_nll / val_n
            if not math.isfinite(val_loss):
                status = diverged(train_loss)
                break
            elapsed = time.perf_counter() - t0
            metrics.append({"epoch": pos["epoch"] + 1, "train_loss": train_loss, "val_loss": val_loss,
                            "val_ppl": math.exp(val_loss), "lr": opt.param_groups[0]["lr"],
                            "seconds": elapsed, "tokens_per_s": pos["loss_n"] * B * L / elapsed})
            if val_loss < best_val:
                best_val = val_loss
                with atomic_path(best_state) as tmp:
                    torch.save({"spec": spec, "model_config": mcfg.to_dict(), "model": model.state_dict(),
                                "epoch": pos["epoch"] + 1, "val_loss": val_loss}, tmp)
            write_text(out / "metrics.jsonl", "".join(json.dumps(m) + "\n" for m in metrics))
            pos = {"epoch": pos["epoch"] + 1, "step": 0, "loss_sum": 0.0, "loss_n": 0, "seconds": 0.0}
            checkpoint()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)

    if status["state"] == "running":
        status = {"state": "completed"}
    if status["state"] == "diverged":
        checkpoint()
    # The declared outputs are (re)written from the working files only now: a failed attempt's
    # outputs are deleted by Snakemake, and a resumed run must still produce all of them.
    write_text(out / "metrics.jsonl", "".join(json.dumps(m) + "\n" for m in metrics))
    with atomic_path(out / "best.pt") as tmp:
        if best_state.exists():
            shutil.copyfile(best_state, tmp)
        else:  # diverged before a first validation: keep the record evaluable
            torch.save({"spec": spec, "model_config": mcfg.to_dict(), "model": None,
                        "epoch": 0, "val_loss": math.nan}, tmp)
    best = min(metrics, key=lambda m: m["val_loss"]) if metrics else None
    record = {
        "run_id": spec["run_id"], "spec": spec, "spec_hash": h, "model_config": mcfg.to_dict(),
        "n_params": model.num_params(), "status": status, "epochs_completed": len(metrics),
        "best_epoch": best["epoch"] if best else None, "best_val_ppl": best["val_ppl"] if best else None,
        "git": git_state(Path(__file__).parent), "packages": package_versions(), "machine": machine(),
        "device": device_name(device), "seed": seed,
        "data": {"train": {"path": str(train_tokens), **train_meta, "file_sha256": sha256_file(train_tokens)},
                 "validation": {"path": str(val_tokens), **val_meta, "file_sha256": sha256_file(val_tokens)}},
        "wall_seconds": time.time() - t_start,
        "checkpoint_sha256": sha256_file(out / "best.pt"),
    }
    write_json(out / "run.json", record)
    return record

