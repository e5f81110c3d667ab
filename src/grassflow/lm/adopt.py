"""A run finished elsewhere joins this tree's tables from its records (config `finished_runs`): a
GPU lease's committed runs, another allocation's, a colleague's. Its run.json, eval.json and
metrics.jsonl are checked to be the run this tree would make, then copied into the run's
directory, where the tables read every run; it is neither trained nor evaluated here.

The checks, each refused in one line naming the file and what differs:
  the spec      run.json's spec equals the spec this preset gives the run (every key)
  the data      the token files it trained and validated on (run.json) and those it was evaluated
                on, documents included (eval.json), have this tree's files' sha256
  the records   eval.json evaluates run.json's best weights (their sha256), of the same run
  their claims  what a table prints or reads from them is what it says it is (claims): a commit
                id, a status the pipeline writes, perplexities that are perplexities (finite, ≥ 1),
                epochs 1, 2, … in metrics.jsonl as many as run.json says, the best epoch a recorded
                one, the lowest validation loss's, with its validation perplexity
What may differ, and is said in the table (its `commit` column and the line under it): the code
it ran, by its commit. adopted.json beside the copies says where they came from and their sha256.
"""

from __future__ import annotations

import math
import re
import shutil
import sys
from pathlib import Path

from grassflow import job
from grassflow.errors import DataError
from grassflow.io import atomic_path, sha256_file, write_json
from grassflow.report.records import read_metrics, read_record

RECORDS = ("run.json", "eval.json", "metrics.jsonl")


def _differences(mine, theirs, at="") -> list[str]:
    """The keys (dotted) where two specs differ, each with both values."""
    if isinstance(mine, dict) and isinstance(theirs, dict):
        return [d for k in sorted(set(mine) | set(theirs))
                for d in _differences(mine.get(k, "<absent>"), theirs.get(k, "<absent>"), f"{at}.{k}" if at else k)]
    return [] if mine == theirs else [f"{at} ({mine!r} here, {theirs!r} there)"]


COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # git's object ids: SHA-1, SHA-256
STATES = ("completed", "diverged")  # how a run the pipeline records ends


def _refuse(path: Path, key: str, value, why: str):
    raise DataError(f"{path}: {key} {str(repr(value))[:80]} {why}: not adopted")


def _ppl(path: Path, key: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 1:
        _refuse(path, key, value, "is not a perplexity (a finite number, at least 1)")


def claims(source: Path, rec: dict, ev: dict, metrics: list[dict]) -> None:
    """What the records say of themselves, as the tables will print and read it, checked (each
    refusal names the file and the key): a run's commit, status, epochs, best epoch, perplexities."""
    run, evj, mj = source / "run.json", source / "eval.json", source / "metrics.jsonl"
    git = rec.get("git") if isinstance(rec.get("git"), dict) else {}
    if git.get("commit") is not None and not (isinstance(git["commit"], str) and COMMIT.fullmatch(git["commit"])):
        _refuse(run, "git.commit", git["commit"], "is not a commit id (40 or 64 lower-case hex digits)")
    if git.get("dirty") not in (True, False, None):
        _refuse(run, "git.dirty", git.get("dirty"), "is not true, false or null")
    state = (rec.get("status") or {}).get("state") if isinstance(rec.get("status"), dict) else None
    if state not in STATES:
        _refuse(run, "status.state", state, f"is not one of {', '.join(STATES)}")
    epochs = [m.get("epoch") for m in metrics]
    if epochs != list(range(1, len(metrics) + 1)):
        _refuse(mj, "epoch", epochs[:8], "are not the epochs 1, 2, … in order")
    if len(metrics) > rec["spec"]["train"]["epochs"]:
        _refuse(mj, "epoch", len(metrics), f"epochs: more than the {rec['spec']['train']['epochs']} its spec trains")
    if rec.get("epochs_completed") != len(metrics):
        _refuse(run, "epochs_completed", rec.get("epochs_completed"), f"is not metrics.jsonl's {len(metrics)} epochs")
    for m in metrics:
        _ppl(mj, f"epoch {m['epoch']}'s val_ppl", m.get("val_ppl"))
        if not isinstance(m.get("val_loss"), (int, float)) or not math.isfinite(m["val_loss"]):
            _refuse(mj, f"epoch {m['epoch']}'s val_loss", m.get("val_loss"), "is not a finite number")
    best = rec.get("best_epoch")
    if metrics:
        if best not in epochs or isinstance(best, bool):
            _refuse(run, "best_epoch", best, f"is not a recorded epoch (1 … {len(metrics)}, metrics.jsonl)")
        lowest = min(metrics, key=lambda m: m["val_loss"])["epoch"]
        if metrics[best - 1]["val_loss"] != metrics[lowest - 1]["val_loss"]:
            _refuse(run, "best_epoch", best, f"is not the epoch of the lowest validation loss (epoch {lowest})")
        if "best_val_ppl" in rec and rec["best_val_ppl"] != metrics[best - 1]["val_ppl"]:
            _refuse(run, "best_val_ppl", rec["best_val_ppl"], f"is not epoch {best}'s ({metrics[best - 1]['val_ppl']})")
    elif best is not None:
        _refuse(run, "best_epoch", best, "names an epoch, but metrics.jsonl records none")
    if state == "completed" and not metrics:
        _refuse(mj, "epoch", 0, "epochs: a completed run records at least one")
    if ev.get("best_epoch", best) != best:
        _refuse(evj, "best_epoch", ev.get("best_epoch"), f"is not run.json's ({best})")
    for split in ("validation", "test"):
        e = ev.get(split) or {}
        for key in ("chunked_ppl", "strided_ppl"):
            if key in e:
                _ppl(evj, f"{split}.{key}", e[key])
        if "word_ppl" in (e.get("harness") or {}):
            _ppl(evj, f"{split}.harness.word_ppl", e["harness"]["word_ppl"])
    parts = rec.get("parts")
    if parts is not None and (not isinstance(parts, list) or not all(isinstance(x, dict) for x in parts)):
        _refuse(run, "parts", parts, "is not a list of parts")
    if state == "completed" and parts and parts[-1].get("ended") != "finished":
        _refuse(run, "parts", [x.get("ended") for x in parts], "do not end with the part that finished the run")
    wall = rec.get("wall_seconds")
    if isinstance(wall, bool) or not isinstance(wall, (int, float)) or not math.isfinite(wall) or wall < 0:
        _refuse(run, "wall_seconds", wall, "is not a duration (a finite number, at least 0)")
    if isinstance(rec.get("n_params"), bool) or not isinstance(rec.get("n_params"), int) or rec["n_params"] < 1:
        _refuse(run, "n_params", rec.get("n_params"), "is not a count of parameters")


def check(spec: dict, source: Path, files: dict[str, Path]) -> dict:
    """The records in `source` checked against `spec` and this tree's `files` ({train, validation,
    test, validation_docs, test_docs}), and for what they claim (claims); returns what adopted.json
    says of them."""
    rec, ev = read_record(source / "run.json"), read_record(source / "eval.json")
    metrics = read_metrics(source / "metrics.jsonl")
    if rec.get("run_id") != spec["run_id"] or ev.get("run_id") != spec["run_id"]:
        raise DataError(f"{source}: records of {rec.get('run_id')!r} (eval.json: {ev.get('run_id')!r}), not of "
                        f"{spec['run_id']}: not this run")
    differ = _differences(spec, rec.get("spec"))
    if differ:
        raise DataError(f"{source / 'run.json'}: its spec differs from this preset's {spec['run_id']} at "
                        f"{'; '.join(differ[:4])}{' ...' if len(differ) > 4 else ''}: another run, not adopted")
    data = rec.get("data") or {}
    said = [("run.json's training tokens", data.get("train", {}).get("file_sha256"), files["train"]),
            ("run.json's validation tokens", data.get("validation", {}).get("file_sha256"), files["validation"])]
    if rec.get("status", {}).get("state") == "completed":  # a diverged run may have nothing evaluated
        for split in ("validation", "test"):
            e = ev.get(split) or {}
            said += [(f"eval.json's {split} tokens", e.get("tokens_sha256"), files[split]),
                     (f"eval.json's {split} documents", e.get("harness", {}).get("docs_sha256"), files[f"{split}_docs"])]
    ours = {}
    for what, theirs, path in said:
        mine = ours.setdefault(path, sha256_file(path))
        if theirs != mine:
            raise DataError(f"{source}: {what} have sha256 {theirs}, this tree's {path} {mine}: made on other "
                            "data, not adopted")
    if ev.get("weights_sha256") != rec.get("weights_sha256"):
        raise DataError(f"{source / 'eval.json'}: evaluates weights {ev.get('weights_sha256')}, not run.json's "
                        f"best weights {rec.get('weights_sha256')}: the two records are of different runs")
    claims(source, rec, ev, metrics)
    return {"source": str(source), "commit": (rec.get("git") or {}).get("commit"),
            "dirty": (rec.get("git") or {}).get("dirty"),
            "sha256": {name: sha256_file(source / name) for name in RECORDS}}


def adopt(spec: dict, source, out_dir, files: dict) -> None:
    """The checked records of run `spec` from `source` in `out_dir`, with adopted.json; nothing is
    written unless every check passes, and adopted.json, written last, marks the copy complete."""
    source, out = Path(source), Path(out_dir)
    said = check(spec, source, {k: Path(v) for k, v in files.items()})
    out.mkdir(parents=True, exist_ok=True)
    for name in RECORDS:
        with atomic_path(out / name) as tmp:
            shutil.copyfile(source / name, tmp)
    write_json(out / "adopted.json", said)


def main(argv=None) -> int:
    p = job.parser(__spec__.name, __doc__)
    p.add_argument("--spec", required=True, type=job.json_arg, help="the run's spec here: " + job.JSON)
    p.add_argument("--records", required=True, help="the directory of its run.json, eval.json, metrics.jsonl")
    p.add_argument("--out-dir", required=True)
    for split in ("train", "validation", "test", "validation-docs", "test-docs"):
        p.add_argument(f"--{split}", required=True, help=f"this tree's {split.replace('-', ' ')} file")
    a = p.parse_args(argv)
    files = {"train": a.train, "validation": a.validation, "test": a.test, "validation_docs": a.validation_docs,
             "test_docs": a.test_docs}
    return job.run(adopt, a.spec, a.records, a.out_dir, files)


if __name__ == "__main__":
    sys.exit(main())
