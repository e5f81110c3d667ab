"""A task's job: `python -m grassflow.stage <task> <stage> --...`, what a rule's shell runs
(`grassflow <command>`, e.g. `grassflow snli-train`, hands its arguments here). A job's code is
this module's part for its stage (its row of STAGE_COMMANDS and what that names), its task's
declaration and the function the declaration names (grassflow.staleness): not the other stages'
handlers, the CLI's other commands, the planning (config, run grids, grassflow.tasks) or the
other tasks.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grassflow.command import JSON, ArgumentParser, call, json_arg, record, required, run
from grassflow.declaration import STAGES, declared, entry


def _train_args(p):
    p.add_argument("--spec", required=True, type=json_arg, help="the run's spec: " + JSON)
    required("train-tokens", "val-tokens", "out-dir")(p)


def _train_fused_args(p):
    p.add_argument("--specs", required=True, nargs="+", type=json_arg, help="each run's spec: " + JSON)
    p.add_argument("--out-dirs", required=True, nargs="+", help="each run's directory, in the specs' order")
    required("train-tokens", "val-tokens", "work-dir")(p)


def _execution_args(p):
    p.add_argument("--preflight", help="the preflight record of this job's environment, kept in run.json")
    p.add_argument("--compile", choices=("auto", "true", "false", "graph"), default="auto",
                   help="train.compile: torch.compile the training loss and validation forward, or (graph) "
                        "capture the training step as one CUDA graph")
    p.add_argument("--compile-mode", default="default", help="train.compile_mode (torch.compile's mode)")
    p.add_argument("--trackers", default="none", help="train.trackers, comma-separated (tensorboard,wandb), or none")


def _train(a):
    # how the job runs, not what it computes (train.compile, train.compile_mode, train.trackers)
    a.execution = {"compile": {"true": True, "false": False}.get(a.compile, a.compile), "compile_mode": a.compile_mode,
                   "trackers": [t for t in a.trackers.split(",") if t != "none"]}
    del a.compile, a.compile_mode, a.trackers
    return call(a)


def _tokenize_args(p):
    p.add_argument("--tokenizer", required=True, type=json_arg,
                   help="its tokenizer section, with the cut of its splits (LM: eval_max_tokens, SNLI: max_tokens): " + JSON)
    p.add_argument("--artifact", help="trained tokenizer.json (tokenizer.name: trained)")
    p.add_argument("--raw", nargs="+", required=True)
    p.add_argument("--out-dir", required=True)


def _tokenize(a):
    for raw in a.raw:
        meta = entry(a.entry)(a.tokenizer, raw, Path(a.out_dir) / Path(raw).name, a.artifact)
        print(f"{Path(raw).stem}: " + ", ".join(f"{k} {v}" for k, v in meta.items() if isinstance(v, int | float)),
              file=sys.stderr)


def _download(a):
    from grassflow.io import write_json

    records = {split: entry(a.entry)(a.data, split, Path(a.out_dir) / f"{split}.parquet") for split in a.splits}
    write_json(Path(a.out_dir) / "checksums.json", records)


_DATA_ARGS = [required("data", type=json_arg, help="its data section: " + JSON), required("out-dir")]
AGGREGATE_ARGS = [required("preset", type=json_arg, help="the preset: " + JSON), required("preset-name", "out-dir"),
                  required("runs", nargs="+", help="run directories")]

# stage → (help, handler, argument groups)
STAGE_COMMANDS = {
    "train": ("train one run from its spec", _train, [_train_args, _execution_args]),
    "train_fused": ("train runs that differ only in their seed as one ensemble (train.fuse_seeds)", _train,
                    [_train_fused_args, _execution_args]),
    "evaluate": ("evaluate a run's best weights (model.safetensors, config.json beside it)", call,
                 [required("weights", "run-json", "val-tokens", "test-tokens", "out")]),
    "aggregate": ("its tables and figures", call, AGGREGATE_ARGS),
    "data": ("its train/validation/test parquet files", call, _DATA_ARGS),
    "download": ("raw splits to parquet", _download,
                 [*_DATA_ARGS, lambda p: p.add_argument("--splits", nargs="+", default=["train", "validation", "test"])]),
    "train_tokenizer": ("train a WordPiece tokenizer on the train split", call,
                        [required("train", "out"), required("vocab-size", type=int)]),
    "tokenize": ("raw parquet files to token parquet files", _tokenize, [_tokenize_args]),
    "documents": ("validation and test splits as lm-evaluation-harness's documents (its word-level perplexity)",
                  _tokenize, [_tokenize_args]),
}


def parser(task, stage: str, prog: str) -> argparse.ArgumentParser:
    """The command line of `task`'s `stage` (a task's runs' jobs also get `--<dir>-dir` per declared dir)."""
    help_, fn, groups = STAGE_COMMANDS[stage]
    p = ArgumentParser(prog=prog, description=f"{task.title}: {help_}")
    for add in groups:
        add(p)
    for d in task.dirs if stage in (*STAGES, "train_fused") else ():
        p.add_argument(f"--{d}-dir", help=f"the run's {d} directory")
    for split in ("val", "test") if stage == "evaluate" and task.documents else ():
        p.add_argument(f"--{split}-docs", help="the split's documents (the documents stage): its word-level "
                       "perplexity as lm-evaluation-harness's (without them, eval.json has none)")
    ref = getattr(task, stage)
    p.set_defaults(fn=fn, entry=ref, cmd=prog.removeprefix("grassflow "))
    return p


def main(argv=None, prog: str | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    record(argv)
    if len(argv) < 2:
        raise SystemExit("usage: python -m grassflow.stage <task> <stage> --...")
    try:
        task, stage = declared(argv[0]), argv[1]
    except ModuleNotFoundError:
        raise SystemExit(f"no task {argv[0]!r} (a task is a package grassflow/<task>/ with a task.py)") from None
    if stage not in STAGE_COMMANDS or not getattr(task, stage, None):
        raise SystemExit(f"task {task.name} has no stage {stage!r}")
    return run(parser(task, stage, prog or f"grassflow.stage {task.name} {stage}").parse_args(argv[2:]))


if __name__ == "__main__":
    sys.exit(main())
