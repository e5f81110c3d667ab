"""A lease's first minute: the execution setting its training runs with, and the seeds that finish.

For each table the window makes and each model, a fused group of the seeds to train is built as
the training job builds it (lm.train.train_fused: each member with its own seed, stacked), and
each candidate setting (train.compile × train.head_loss) runs the loop's own step on the table's
token file (TrainStep, AdamW made for a capture where it captures, the head op), as the job runs it:

  check  at dropout 0, from the same initial weights and batches as the reference (eager, the
         reference head): every step's loss per member within LOSS_TOL, the last step's gradients
         within GRAD_TOL (relative, over all parameters): bf16's rounding, no more. A captured
         candidate replays its graph in two of the steps checked.
  time   the steps after those: seconds per step, and what its warm-up, compile and capture took
A candidate that differs, fails, or has not finished its steps by its share of the time box is
dropped, said in one line. The fastest candidate that passed for every model wins (the sum of the
models' step times: their groups share the GPU, time-sliced). Then, with the winner, the number of
seeds whose groups finish by the deadline (their steps per epoch × epochs × step time, the
validation's share on top), measured again at fewer members where all do not fit.

`--overlay` (the window's config overlay) gets the decision: train.compile, train.head_loss, the
preset's seeds (those finished elsewhere, `--finished`, and this lease's) and finished_runs. The
figures go to `<out>/choose-<device>.json` and `.md` (reports/bench/).
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import torch
import yaml

from grassflow import job, markdown
from grassflow.bench.common import sync
from grassflow.compiled import Compiled
from grassflow.lm.data import read_tokens
from grassflow.lm.grid import finished_runs, runs
from grassflow.lm.train import LanguageModelObjective, build_group
from grassflow.loop import lr_at, make_optimizer, set_lr
from grassflow.models import ModelConfig
from grassflow.run_spec import RunSpec
from grassflow.runtime import claim_device, configure_torch, device_name
from grassflow.train_step import WARMUP, EpochLoss, TrainStep

REFERENCE = ("false", "reference")  # eager, the reference head: what the others must compute
CANDIDATES = {"cuda": [("graph", "reference"), ("graph", "fused"), ("graph", "chunked-bf16"), ("true", "reference")],
              "cpu": [("false", "chunked")]}
LOSS_TOL, GRAD_TOL = 1e-2, 3e-2  # a few of bf16's roundings (2^-8): a loss's, the gradients' norm
CHECK_STEPS = WARMUP + 2  # a captured step is replayed twice among them
VALIDATION_SHARE = 0.05  # an epoch's validation, on top of its steps (Table 1 on the H200: ≈ 3 %)


def _setting(compile_: str):
    return {"true": True, "false": False}.get(compile_, compile_)


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


def _close(trial: Trial, ref: Trial) -> tuple[float, float]:
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
    t.checked_grads = t.grads().clone()  # the last checked step's (post-clipping), before any timed step
    t.run(timed_steps, timed=True)
    return t


class _Alarm:
    """A TimeoutError raised in this (the main) thread after `seconds`: a candidate still compiling
    or capturing at the end of its time is dropped."""

    def __init__(self, seconds: float):
        self.seconds = max(seconds, 0.01)

    def _ring(self, signum, frame):
        raise TimeoutError(f"still running after {self.seconds:.0f} s, its share of the time box")

    def __enter__(self):
        self.old = signal.signal(signal.SIGALRM, self._ring)
        signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc):
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.old)


MIN_SHARE = 3.0  # seconds the time box keeps for each candidate still to run


def choose(tables: dict, ids, vocab, device, candidates, box_s: float, timed_steps: int = 10) -> dict:
    """`tables`: {table: {kind: (spec of its first run to train, seeds to train)}}. Returns
    {"rows": a row per table, kind and candidate, "choice": (compile, head loss) or None, "lines"}.
    Each candidate runs with the box's time left, less MIN_SHARE for each one still to run."""
    rows, lines = [], []
    end = time.perf_counter() + box_s
    runs_left = sum(len(k) for k in tables.values()) * len(candidates)
    ok = {c: True for c in candidates}
    for table, kinds in tables.items():
        for kind, (spec, seeds) in kinds.items():
            ref = trial(spec, seeds, ids, vocab, device, REFERENCE, CHECK_STEPS, 0)
            for cand in candidates:
                row = {"table": table, "model": kind, "compile": cand[0], "head_loss": cand[1],
                       "members": len(seeds), "tokens_per_step": len(seeds) * spec.train.batch_size * spec.model["context_len"]}
                runs_left -= 1
                try:
                    with _Alarm(end - time.perf_counter() - MIN_SHARE * runs_left):
                        t = trial(spec, seeds, ids, vocab, device, cand, CHECK_STEPS, timed_steps)
                    row.update(zip(("loss_rel_diff", "grad_rel_diff"), _close(t, ref)))
                    row.update(setup_s=t.setup_s, step_s=t.step_s, tokens_per_s=row["tokens_per_step"] / t.step_s)
                    good = row["loss_rel_diff"] <= LOSS_TOL and row["grad_rel_diff"] <= GRAD_TOL
                    row["status"] = "ok" if good else "differs"
                    if not good:
                        lines.append(f"{table} {kind}: dropped compile={cand[0]} head_loss={cand[1]}: it differs "
                                     f"from the reference (loss {row['loss_rel_diff']:.1e}, gradients "
                                     f"{row['grad_rel_diff']:.1e}; allowed {LOSS_TOL:.0e}, {GRAD_TOL:.0e})")
                except Exception as err:  # noqa: BLE001 - any failure drops the candidate, said in one line
                    row["status"] = "failed"
                    row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]
                    lines.append(f"{table} {kind}: dropped compile={cand[0]} head_loss={cand[1]}: {row['error']}")
                ok[cand] &= row["status"] == "ok"
                rows.append(row)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    passed = [c for c in candidates if ok[c]]
    choice = min(passed, key=lambda c: sum(r["step_s"] for r in rows if (r["compile"], r["head_loss"]) == c),
                 default=None)
    if choice:
        lines.append(f"chosen: compile={choice[0]} head_loss={choice[1]} (the fastest of {len(passed)} that compute "
                     f"the reference's loss, of {len(candidates)} tried)")
    else:
        lines.append("chosen: none of the candidates computes the reference's loss: the reference setting "
                     f"(compile={REFERENCE[0]} head_loss={REFERENCE[1]})")
    return {"rows": rows, "choice": choice or REFERENCE, "lines": lines}


def seeds_that_fit(tables, ids, vocab, device, setting, seconds: float, step_s: dict, timed_steps: int = 5):
    """The most seeds (of each table's seeds to train, in order) whose groups, every model's side by
    side, finish in `seconds`: ({table: seeds}, a line per table). `step_s`: {(table, kind,
    members): seconds per step} measured so far; fewer members are measured where needed."""
    fit, lines = {}, []
    left = seconds
    for table, kinds in tables.items():
        todo = next(iter(kinds.values()))[1]
        chosen = []
        for n in range(len(todo), 0, -1):
            need = 0.0
            for kind, (spec, _) in kinds.items():
                key = (table, kind, n)
                if key not in step_s:
                    step_s[key] = trial(spec, todo[:n], ids, vocab, device, setting, CHECK_STEPS, timed_steps).step_s
                steps = (len(ids) - 1) // spec.model["context_len"] // spec.train.batch_size * spec.train.epochs
                need += steps * step_s[key] * (1 + VALIDATION_SHARE)
            if need <= left:
                chosen = todo[:n]
                break
        fit[table] = chosen
        left -= need if chosen else 0
        lines.append(f"{table}: seeds {', '.join(map(str, chosen)) or 'none'} this lease (about {need:.0f} s of "
                     f"training for {len(chosen) or 1} seed(s) of {len(todo)} to train, {seconds:.0f} s left)")
    return fit, lines


def plan(config: dict, targets, finished_dirs) -> tuple[str, dict, dict, list[int]]:
    """(preset name, preset, {table: {kind: (spec of its first run to train, its seeds to train)}},
    the seeds of which every run of the targets is finished elsewhere) for the window's `targets`
    (tables): a seed with a run left to train is trained (its finished runs adopted)."""
    from grassflow.pipeline.presets import select_preset

    name, p = select_preset(config)
    specs = runs(name, p)
    done = finished_runs(finished_dirs, specs)
    tables = {}
    for table in targets:
        if table not in (p.get("experiments") or {}):
            raise job.CommandError(f"--targets {table}: not a table of preset {name} ({sorted(p['experiments'])})")
        todo = [s for s in p["seeds"] if any(f"{table}-{k}-s{s}" not in done for k in p["models"])]
        tables[table] = {k: (RunSpec.of(specs[f"{table}-{k}-s{todo[0]}"]), todo) for k in p["models"]} if todo else {}
    finished = [s for s in p["seeds"] if all(f"{t}-{k}-s{s}" in done for t in targets for k in p["models"])]
    return name, p, {t: k for t, k in tables.items() if k}, finished


def to_markdown(result: dict, device: str) -> str:
    head = ["table", "model", "members", "compile", "head loss", "status", "loss rel. diff", "grad rel. diff",
            "warm-up + compile + capture (s)", "ms / step", "tokens/s per group"]
    rows = [[r["table"], r["model"], r["members"], r["compile"], r["head_loss"], r["status"] + (f" ({r['error']})" if r.get("error") else ""),
             *(f"{r[k]:.1e}" if k in r else "—" for k in ("loss_rel_diff", "grad_rel_diff")),
             f"{r['setup_s']:.1f}" if "setup_s" in r else "—", f"{r['step_s'] * 1e3:.1f}" if "step_s" in r else "—",
             f"{r['tokens_per_s']:,.0f}" if "tokens_per_s" in r else "—"] for r in result["rows"]]
    return "\n".join([f"# The lease's first minute on {device}", "",
                      "Each candidate against the reference (eager, reference head) at dropout 0, on the "
                      "table's token file, as `grassflow.bench.choose` ran it:", "",
                      *markdown.table(head, rows), "", *(f"- {line}" for line in result["lines"]), ""])


def main(argv=None) -> int:
    p = job.parser(__spec__.name, __doc__)
    p.add_argument("--configfile", nargs="*", default=[], help="as snakemake's (config.yaml first, always)")
    p.add_argument("--preset", required=True)
    p.add_argument("--targets", nargs="+", required=True, help="the tables the window makes (table1, table2)")
    p.add_argument("--train-tokens", required=True, help="the tables' training token file")
    p.add_argument("--finished", nargs="*", default=[], help="finished_runs: records of runs finished elsewhere")
    p.add_argument("--seconds", type=float, required=True, help="the training time left in the lease")
    p.add_argument("--box", type=float, default=90.0, help="seconds for the candidates in all")
    p.add_argument("--timed-steps", type=int, default=10, help="steps each candidate is timed over")
    p.add_argument("--candidates", nargs="*", help="compile:head_loss pairs (default: the device's CANDIDATES)")
    p.add_argument("--seeds", help="this lease's seeds, comma-separated, instead of those that fit")
    p.add_argument("--device", default="auto")
    p.add_argument("--overlay", required=True, help="the window's config overlay (YAML), updated")
    p.add_argument("--out", required=True, help="directory for choose-<device>.json and .md")
    a = p.parse_args(argv)
    return job.run(run_choice, a)


def run_choice(a) -> None:
    from grassflow.pipeline.plan import load_config

    configure_torch()
    device = claim_device(a.device, log=True)
    name, preset, tables, done = plan(load_config(Path.cwd(), a.configfile, a.preset), a.targets, a.finished)
    ids, meta = read_tokens(a.train_tokens)
    vocab = meta["vocab_size"]
    candidates = [tuple(c.split(":", 1)) for c in a.candidates] if a.candidates else CANDIDATES.get(device.type, [])
    t0 = time.perf_counter()
    result = choose(tables, ids, vocab, device, candidates, a.box, a.timed_steps) if tables else {
        "rows": [], "choice": REFERENCE, "lines": ["every run of the targets is finished elsewhere: nothing to train"]}
    if a.seeds is not None:
        seeds = [int(s) for s in a.seeds.split(",") if s]
        fit = {t: [s for s in k[next(iter(k))][1] if s in seeds] for t, k in tables.items()}
        result["lines"].append(f"seeds {a.seeds or 'none'} this lease, as asked (--seeds)")
    else:
        step_s = {(r["table"], r["model"], r["members"]): r["step_s"] for r in result["rows"]
                  if (r["compile"], r["head_loss"]) == result["choice"] and "step_s" in r}
        left = a.seconds - (time.perf_counter() - t0)
        fit, fit_lines = seeds_that_fit(tables, ids, vocab, device, result["choice"], left, step_s, a.timed_steps)
        result["lines"] += fit_lines
    result["seeds"] = fit
    lease = sorted({s for seeds in fit.values() for s in seeds})
    overlay = yaml.safe_load(Path(a.overlay).read_text()) if Path(a.overlay).is_file() else {}
    section = overlay.setdefault("presets", {}).setdefault(name, {})
    section.setdefault("train", {}).update(compile=_setting(result["choice"][0]), head_loss=result["choice"][1])
    section["seeds"] = sorted(set(done) | set(lease)) or preset["seeds"]
    overlay["finished_runs"] = list(a.finished)
    Path(a.overlay).write_text(yaml.safe_dump(overlay, sort_keys=False))
    result.update(device=device_name(device), choice=list(result["choice"]), tables=a.targets,
                  finished_seeds=done, seconds=a.seconds, box=a.box)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"choose-{device.type}.json").write_text(json.dumps(result, indent=1, default=str))
    (out / f"choose-{device.type}.md").write_text(to_markdown(result, result["device"]))
    for line in result["lines"]:
        print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
