"""A lease's first minute: the execution setting its training runs with, and the seeds that finish.

For each table the window makes and each model, a fused group of the seeds to train is built as
the training job builds it (lm.train.train_fused: each member with its own seed, stacked), and
each candidate setting (train.compile × train.head_loss) runs the loop's own step on the table's
token file (TrainStep, AdamW made for a capture where it captures, the head op), as the job runs it:

  check  at dropout 0, from the same initial weights and batches as the reference (eager, the
         reference head): every step's loss per member within LOSS_TOL, the last step's gradients
         within GRAD_TOL (relative, over all parameters): bf16's rounding, no more. A captured
         candidate replays its graph in two of the steps checked; one whose capture failed (it
         would train eagerly) is dropped with the capture's error.
  time   the steps after those: seconds per step, and what its warm-up, compile and capture took
The candidates are tried one after another, each on every model before the next (the compiler's
last: a cold compile takes tens of seconds). One that differs, fails, or has not finished its
steps by its share of the time box (an alarm held while a capture runs, then raised: no capture's
or compiler's own fallback catches it) is dropped, said in one line, and not tried for the models
left. The fastest that passed for every model wins (the sum of the models' step times: their
groups share the GPU, time-sliced). None passing is one line, and no choice: the window trains on
no setting nobody asked for.

Then the seeds, with the winner: the most seeds (in order) whose groups finish within the
lease's training time (`--seconds`, across the window's commands), each group's steps left after
the progress its last.pt holds, times its step, with the validation's share and each epoch's
checkpoint (measured) on top, and, where that runs past this command's deadline (`--deadline`),
a resumed command's start and the setting's warm-up, compile and capture again (RESUME_S).

`--overlay` (the window's config overlay) gets the decision: train.compile, train.head_loss, the
preset's seeds (those finished elsewhere, `--finished`, and this lease's) and finished_runs;
`--record` keeps it for the lease's next command, which `--reuse`s it and times nothing. The
figures go to `<out>/choose-<device>.json` and `.md` (reports/bench/).
"""

from __future__ import annotations

import json
import signal
import sys
import tempfile
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import torch
import yaml

from grassflow import job, markdown
from grassflow.bench.common import sync
from grassflow.checkpoint import (
    CheckpointError,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    to_host,
)
from grassflow.compiled import Compiled
from grassflow.io import spec_hash
from grassflow.lm.data import read_tokens
from grassflow.lm.grid import finished_runs, runs
from grassflow.lm.train import LanguageModelObjective, build_group
from grassflow.loop import lr_at, make_optimizer, set_lr, trained_state
from grassflow.models import ModelConfig
from grassflow.planning.sections import run_id
from grassflow.run_spec import RunSpec
from grassflow.runtime import claim_device, configure_torch, device_name
from grassflow.train_step import WARMUP, EpochLoss, TrainStep

REFERENCE = ("false", "reference")  # eager, the reference head: what the others must compute
# CUDA's candidates, the cheapest to try first and the compiler last (docs/scale/gpu.md says what
# each is expected to give): the captured step with the fused head (≈ 14 GB less traffic a
# three-member step than the reference head: reports/bench/head-bytes.md), the captured step with
# the reference head (what trained Table 1 on the H200), and the compiled loss captured (the compiler
# fuses the casts and elementwise ops that are most of the step's launches: reports/bench/step-ops.md).
# Not by default: chunked-bf16 (more bytes than fused) and `true` (the compiled loss uncaptured:
# launch-bound at 4,096 tokens a member-step, as the eager step is).
CANDIDATES = {"cuda": [("graph", "fused"), ("graph", "reference"), ("compiled-graph", "fused")],
              "cpu": [("false", "chunked")]}
LOSS_TOL, GRAD_TOL = 1e-2, 3e-2  # a few of bf16's roundings (2^-8): a loss's, the gradients' norm
CHECK_STEPS = WARMUP + 2  # a captured step is replayed twice among them
VALIDATION_SHARE = 0.05  # an epoch's validation, on top of its steps (Table 1 on the H200: ≈ 3 %)
MIN_SHARE = 3.0  # seconds the time box keeps for each trial of a later candidate
# A resumed command's seconds before its jobs train again, on top of the setting's warm-up, compile
# and capture (the first minute's setup_s): the stopped command's tail (its jobs' last checkpoint,
# the pack), the wait between two commands, the window's start (unpack, dry run, the preflight's
# no-op: 12 s in the H200 lease's second command, reports/wikitext2-v1-gpu/window-2.log) and the
# job's (imports, data, model, last.pt).
RESUME_S = 60.0


def _setting(compile_: str):
    return {"true": True, "false": False}.get(compile_, compile_)


def _name(setting) -> str:
    return f"compile={setting[0]} head_loss={setting[1]}"


class BoxTimeout(BaseException):
    """The time box's alarm. Not an Exception: no library's fallback (a CUDA capture's, the
    compiler's) may catch it and carry on eagerly under the candidate's name."""


class _Alarm:
    """BoxTimeout raised in this (the main) thread after `seconds`: a candidate still compiling
    or capturing at the end of its share is dropped. While a capture runs (`held`), the ring
    waits, and is raised as the capture returns: a capture cut off midway leaves CUDA's stream
    capturing, and every later trial would fail on it."""

    held, rang = 0, None

    def __init__(self, seconds: float):
        self.seconds = max(seconds, 0.01)

    def _ring(self, signum, frame):
        ring = BoxTimeout(f"still running after {self.seconds:.0f} s, its share of the time box")
        if _Alarm.held:
            _Alarm.rang = ring
            return
        raise ring

    def __enter__(self):
        self.old = signal.signal(signal.SIGALRM, self._ring)
        _Alarm.rang = None
        signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc):
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.old)
        _Alarm.rang = None


@contextmanager
def held_alarm():
    """The box's alarm held while a capture runs; one that rang meanwhile raised as it returns."""
    _Alarm.held += 1
    try:
        yield
    finally:
        _Alarm.held -= 1
    if _Alarm.rang is not None and not _Alarm.held:
        ring, _Alarm.rang = _Alarm.rang, None
        raise ring


class Trial:
    """One candidate on one fused group: its per-step losses, last gradients and step times."""

    def __init__(self, model, objective, tcfg, device, compile_, total_steps):
        self.model = model
        self.compiled = Compiled(self.model, objective, _setting(compile_), "default", device)
        self.opt, _ = make_optimizer(self.model, tcfg, device, capture=self.compiled.graph)
        E = getattr(self.model, "ensemble_size", 1)
        self.losses = EpochLoss(device, E)
        self.losses.reset([0.0] * E, 0)
        self.step = TrainStep(self.model, self.compiled.loss, self.opt, tcfg.grad_clip, device, self.losses,
                              capture=self.compiled.graph)
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
        return torch.cat([p.grad.detach().float().reshape(-1) for p in self.model.parameters()
                          if p.grad is not None])

    def checkpoint_seconds(self, where: Path) -> tuple[float, float]:
        """(the training thread's share of an epoch's checkpoint: the state's snapshot to host
        memory; the write the checkpoint writer then does beside training), timed once in `where`."""
        sync(self.device)
        t0 = time.perf_counter()
        state = to_host({"model": trained_state(self.model), "optimizer": self.opt.state_dict(), "rng": rng_state()})
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
    """What a reference trial leaves to compare against: its losses and its last checked gradients."""

    def __init__(self, t: Trial):
        self.seen, self.checked_grads = t.seen, t.checked_grads


def _close(trial: Trial, ref) -> tuple[float, float]:
    """(the largest relative loss difference over the steps checked, the relative norm of the
    last gradients' difference) against the reference."""
    loss = max(abs(a - b) / max(abs(b), 1e-12) for s, r in zip(trial.seen, ref.seen) for a, b in zip(s, r))
    g, gr = trial.checked_grads, ref.checked_grads
    return loss, float((g - gr).norm() / gr.norm().clamp_min(1e-30))


def trial(spec, seeds, ids, vocab, device, setting, steps, timed_steps, dropout=0.0) -> Trial:
    """`setting` (compile, head loss) on the fused group of `seeds` of run `spec`'s config: its
    checked steps, then its timed ones."""
    tcfg = spec.train
    objective = LanguageModelObjective(ids, ids[: spec.model["context_len"] * 4 + 1], spec.model["context_len"],
                                       tcfg.batch_size, list(seeds) if len(seeds) > 1 else seeds[0],
                                       tcfg.eval_batch_size, device, "choose", setting[1])
    model, _ = build_group(spec.model_kind, ModelConfig.from_dict({**spec.model, "vocab_size": vocab,
                                                                   "dropout": dropout}), seeds, device)
    t = Trial(model, objective, tcfg, device, setting[0], objective.steps_per_epoch * tcfg.epochs)
    t0 = time.perf_counter()
    t.run(steps)
    sync(device)
    t.setup_s = time.perf_counter() - t0  # its warm-up, compile and capture, with the checked steps
    if t.step.capture_error:  # it would train eagerly, not as the candidate says
        raise CaptureFailed(t.step.capture_error)
    t.checked_grads = t.grads().clone()  # the last checked step's (post-clipping), before any timed step
    t.run(timed_steps, timed=True)
    return t


def _free(device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def choose(tables: dict, ids, vocab, device, candidates, box_s: float, timed_steps: int = 10,
           checkpoint_dir: Path | None = None) -> dict:
    """`tables`: {table: {kind: (spec of its first run to train, seeds to train)}}. Returns
    {"rows": a row per table, kind and setting (the reference's first), "choice": (compile, head
    loss), or None where none passed, "lines"}. The references run outside the box; each candidate
    then shares the box's time left, less MIN_SHARE for each trial of a later candidate, evenly
    over its models left. With `checkpoint_dir`, each reference also times its group's checkpoint."""
    rows, lines = [], []
    groups = [(table, kind, spec, seeds) for table, kinds in tables.items() for kind, (spec, seeds) in kinds.items()]

    def row_of(table, kind, spec, seeds, setting):
        return {"table": table, "model": kind, "compile": setting[0], "head_loss": setting[1], "members": len(seeds),
                "tokens_per_step": len(seeds) * spec.train.batch_size * spec.model["context_len"]}

    refs = {}
    for table, kind, spec, seeds in groups:
        t = trial(spec, seeds, ids, vocab, device, REFERENCE, CHECK_STEPS, 0)
        refs[table, kind] = _Checked(t)
        row = {**row_of(table, kind, spec, seeds, REFERENCE), "status": "reference", "setup_s": t.setup_s}
        if checkpoint_dir is not None:
            row["checkpoint_s"], row["checkpoint_write_s"] = t.checkpoint_seconds(checkpoint_dir)
        rows.append(row)
        del t
        _free(device)
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
                with _Alarm(share):
                    t = trial(spec, seeds, ids, vocab, device, cand, CHECK_STEPS, timed_steps)
                row.update(zip(("loss_rel_diff", "grad_rel_diff"), _close(t, refs[table, kind])))
                row.update(setup_s=t.setup_s, step_s=t.step_s, tokens_per_s=row["tokens_per_step"] / t.step_s,
                           captured=t.step.graph is not None)
                good = row["loss_rel_diff"] <= LOSS_TOL and row["grad_rel_diff"] <= GRAD_TOL
                row["status"] = "ok" if good else "differs"
                if not good:
                    row["error"] = (f"it differs from the reference (loss {row['loss_rel_diff']:.1e}, gradients "
                                    f"{row['grad_rel_diff']:.1e}; allowed {LOSS_TOL:.0e}, {GRAD_TOL:.0e})")
            except (Exception, BoxTimeout) as err:  # noqa: BLE001 - any failure drops the candidate, said in one line
                row["status"] = "failed"
                row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]
                if getattr(err, "capture_error", None):
                    row["capture_error"] = err.capture_error[:300]
            rows.append(row)
            del t
            _free(device)
            if row["status"] != "ok":
                dropped = f"{table} {kind}"
                lines.append(f"{table} {kind}: dropped {_name(cand)}: {row['error']}"
                             + (" (not tried for the models left)" if g < len(groups) - 1 else ""))
        if not dropped:
            passed.append(cand)
    choice = min(passed, key=lambda c: sum(r["step_s"] for r in rows if (r["compile"], r["head_loss"]) == c
                                           and r["status"] == "ok"), default=None)
    if choice:
        lines.append(f"chosen: {_name(choice)} (the fastest of {len(passed)} that compute the reference's loss, "
                     f"of {len(candidates)} tried)")
    else:
        lines.append(f"chosen: none: no candidate ({', '.join(':'.join(c) for c in candidates) or 'none given'}) "
                     "computes the reference's loss for every model (each dropped above); nothing trains on a "
                     "setting nobody asked for (CANDIDATES=false:reference would train the reference)")
    return {"rows": rows, "choice": choice, "lines": lines}


def steps_of(spec, ids) -> tuple[int, int]:
    """(steps an epoch, epochs) of a run of `spec` on the training tokens `ids`."""
    steps = (len(ids) - 1) // spec.model["context_len"] // spec.train.batch_size
    return min(steps, spec.train.max_steps_per_epoch or steps), spec.train.epochs


def progress(results: Path | None, specs: dict, table: str, kind: str, seeds, per_epoch: int) -> int:
    """The steps of the group of `seeds` (one run alone) that its last.pt holds, where it is that
    group's (its spec hash; rule train_fused's work dir, a lone run's directory), else 0."""
    if results is None:
        return 0
    ids = [run_id(f"{table}-{kind}", s) for s in seeds]
    if len(ids) > 1:
        path, want = results / "fused" / f"{table}-{kind}" / "last.pt", spec_hash({"runs": [specs[r] for r in ids]})
    else:
        path, want = results / "runs" / ids[0] / "last.pt", spec_hash(specs[ids[0]])
    try:
        state = load_checkpoint(path)
    except CheckpointError:
        return 0
    if state is None or state.get("spec_hash") != want:
        return 0
    return state["pos"]["epoch"] * per_epoch + state["pos"]["step"]


def seeds_that_fit(tables, ids, vocab, device, setting, seconds: float, step_s: dict, timed_steps: int = 5,
                   deadline: float | None = None, costs: dict | None = None, done=None):
    """The most seeds (of each table's seeds to train, in order) whose groups, every model's side by
    side, finish within `seconds` of training (the lease's): ({table: seeds}, a line per table).
    `step_s`: {(table, kind, members): seconds per step} measured so far; fewer members are measured
    where needed. A group's need: its steps left (`done(table, kind, seeds, steps an epoch)`: those
    its last.pt holds) × its step × (1 + VALIDATION_SHARE), plus its epochs left × `costs`'
    checkpoint_s[(table, kind)]; where the whole lease's need runs past this command's `deadline`,
    one resumed command's start (RESUME_S) and the setting's setup_s[(table, kind)] again."""
    costs = costs or {}
    fit, lines = {}, []
    left, restarted = seconds, False
    for table, kinds in tables.items():
        todo = next(iter(kinds.values()))[1]
        chosen, need, restarts = [], 0.0, False
        for n in range(len(todo), 0, -1):
            need = setup = 0.0
            for kind, (spec, _) in kinds.items():
                key = (table, kind, n)
                if key not in step_s:
                    step_s[key] = trial(spec, todo[:n], ids, vocab, device, setting, CHECK_STEPS, timed_steps).step_s
                    _free(device)
                per_epoch, epochs = steps_of(spec, ids)
                steps_left = per_epoch * epochs - (done(table, kind, todo[:n], per_epoch) if done else 0)
                need += steps_left * step_s[key] * (1 + VALIDATION_SHARE)
                need += -(-steps_left // per_epoch) * costs.get("checkpoint_s", {}).get((table, kind), 0.0)
                setup = max(setup, costs.get("setup_s", {}).get((table, kind), 0.0))
            # the tables before this one and this one past this command's deadline: one resumed command
            restarts = deadline is not None and not restarted and seconds - left + need > deadline
            need += (RESUME_S + setup) if restarts else 0.0
            if need <= left:
                chosen = todo[:n]
                break
        fit[table] = chosen
        if chosen:
            left -= need
            restarted |= restarts
        when = "" if deadline is None else f", {max(deadline, 0):.0f} s to this command's deadline: " + (
            "none" if not chosen else "they finish in the lease's next command" if restarted else "within this command")
        lines.append(f"{table}: seeds {', '.join(map(str, chosen)) or 'none'} this lease (about {need:.0f} s of "
                     f"training for {len(chosen) or 1} seed(s) of {len(todo)} to train; {seconds:.0f} s of the "
                     f"lease's training left{when})")
    return fit, lines


def plan(config: dict, targets, finished_dirs) -> tuple[str, dict, dict, list[int], dict]:
    """(preset name, preset, {table: {kind: (spec of its first run to train, its seeds to train)}},
    the seeds of which every run of the targets is finished elsewhere, every run's spec) for the
    window's `targets` (tables): a seed with a run left to train is trained (its finished runs adopted)."""
    from grassflow.pipeline.presets import select_preset

    name, p = select_preset(config)
    specs = runs(name, p)
    done = finished_runs(finished_dirs, specs)
    tables = {}
    for table in targets:
        if table not in (p.get("experiments") or {}):
            raise job.CommandError(f"--targets {table}: not a table of preset {name} ({sorted(p['experiments'])})")
        todo = [s for s in p["seeds"] if any(run_id(f"{table}-{k}", s) not in done for k in p["models"])]
        tables[table] = {k: (RunSpec.of(specs[run_id(f"{table}-{k}", todo[0])]), todo) for k in p["models"]} if todo else {}
    finished = [s for s in p["seeds"] if all(run_id(f"{t}-{k}", s) in done for t in targets for k in p["models"])]
    return name, p, {t: k for t, k in tables.items() if k}, finished, specs


def _cell(r, key, fmt):
    return fmt(r[key]) if key in r else "—"


def to_markdown(result: dict, device: str) -> str:
    head = ["table", "model", "members", "compile", "head loss", "status", "loss rel. diff", "grad rel. diff",
            "warm-up + compile + capture (s)", "ms / step", "tokens/s per group", "checkpoint: snapshot + write (s)"]
    rows = [[r["table"], r["model"], r["members"], r["compile"], r["head_loss"],
             r["status"] + (f" ({r['error']})" if r.get("error") else "")
             + (f"; capture: {r['capture_error']}" if r.get("capture_error") else ""),
             _cell(r, "loss_rel_diff", "{:.1e}".format), _cell(r, "grad_rel_diff", "{:.1e}".format),
             _cell(r, "setup_s", "{:.1f}".format), _cell(r, "step_s", lambda v: f"{v * 1e3:.1f}"),
             _cell(r, "tokens_per_s", "{:,.0f}".format),
             f"{r['checkpoint_s']:.2f} + {r['checkpoint_write_s']:.2f}" if "checkpoint_s" in r else "—"]
            for r in result["rows"]]
    return "\n".join([f"# The lease's first minute on {device}", "",
                      "Each candidate against the reference (eager, reference head) at dropout 0, on the "
                      "table's token file, as `grassflow.bench.lease` ran it:", "",
                      *markdown.table(head, rows), "", *(f"- {line}" for line in result["lines"]), ""])


def main(argv=None) -> int:
    p = job.parser(__spec__.name, __doc__)
    p.add_argument("--configfile", nargs="*", default=[], help="as snakemake's (config.yaml first, always)")
    p.add_argument("--preset", required=True)
    p.add_argument("--targets", nargs="+", required=True, help="the tables the window makes (table1, table2)")
    p.add_argument("--overlay", required=True, help="the window's config overlay (YAML), updated")
    p.add_argument("--record", required=True, help="the decision, kept for the lease's next command (JSON)")
    p.add_argument("--reuse", action="store_true", help="the decision --record holds, timing nothing")
    p.add_argument("--train-tokens", help="the tables' training token file")
    p.add_argument("--results", help="the preset's results directory (its last.pt files: progress so far)")
    p.add_argument("--finished", nargs="*", default=[], help="finished_runs: records of runs finished elsewhere")
    p.add_argument("--seconds", type=float, help="the lease's training time left, across its commands")
    p.add_argument("--deadline", type=float, help="the seconds to this command's deadline")
    p.add_argument("--lease-end", type=float, help="when the lease's last command must end (Unix time), recorded")
    p.add_argument("--box", type=float, default=90.0, help="seconds for the candidates in all")
    p.add_argument("--timed-steps", type=int, default=10, help="steps each candidate is timed over")
    p.add_argument("--candidates", nargs="*", help="compile:head_loss pairs (default: the device's CANDIDATES)")
    p.add_argument("--seeds", help="this lease's seeds, comma-separated, instead of those that fit")
    p.add_argument("--device", default="auto")
    p.add_argument("--out", help="directory for choose-<device>.json and .md")
    a = p.parse_args(argv)
    if a.reuse:
        return job.run(reuse, a)
    missing = [f"--{k.replace('_', '-')}" for k in ("train_tokens", "seconds", "out") if getattr(a, k) is None]
    if missing:
        p.error(f"{', '.join(missing)} needed (or --reuse)")
    return job.run(run_choice, a)


def write_overlay(path: Path, name: str, preset: dict, decision: dict) -> None:
    """The window's overlay with the decision: the setting, the preset's seeds, finished_runs."""
    overlay = yaml.safe_load(path.read_text()) if path.is_file() else {}
    section = overlay.setdefault("presets", {}).setdefault(name, {})
    compile_, head_loss = decision["choice"]
    section.setdefault("train", {}).update(compile=_setting(compile_), head_loss=head_loss)
    lease = {s for seeds in decision["seeds"].values() for s in seeds}
    section["seeds"] = sorted(set(decision["finished_seeds"]) | lease) or preset["seeds"]
    overlay["finished_runs"] = list(decision["finished"])
    path.write_text(yaml.safe_dump(overlay, sort_keys=False))


def reuse(a) -> None:
    """The lease's next command: the first command's decision, as it was (its setting and seeds),
    timing nothing; refused (one line) where it was made for other targets or another preset."""
    from grassflow.pipeline.presets import select_preset
    from grassflow.pipeline.preview import load_config

    rec = json.loads(Path(a.record).read_text())
    if rec["preset"] != a.preset or rec["targets"] != list(a.targets):
        raise job.CommandError(f"{a.record}: chosen for preset {rec['preset']}, targets {' '.join(rec['targets'])}; "
                               f"this command makes {a.preset} {' '.join(a.targets)}: delete it to choose anew")
    name, preset = select_preset(load_config(Path.cwd(), a.configfile, a.preset))
    write_overlay(Path(a.overlay), name, preset, rec)
    seeds = "; ".join(f"{t} seeds {', '.join(map(str, s)) or 'none'}" for t, s in rec["seeds"].items())
    print(f"reusing {_name(rec['choice'])} chosen at {rec['chosen_at']} ({seeds}; the lease ends at "
          f"{datetime.fromtimestamp(rec['lease_end'], timezone.utc).isoformat(timespec='seconds')})", flush=True)


def run_choice(a) -> None:
    from grassflow.pipeline.preview import load_config

    configure_torch()
    device = claim_device(a.device, log=True)
    name, preset, tables, finished_seeds, specs = plan(load_config(Path.cwd(), a.configfile, a.preset), a.targets,
                                                       a.finished)
    ids, meta = read_tokens(a.train_tokens)
    vocab = meta["vocab_size"]
    candidates = [tuple(c.split(":", 1)) for c in a.candidates] if a.candidates else CANDIDATES.get(device.type, [])
    t0 = time.perf_counter()
    results = Path(a.results) if a.results else None
    if tables:
        result = choose(tables, ids, vocab, device, candidates, a.box, a.timed_steps, checkpoint_dir=results)
    else:
        result = {"rows": [], "choice": None, "lines": ["every run of the targets is finished elsewhere: nothing to train"]}
    fit = {}
    if result["choice"] is None:
        pass  # nothing to train with: the window stops, the figures written
    elif a.seeds is not None:
        seeds = [int(s) for s in a.seeds.split(",") if s]
        fit = {t: [s for s in k[next(iter(k))][1] if s in seeds] for t, k in tables.items()}
        result["lines"].append(f"seeds {a.seeds or 'none'} this lease, as asked (--seeds)")
    else:
        chosen = [r for r in result["rows"] if (r["compile"], r["head_loss"]) == tuple(result["choice"])]
        step_s = {(r["table"], r["model"], r["members"]): r["step_s"] for r in chosen if "step_s" in r}
        costs = {"setup_s": {(r["table"], r["model"]): r["setup_s"] for r in chosen if "setup_s" in r},
                 "checkpoint_s": {(r["table"], r["model"]): r["checkpoint_s"] for r in result["rows"]
                                  if "checkpoint_s" in r}}
        spent = time.perf_counter() - t0
        fit, fit_lines = seeds_that_fit(
            tables, ids, vocab, device, result["choice"], a.seconds - spent, step_s, a.timed_steps,
            deadline=None if a.deadline is None else a.deadline - spent, costs=costs,
            done=lambda table, kind, seeds, per_epoch: progress(results, specs, table, kind, seeds, per_epoch))
        result["lines"] += fit_lines
    result.update(seeds=fit, device=device_name(device), tables=a.targets, finished_seeds=finished_seeds,
                  seconds=a.seconds, deadline=a.deadline, box=a.box)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"choose-{device.type}.json").write_text(json.dumps(result, indent=1, default=str))
    (out / f"choose-{device.type}.md").write_text(to_markdown(result, result["device"]))
    if result["choice"] is not None:
        decision = {"preset": a.preset, "targets": list(a.targets), "choice": list(result["choice"]), "seeds": fit,
                    "finished_seeds": finished_seeds, "finished": list(a.finished),
                    "chosen_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "lease_end": a.lease_end}
        write_overlay(Path(a.overlay), name, preset, decision)
        Path(a.record).write_text(json.dumps(decision, indent=1))
    for line in result["lines"]:
        print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
