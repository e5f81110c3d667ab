"""A run finished elsewhere joins this tree's tables from its records (config `finished_runs`): a
GPU lease's committed runs, another allocation's, a colleague's. Its run.json, eval.json and
metrics.jsonl are checked to be the run this tree would make, then copied into the run's directory,
where the tables read every run; it is neither trained nor evaluated here.

The checks, each refused in one line naming the file and what differs:
  the spec      run.json's spec equals the spec this preset gives the run (every key)
  the data      the token files it trained and validated on (run.json) and those it was evaluated
                on, documents included (eval.json), have this tree's files' sha256
  the records   eval.json evaluates run.json's best weights (their sha256), of the same run
  their agreement  what a table prints of them is what training recorded
  (grassflow.report.agreement:
                eval.json's validation PPL the best epoch's in metrics.jsonl and run.json's, a
                completed run its spec's epochs or a reason, the parts ending at its last epoch,
                ...)
What may differ, and is said in the table (its `commit` column and the line under it): the code it
ran, by its commit. adopted.json beside the copies says where they came from and their sha256.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from grassflow import job
from grassflow.errors import DataError
from grassflow.io import atomic_path, sha256_file, write_json
from grassflow.report import agreement
from grassflow.report.agreement import RECORDS
from grassflow.report.records import read_metrics, read_record


def _differences(mine, theirs, at="") -> list[str]:
    """The keys (dotted) where two specs differ, each with both values."""
    if isinstance(mine, dict) and isinstance(theirs, dict):
        return [
            d
            for k in sorted(set(mine) | set(theirs))
            for d in _differences(
                mine.get(k, "<absent>"), theirs.get(k, "<absent>"), f"{at}.{k}" if at else k
            )
        ]
    return [] if mine == theirs else [f"{at} ({mine!r} here, {theirs!r} there)"]


def check(spec: dict, source: Path, files: dict[str, Path]) -> dict:
    """The records in `source` checked against `spec` and this tree's `files` ({train, validation,
    test, validation_docs, test_docs}), and against each other (report.agreement); returns what
    adopted.json says of them."""
    rec, ev = read_record(source / "run.json"), read_record(source / "eval.json")
    metrics = read_metrics(source / "metrics.jsonl")
    if rec.get("run_id") != spec["run_id"] or ev.get("run_id") != spec["run_id"]:
        raise DataError(
            f"{source}: records of {rec.get('run_id')!r} (eval.json: {ev.get('run_id')!r}), not of "
            f"{spec['run_id']}: not this run"
        )
    differ = _differences(spec, rec.get("spec"))
    if differ:
        raise DataError(
            f"{source / 'run.json'}: its spec differs from this preset's {spec['run_id']} at "
            f"{'; '.join(differ[:4])}{' ...' if len(differ) > 4 else ''}: another run, not adopted"
        )
    data = rec.get("data") or {}
    said = [
        ("run.json's training tokens", data.get("train", {}).get("file_sha256"), files["train"]),
        (
            "run.json's validation tokens",
            data.get("validation", {}).get("file_sha256"),
            files["validation"],
        ),
    ]
    # a diverged run may have nothing evaluated
    if rec.get("status", {}).get("state") == "completed":
        for split in ("validation", "test"):
            e = ev.get(split) or {}
            said += [
                (f"eval.json's {split} tokens", e.get("tokens_sha256"), files[split]),
                (
                    f"eval.json's {split} documents",
                    e.get("harness", {}).get("docs_sha256"),
                    files[f"{split}_docs"],
                ),
            ]
    ours = {}
    for what, theirs, path in said:
        mine = ours.setdefault(path, sha256_file(path))
        if theirs != mine:
            raise DataError(
                f"{source}: {what} have sha256 {theirs}, this tree's {path} {mine}: made on other "
                "data, not adopted"
            )
    if ev.get("weights_sha256") != rec.get("weights_sha256"):
        raise DataError(
            f"{source / 'eval.json'}: evaluates weights {ev.get('weights_sha256')}, not run.json's "
            f"best weights {rec.get('weights_sha256')}: the two records are of different runs"
        )
    try:
        agreement.check(source, rec, ev, metrics)
    except DataError as e:
        raise DataError(f"{e}: not adopted") from None
    return {
        "source": str(source),
        "commit": (rec.get("git") or {}).get("commit"),
        "dirty": (rec.get("git") or {}).get("dirty"),
        "sha256": {name: sha256_file(source / name) for name in RECORDS},
    }


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
    p.add_argument(
        "--spec", required=True, type=job.json_arg, help="the run's spec here: " + job.JSON
    )
    p.add_argument(
        "--records", required=True, help="the directory of its run.json, eval.json, metrics.jsonl"
    )
    p.add_argument("--out-dir", required=True)
    for split in ("train", "validation", "test", "validation-docs", "test-docs"):
        p.add_argument(
            f"--{split}", required=True, help=f"this tree's {split.replace('-', ' ')} file"
        )
    a = p.parse_args(argv)
    files = {
        "train": a.train,
        "validation": a.validation,
        "test": a.test,
        "validation_docs": a.validation_docs,
        "test_docs": a.test_docs,
    }
    return job.run(adopt, a.spec, a.records, a.out_dir, files)


if __name__ == "__main__":
    sys.exit(main())
