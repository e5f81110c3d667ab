"""The lease's first minute, its decision: the setting its runs train with (trials.choose) and the
seeds whose groups finish within the lease (budget.seeds_that_fit, each smaller group's trial inside
the time box's alarm and counted), written to the window's overlay (train.compile, train.head_loss,
the preset's seeds, finished_runs) and to a record the lease's next command reuses, timing nothing.
The figures go to `<out>/choose-<device>.json` and `.md` (reports/bench/)."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path

import yaml

from grassflow.checkpoint import CheckpointError, load_checkpoint, resume_hash
from grassflow.errors import CommandError
from grassflow.lease import Stop, setting_value
from grassflow.lease.budget import TrialFailed, common_seeds, seeds_that_fit
from grassflow.lease.trials import (
    CANDIDATES,
    CHECK_STEPS,
    MIN_SHARE,
    Alarm,
    BoxTimeout,
    choose,
    free,
    one_line,
    setting_name,
    shape,
    to_markdown,
    trial,
)
from grassflow.lm.data import read_tokens
from grassflow.lm.grid import ablation_grid, finished_runs, run_group, runs, sweep_grid
from grassflow.lm.layout import fused_dir
from grassflow.pipeline.presets import select_preset
from grassflow.pipeline.preview import load_config
from grassflow.planning.sections import group_seed, run_id
from grassflow.run_spec import RunSpec
from grassflow.runtime import claim_device, configure_torch, device_name

# the grids a window may target besides a table: their cells' runs ({model: [run id per seed]})
GRIDS = {
    "sweep": lambda name, p: sweep_grid(name, p)["runs"],
    "ablations": lambda name, p: list(ablation_grid(name, p).values()),
}


def target_groups(name: str, p: dict, target: str) -> dict[str, list[str]]:
    """{label: its group's run ids, one per seed} of a window target: a table's groups by model, or
    a grid's (the sweep's, the ablations') by group id; Table 1's own runs are a sweep's too."""
    if target in (p.get("experiments") or {}):
        return {k: [run_id(run_group(target, k), s) for s in p["seeds"]] for k in p["models"]}
    if target in GRIDS and p.get(target):
        cells = GRIDS[target](name, p)
        return {group_seed(ids[0])[0]: ids for cell in cells for ids in cell.values()}
    raise CommandError(
        f"--targets {target}: not a table of preset {name} ({sorted(p.get('experiments') or {})}) "
        f"nor one of its grids ({', '.join(g for g in GRIDS if p.get(g)) or 'none'})"
    )


def tables_to_train(
    config: dict, targets, finished_dirs
) -> tuple[str, dict, dict, list[int], dict]:
    """(preset name, preset, {target: {label: (spec of its group's first run to train, the target's
    seeds to train)}}, the seeds of which every run of the targets is finished elsewhere, every
    run's spec) for the window's `targets` (tables, grids): a seed with a run left to train is
    trained (its finished runs adopted); a group with none left is not."""
    name, p = select_preset(config)
    specs = runs(name, p)
    done = finished_runs(finished_dirs, specs)
    tables, seeds_done = {}, None
    for target in targets:
        groups = target_groups(name, p, target)
        seeds = [group_seed(r)[1] for r in next(iter(groups.values()))]
        todo = [s for s in seeds if any(ids[seeds.index(s)] not in done for ids in groups.values())]
        left = {g: ids for g, ids in groups.items() if any(r not in done for r in ids)}
        if todo:
            tables[target] = {
                g: (RunSpec.of(specs[ids[seeds.index(todo[0])]]), todo) for g, ids in left.items()
            }
        finished = {s for s in seeds if s not in todo}
        seeds_done = finished if seeds_done is None else seeds_done & finished
    return name, p, tables, sorted(seeds_done or ()), specs


def progress(results: Path | None, specs: dict, group: str, seeds, per_epoch: int) -> int:
    """The steps of the group of `seeds` (one run alone) that its last.pt holds, where it is that
    group's (the loop's resume hash; rule train_fused's work dir, a lone run's directory), else
    0."""
    if results is None:
        return 0
    ids = [run_id(group, s) for s in seeds]
    where = Path(fused_dir(str(results), group)) if len(ids) > 1 else results / "runs" / ids[0]
    try:
        state = load_checkpoint(where / "last.pt")
    except CheckpointError:
        return 0
    if state is None or state.get("spec_hash") != resume_hash([specs[r] for r in ids]):
        return 0
    return state["pos"]["epoch"] * per_epoch + state["pos"]["step"]


def boxed(ids, vocab, device, setting, timed_steps: int, box_end: float):
    """budget.seeds_that_fit's `measure`: a smaller group's trial of `setting`, inside the time
    box's alarm (whatever is left of it, at least MIN_SHARE), its failure a TrialFailed."""

    timed = {}  # by shape (trials.shape): a sweep's values time once

    def measure(spec, seeds) -> float:
        key = shape(spec, len(seeds))
        if key not in timed:
            try:
                with Alarm(max(box_end - time.perf_counter(), MIN_SHARE)):
                    t = trial(spec, seeds, ids, vocab, device, setting, CHECK_STEPS, timed_steps)
                    timed[key] = t.step_s
            # any failure: the group does not fit, said
            except (Exception, BoxTimeout) as err:
                timed[key] = TrialFailed(one_line(err))
            finally:
                free(device)
        if isinstance(timed[key], TrialFailed):
            raise timed[key]
        return timed[key]

    return measure


def write_decision(path: Path, name: str, preset: dict, decision: dict) -> None:
    """The window's overlay with the decision: the setting, the seeds (the preset's and its grids':
    a grid's runs fuse over the preset's seeds), finished_runs."""
    overlay = yaml.safe_load(path.read_text()) if path.is_file() else {}
    section = overlay.setdefault("presets", {}).setdefault(name, {})
    compile_, head_loss = decision["choice"]
    section.setdefault("train", {}).update(compile=setting_value(compile_), head_loss=head_loss)
    lease = {s for seeds in decision["seeds"].values() for s in seeds}
    section["seeds"] = sorted(set(decision["finished_seeds"]) | lease) or preset["seeds"]
    for grid in GRIDS:
        if preset.get(grid):
            section.setdefault(grid, {})["seeds"] = section["seeds"]
    overlay["finished_runs"] = list(decision["finished"])
    path.write_text(yaml.safe_dump(overlay, sort_keys=False))


def reuse(a) -> None:
    """The lease's next command: the first command's decision, as it was (its setting and seeds),
    timing nothing; refused (one line) where it was made for other targets or another preset."""
    rec = json.loads(Path(a.record).read_text())
    if rec["preset"] != a.preset or rec["asked"] != list(a.targets):
        raise CommandError(
            f"{a.record}: chosen for preset {rec['preset']}, targets {' '.join(rec['asked'])}; "
            f"this command makes {a.preset} {' '.join(a.targets)}: delete it to choose anew"
        )
    name, preset = select_preset(load_config(Path.cwd(), a.configfile, a.preset))
    write_decision(Path(a.overlay), name, preset, rec)
    seeds = "; ".join(
        f"{t} seeds {', '.join(map(str, s)) or 'none'}" for t, s in rec["seeds"].items()
    )
    print(
        f"reusing {setting_name(rec['choice'])} chosen at {rec['chosen_at']} ({seeds}; the lease "
        "ends at "
        f"{datetime.fromtimestamp(rec['lease_end'], timezone.utc).isoformat(timespec='seconds')})",
        flush=True,
    )


def decide(a) -> None:
    """The first minute (see the module's docstring); Stop (3) where nothing is to train, (1) where
    the setting pinned fails."""
    Path(a.record).unlink(missing_ok=True)  # a decision is this first minute's, or none
    configure_torch()
    device = claim_device(a.device, log=True)
    name, preset, tables, finished_seeds, specs = tables_to_train(
        load_config(Path.cwd(), a.configfile, a.preset), a.targets, a.finished
    )
    ids, meta = read_tokens(a.train_tokens)
    vocab = meta["vocab_size"]
    candidates = (
        [tuple(c.split(":", 1)) for c in a.candidates]
        if a.candidates
        else CANDIDATES.get(device.type, [])
    )
    t0 = time.perf_counter()
    results = Path(a.results) if a.results else None
    if tables:
        result = choose(
            tables, ids, vocab, device, candidates, a.box, a.timed_steps, checkpoint_dir=results
        )
    else:
        result = {
            "rows": [],
            "choice": None,
            "lines": ["every run of the targets is finished elsewhere: nothing to train"],
        }
    fit = {}
    if result["choice"] is None:
        pass  # nothing to train with: the window stops, the figures written
    elif a.seeds is not None:
        seeds = [int(s) for s in a.seeds.split(",") if s]
        fit = {t: [s for s in k[next(iter(k))][1] if s in seeds] for t, k in tables.items()}
        result["lines"].append(f"seeds {a.seeds or 'none'} this lease, as asked (--seeds)")
    else:
        chosen = [
            r for r in result["rows"] if (r["compile"], r["head_loss"]) == tuple(result["choice"])
        ]
        step_s = {
            (r["table"], r["model"], r["members"]): r["step_s"] for r in chosen if "step_s" in r
        }
        costs = {
            "setup_s": {(r["table"], r["model"]): r["setup_s"] for r in chosen if "setup_s" in r},
            "checkpoint_s": {
                (r["table"], r["model"]): r["checkpoint_s"]
                for r in result["rows"]
                if "checkpoint_s" in r
            },
        }
        spent = time.perf_counter() - t0
        measure = boxed(ids, vocab, device, result["choice"], a.timed_steps, t0 + a.box)
        fit, fit_lines = seeds_that_fit(
            tables,
            measure,
            len(ids),
            a.seconds - spent,
            step_s,
            deadline=None if a.deadline is None else a.deadline - spent,
            costs=costs,
            done=lambda table, label, seeds, per_epoch: progress(
                results, specs, group_seed(tables[table][label][0].run_id)[0], seeds, per_epoch
            ),
        )
        result["lines"] += fit_lines
    fit, common = common_seeds(fit)
    result["lines"] += common
    result.update(
        seeds=fit,
        device=device_name(device),
        tables=a.targets,
        finished_seeds=finished_seeds,
        seconds=a.seconds,
        deadline=a.deadline,
        box=a.box,
    )
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"choose-{device.type}.json").write_text(json.dumps(result, indent=1, default=str))
    (out / f"choose-{device.type}.md").write_text(to_markdown(result, result["device"]))
    for line in result["lines"]:
        print(line, flush=True)
    if a.pinned and result["choice"] is None:
        raise Stop(
            f"compile={a.candidates[0].replace(':', ' head_loss=', 1)} does not compute the "
            "reference's loss here, or failed: not training with it",
            code=1,
        )
    if result["choice"] is None:
        raise Stop(
            "no setting computes the reference's loss for every model: not training (the step's "
            f"figures are in {out})",
            code=3,
        )
    if not fit:
        raise Stop(
            "no seed of a table finishes within the lease: not training (the step's figures are in "
            f"{out})",
            code=3,
        )
    decision = {
        "preset": a.preset,
        "asked": list(a.targets),
        "targets": list(fit),
        "choice": list(result["choice"]),
        "seeds": fit,
        "finished_seeds": finished_seeds,
        "finished": list(a.finished),
        "chosen_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "lease_end": a.lease_end,
    }
    write_decision(Path(a.overlay), name, preset, decision)
    Path(a.record).write_text(json.dumps(decision, indent=1))
