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
from dataclasses import dataclass
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
from grassflow.models import layers
from grassflow.models.ensemble import member_state
from grassflow.run_spec import RunSpec
from grassflow.trackers import Trackers
from grassflow.train_config import TrainConfig
from grassflow.train_step import EpochLoss, GraphedForward, TrainStep


class Objective(Protocol):
    """What fit() trains: its batches, loss, validation and the score that picks the best weights
    (each task has one: LanguageModelObjective, SNLIObjective, RecallObjective)."""

    steps_per_epoch: int
    items_per_step: int  # tokens or examples per step, for the throughput column
    rate_key: str  # its metrics column: "tokens_per_s" | "examples_per_s"

    def batch(self, epoch: int, step: int) -> Any: ...  # a function of (seed, epoch, step) only
    def loss(self, model, batch) -> torch.Tensor: ...
    def validate(self, model) -> dict: ...  # metrics of one epoch; must hold "val_loss"
    def score(self, row: dict) -> float: ...  # lower is better; selects the best weights


def lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    warmup = max(1, int(cfg.warmup_frac * total))
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    floor = cfg.min_lr_frac * cfg.lr
    return floor + (cfg.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


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


def make_optimizer(model, tcfg: TrainConfig, device, capture: bool = False) -> tuple[torch.optim.AdamW, str]:
    """AdamW over the trainable parameters (no decay on biases and norms) and its
    implementation: `fused` (one kernel per step; its LR a device tensor updated in place, so
    a compiled or captured step never sees a new Python float) where fused_adamw() says so,
    else PyTorch's default (`foreach` on CUDA, a loop on the CPU) with a Python-float LR.
    `capture`: the step is to be captured as a CUDA graph, so the optimizer is `capturable`
    (its step counters on the device): torch refuses to capture a step() whose param groups are
    not (Optimizer._accelerator_graph_capture_health_check, which runs only under a CUDA
    capture; tests/test_capture.py runs it), and an uncaptured capturable step only costs more.
    An ensemble's parameters have a member dimension more (AdamW is elementwise: each member
    steps as its own run's optimizer would)."""
    extra = 1 if layers.members(model) else 0
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() - extra >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() - extra < 2]
    groups = [{"params": decay, "weight_decay": tcfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    if fused_adamw(device):
        lr = torch.tensor(float(tcfg.lr), dtype=torch.float32, device=device)
        return torch.optim.AdamW(groups, lr=lr, betas=tcfg.betas, fused=True, capturable=capture), "fused"
    return torch.optim.AdamW(groups, lr=tcfg.lr, betas=tcfg.betas), "default"


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


def tensor_lr(opt, device, capture: bool = False) -> None:
    """After load_state_dict: a fused optimizer's LR back to one tensor on `device` (a
    checkpoint holds it on the CPU, or as a float if written by the default optimizer), and its
    `capturable` flag this run's (load_state_dict restores the checkpoint's groups, whose flag is
    the writing run's: an eager run's False would make CUDA refuse this run's capture)."""
    if opt.defaults.get("fused"):
        lr = torch.tensor(float(opt.param_groups[0]["lr"]), dtype=torch.float32, device=device)
        for g in opt.param_groups:
            g["lr"] = lr
            g["capturable"] = capture


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


@dataclass
class Run:
    """One run of a fit: its spec, its directory, and what config.json says of its weights."""

    spec: RunSpec
    out_dir: Path
    header: dict


def fit(model, objective: Objective, spec: RunSpec | dict, out_dir, device, header: dict,
        execution: dict | None = None) -> tuple[dict, list[dict], dict]:
    """Train `model` on `objective` per spec.train; return (status, metrics per epoch, how it
    ran: optimizer, compile settings and trackers, for run.json). `header` (JSON: the spec, what the model
    is) goes into config.json beside the weights, with the best epoch's numbers. `execution`: how
    to run, not what to compute (compile, compile_mode, trackers; train.* keys kept out of the
    spec): a checkpoint resumes under any of them."""
    run = Run(RunSpec.of(spec), Path(out_dir), header)
    (status,), (metrics,), ran = fit_runs(model, objective, [run], out_dir, device,
                                          execution=execution)
    return status, metrics, ran


def fit_runs(model, objective: Objective, runs: list[Run], work_dir, device, viewer=None,
             execution: dict | None = None) -> tuple[list[dict], list[list[dict]], dict]:
    """fit() of one run, or of E runs that differ only in their seeds as one ensemble
    (models/ensemble.py: `model` stacked, `viewer` a plain model of the same shape, in which
    each member is validated; the objective's loss one per member). Each member is what its own run
    would be: its batches, its clipping, its validation, its best weights, its divergence (it
    stops alone: its record freezes, the others go on), its outputs in its own directory. The
    resume state (last.pt) is the ensemble's, in `work_dir`. Returns (status per run, metrics
    per run, how it ran)."""
    execution = {"compile": "auto", "compile_mode": "default", "trackers": [], **(execution or {})}
    E, work = len(runs), Path(work_dir)
    tcfg = runs[0].spec.train
    if E > 1 and (viewer is None or layers.members(model) != E):
        raise ValueError(f"fit_runs: {E} runs need an ensemble of {E} and a viewer model")
    viewer = model if E == 1 else viewer
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    check_disk(work, n_params)
    for d in {work, *(r.out_dir for r in runs)}:
        for stray in d.glob(".*.tmp"):  # left by a write that was killed; never a checkpoint
            stray.unlink()
    compiled = Compiled(model, objective, execution["compile"], execution["compile_mode"], device, eval_model=viewer)
    opt, opt_impl = make_optimizer(model, tcfg, device, capture=compiled.graph)
    steps = min(objective.steps_per_epoch, tcfg.max_steps_per_epoch or objective.steps_per_epoch)
    total_steps = steps * tcfg.epochs

    h = spec_hash(runs[0].spec.source) if E == 1 else spec_hash({"runs": [r.spec.source for r in runs]})
    last = work / "last.pt"
    best_states = [r.out_dir / "best_state.pt" for r in runs]
    state = load_checkpoint(last)
    if state is not None and state["spec_hash"] != h:
        print(f"[train] {last} belongs to another spec ({state['spec_hash']} ≠ {h}); starting fresh",
              file=sys.stderr)
        state = None
    if state is not None and "members" not in state:  # written before fused runs: one run's, as then
        state["members"] = [{"metrics": state["metrics"], "best": state["best_val"], "status": state["status"]}]
        state["pos"]["loss_sum"] = [state["pos"]["loss_sum"]]
    if state is None:
        for f in best_states:  # weights of an abandoned attempt are not this run's best
            f.unlink(missing_ok=True)
        pos = {"epoch": 0, "step": 0, "loss_sum": [0.0] * E, "seconds": 0.0}
        members = [{"metrics": [], "best": math.inf, "status": {"state": "running"}} for _ in runs]
    else:
        load_trained(model, state["model"])
        opt.load_state_dict(state["optimizer"])
        tensor_lr(opt, device, capture=compiled.graph)
        set_rng_state(state["rng"])
        pos, members = state["pos"], state["members"]
        print(f"[train] resuming {', '.join(r.spec.run_id for r in runs)} at epoch {pos['epoch'] + 1}, "
              f"step {pos['step']}", file=sys.stderr)

    def running() -> list[int]:
        return [e for e, m in enumerate(members) if m["status"]["state"] == "running"]

    def checkpoint():
        save_checkpoint(last, {"spec_hash": h, "model": trained_state(model), "optimizer": opt.state_dict(),
                               "rng": rng_state(), "pos": pos, "members": members})

    def diverged(e, loss_mean, bad_step=None):
        record = {"state": "diverged", "epoch": pos["epoch"] + 1,
                  "step": pos["step"] if bad_step is None else bad_step, "last_finite_loss": loss_mean}
        if bad_step is not None:  # found by the periodic check: the steps after it also ran
            record["detected_at_step"] = pos["step"]
        members[e]["status"] = record

    def sync() -> None:
        """The periodic host sync: the loss sums into pos, divergence into each member's status,
        the gradient norms' sums into `read`."""
        sums, bads, read["grad_norm_sum"] = losses.read()
        for e in running():
            pos["loss_sum"][e] = sums[e]
            if bads[e] is not None:
                prev = members[e]["metrics"][-1]["train_loss"] if members[e]["metrics"] else None
                diverged(e, sums[e] / bads[e] if bads[e] else prev, bads[e])

    def log_window(now: float) -> None:
        """The steps since the last log, to the trackers: floats the sync has already read."""
        n, at = pos["step"] - mark["step"], pos["epoch"] * steps + pos["step"]
        for e in running():
            trackers[e].log({"train/loss": (pos["loss_sum"][e] - mark["loss_sum"][e]) / n,
                             "train/grad_norm": (read["grad_norm_sum"][e] - mark["grad_norm_sum"][e]) / n,
                             "train/lr": lr_at(at - 1, total_steps, tcfg),
                             f"train/{objective.rate_key}": n * objective.items_per_step / (now - mark["time"])}, at)
        mark.update(step=pos["step"], loss_sum=list(pos["loss_sum"]), grad_norm_sum=list(read["grad_norm_sum"]),
                    time=now)

    def validate(e) -> dict:
        if E > 1:  # member e's weights into the plain model (in place: a captured forward stays valid)
            load_trained(viewer, member_state(model, e))
        return objective.validate(eval_model)

    trackers = [Trackers(execution["trackers"], r.spec.source, r.out_dir, fresh=state is None) for r in runs]
    losses = EpochLoss(device, E)
    train_step = TrainStep(model, compiled.loss, opt, tcfg.grad_clip, device, losses, capture=compiled.graph)
    eval_model = GraphedForward(compiled.eval_model, device) if compiled.graph else compiled.eval_model
    stop = StopRequest()
    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGUSR1)}
    every = tcfg.checkpoint_every
    label = runs[0].spec.run_id if E == 1 else f"{runs[0].spec.run_id} (+{E - 1} fused)"
    try:
        while pos["epoch"] < tcfg.epochs and running():
            model.train()
            t0 = time.perf_counter() - pos["seconds"]
            losses.reset(pos["loss_sum"], pos["step"])
            read = {"grad_norm_sum": [0.0] * E}
            mark = {"step": pos["step"], "loss_sum": list(pos["loss_sum"]), "grad_norm_sum": [0.0] * E,
                    "time": time.perf_counter()}
            bar = tqdm(total=steps, initial=pos["step"], unit="step", mininterval=5,
                       desc=f"{label} epoch {pos['epoch'] + 1}", file=sys.stderr)
            while pos["step"] < steps and running():
                if stop.signal:
                    pos["seconds"] = time.perf_counter() - t0
                    sync()
                    if running():
                        checkpoint()
                        print(f"[train] {stop.signal}: checkpointed at epoch {pos['epoch'] + 1}, step "
                              f"{pos['step']}; rerun to resume", file=sys.stderr)
                        raise SystemExit(75)
                    break
                set_lr(opt, lr_at(pos["epoch"] * steps + pos["step"], total_steps, tcfg))
                train_step(objective.batch(pos["epoch"], pos["step"]))
                pos["step"] += 1
                at_checkpoint = every and pos["step"] % every == 0 and pos["step"] < steps
                if pos["step"] % tcfg.log_every == 0 or pos["step"] == steps or at_checkpoint:
                    sync()
                    if not running():
                        break
                    bar.update(pos["step"] - bar.n)
                    rate = pos["step"] * objective.items_per_step / (time.perf_counter() - t0)
                    bar.set_postfix(loss=f"{pos['loss_sum'][running()[0]] / pos['step']:.3f}", per_s=f"{rate:.0f}",
                                    refresh=False)
                    log_window(time.perf_counter())
                if at_checkpoint:
                    pos["seconds"] = time.perf_counter() - t0
                    checkpoint()
            bar.close()
            if not running():
                break
            for e in running():
                train_loss = pos["loss_sum"][e] / max(1, pos["step"])
                val = validate(e)
                if not math.isfinite(val["val_loss"]):
                    diverged(e, train_loss)
                    continue
                elapsed = time.perf_counter() - t0
                row = {"epoch": pos["epoch"] + 1, "train_loss": train_loss, **val, "lr": lr_at(
                       pos["epoch"] * steps + steps - 1, total_steps, tcfg),
                       "seconds": elapsed, objective.rate_key: pos["step"] * objective.items_per_step / elapsed}
                members[e]["metrics"].append(row)
                trackers[e].log({f"val/{k.removeprefix('val_')}": v for k, v in val.items()}, (pos["epoch"] + 1) * steps)
                if objective.score(row) < members[e]["best"]:
                    members[e]["best"] = objective.score(row)
                    with atomic_path(best_states[e]) as tmp:
                        # a member's state as copies: views would save the whole stacked storage (E× the size)
                        torch.save({"model": trained_state(model) if E == 1 else
                                    {k: v.clone() for k, v in member_state(model, e).items()},
                                    "epoch": row["epoch"], "val_loss": row["val_loss"], "val_metrics": val}, tmp)
                write_text(runs[e].out_dir / "metrics.jsonl",
                           "".join(json.dumps(m) + "\n" for m in members[e]["metrics"]))
            pos = {"epoch": pos["epoch"] + 1, "step": 0, "loss_sum": [0.0] * E, "seconds": 0.0}
            checkpoint()
    finally:
        for t in trackers:
            t.close()
        for s, handler in old.items():
            signal.signal(s, handler)

    if any(m["status"]["state"] == "diverged" for m in members):
        checkpoint()
    for e, (run, m) in enumerate(zip(runs, members)):
        if m["status"]["state"] == "running":
            m["status"] = {"state": "completed"}
        # The declared outputs are (re)written from the working files only now: a failed attempt's
        # outputs are deleted by Snakemake, and a resumed run must still produce all of them.
        write_text(run.out_dir / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in m["metrics"]))
        # diverged before a first validation: no weights, and a record that still evaluates (as diverged)
        best_run = load_data(best_states[e]) if best_states[e].exists() else {"model": None, "epoch": 0,
                                                                                "val_loss": math.nan}
        save_weights(run.out_dir / WEIGHTS, best_run["model"])
        write_json(run.out_dir / CONFIG, {**run.header, **{k: v for k, v in best_run.items()
                                                             if k in ("epoch", "val_loss", "val_metrics")},
                                          "weights_sha256": state_sha256(best_run["model"])})
    ran = {"optimizer": f"adamw-{opt_impl}", "compile": compiled.record(), "trackers": execution["trackers"]}
    if train_step.capture_error:  # the step ran eagerly after its capture failed
        ran["compile"].update(cuda_graph=False, capture_error=train_step.capture_error)
    return [m["status"] for m in members], [m["metrics"] for m in members], ran
