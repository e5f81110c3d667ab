"""The lease's first minute, its trials: the execution setting its training runs with.

For each table the window makes and each model, a fused group of the seeds to train is built as the
training job builds it (lm.train.train_fused: each member with its own seed, stacked), and each
candidate setting (train.compile × train.head_loss) runs the loop's own step on the table's token
file (TrainStep, AdamW made for a capture where it captures, the head op), as the job runs it:

  check  at dropout 0, from the same initial weights and batches as the reference (eager, the
         reference head): every step's loss per member within LOSS_TOL, the last step's gradients
         within GRAD_TOL (relative, over all parameters): bf16's rounding, no more. A captured
         candidate replays its graph in two of the steps checked; one whose capture failed (it
         would train eagerly) is dropped with the capture's error.
  time   the steps after those: seconds per step, and what its warm-up, compile and capture took
The candidates are tried one after another, each on every model before the next (the compiler's
last: a cold compile takes tens of seconds). One that differs, fails, or has not finished its steps
by its share of the time box (an alarm held while a capture runs, then raised: no capture's or
compiler's own fallback catches it) is dropped, said in one line, and not tried for the models left.
The fastest that passed for every model wins (the sum of the models' step times: their groups share
the GPU, time-sliced). None passing is one line, and no choice: the window trains on no setting
nobody asked for. The figures: `to_markdown` (reports/bench/choose-<device>.md).
"""

from __future__ import annotations

import json
import signal
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from grassflow import markdown
from grassflow.bench.common import sync
from grassflow.checkpoint import rng_state, save_checkpoint, to_host
from grassflow.compiled import Compiled
from grassflow.lease import setting_value
from grassflow.lm.train import LanguageModelObjective, build_group
from grassflow.loop import lr_at, make_optimizer, set_lr, trained_state
from grassflow.models import ModelConfig
from grassflow.train_step import WARMUP, EpochLoss, TrainStep

REFERENCE = ("false", "reference")  # eager, the reference head: what the others must compute
# CUDA's candidates, the cheapest to try first and the compiler last (docs/scale/gpu.md says what
# each is expected to give): the captured step with the fused head (≈ 14 GB less traffic a
# three-member step than the reference head: reports/bench/head-bytes.md), the captured step with
# the reference head (what trained Table 1 on the H200), and the compiled loss captured (the
# compiler fuses the casts and elementwise ops that are most of the step's launches:
# reports/bench/step-ops.md). Not by default: chunked-bf16 (more bytes than fused) and `true` (the
# compiled loss uncaptured: launch-bound at 4,096 tokens a member-step, as the eager step is).
CANDIDATES = {
    "cuda": [("graph", "fused"), ("graph", "reference"), ("compiled-graph", "fused")],
    "cpu": [("false", "chunked")],
}
LOSS_TOL, GRAD_TOL = 1e-2, 3e-2  # a few of bf16's roundings (2^-8): a loss's, the gradients' norm
CHECK_STEPS = WARMUP + 2  # a captured step is replayed twice among them
MIN_SHARE = 3.0  # seconds the time box keeps for each trial of a later candidate


def setting_name(setting) -> str:
    return f"compile={setting[0]} head_loss={setting[1]}"


class BoxTimeout(BaseException):
    """The time box's alarm. Not an Exception: no library's fallback (a CUDA capture's, the
    compiler's) may catch it and carry on eagerly under the candidate's name."""


class Alarm:
    """BoxTimeout raised in this (the main) thread after `seconds`: a candidate still compiling or
    capturing at the end of its share is dropped. While a capture runs (`held`), the ring waits, and
    is raised as the capture returns: a capture cut off midway leaves CUDA's stream capturing, and
    every later trial would fail on it."""

    held, rang = 0, None

    def __init__(self, seconds: float):
        self.seconds = max(seconds, 0.01)

    def _ring(self, signum, frame):
        ring = BoxTimeout(f"still running after {self.seconds:.0f} s, its share of the time box")
        if Alarm.held:
            Alarm.rang = ring
            return
        raise ring

    def __enter__(self):
        self.old = signal.signal(signal.SIGALRM, self._ring)
        Alarm.rang = None
        signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc):
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.old)
        Alarm.rang = None


@contextmanager
def held_alarm():
    """The box's alarm held while a capture runs; one that rang meanwhile raised as it returns."""
    Alarm.held += 1
    try:
        yield
    finally:
        Alarm.held -= 1
    if Alarm.rang is not None and not Alarm.held:
        ring, Alarm.rang = Alarm.rang, None
        raise ring


class Trial:
    """One candidate on one fused group: its per-step losses, last gradients and step times."""

    def __init__(self, model, objective, tcfg, device, compile_, total_steps):
        self.model = model
        self.compiled = Compiled(self.model, objective, setting_value(compile_), "default", device)
        self.opt, _ = make_optimizer(self.model, tcfg, device, capture=self.compiled.graph)
        E = getattr(self.model, "ensemble_size", 1)
        self.losses = EpochLoss(device, E)
        self.losses.reset([0.0] * E, 0)
        self.step = TrainStep(
            self.model,
            self.compiled.loss,
            self.opt,
            tcfg.grad_clip,
            device,
            self.losses,
            capture=self.compiled.graph,
        )
        capture = self.step._capture

        def held_capture():
            with held_alarm():
                return capture()

        self.step._capture = held_capture
        self.objective, self.device, self.tcfg, self.total = objective, device, tcfg, total_steps
        self.done, self.per_step, self.seen = 0, [], []

    def run(self, steps: int, timed: bool = False) -> None:
        for _ in range(steps):
            i = self.done
            set_lr(self.opt, lr_at(i, self.total, self.tcfg))
            before = self.losses.sum.clone()
            if timed:
                sync(self.device)
                t0 = time.perf_counter()
            self.step(self.objective.batch(0, i % self.objective.steps_per_epoch))
            if timed:
                sync(self.device)
                self.per_step.append(time.perf_counter() - t0)
            else:
                self.seen.append((self.losses.sum - before).tolist())
            self.done += 1

    @property
    def step_s(self) -> float:
        """The median of the timed steps."""
        return sorted(self.per_step)[len(self.per_step) // 2]

    def grads(self) -> torch.Tensor:
        return torch.cat(
            [
                p.grad.detach().float().reshape(-1)
                for p in self.model.parameters()
                if p.grad is not None
            ]
        )

    def checkpoint_seconds(self, where: Path) -> tuple[float, float]:
        """(the training thread's share of an epoch's checkpoint: the state's snapshot to host
        memory; the write the checkpoint writer then does beside training), timed once in
        `where`."""
        sync(self.device)
        t0 = time.perf_counter()
        state = to_host(
            {
                "model": trained_state(self.model),
                "optimizer": self.opt.state_dict(),
                "rng": rng_state(),
            }
        )
        t1 = time.perf_counter()
        with tempfile.TemporaryDirectory(dir=where) as tmp:
            save_checkpoint(Path(tmp) / "last.pt", state)
        return t1 - t0, time.perf_counter() - t1


class CaptureFailed(RuntimeError):
    """A captured candidate whose capture failed (its step fell back to eager)."""

    def __init__(self, error: str):
        super().__init__(f"its capture failed: {error}")
        self.capture_error = error


class _Checked:
    """What a reference trial leaves to compare against: its losses and its last checked
    gradients."""

    def __init__(self, t: Trial):
        self.seen, self.checked_grads = t.seen, t.checked_grads


def _close(trial: Trial, ref) -> tuple[float, float]:
    """(the largest relative loss difference over the steps checked, the relative norm of the last
    gradients' difference) against the reference."""
    loss = max(
        abs(a - b) / max(abs(b), 1e-12) for s, r in zip(trial.seen, ref.seen) for a, b in zip(s, r)
    )
    g, gr = trial.checked_grads, ref.checked_grads
    return loss, float((g - gr).norm() / gr.norm().clamp_min(1e-30))


def trial(spec, seeds, ids, vocab, device, setting, steps, timed_steps, dropout=0.0) -> Trial:
    """`setting` (compile, head loss) on the fused group of `seeds` of run `spec`'s config: its
    checked steps, then its timed ones."""
    tcfg = spec.train
    objective = LanguageModelObjective(
        ids,
        ids[: spec.model["context_len"] * 4 + 1],
        spec.model["context_len"],
        tcfg.batch_size,
        list(seeds) if len(seeds) > 1 else seeds[0],
        tcfg.eval_batch_size,
        device,
        "choose",
        setting[1],
    )
    model, _ = build_group(
        spec.model_kind,
        ModelConfig.from_dict({**spec.model, "vocab_size": vocab, "dropout": dropout}),
        seeds,
        device,
    )
    t = Trial(model, objective, tcfg, device, setting[0], objective.steps_per_epoch * tcfg.epochs)
    t0 = time.perf_counter()
    t.run(steps)
    sync(device)
    t.setup_s = time.perf_counter() - t0  # its warm-up, compile and capture, with the checked steps
    if t.step.capture_error:  # it would train eagerly, not as the candidate says
        raise CaptureFailed(t.step.capture_error)
    # the last checked step's (post-clipping), before any timed step
    t.checked_grads = t.grads().clone()
    t.run(timed_steps, timed=True)
    return t


def one_line(err: BaseException) -> str:
    """A failed trial said in one line: its type and its message's first line."""
    return f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"[:300]


def shape(spec, members: int) -> str:
    """What a group's step costs and computes alike: its model, batch and members, not its learning
    rate (a sweep's values): the first minute times one group of each shape."""
    return json.dumps([spec.model_kind, spec.model, spec.train.batch_size, members], sort_keys=True)


def free(device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def choose(
    tables: dict,
    ids,
    vocab,
    device,
    candidates,
    box_s: float,
    timed_steps: int = 10,
    checkpoint_dir: Path | None = None,
) -> dict:
    """`tables`: {table: {kind: (spec of its first run to train, seeds to train)}}. Returns {"rows":
    a row per table, kind and setting (the reference's first), "choice": (compile, head loss), or
    None where none passed, "lines"}. The references run outside the box; each candidate then shares
    the box's time left, less MIN_SHARE for each trial of a later candidate, evenly over its models
    left. With `checkpoint_dir`, each reference also times its group's checkpoint."""
    rows, lines = [], []
    firsts, same, groups = {}, {}, []
    for table, kinds in tables.items():
        for kind, (spec, seeds) in kinds.items():
            same[table, kind] = firsts.setdefault(shape(spec, len(seeds)), (table, kind))
            if same[table, kind] == (table, kind):  # the first group of its shape: timed
                groups.append((table, kind, spec, seeds))

    def row_of(table, kind, spec, seeds, setting):
        return {
            "table": table,
            "model": kind,
            "compile": setting[0],
            "head_loss": setting[1],
            "members": len(seeds),
            "tokens_per_step": len(seeds) * spec.train.batch_size * spec.model["context_len"],
        }

    refs = {}
    for table, kind, spec, seeds in groups:
        t = trial(spec, seeds, ids, vocab, device, REFERENCE, CHECK_STEPS, 0)
        refs[table, kind] = _Checked(t)
        row = {
            **row_of(table, kind, spec, seeds, REFERENCE),
            "status": "reference",
            "setup_s": t.setup_s,
        }
        if checkpoint_dir is not None:
            row["checkpoint_s"], row["checkpoint_write_s"] = t.checkpoint_seconds(checkpoint_dir)
        rows.append(row)
        del t
        free(device)
    end = time.perf_counter() + box_s
    passed = []
    for c, cand in enumerate(candidates):
        later = len(groups) * (len(candidates) - c - 1)
        dropped = None
        for g, (table, kind, spec, seeds) in enumerate(groups):
            row = row_of(table, kind, spec, seeds, cand)
            if dropped:
                row.update(status="skipped", error=f"dropped for {dropped}")
                rows.append(row)
                continue
            share = (end - time.perf_counter() - MIN_SHARE * later) / (len(groups) - g)
            t = None
            try:
                with Alarm(share):
                    t = trial(spec, seeds, ids, vocab, device, cand, CHECK_STEPS, timed_steps)
                row.update(zip(("loss_rel_diff", "grad_rel_diff"), _close(t, refs[table, kind])))
                row.update(
                    setup_s=t.setup_s,
                    step_s=t.step_s,
                    tokens_per_s=row["tokens_per_step"] / t.step_s,
                    captured=t.step.graph is not None,
                )
                good = row["loss_rel_diff"] <= LOSS_TOL and row["grad_rel_diff"] <= GRAD_TOL
                row["status"] = "ok" if good else "differs"
                if not good:
                    row["error"] = (
                        f"it differs from the reference (loss {row['loss_rel_diff']:.1e}, "
                        "gradients "
                        f"{row['grad_rel_diff']:.1e}; allowed {LOSS_TOL:.0e}, {GRAD_TOL:.0e})"
                    )
            # any failure drops the candidate, said in one line
            except (Exception, BoxTimeout) as err:
                row["status"] = "failed"
                row["error"] = one_line(err)
                if getattr(err, "capture_error", None):
                    row["capture_error"] = err.capture_error[:300]
            rows.append(row)
            del t
            free(device)
            if row["status"] != "ok":
                dropped = f"{table} {kind}"
                lines.append(
                    f"{table} {kind}: dropped {setting_name(cand)}: {row['error']}"
                    + (" (not tried for the models left)" if g < len(groups) - 1 else "")
                )
        if not dropped:
            passed.append(cand)
    for (table, kind), first in same.items():  # the groups of a shape timed before: its rows
        if first != (table, kind):
            rows += [
                {**r, "table": table, "model": kind, "timed_as": " ".join(first)}
                for r in rows
                if (r["table"], r["model"]) == first and "timed_as" not in r
            ]
            lines.append(f"{table} {kind}: timed as {' '.join(first)}, its shape")
    choice = min(
        passed,
        key=lambda c: sum(
            r["step_s"] for r in rows if (r["compile"], r["head_loss"]) == c and r["status"] == "ok"
        ),
        default=None,
    )
    if choice:
        lines.append(
            f"chosen: {setting_name(choice)} (the fastest of {len(passed)} that compute the "
            f"reference's loss, of {len(candidates)} tried)"
        )
    else:
        lines.append(
            "chosen: none: no candidate "
            f"({', '.join(':'.join(c) for c in candidates) or 'none given'}) computes the "
            "reference's loss for every model (each dropped above); nothing trains on a setting "
            "nobody asked for (CANDIDATES=false:reference would train the reference)"
        )
    return {"rows": rows, "choice": choice, "lines": lines}


def _cell(r, key, fmt):
    return fmt(r[key]) if key in r else "—"


def to_markdown(result: dict, device: str) -> str:
    head = [
        "table",
        "model",
        "members",
        "compile",
        "head loss",
        "status",
        "loss rel. diff",
        "grad rel. diff",
        "warm-up + compile + capture (s)",
        "ms / step",
        "tokens/s per group",
        "checkpoint: snapshot + write (s)",
    ]
    rows = [
        [
            r["table"],
            r["model"],
            r["members"],
            r["compile"],
            r["head_loss"],
            r["status"]
            + (f" (timed as {r['timed_as']})" if r.get("timed_as") else "")
            + (f" ({r['error']})" if r.get("error") else "")
            + (f"; capture: {r['capture_error']}" if r.get("capture_error") else ""),
            _cell(r, "loss_rel_diff", "{:.1e}".format),
            _cell(r, "grad_rel_diff", "{:.1e}".format),
            _cell(r, "setup_s", "{:.1f}".format),
            _cell(r, "step_s", lambda v: f"{v * 1e3:.1f}"),
            _cell(r, "tokens_per_s", "{:,.0f}".format),
            f"{r['checkpoint_s']:.2f} + {r['checkpoint_write_s']:.2f}"
            if "checkpoint_s" in r
            else "—",
        ]
        for r in result["rows"]
    ]
    return "\n".join(
        [
            f"# The lease's first minute on {device}",
            "",
            "Each candidate against the reference (eager, reference head) at dropout 0, on the "
            "table's token file, as `python -m grassflow.lease choose` ran it:",
            "",
            *markdown.table(head, rows),
            "",
            *(f"- {line}" for line in result["lines"]),
            "",
        ]
    )
