"""The lease's time: the seeds whose groups finish within it (before training), and each group's
projected finish once its first epoch is in (while training). No torch here: the window asks for the
projections every few seconds."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from grassflow.planning.sections import group_seed

VALIDATION_SHARE = 0.05  # an epoch's validation, on top of its steps (Table 1 on the H200: ≈ 3 %)
# A training job's own start before its first step: imports, CUDA's start, token files, model. No
# lease has timed it alone; the preflight job, which starts the same way and then checks the
# kernels, took 31 s in the H200 lease (reports/wikitext2-v1-gpu/window-1.log: 13 → 44 s).
JOB_START_S = 30.0
# A resumed command's seconds before its jobs train again, on top of the setting's warm-up, compile
# and capture (the first minute's setup_s): the stopped command's tail (its jobs' last checkpoint,
# the pack), the wait between two commands, the window's start (unpack, dry run, the preflight's
# no-op: 12 s in the H200 lease's second command, reports/wikitext2-v1-gpu/window-2.log) and the
# job's (imports, data, model, last.pt).
RESUME_S = 60.0


class TrialFailed(Exception):
    """A group that could not be timed (its trial failed, or ran past the time box): it fits
    nowhere."""


def steps_of(spec, n_tokens: int) -> tuple[int, int]:
    """(steps an epoch, epochs) of a run of `spec` on `n_tokens` training tokens."""
    steps = (n_tokens - 1) // spec.model["context_len"] // spec.train.batch_size
    return min(steps, spec.train.max_steps_per_epoch or steps), spec.train.epochs


def seeds_that_fit(
    tables,
    measure,
    n_tokens: int,
    seconds: float,
    step_s: dict,
    deadline: float | None = None,
    costs: dict | None = None,
    done=None,
    clock=time.monotonic,
):
    """The most seeds (of each table's seeds to train, in order) whose groups, every model's side by
    side, finish within `seconds` (the lease's training time, across its commands, from this call):
    ({table: seeds}, a line per table and per group that could not be timed).

    `step_s`: {(table, kind, members): seconds per step} measured so far; a group of fewer members
    is measured where needed (`measure(spec, seeds)`, raising TrialFailed), and the time its trial
    takes counts against `seconds`, as everything since this call does. A group's need: its steps
    left (`done(table, kind, seeds, steps an epoch)`: those its last.pt holds) × its step × (1 +
    VALIDATION_SHARE), plus its epochs left × `costs`' checkpoint_s[(table, kind)]. The window's
    jobs start once (JOB_START_S and the setting's setup_s[(table, kind)]: warm-up, compile,
    capture); where the need runs past this command's `deadline`, a resumed command starts them
    again (RESUME_S and setup_s)."""
    costs = costs or {}
    setup_s, checkpoint_s = costs.get("setup_s", {}), costs.get("checkpoint_s", {})
    t0 = clock()
    # the tables fitted so far: their need; their jobs' starts
    used, started, restarted = 0.0, False, False
    fit, lines = {}, []
    for table, kinds in tables.items():
        todo = next(iter(kinds.values()))[1]
        chosen, need, restarts = [], 0.0, False
        for n in range(len(todo), 0, -1):
            need = setup = 0.0
            for kind, (spec, _) in kinds.items():
                key = (table, kind, n)
                if key not in step_s:
                    try:
                        step_s[key] = measure(spec, todo[:n])
                    except TrialFailed as e:
                        step_s[key] = math.inf
                        lines.append(
                            f"{table} {kind} with {n} seed(s): not timed ({e}): it does not fit"
                        )
                per_epoch, epochs = steps_of(spec, n_tokens)
                steps_left = per_epoch * epochs - (
                    done(table, kind, todo[:n], per_epoch) if done else 0
                )
                need += steps_left * step_s[key] * (1 + VALIDATION_SHARE)
                need += -(-steps_left // per_epoch) * checkpoint_s.get((table, kind), 0.0)
                setup = max(setup, setup_s.get((table, kind), 0.0))
            need += 0.0 if started else JOB_START_S + setup
            spent = clock() - t0  # every trial so far, this table's smaller groups' included
            restarts = deadline is not None and not restarted and spent + used + need > deadline
            need += (RESUME_S + setup) if restarts else 0.0
            if spent + used + need <= seconds:
                chosen = todo[:n]
                break
        left = seconds - (clock() - t0) - used
        fit[table] = chosen
        if chosen:
            used += need
            started = True
            restarted |= restarts
        when = (
            ""
            if deadline is None
            else f", {max(deadline - (clock() - t0), 0):.0f} s to this command's deadline: "
            + (
                "none"
                if not chosen
                else "they finish in the lease's next command"
                if restarted
                else "within this command"
            )
        )
        lines.append(
            f"{table}: seeds {', '.join(map(str, chosen)) or 'none'} this lease (about {need:.0f} "
            f"s of training for {len(chosen) or 1} seed(s) of {len(todo)} to train; {left:.0f} s "
            f"of the lease's training left{when})"
        )
    return fit, lines


def common_seeds(fit: dict) -> tuple[dict, list[str]]:
    """The window's targets and their seeds: the preset's seeds are one list for every table, so the
    tables with a seed that fits train the seeds every one of them fits (a prefix of each: a table
    that fits more trains fewer, never one that fits fewer more); a table with none is left out."""
    kept = {t: s for t, s in fit.items() if s}
    if not kept:
        return {}, []
    shared = [s for s in min(kept.values(), key=len) if all(s in v for v in kept.values())]
    lines = [
        f"{t}: left out of this lease's targets (no seed fits)" for t, s in fit.items() if not s
    ]
    lines += [
        f"{t}: seeds {', '.join(map(str, shared))} this lease, as every target's (the preset's "
        "seeds are one list)"
        for t, s in kept.items()
        if s != shared
    ]
    return {t: shared for t in kept}, lines


def projections(
    results: Path, specs: dict, said: set, now: float, deadline: float, lease: float
) -> list[tuple[str, str]]:
    """(group, line) for each group whose first run trained in this tree (not adopted) has an epoch
    in and is not in `said`: its epoch's time, its projected finish against this command's deadline
    and the lease's end (seconds of the window)."""
    first = {}
    for m in sorted(
        results.glob("runs/*/metrics.jsonl"), key=lambda m: group_seed(m.parent.name)[1]
    ):
        if not (m.parent / "adopted.json").exists():
            first.setdefault(group_seed(m.parent.name)[0], m)
    out = []
    for group, m in sorted(first.items()):
        rows = [json.loads(line) for line in m.read_text().splitlines() if line.strip()]
        if group in said or not rows:
            continue
        epochs = specs[m.parent.name]["train"]["epochs"]
        per_epoch = rows[-1]["seconds"]
        finish = now + (epochs - len(rows)) * per_epoch
        by_deadline = min(epochs, len(rows) + int(max(0, deadline - now) // per_epoch))
        verdict = (
            "fits in this command"
            if finish <= deadline
            else f"fits in the lease: about {by_deadline} of {epochs} epochs by the deadline, "
            "the rest in "
            "its next command"
            if finish + RESUME_S <= lease
            else f"does NOT fit: about {by_deadline} of {epochs} epochs by the deadline"
        )
        out.append(
            (
                group,
                f"{group} budget: epoch {len(rows)} took {per_epoch:.0f} s; all {epochs} epochs "
                f"done at about {finish:.0f} s of the window, deadline {deadline:.0f} s, lease "
                f"{lease:.0f} s: {verdict}",
            )
        )
    return out
