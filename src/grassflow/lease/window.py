"""The window's light verbs (no torch): the copy's check, the overlay, the dry-run gate, the
preflight's device, the lease's time left, each group's projected finish, each run's progress."""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from pathlib import Path

import yaml

from grassflow.lease import Stop, setting_value
from grassflow.lease.budget import projections
from grassflow.lm.grid import runs
from grassflow.pipeline.presets import select_preset
from grassflow.pipeline.preview import dry_run, load_config
from grassflow.provenance import differences, git_state

# The jobs a window may run, in the order the plan is said; anything else (the data stages, another
# task's) means a copy whose file times or Snakemake records were lost: it would replan them here,
# where their sources (../shared, the hub) are not
WINDOW_RULES = (
    *("adopt_run", "preflight", "train", "train_fused", "evaluate"),
    *("aggregate", "sweep_aggregate", "ablation_aggregate"),  # the tables: a table's, the grids'
)


def check_tree(a) -> None:
    """A lease's runs trace to a commit: a copy with the prepared commit's tree (`--manifest`, from
    make gpu-paper-prepare) is checked by content (every file the commit's, none missing, none
    added; modes and the copy's own .git, which may lag, not asked); without it, git's own state
    (uncommitted changes to tracked files, a tree outside git) is. Before anything runs."""
    manifest = Path(a.manifest)
    if manifest.is_file():
        tree = json.loads(manifest.read_text())
        diff = differences(manifest.resolve().parent, tree)
        if diff:
            more = f" and {len(diff) - 8} more" if len(diff) > 8 else ""
            raise Stop(
                f"{', '.join(diff[:8])}{more} differ from the prepared commit {tree['commit'][:7]} "
                f"({manifest}, by content): commit them and run make gpu-paper-prepare again (a "
                "lease's runs must trace to a commit)"
            )
        print(f"tree: the prepared commit {tree['commit'][:12]}, every file its own (by content)")
        return
    state = git_state("src/grassflow")
    if state["commit"] is None:
        raise Stop(
            "this tree is not a git checkout (or git is missing): a lease's runs must trace to a "
            "commit"
        )
    if state["dirty"]:
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        ).stdout.split("\n")
        names = [line[3:] for line in changed if line.strip()]
        raise Stop(
            f"uncommitted changes to {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}: "
            f"commit them first (a lease's runs must trace to a commit, and {state['commit'][:7]} "
            "is not what would run)"
        )


def initial_overlay(a) -> None:
    """The window's overlay until the first minute decides: its jobs fused and side by side, the
    setting pinned or (to be chosen) what the dry run may plan, the records finished elsewhere."""
    train = {
        "fuse_seeds": True,
        "runs_per_gpu": a.runs_per_gpu,
        "threads": a.threads,
        "compile": False if a.compile == "choose" else setting_value(a.compile),
        "head_loss": "auto" if a.head_loss == "choose" else a.head_loss,
    }
    overlay = {
        "presets": {a.preset: {"train": train}},
        "finished_runs": [a.finished] if a.finished else [],
    }
    Path(a.overlay).write_text(yaml.safe_dump(overlay, sort_keys=False))


def gate(a) -> None:
    """Snakemake's own dry run of the targets (pipeline.preview.dry_run): refused (2) where it plans
    a job besides the window's (WINDOW_RULES and the targets' tables), stopped (3) where it trains
    and evaluates nothing (the targets' runs are all finished: spend the lease on the next
    target)."""
    try:
        jobs, _ = dry_run(Path.cwd(), a.targets, [*a.configfile, a.overlay], a.preset)
    except SystemExit as e:  # its one line
        raise Stop(f"the dry run failed: {str(e).removeprefix('error: ')}") from None
    counts = Counter(j["rule"] for j in jobs)
    extra = sorted(set(counts) - {*WINDOW_RULES, *a.targets})
    if extra:
        raise Stop(
            f"the dry run plans {' '.join(extra)} besides the preflight, training, evaluation and "
            f"tables; carry {a.carry} from make gpu-paper-prepare"
        )
    if not counts.keys() & {"train", "train_fused", "evaluate"}:
        raise Stop(
            f"the dry run of {' '.join(a.targets)} plans no training or evaluation: its runs are "
            f"all finished ({a.finished or 'in this tree'}); name the next target (TARGETS=…, "
            "docs/scale/gpu.md) before spending the lease",
            code=3,
        )
    order = [*WINDOW_RULES, *a.targets]
    print("planned: " + ", ".join(f"{r} {counts[r]}" for r in sorted(counts, key=order.index)))


def check_device(a) -> None:
    """What the jobs will run on, as the preflight resolved it: a lease is for CUDA and the CuPy
    kernels, never for a silent fallback (a CPU device, the slower `fast` op after a failed
    compile)."""
    d = json.loads(Path(a.preflight).read_text())["devices"][0]
    resolved = " ".join([d.get("type", "cpu"), *sorted({b["resolved"] for b in d["backends"]})])
    if resolved != a.expect:
        raise Stop(
            f"the preflight resolved '{resolved}' (device, op backends), not '{a.expect}': not "
            "spending the lease on it"
        )
    print(f"preflight done: {resolved}")


def lease_left(a) -> None:
    """The lease's seconds left at `--start`, by the first command's record (its `lease_end`)."""
    print(max(0, int(json.loads(Path(a.record).read_text())["lease_end"] - a.start)))


def targets(a) -> None:
    """The tables the decision trains (its record's)."""
    print(" ".join(json.loads(Path(a.record).read_text())["targets"]))


def budget(a) -> None:
    """Each group's projected finish, said once (`--said` keeps the groups said)."""
    name, p = select_preset(load_config(Path.cwd(), [*a.configfile, a.overlay], a.preset))
    said_file = Path(a.said)
    said = set(said_file.read_text().split()) if said_file.is_file() else set()
    now = time.time() - a.start
    lines = projections(Path(a.results), runs(name, p), said, now, a.deadline, a.lease)
    for _, line in lines:
        print(line)
    said_file.write_text(" ".join(sorted(said | {g for g, _ in lines})))


def run_progress(a) -> None:
    """Each run's epochs so far and best validation PPL, and whether it finished."""
    for d in sorted(p for p in Path(a.results, "runs").iterdir() if p.is_dir()):
        try:
            rows = [
                json.loads(line)
                for line in (d / "metrics.jsonl").read_text().splitlines()
                if line.strip()
            ]
        except OSError:
            rows = []
        best = min((r["val_ppl"] for r in rows if "val_ppl" in r), default=None)
        print(
            f"{d.name}: {len(rows)} epochs"
            + (f", best validation PPL so far {best:.1f}" if best is not None else "")
            + (", finished" if (d / "run.json").is_file() else "")
        )
