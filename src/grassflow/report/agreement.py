"""A finished run's records checked against each other: what a table would print of it (eval.json's
figures) must be what its training recorded (metrics.jsonl, run.json). Read wherever records made
elsewhere are taken in (adoption: grassflow.lm.adopt) and by `grassflow check`, over a results tree.

Checked, each refusal one line naming the file, the key and both values:
  run.json       a commit id; a status the pipeline writes (completed, diverged); epochs_completed
                 metrics.jsonl's epochs; a completed run has its spec's epochs, or says why it
                 stopped (status.reason); its last part ends at its last epoch and the part that
                 finished it; best_epoch a recorded epoch, the best one by the task's rule (the
                 lowest validation loss; the highest validation accuracy), its best figure
                 (best_val_ppl, best_val_acc) that epoch's; wall seconds and parameters that are
                 numbers
  metrics.jsonl  epochs 1, 2, ... in order, at most the spec's; finite validation figures
  eval.json      the same run and best epoch as run.json; its validation figure (chunked PPL,
                 accuracy) that of the best epoch in metrics.jsonl, to 1 part in 10^4 (the two
                 are computed apart, by training and by the evaluation); perplexities that are
                 perplexities (finite, at least 1)
What records cannot show: a test figure (eval.json's alone: it is not recomputed without the
weights, which records leave behind), or whether a run was trained as its spec says (the weights'
sha256 names the weights, not how they were made).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from grassflow.errors import DataError
from grassflow.report.records import read_metrics, read_record

RECORDS = ("run.json", "eval.json", "metrics.jsonl")
COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # git's object ids: SHA-1, SHA-256
STATES = ("completed", "diverged")  # how a run the pipeline records ends
REL = 1e-4  # eval.json's validation figure against training's, relative


# A task's figures: (eval.json's validation key, metrics.jsonl's key, run.json's best key, the rule
# that picks the best epoch: its key, whether lower is better, in words)
FIGURES = {
    "lm": ("chunked_ppl", "val_ppl", "best_val_ppl", ("val_loss", True, "lowest validation loss")),
    "snli": (
        "accuracy",
        "val_acc",
        "best_val_acc",
        ("val_acc", False, "highest validation accuracy"),
    ),
    "recall": (
        "accuracy",
        "val_acc",
        "best_val_acc",
        ("val_acc", False, "highest validation accuracy"),
    ),
}


def refuse(path: Path, key: str, value, why: str):
    raise DataError(f"{path}: {key} {str(repr(value))[:80]} {why}")


def _number(x) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x)


def _ppl(path: Path, key: str, value) -> None:
    if not _number(value) or value < 1:
        refuse(path, key, value, "is not a perplexity (a finite number, at least 1)")


def check(
    source, rec: dict | None = None, ev: dict | None = None, metrics: list | None = None
) -> None:
    """The records in `source` (a run's directory; its files read unless given) checked against each
    other (the module's list); a DataError names the first disagreement."""
    source = Path(source)
    run, evj, mj = source / "run.json", source / "eval.json", source / "metrics.jsonl"
    rec = read_record(run) if rec is None else rec
    ev = read_record(evj) if ev is None else ev
    metrics = read_metrics(mj) if metrics is None else metrics
    spec = rec.get("spec") if isinstance(rec.get("spec"), dict) else {}
    task = spec.get("task", "lm")
    if task not in FIGURES:
        refuse(
            run,
            "spec.task",
            task,
            f"is not a task whose records this checks ({', '.join(FIGURES)})",
        )
    figure, key, best_key, (rule_key, lower, rule) = FIGURES[task]
    git = rec.get("git") if isinstance(rec.get("git"), dict) else {}
    if git.get("commit") is not None and not (
        isinstance(git["commit"], str) and COMMIT.fullmatch(git["commit"])
    ):
        refuse(
            run, "git.commit", git["commit"], "is not a commit id (40 or 64 lower-case hex digits)"
        )
    if git.get("dirty") not in (True, False, None):
        refuse(run, "git.dirty", git.get("dirty"), "is not true, false or null")
    status = rec.get("status") if isinstance(rec.get("status"), dict) else {}
    state = status.get("state")
    if state not in STATES:
        refuse(run, "status.state", state, f"is not one of {', '.join(STATES)}")
    asked = (spec.get("train") or {}).get("epochs")
    epochs = [m.get("epoch") for m in metrics]
    if epochs != list(range(1, len(metrics) + 1)):
        refuse(mj, "epoch", epochs[:8], "are not the epochs 1, 2, … in order")
    if isinstance(asked, int) and len(metrics) > asked:
        refuse(mj, "epoch", len(metrics), f"epochs: more than the {asked} its spec trains")
    if rec.get("epochs_completed") != len(metrics):
        refuse(
            run,
            "epochs_completed",
            rec.get("epochs_completed"),
            f"is not metrics.jsonl's {len(metrics)} epochs",
        )
    if state == "completed" and not metrics:
        refuse(mj, "epoch", 0, "epochs: a completed run records at least one")
    if (
        state == "completed"
        and isinstance(asked, int)
        and len(metrics) < asked
        and not status.get("reason")
    ):
        refuse(
            run,
            "epochs_completed",
            len(metrics),
            f"of its spec's {asked} epochs, and status.state 'completed' "
            "with no status.reason saying why it stopped",
        )
    for m in metrics:
        for k in (key, "val_loss"):
            if not _number(m.get(k)):
                refuse(mj, f"epoch {m['epoch']}'s {k}", m.get(k), "is not a finite number")
        if task == "lm":
            _ppl(mj, f"epoch {m['epoch']}'s {key}", m[key])
    best = rec.get("best_epoch")
    if metrics:
        if best not in epochs or isinstance(best, bool):
            refuse(
                run,
                "best_epoch",
                best,
                f"is not a recorded epoch (1 … {len(metrics)}, metrics.jsonl)",
            )
        pick = min if lower else max
        top = pick(metrics, key=lambda m: m[rule_key])
        if metrics[best - 1][rule_key] != top[rule_key]:
            refuse(
                run,
                "best_epoch",
                best,
                f"is not the epoch of the {rule} (epoch {top['epoch']}, metrics.jsonl)",
            )
        if best_key in rec and rec[best_key] != metrics[best - 1][key]:
            refuse(
                run,
                best_key,
                rec[best_key],
                f"is not epoch {best}'s {key} in metrics.jsonl ({metrics[best - 1][key]})",
            )
    elif best is not None:
        refuse(run, "best_epoch", best, "names an epoch, but metrics.jsonl records none")
    parts = rec.get("parts")
    if parts is not None and (
        not isinstance(parts, list) or not all(isinstance(x, dict) for x in parts)
    ):
        refuse(run, "parts", parts, "is not a list of parts")
    if state == "completed" and parts:
        if parts[-1].get("ended") != "finished":
            refuse(
                run,
                "parts",
                [x.get("ended") for x in parts],
                "do not end with the part that finished the run",
            )
        to = (parts[-1].get("to") or {}).get("epoch")
        if to != len(metrics):
            refuse(
                run,
                "parts[-1].to.epoch",
                to,
                f"is not the run's last epoch ({len(metrics)}, metrics.jsonl)",
            )
    if not _number(rec.get("wall_seconds")) or rec["wall_seconds"] < 0:
        refuse(
            run,
            "wall_seconds",
            rec.get("wall_seconds"),
            "is not a duration (a finite number, at least 0)",
        )
    if (
        isinstance(rec.get("n_params"), bool)
        or not isinstance(rec.get("n_params"), int)
        or rec["n_params"] < 1
    ):
        refuse(run, "n_params", rec.get("n_params"), "is not a count of parameters")
    _evaluation(evj, ev, rec, metrics, task, figure, key, best)


def _evaluation(
    evj: Path, ev: dict, rec: dict, metrics: list, task: str, figure: str, key: str, best
) -> None:
    if ev.get("run_id", rec.get("run_id")) != rec.get("run_id"):
        refuse(evj, "run_id", ev.get("run_id"), f"is not run.json's ({rec.get('run_id')!r})")
    val = ev.get("validation") or {}
    completed = (rec.get("status") or {}).get(
        "state"
    ) == "completed"  # a diverged run's may have none
    if (ev.get("best_epoch") if completed else ev.get("best_epoch", best)) != best:
        refuse(evj, "best_epoch", ev.get("best_epoch"), f"is not run.json's ({best})")
    if task == "lm":
        for split in ("validation", "test"):
            e = ev.get(split) or {}
            for k in ("chunked_ppl", "strided_ppl"):
                if k in e:
                    _ppl(evj, f"{split}.{k}", e[k])
            if "word_ppl" in (e.get("harness") or {}):
                _ppl(evj, f"{split}.harness.word_ppl", e["harness"]["word_ppl"])
    if figure in val and metrics and isinstance(best, int) and 1 <= best <= len(metrics):
        trained = metrics[best - 1][key]
        if not _number(val[figure]) or abs(val[figure] - trained) > REL * abs(trained):
            refuse(
                evj,
                f"validation.{figure}",
                val[figure],
                f"is not the best epoch's {key} in metrics.jsonl (epoch {best}: {trained}): the "
                "evaluation is not of the weights that trained to it",
            )


def check_tree(root) -> tuple[list[Path], list[str], list[Path]]:
    """Every run under `root` (a directory with run.json), checked: (those that agree, one line per
    run that does not, those not evaluated yet: no eval.json)."""
    ok, bad, pending = [], [], []
    for run in sorted(Path(root).rglob("run.json")):
        d = run.parent
        if not (d / "eval.json").is_file():
            pending.append(d)
            continue
        try:
            check(d)
        except DataError as e:
            bad.append(str(e))
        else:
            ok.append(d)
    return ok, bad, pending
