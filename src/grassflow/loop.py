"""The training loop shared by every task (language modelling, SNLI).

AdamW, linear warmup then cosine decay (a pure function of the step, so nothing but the step needs
restoring), gradient clipping, bf16 autocast on CUDA, validation after every epoch, the
best-validation weights kept. Every epoch (and every `checkpoint_every` steps) the full state —
model, optimizer, epoch, position in the epoch, RNG states, metrics so far — goes atomically to
last.pt, and a restarted job resumes from it. A task's batches are a function of (seed, epoch,
step), so resuming mid-epoch replays exactly the batches an uninterrupted run would have seen.

Run directory: the best weights (model.safetensors, with config.json: what the weights are, the
Hugging Face layout) and metrics.jsonl are written when the run ends (the caller adds run.json);
working files: last.pt (resume state), best_state.pt (best weights so far).

A run's parts: each start or resume to its stop (when, from and to which epoch and step, on which
device, at which commit and whether the tree was clean, and why it ended: finished, diverged, the
signal that stopped it, killed: a part whose last checkpoint is all that is known of its end, or
preempted: a part stopped in a SLURM job that SLURM then requeued, so that the next part runs in the
same job) go into last.pt and, once it ends, run.json (`parts`; `wall_seconds` their sum). A job
that reruns a run that had ended (a retried or requeued group job whose other run had not) writes
its outputs again and adds no part. Only a last.pt of the same spec and code (the job's code
fingerprint, from the pipeline) is resumed: a job rerun because its code changed trains anew.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from tqdm import tqdm

from grassflow.checkpoint import (
    CONFIG,
    WEIGHTS,
    CheckpointWriter,
    check_disk,
    load_data,
    resume_hash,
    resume_state,
    rng_state,
    save_checkpoint,
    save_data,
    save_weights,
    set_rng_state,
    state_sha256,
)
from grassflow.compiled import Compiled
from grassflow.io import write_json, write_text
from grassflow.models import layers
from grassflow.models.ensemble import member_state
from grassflow.provenance import git_state
from grassflow.run_spec import RunSpec
from grassflow.runtime import device_name
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
    """The item indices of (epoch, step): n items in a (seed, epoch)-shuffled order, in batches of
    B, the last partial batch dropped so every step is full. A task's batches are a function of
    (seed, epoch, step), which is what makes resuming mid-epoch exact. The order lives on `device`,
    where the tasks keep their training data: a step's batch is gathered there, without a
    host-to-device copy (which waits for the GPU) per step."""

    def __init__(self, n: int, B: int, seed: int, device="cpu"):
        self.n, self.B, self.seed, self.device = n, B, seed, device
        self.steps_per_epoch = n // B
        self._order = (None, None)

    def __call__(self, epoch: int, step: int) -> torch.Tensor:
        if self._order[0] != epoch:  # one copy to the device per epoch, none per step
            self._order = (epoch, batch_order(self.n, self.seed, epoch).to(self.device))
        return self._order[1][step * self.B : (step + 1) * self.B]


class StopRequest:
    """SIGTERM/SIGUSR1 (preemption, time limit) set a flag; the loop checkpoints at the next step
    boundary and exits with 75 (EX_TEMPFAIL), so a retry resumes exactly there."""

    def __init__(self):
        self.signal = None

    def __call__(self, signum, frame):
        self.signal = signal.Signals(signum).name


def make_optimizer(
    model, tcfg: TrainConfig, device, capture: bool = False
) -> tuple[torch.optim.AdamW, str]:
    """AdamW over the trainable parameters (no decay on biases and norms) and its implementation:
    `fused` (one kernel per step; its LR a device tensor updated in place, so a compiled or captured
    step never sees a new Python float) where fused_adamw() says so, else PyTorch's default
    (`foreach` on CUDA, a loop on the CPU) with a Python-float LR. `capture`: the step is to be
    captured as a CUDA graph, so the optimizer is `capturable` (its step counters on the device):
    torch refuses to capture a step() whose param groups are not
    (Optimizer._accelerator_graph_capture_health_check, which runs only under a CUDA capture;
    tests/gpu/test_capture.py runs it), and an uncaptured capturable step only costs more. An
    ensemble's parameters have a member dimension more (AdamW is elementwise: each member steps as
    its own run's optimizer would)."""
    extra = 1 if layers.members(model) else 0
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() - extra >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() - extra < 2]
    groups = [
        {"params": decay, "weight_decay": tcfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    if fused_adamw(device):
        lr = torch.tensor(float(tcfg.lr), dtype=torch.float32, device=device)
        return torch.optim.AdamW(
            groups, lr=lr, betas=tcfg.betas, fused=True, capturable=capture
        ), "fused"
    return torch.optim.AdamW(groups, lr=tcfg.lr, betas=tcfg.betas), "default"


def fused_adamw(device) -> bool:
    """Fused AdamW on CUDA (PyTorch's own measurements: 2.7–3× foreach) and on the CPU, where ours
    measured it faster than the default loop (reports/bench/bench-cpu.md, settings rows: a whole
    step 1.10× (Transformer) and 1.03× (Grassmann) faster)."""
    return device.type in ("cuda", "cpu")


def set_lr(opt, value: float) -> None:
    for g in opt.param_groups:
        if isinstance(g["lr"], torch.Tensor):
            g["lr"].fill_(value)  # in place: a kernel on the device, no host sync
        else:
            g["lr"] = value


def tensor_lr(opt, device, capture: bool = False) -> None:
    """After load_state_dict: a fused optimizer's LR back to one tensor on `device` (a checkpoint
    holds it on the CPU, or as a float if written by the default optimizer), and its `capturable`
    flag this run's (load_state_dict restores the checkpoint's groups, whose flag is the writing
    run's: an eager run's False would make CUDA refuse this run's capture)."""
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


ENDS = ("finished", "diverged")  # a part that ended so ended its run
# a part before last.pt kept its parts (a checkpoint of an earlier format): known to have been, no
# more
UNRECORDED = {
    "ended": "unrecorded",
    "note": "a part before run records kept their parts: not recorded",
}


@dataclass
class Run:
    """One run of a fit: its spec, its directory, and what config.json says of its weights."""

    spec: RunSpec
    out_dir: Path
    header: dict


def fit(
    model,
    objective: Objective,
    spec: RunSpec | dict,
    out_dir,
    device,
    header: dict,
    execution: dict | None = None,
) -> tuple[dict, list[dict], dict]:
    """Train `model` on `objective` per spec.train; return (status, metrics per epoch, how it ran:
    optimizer, compile settings and trackers, for run.json). `header` (JSON: the spec, what the
    model is) goes into config.json beside the weights, with the best epoch's numbers. `execution`:
    how to run, not what to compute (compile, compile_mode, trackers; train.* keys kept out of the
    spec): a checkpoint resumes under any of them; and `code`, the job's code fingerprint: a
    checkpoint resumes only under its own."""
    run = Run(RunSpec.of(spec), Path(out_dir), header)
    (status,), (metrics,), ran = fit_runs(
        model, objective, [run], out_dir, device, execution=execution
    )
    return status, metrics, ran


def fit_runs(
    model,
    objective: Objective,
    runs: list[Run],
    work_dir,
    device,
    viewer=None,
    execution: dict | None = None,
) -> tuple[list[dict], list[list[dict]], dict]:
    """fit() of one run, or of E runs that differ only in their seeds as one ensemble
    (models/ensemble.py: `model` stacked, `viewer` a plain model of the same shape, in which each
    member is validated; the objective's loss one per member). Each member is what its own run would
    be: its batches, its clipping, its validation, its best weights, its divergence (it stops alone:
    its record freezes, the others go on), its outputs in its own directory. The resume state
    (last.pt) is the ensemble's, in `work_dir`. Returns (status per run, metrics per run, how it
    ran)."""
    fit = Fit(
        model,
        objective,
        runs,
        Path(work_dir),
        device,
        viewer,
        {"compile": "auto", "compile_mode": "default", "trackers": [], **(execution or {})},
    )
    stop = StopRequest()
    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        while fit.pos["epoch"] < fit.tcfg.epochs and fit.running():
            t0 = fit.train_epoch(stop)
            if not fit.running():
                break
            fit.validate_epoch(t0)
        return fit.finish()
    finally:
        for m in fit.members:
            m.trackers.close()
        for s, handler in old.items():
            signal.signal(s, handler)
        # a failure on the way out: the writes already saved still land
        with contextlib.suppress(Exception):
            fit.writer.close()


@dataclass
class Member:
    """One run's own part of a fit: its metrics, best score and status (what last.pt keeps of it),
    its trackers and the file of its best weights so far."""

    run: Run
    metrics: list = field(default_factory=list)
    best: float = math.inf
    status: dict = field(default_factory=lambda: {"state": "running"})
    trackers: Any = None

    @property
    def running(self) -> bool:
        return self.status["state"] == "running"

    @property
    def best_state(self) -> Path:
        return self.run.out_dir / "best_state.pt"

    def state(self) -> dict:
        return {"metrics": self.metrics, "best": self.best, "status": self.status}

    def diverge(
        self, epoch: int, step: int, last_finite_loss, detected_at: int | None = None
    ) -> None:
        self.status = {
            "state": "diverged",
            "epoch": epoch,
            "step": step,
            "last_finite_loss": last_finite_loss,
        }
        if detected_at is not None:  # found by the periodic check: the steps after it also ran
            self.status["detected_at_step"] = detected_at

    def write_metrics(self) -> None:
        write_text(
            self.run.out_dir / "metrics.jsonl", "".join(json.dumps(m) + "\n" for m in self.metrics)
        )

    def write_outputs(self) -> None:
        """The declared outputs, from the working files: a failed attempt's outputs are deleted by
        Snakemake, and a resumed run must still produce all of them."""
        if self.running:
            self.status = {"state": "completed"}
        self.write_metrics()
        # diverged before a first validation: no weights, and a record that still evaluates (as
        # diverged)
        best = (
            load_data(self.best_state)
            if self.best_state.exists()
            else {"model": None, "epoch": 0, "val_loss": math.nan}
        )
        save_weights(self.run.out_dir / WEIGHTS, best["model"])
        write_json(
            self.run.out_dir / CONFIG,
            {
                **self.run.header,
                **{k: v for k, v in best.items() if k in ("epoch", "val_loss", "val_metrics")},
                "weights_sha256": state_sha256(best["model"]),
            },
        )


class Fit:
    """A fit while it runs: the model (one run's, or the ensemble of E runs'), its optimizer and
    step, the position (epoch, step, each member's loss sum: `pos`) and the members. Built from
    last.pt where one of the same spec is there (resume)."""

    def __init__(
        self,
        model,
        objective: Objective,
        runs: list[Run],
        work: Path,
        device,
        viewer,
        execution: dict,
    ):
        E = self.E = len(runs)
        if E > 1 and (viewer is None or layers.members(model) != E):
            raise ValueError(f"fit_runs: {E} runs need an ensemble of {E} and a viewer model")
        self.model, self.objective, self.runs, self.device = model, objective, runs, device
        self.viewer, self.execution, self.tcfg = (
            model if E == 1 else viewer,
            execution,
            runs[0].spec.train,
        )
        check_disk(work, sum(p.numel() for p in model.parameters() if p.requires_grad))
        for d in {work, *(r.out_dir for r in runs)}:
            for stray in d.glob(".*.tmp"):  # left by a write that was killed; never a checkpoint
                stray.unlink()
        self.compiled = Compiled(
            model,
            objective,
            execution["compile"],
            execution["compile_mode"],
            device,
            eval_model=self.viewer,
        )
        self.opt, self.opt_impl = make_optimizer(
            model, self.tcfg, device, capture=self.compiled.graph
        )
        self.steps = min(
            objective.steps_per_epoch, self.tcfg.max_steps_per_epoch or objective.steps_per_epoch
        )
        self.total_steps = self.steps * self.tcfg.epochs
        self.hash = resume_hash([r.spec.source for r in runs])
        self.last = work / "last.pt"
        self.writer = CheckpointWriter()  # checkpoints and best weights written beside training
        state = resume_state(self.last, self.hash, execution.get("code"))
        if state is None:
            self.pos = {"epoch": 0, "step": 0, "loss_sum": [0.0] * E, "seconds": 0.0}
            self.members = [Member(r) for r in runs]
            for m in self.members:  # weights of an abandoned attempt are not this run's best
                m.best_state.unlink(missing_ok=True)
        else:
            load_trained(model, state["model"])
            self.opt.load_state_dict(state["optimizer"])
            tensor_lr(self.opt, device, capture=self.compiled.graph)
            set_rng_state(state["rng"])
            self.pos = state["pos"]
            self.members = [Member(r, **m) for r, m in zip(runs, state["members"])]
        self.parts = [] if state is None else list(state.get("parts") or [dict(UNRECORDED)])
        last = self.parts[-1] if self.parts else {}
        # stopped without a word (SIGKILL, a lost node): its last checkpoint
        if last and "ended" not in last:
            last.update(
                ended="killed", ended_at=last.pop("saved_at", None), to=last.pop("saved_to", None)
            )
        job = os.environ.get("SLURM_JOB_ID")  # the executor plugin keeps it in its job steps
        ids = ", ".join(r.spec.run_id for r in runs)
        # a run that had ended adds no part (a retry of its group job writes its outputs again)
        if last.get("ended") in ENDS:
            print(
                f"[train] {ids} had ended ({last['ended']}): its outputs written again",
                file=sys.stderr,
            )
        else:
            if state is not None:
                print(
                    f"[train] resuming {ids} at epoch {self.pos['epoch'] + 1}, step "
                    f"{self.pos['step']}",
                    file=sys.stderr,
                )
            # the same job again: SLURM requeued it (PreemptMode=REQUEUE)
            if job and last.get("slurm_job") == job:
                last.update(ended="preempted", stopped_by=last["ended"])
            self.parts.append(
                {
                    "started_at": time.time(),
                    "from": {"epoch": self.pos["epoch"], "step": self.pos["step"]},
                    "device": device_name(device),
                    **git_state(Path(__file__).parent),
                    **({"slurm_job": job} if job else {}),
                }
            )
        for m in self.members:
            m.trackers = Trackers(
                execution["trackers"], m.run.spec.source, m.run.out_dir, fresh=state is None
            )
        self.losses = EpochLoss(device, E)
        self.train_step = TrainStep(
            model,
            self.compiled.loss,
            self.opt,
            self.tcfg.grad_clip,
            device,
            self.losses,
            capture=self.compiled.graph,
        )
        self.eval_model = (
            GraphedForward(self.compiled.eval_model, device)
            if self.compiled.graph
            else self.compiled.eval_model
        )
        self.label = runs[0].spec.run_id if E == 1 else f"{runs[0].spec.run_id} (+{E - 1} fused)"

    def running(self) -> list[int]:
        return [e for e, m in enumerate(self.members) if m.running]

    def checkpoint(self) -> None:
        part = self.parts[-1]
        if "ended" not in part:  # what is known of this part's end if it is killed after this
            part.update(
                saved_at=time.time(),
                saved_to={"epoch": self.pos["epoch"], "step": self.pos["step"]},
            )
        self.writer.save(
            save_checkpoint,
            self.last,
            {
                "spec_hash": self.hash,
                "code": self.execution.get("code"),
                "model": trained_state(self.model),
                "optimizer": self.opt.state_dict(),
                "rng": rng_state(),
                "pos": self.pos,
                "members": [m.state() for m in self.members],
                "parts": self.parts,
            },
        )

    def end_part(self, why: str) -> None:
        """This part of the run ends here, for `why` (finished, diverged, SIGTERM, SIGUSR1)."""
        part = self.parts[-1]
        part.pop("saved_at", None)
        part.pop("saved_to", None)
        part.update(
            ended=why,
            ended_at=time.time(),
            to={"epoch": self.pos["epoch"], "step": self.pos["step"]},
        )

    def sync(self) -> None:
        """The periodic host sync: the loss sums into pos, divergence into each member's status, the
        gradient norms' sums into `grad_norm_sum`."""
        sums, bads, self.grad_norm_sum = self.losses.read()
        for e in self.running():
            self.pos["loss_sum"][e] = sums[e]
            if bads[e] is not None:
                m = self.members[e]
                prev = m.metrics[-1]["train_loss"] if m.metrics else None
                m.diverge(
                    self.pos["epoch"] + 1,
                    bads[e],
                    sums[e] / bads[e] if bads[e] else prev,
                    self.pos["step"],
                )

    def log_window(self, now: float) -> None:
        """The steps since the last log, to the trackers: floats the sync has already read."""
        pos, mark = self.pos, self.mark
        n, at = pos["step"] - mark["step"], pos["epoch"] * self.steps + pos["step"]
        for e in self.running():
            self.members[e].trackers.log(
                {
                    "train/loss": (pos["loss_sum"][e] - mark["loss_sum"][e]) / n,
                    "train/grad_norm": (self.grad_norm_sum[e] - mark["grad_norm_sum"][e]) / n,
                    "train/lr": lr_at(at - 1, self.total_steps, self.tcfg),
                    f"train/{self.objective.rate_key}": n
                    * self.objective.items_per_step
                    / (now - mark["time"]),
                },
                at,
            )
        self.mark = {
            "step": pos["step"],
            "loss_sum": list(pos["loss_sum"]),
            "grad_norm_sum": list(self.grad_norm_sum),
            "time": now,
        }

    def train_epoch(self, stop: StopRequest) -> float:
        """The rest of this epoch's steps (from pos); returns the epoch's start time. On a stop
        request: a checkpoint and SystemExit(75)."""
        pos, steps, every, objective = (
            self.pos,
            self.steps,
            self.tcfg.checkpoint_every,
            self.objective,
        )
        self.model.train()
        t0 = time.perf_counter() - pos["seconds"]
        self.losses.reset(pos["loss_sum"], pos["step"])
        self.grad_norm_sum = [0.0] * self.E
        self.mark = {
            "step": pos["step"],
            "loss_sum": list(pos["loss_sum"]),
            "grad_norm_sum": [0.0] * self.E,
            "time": time.perf_counter(),
        }
        bar = tqdm(
            total=steps,
            initial=pos["step"],
            unit="step",
            mininterval=5,
            desc=f"{self.label} epoch {pos['epoch'] + 1}",
            file=sys.stderr,
        )
        while pos["step"] < steps and self.running():
            if stop.signal:
                pos["seconds"] = time.perf_counter() - t0
                self.sync()
                if self.running():
                    self.end_part(stop.signal)
                    self.checkpoint()
                    self.writer.wait()  # on disk before the exit that says it is
                    print(
                        f"[train] {stop.signal}: checkpointed at epoch {pos['epoch'] + 1}, step "
                        f"{pos['step']}; rerun to resume",
                        file=sys.stderr,
                    )
                    raise SystemExit(75)
                break
            set_lr(self.opt, lr_at(pos["epoch"] * steps + pos["step"], self.total_steps, self.tcfg))
            self.train_step(objective.batch(pos["epoch"], pos["step"]))
            pos["step"] += 1
            at_checkpoint = every and pos["step"] % every == 0 and pos["step"] < steps
            if pos["step"] % self.tcfg.log_every == 0 or pos["step"] == steps or at_checkpoint:
                self.sync()
                if not self.running():
                    break
                bar.update(pos["step"] - bar.n)
                rate = pos["step"] * objective.items_per_step / (time.perf_counter() - t0)
                bar.set_postfix(
                    loss=f"{pos['loss_sum'][self.running()[0]] / pos['step']:.3f}",
                    per_s=f"{rate:.0f}",
                    refresh=False,
                )
                self.log_window(time.perf_counter())
            if at_checkpoint:
                pos["seconds"] = time.perf_counter() - t0
                self.checkpoint()
        bar.close()
        return t0

    def validate_epoch(self, t0: float) -> None:
        """Each running member validated in the plain model, its row and best weights kept; the next
        epoch's position checkpointed."""
        pos, steps, objective = self.pos, self.steps, self.objective
        for e in self.running():
            m = self.members[e]
            train_loss = pos["loss_sum"][e] / max(1, pos["step"])
            # member e's weights into the plain model (in place: a captured forward stays valid)
            if self.E > 1:
                load_trained(self.viewer, member_state(self.model, e))
            val = objective.validate(self.eval_model)
            if not math.isfinite(val["val_loss"]):
                m.diverge(pos["epoch"] + 1, pos["step"], train_loss)
                continue
            elapsed = time.perf_counter() - t0
            row = {
                "epoch": pos["epoch"] + 1,
                "train_loss": train_loss,
                **val,
                "lr": lr_at(pos["epoch"] * steps + steps - 1, self.total_steps, self.tcfg),
                "seconds": elapsed,
                objective.rate_key: pos["step"] * objective.items_per_step / elapsed,
            }
            m.metrics.append(row)
            m.trackers.log(
                {f"val/{k.removeprefix('val_')}": v for k, v in val.items()},
                (pos["epoch"] + 1) * steps,
            )
            if objective.score(row) < m.best:
                m.best = objective.score(row)
                # a member's state as its own tensors (the writer's snapshot copies each view alone)
                self.writer.save(
                    save_data,
                    m.best_state,
                    {
                        "model": trained_state(self.model)
                        if self.E == 1
                        else member_state(self.model, e),
                        "epoch": row["epoch"],
                        "val_loss": row["val_loss"],
                        "val_metrics": val,
                    },
                )
            m.write_metrics()
        self.pos = {
            "epoch": pos["epoch"] + 1,
            "step": 0,
            "loss_sum": [0.0] * self.E,
            "seconds": 0.0,
        }
        # the run's end, in its last checkpoint
        if self.pos["epoch"] == self.tcfg.epochs or not self.running():
            self.end_part(self.end())
        self.checkpoint()

    def end(self) -> str:
        """How the run ended: finished unless every member diverged."""
        return (
            "finished" if any(m.status["state"] != "diverged" for m in self.members) else "diverged"
        )

    def finish(self) -> tuple[list[dict], list[list[dict]], dict]:
        # ended within an epoch (every member diverged): its end into last.pt
        if "ended" not in self.parts[-1]:
            self.end_part(self.end())  # too, so that a rerun of the job adds no part
            self.checkpoint()
        # the best weights the outputs are made from, and the last checkpoint, on disk
        self.writer.wait()
        for m in self.members:
            m.write_outputs()
        for m in self.members:  # closed before the record: a tracker that fails to close is in it
            m.trackers.close()
        ran = {
            "optimizer": f"adamw-{self.opt_impl}",
            "compile": self.compiled.record(),
            "trackers": self.execution["trackers"],
            "parts": self.parts,
            "trackers_failed": [f for m in self.members for f in m.trackers.failed],
        }
        if self.train_step.capture_error:  # the step ran eagerly after its capture failed
            ran["compile"].update(cuda_graph=False, capture_error=self.train_step.capture_error)
        return [m.status for m in self.members], [m.metrics for m in self.members], ran
