"""The training loop shared by every task (language modelling, SNLI).

AdamW, linear warmup then cosine decay (a pure function of the step, so nothing but the step
needs restoring), gradient clipping, bf16 autocast on CUDA, validation after every epoch, the
best-validation weights kept. Every epoch (and every `checkpoint_every` steps) the full
state — model, optimizer, epoch, position in the epoch, RNG states, metrics so far — goes
atomically to last.pt, and a restarted job resumes from it. A task's batches are a function
of (seed, epoch, step), so resuming mid-epoch replays exactly the batches an uninterrupted
run would have seen.

Run directory: the best weights (model.safetensors, with config.json: what the weights are, the
Hugging Face layout) and metrics.jsonl are written when the run ends (the caller adds run.json);
working files: last.pt (resume state), best_state.pt (best weights so far).
"""

from __future__ import annotations

import json
import math
import signal
import sys
import time
from pathlib import Path
from typing import Any, Protocol

import torch
from tqdm import tqdm

from grassflow.checkpoint import (
    CONFIG,
    WEIGHTS,
    check_disk,
    load_checkpoint,
    load_data,
    rng_state,
    save_checkpoint,
    save_weights,
    set_rng_state,
    state_sha256,
)
from grassflow.compiled import Compiled
from grassflow.io import atomic_path, spec_hash, write_json, write_text
from grassflow.trackers import Trackers
from grassflow.train_step import EpochLoss, GraphedForward, TrainStep


class TrainingTask(Protocol):
    """What fit() trains on: a task's batches, loss, validation and the score that picks the best weights."""

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
    of (seed, epoch, step), which is what makes resuming mid-epoch exact. The order lives on
    `device`, where the tasks keep their training data: a step's batch is gathered there,
    without a host-to-device copy (which waits for the GPU) per step."""

    def __init__(self, n: int, B: int, seed: int, device="cpu"):
        self.n, self.B, self.seed, self.device = n, B, seed, device
        self.steps_per_epoch = n // B
        self._order = (None, None)

    def __call__(self, epoch: int, step: int) -> torch.Tensor:
        if self._order[0] != epoch:  # one copy to the device per epoch, none per step
            self._order = (epoch, batch_order(self.n, self.seed, epoch).to(self.device))
        return self._order[1][step * self.B : (step + 1) * self.B]


class StopRequest:
    """SIGTERM/SIGUSR1 (preemption, time limit) set a flag; the loop checkpoints at the next
    step boundary and exits with 75 (EX_TEMPFAIL), so a retry resumes exactly there."""

    def __init__(self):
        self.signal = None

    def __call__(self, signum, frame):
        self.signal = signal.Signals(signum).name


def make_optimizer(model, tcfg: dict, device) -> tuple[torch.optim.AdamW, str]:
    """AdamW over the trainable parameters (no decay on biases and norms) and its
    implementation: `fused` (one kernel per step; its LR a device tensor updated in place, so
    a compiled or captured step never sees a new Python float) where fused_adamw() says so,
    else PyTorch's default (`foreach` on CUDA, a loop on the CPU) with a Python-float LR."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": tcfg["weight_decay"]},
              {"params": no_decay, "weight_decay": 0.0}]
    if fused_adamw(device):
        lr = torch.tensor(float(tcfg["lr"]), dtype=torch.float32, device=device)
        return torch.optim.AdamW(groups, lr=lr, betas=tuple(tcfg["betas"]), fused=True), "fused"
    return torch.optim.AdamW(groups, lr=tcfg["lr"], betas=tuple(tcfg["betas"])), "default"


def fused_adamw(device) -> bool:
    """Fused AdamW on CUDA (PyTorch's own measurements: 2.7–3× foreach) and on the CPU, where
    ours measured it faster than the default loop (reports/bench/bench-cpu.md, settings rows:
    a whole step 1.10× (Transformer) and 1.03× (Grassmann) faster)."""
    return device.type in ("cuda", "cpu")


def set_lr(opt, value: float) -> None:
    for g in opt.param_groups:
        if isinstance(g["lr"], torch.Tensor):
            g["lr"].fill_(value)  # in place: a kernel on the device, no host sync
        else:
            g["lr"] = value


def tensor_lr(opt, device) -> None:
    """After load_state_dict: a fused optimizer's LR back to one tensor on `device` (a
    checkpoint holds it on the CPU, or as a float if written by the default optimizer)."""
    if opt.defaults.get("fused"):
        lr = torch.tensor(float(opt.param_groups[0]["lr"]), dtype=torch.float32, device=device)
        for g in opt.param_groups:
            g["lr"] = lr


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


def fit(model, task: TrainingTask, spec: dict, out_dir, device, header: dict,
        execution: dict | None = None) -> tuple[dict, list[dict], dict]:
    """Train `model` on `task` per spec["train"]; return (status, metrics per epoch, how it
    ran: optimizer, compile settings and trackers, for run.json). `header` (JSON: the spec, what the model
    is) goes into config.json beside the weights, with the best epoch's numbers. `execution`: how
    to run, not what to compute (compile, compile_mode, trackers; train.* keys kept out of the
    spec): a checkpoint resumes under any of them."""
    execution = {"compile": "auto", "compile_mode": "default", "trackers": [], **(execution or {})}
    out = Path(out_dir)
    tcfg = spec["train"]
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    check_disk(out, n_params)
    for stray in out.glob(".*.tmp"):  # left by a write that was killed; never a checkpoint
        stray.unlink()
    opt, opt_impl = make_optimizer(model, tcfg, device)
    compiled = Compiled(model, task, execution["compile"], execution["compile_mode"], device)
    steps = min(task.steps_per_epoch, tcfg.get("max_steps_per_epoch") or task.steps_per_epoch)
    total_steps = steps * tcfg["epochs"]
    log_every = tcfg.get("log_every") or 50

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
        pos = {"epoch": 0, "step": 0, "loss_sum": 0.0, "seconds": 0.0}
        metrics, best, status = [], math.inf, {"state": "running"}
    else:
        load_trained(model, state["model"])
        opt.load_state_dict(state["optimizer"])
        tensor_lr(opt, device)
        set_rng_state(state["rng"])
        pos, metrics, best, status = state["pos"], state["metrics"], state["best_val"], state["status"]
        print(f"[train] resuming {spec['run_id']} at epoch {pos['epoch'] + 1}, step {pos['step']}",
              file=sys.stderr)

    def checkpoint():
        save_checkpoint(last, {"spec_hash": h, "model": trained_state(model), "optimizer": opt.state_dict(),
                               "rng": rng_state(), "pos": pos, "metrics": metrics, "best_val": best,
                               "status": status})

    def diverged(loss_mean, bad_step=None):
        record = {"state": "diverged", "epoch": pos["epoch"] + 1,
                  "step": pos["step"] if bad_step is None else bad_step, "last_finite_loss": loss_mean}
        if bad_step is not None:  # found by the periodic check: the steps after it also ran
            record["detected_at_step"] = pos["step"]
        return record

    def sync(losses) -> bool:
        """The periodic host sync: the loss sum into pos, divergence into status, the gradient
        norms' sum into `read`. True if the run diverged (some step of this epoch had a
        non-finite loss)."""
        nonlocal status
        pos["loss_sum"], bad, read["grad_norm_sum"] = losses.read()
        if bad is None:
            return False
        prev = metrics[-1]["train_loss"] if metrics else None
        status = diverged(pos["loss_sum"] / bad if bad else prev, bad)
        return True

    def log_window(now: float) -> None:
        """The steps since the last log, to the trackers: floats the sync has already read."""
        n, at = pos["step"] - mark["step"], pos["epoch"] * steps + pos["step"]
        trackers.log({"train/loss": (pos["loss_sum"] - mark["loss_sum"]) / n,
                      "train/grad_norm": (read["grad_norm_sum"] - mark["grad_norm_sum"]) / n,
                      "train/lr": lr_at(at - 1, total_steps, tcfg),
                      f"train/{task.rate_key}": n * task.items_per_step / (now - mark["time"])}, at)
        mark.update(step=pos["step"], loss_sum=pos["loss_sum"], grad_norm_sum=read["grad_norm_sum"], time=now)

    trackers = Trackers(execution["trackers"], spec, out)
    losses = EpochLoss(device)
    train_step = TrainStep(model, compiled.loss, opt, tcfg["grad_clip"], device, losses, capture=compiled.graph)
    eval_model = GraphedForward(compiled.eval_model, device) if compiled.graph else compiled.eval_model
    stop = StopRequest()
    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGUSR1)}
    every = tcfg.get("checkpoint_every") or 0
    try:
        while pos["epoch"] < tcfg["epochs"] and status["state"] == "running":
            model.train()
            t0 = time.perf_counter() - pos["seconds"]
            losses.reset(pos["loss_sum"], pos["step"])
            read = {"grad_norm_sum": 0.0}
            mark = {"step": pos["step"], "loss_sum": pos["loss_sum"], "grad_norm_sum": 0.0, "time": time.perf_counter()}
            bar = tqdm(total=steps, initial=pos["step"], unit="step", mininterval=5,
                       desc=f"{spec['run_id']} epoch {pos['epoch'] + 1}", file=sys.stderr)
            while pos["step"] < steps:
                if stop.signal:
                    pos["seconds"] = time.perf_counter() - t0
                    if not sync(losses):
                        checkpoint()
                        print(f"[train] {stop.signal}: checkpointed at epoch {pos['epoch'] + 1}, step "
                              f"{pos['step']}; rerun to resume", file=sys.stderr)
                        raise SystemExit(75)
                    break
                set_lr(opt, lr_at(pos["epoch"] * steps + pos["step"], total_steps, tcfg))
                train_step(task.batch(pos["epoch"], pos["step"]))
                pos["step"] += 1
                at_checkpoint = every and pos["step"] % every == 0 and pos["step"] < steps
                if pos["step"] % log_every == 0 or pos["step"] == steps or at_checkpoint:
                    if sync(losses):
                        break
                    bar.update(pos["step"] - bar.n)
                    rate = pos["step"] * task.items_per_step / (time.perf_counter() - t0)
                    bar.set_postfix(loss=f"{pos['loss_sum'] / pos['step']:.3f}", per_s=f"{rate:.0f}",
                                    refresh=False)
                    log_window(time.perf_counter())
                if at_checkpoint:
                    pos["seconds"] = time.perf_counter() - t0
                    checkpoint()
            bar.close()
            if status["state"] != "running":
                break
            train_loss = pos["loss_sum"] / max(1, pos["step"])
            val = task.validate(eval_model)
            if not math.isfinite(val["val_loss"]):
                status = diverged(train_loss)
                break
            elapsed = time.perf_counter() - t0
            row = {"epoch": pos["epoch"] + 1, "train_loss": train_loss, **val, "lr": lr_at(
                   pos["epoch"] * steps + steps - 1, total_steps, tcfg),
                   "seconds": elapsed, task.rate_key: pos["step"] * task.items_per_step / elapsed}
            metrics.append(row)
            trackers.log({f"val/{k.removeprefix('val_')}": v for k, v in val.items()}, (pos["epoch"] + 1) * steps)
            if task.score(row) < best:
                best = task.score(row)
                with atomic_path(best_state) as tmp:
                    torch.save({"model": trained_state(model), "epoch": row["epoch"], "val_loss": row["val_loss"],
                                "val_metrics": val}, tmp)
            write_text(out / "metrics.jsonl", "".join(json.dumps(m) + "\n" for m in metrics))
            pos = {"epoch": pos["epoch"] + 1, "step": 0, "loss_sum": 0.0, "seconds": 0.0}
            checkpoint()
    finally:
        trackers.close()
        for s, handler in old.items():
            signal.signal(s, handler)

    if status["state"] == "running":
        status = {"state": "completed"}
    if status["state"] == "diverged":
        checkpoint()
    # The declared outputs are (re)written from the working files only now: a failed attempt's
    # outputs are deleted by Snakemake, and a resumed run must still produce all of them.
    write_text(out / "metrics.jsonl", "".join(json.dumps(m) + "\n" for m in metrics))
    # diverged before a first validation: no weights, and a record that still evaluates (as diverged)
    best_run = load_data(best_state) if best_state.exists() else {"model": None, "epoch": 0, "val_loss": math.nan}
    save_weights(out / WEIGHTS, best_run["model"])
    write_json(out / CONFIG, {**header, **{k: v for k, v in best_run.items() if k in ("epoch", "val_loss", "val_metrics")},
                              "weights_sha256": state_sha256(best_run["model"])})
    return status, metrics, {"optimizer": f"adamw-{opt_impl}", "compile": compiled.record(), "trackers": execution["trackers"]}
