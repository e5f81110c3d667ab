"""The training loop shared by every task (language modelling, SNLI).

AdamW, linear warmup then cosine decay (a pure function of the step, so nothing but the step
needs restoring), gradient clipping, bf16 autocast on CUDA, validation after every epoch, the
best-validation weights kept. Every epoch (and every `checkpoint_every` steps) the full
state — model, optimizer, epoch, position in the epoch, RNG states, metrics so far — goes
atomically to last.pt, and a restarted job resumes from it. A task's batches are a function
of (seed, epoch, step), so resuming mid-epoch replays exactly the batches an uninterrupted
run would have seen.

Run directory: best.pt and metrics.jsonl are written when the run ends (the caller adds
run.json); working files: last.pt (resume state), best_state.pt (best weights so far).
"""

from __future__ import annotations

import json
import math
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any, Protocol

import torch
from tqdm import tqdm

from grassflow.checkpoint import (
    check_disk,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from grassflow.config import spec_hash
from grassflow.io import atomic_path, write_text
from grassflow.runtime import autocast


class Task(Protocol):
    steps_per_epoch: int
    items_per_step: int  # tokens or examples per step, for the throughput column
    rate_key: str  # its metrics column: "tokens_per_s" | "examples_per_s"

    def batch(self, epoch: int, step: int) -> Any: ...  # a function of (seed, epoch, step) only
    def loss(self, model, batch) -> torch.Tensor: ...
    def validate(self, model) -> dict: ...  # metrics of one epoch; must hold "val_loss"
    def score(self, row: dict) -> float: ...  # lower is better; selects the best weights


def lr_at(step: int, total: int, cfg: dict) -> float:
    warmup = max(1, int(cfg["warmup_frac"] * total))
    if step < warmup:
        return cfg["lr"] * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    floor = cfg["min_lr_frac"] * cfg["lr"]
    return floor + (cfg["lr"] - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def batch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))


class ShuffledBatches:
    """The item indices of (epoch, step): n items in a (seed, epoch)-shuffled order, in batches
    of B, the last partial batch dropped so every step is full. A task's batches are a function
    of (seed, epoch, step), which is what makes resuming mid-epoch exact."""

    def __init__(self, n: int, B: int, seed: int):
        self.n, self.B, self.seed = n, B, seed
        self.steps_per_epoch = n // B
        self._order = (None, None)

    def __call__(self, epoch: int, step: int) -> torch.Tensor:
        if self._order[0] != epoch:
            self._order = (epoch, batch_order(self.n, self.seed, epoch))
        return self._order[1][step * self.B : (step + 1) * self.B]


class StopRequest:
    """SIGTERM/SIGUSR1 (preemption, time limit) set a flag; the loop checkpoints at the next
    step boundary and exits with 75 (EX_TEMPFAIL), so a retry resumes exactly there."""

    def __init__(self):
        self.signal = None

    def __call__(self, signum, frame):
        self.signal = signal.Signals(signum).name


def make_optimizer(model, tcfg: dict) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": tcfg["weight_decay"]},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=tcfg["lr"], betas=tuple(tcfg["betas"]))


def _owned(model, key: str) -> bool:
    # a model lists the state-dict prefixes of frozen parts rebuilt from their source
    # (SNLIClassifier: the backbone), which checkpoints never carry
    return not key.startswith(tuple(getattr(model, "not_checkpointed", ())))


def trained_state(model) -> dict:
    """The weights a run owns: all but those of its frozen, rebuilt parts."""
    return {k: v for k, v in model.state_dict().items() if _owned(model, k)}


def load_trained(model, state: dict) -> None:
    missing, unexpected = model.load_state_dict(state, strict=False)
    bad = [k for k in missing if _owned(model, k)] + list(unexpected)
    if bad:
        raise RuntimeError(f"checkpoint does not fit the model: {bad[:5]}")


def fit(model, task: Task, spec: dict, out_dir, device, header: dict) -> tuple[dict, list[dict]]:
    """Train `model` on `task` per spec["train"]; return (status, metrics per epoch).
    `header` goes into best.pt beside the weights (spec, model config)."""
    out = Path(out_dir)
    tcfg = spec["train"]
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    check_disk(out, n_params)
    for stray in out.glob(".*.tmp"):  # left by a write that was killed; never a checkpoint
        stray.unlink()
    opt = make_optimizer(model, tcfg)
    steps = min(task.steps_per_epoch, tcfg.get("max_steps_per_epoch") or task.steps_per_epoch)
    total_steps = steps * tcfg["epochs"]

    h = spec_hash(spec)
    last = out / "last.pt"
    best_state = out / "best_state.pt"
    state = load_checkpoint(last)
    if state is not None and state["spec_hash"] != h:
        print(f"[train] {last} belongs to another spec ({state['spec_hash']} ≠ {h}); starting fresh",
              file=sys.stderr)
        state = None
    if state is None:
        best_state.unlink(missing_ok=True)  # weights of an abandoned attempt are not this run's best
        pos = {"epoch": 0, "step": 0, "loss_sum": 0.0, "loss_n": 0, "seconds": 0.0}
        metrics, best, status = [], math.inf, {"state": "running"}
    else:
        load_trained(model, state["model"])
        opt.load_state_dict(state["optimizer"])
        set_rng_state(state["rng"])
        pos, metrics, best, status = state["pos"], state["metrics"], state["best_val"], state["status"]
        print(f"[train] resuming {spec['run_id']} at epoch {pos['epoch'] + 1}, step {pos['step']}",
              file=sys.stderr)

    def checkpoint():
        save_checkpoint(last, {"spec_hash": h, "model": trained_state(model), "optimizer": opt.state_dict(),
                               "rng": rng_state(), "pos": pos, "metrics": metrics, "best_val": best,
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
            t0 = time.perf_counter() - pos["seconds"]
            bar = tqdm(total=steps, initial=pos["step"], unit="step", mininterval=5,
                       desc=f"{spec['run_id']} epoch {pos['epoch'] + 1}", file=sys.stderr)
            while pos["step"] < steps:
                if stop.signal:
                    pos["seconds"] = time.perf_counter() - t0
                    checkpoint()
                    print(f"[train] {stop.signal}: checkpointed at epoch {pos['epoch'] + 1}, step "
                          f"{pos['step']}; rerun to resume", file=sys.stderr)
                    raise SystemExit(75)
                batch = task.batch(pos["epoch"], pos["step"])
                for g in opt.param_groups:
                    g["lr"] = lr_at(pos["epoch"] * steps + pos["step"], total_steps, tcfg)
                with autocast(device):
                    loss = task.loss(model, batch)
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
                rate = pos["loss_n"] * task.items_per_step / (time.perf_counter() - t0)
                bar.set_postfix(loss=f"{loss.item():.3f}", per_s=f"{rate:.0f}", refresh=False)
                if every and pos["step"] % every == 0 and pos["step"] < steps:
                    pos["seconds"] = time.perf_counter() - t0
                    checkpoint()
            bar.close()
            if status["state"] != "running":
                break
            train_loss = pos["loss_sum"] / max(1, pos["loss_n"])
            val = task.validate(model)
            if not math.isfinite(val["val_loss"]):
                status = diverged(train_loss)
                break
            elapsed = time.perf_counter() - t0
            row = {"epoch": pos["epoch"] + 1, "train_loss": train_loss, **val, "lr": opt.param_groups[0]["lr"],
                   "seconds": elapsed, task.rate_key: pos["loss_n"] * task.items_per_step / elapsed}
            metrics.append(row)
            if task.score(row) < best:
                best = task.score(row)
                with atomic_path(best_state) as tmp:
                    torch.save({**header, "model": trained_state(model), "epoch": row["epoch"],
                                "val_loss": row["val_loss"], "val_metrics": val}, tmp)
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
            torch.save({**header, "model": None, "epoch": 0, "val_loss": math.nan}, tmp)
    return status, metrics
