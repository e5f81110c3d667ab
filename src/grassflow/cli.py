"""Command line of the pipeline stages: `python -m grassflow <stage> ...` (or `grassflow`).

The Snakemake rules are thin shells over these commands. Expected failures (bad data, bad
config, missing files) print one `error:` line naming the file or key, and exit 1.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
from pathlib import Path

from grassflow.errors import CommandError
from grassflow.tasks import COMMANDS as TASK_COMMANDS
from grassflow.tasks import STAGES, TASKS, entry


def json_arg(value: str):
    """A JSON argument: the path of a JSON file (what the rules pass: a job's spec file, so its
    command line can be pasted to rerun it), or the JSON itself (`{...}`, `[...]`, `null`)."""
    text = value.strip()
    if text[:1] in ("{", "[") or text == "null":
        source = "the argument"
    else:
        source, path = value, Path(value)
        if not path.is_file():
            raise argparse.ArgumentTypeError(f"{value}: no such JSON file (and not JSON)")
        text = path.read_text()
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"{source} is not valid JSON: {e}") from None


JSON = "a JSON file, or JSON"


PARSER_KEYS = {"cmd", "fn", "entry", "task"}  # what the parser sets besides the command's arguments


def _call(a):
    """A command that is one function (`a.entry`, "module:function"): called with the parsed
    arguments its parameters are named after (`--out-dir`: out_dir). An argument no parameter
    takes is refused, before any work: dropped, it would silently change what runs."""
    fn = entry(a.entry)
    params = inspect.signature(fn).parameters
    unused = sorted(set(vars(a)) - PARSER_KEYS - set(params))
    if unused:
        raise CommandError(f"grassflow {a.cmd}: {a.entry} has no parameter for "
                           + ", ".join(f"--{k.replace('_', '-')} ({k})" for k in unused))
    return fn(**{k: getattr(a, k) for k in params if hasattr(a, k)})


def _gpus(a):
    """Snakemake's flag for K = the preset's train.runs_per_gpu runs per GPU: locally --resources
    for this machine's GPUs × K; on SLURM (--slurm) --group-components packing K runs into each
    allocation (nothing for K = 1: one run per allocation, the profile's default)."""
    from grassflow.config import select_preset
    from grassflow.gpu_slots import flag
    from grassflow.plan import load_config
    from grassflow.tasks import pipeline_train

    _, p = select_preset(load_config(Path(a.project).resolve(), a.configfile, a.preset))
    k = a.runs_per_gpu or pipeline_train(p)["runs_per_gpu"]
    if a.slurm:
        print(" ".join(["--group-components", *(f"{t.group}={k}" for t in TASKS.values())]) if k > 1 else "")
    else:
        print(flag(k))


def _required(*names, **kw):
    """An argument group: each --<name> required, with add_argument's other keywords `kw`."""
    return lambda p: [p.add_argument(f"--{n}", required=True, **kw) for n in names]


def _baseline_args(p):
    p.add_argument("--unigram", required=True, help="unigram.json of the evaluation tokens")
    p.add_argument("--checksums", required=True, help="the download stage's checksums.json")
    p.add_argument("--published", required=True, help="workflow/resources/published.yaml")


def _preflight_args(p):
    p.add_argument("--device", nargs="+", default=["auto"], dest="devices", help="train.device value(s): auto, cpu, cuda")
    p.add_argument("--backend", nargs="+", default=["auto"], dest="backends", help="the Plücker op backend(s) the jobs use")
    p.add_argument("--snli", action="store_true", help="also step both SNLI heads")
    p.add_argument("--out", required=True, help="the JSON record the training jobs keep")


def _tokenize_args(p):
    p.add_argument("--tokenizer", required=True, type=json_arg,
                   help="its tokenizer section, with the cut of its splits (LM: eval_max_tokens, SNLI: max_tokens): " + JSON)
    p.add_argument("--artifact", help="trained tokenizer.json (tokenizer.name: trained)")
    p.add_argument("--raw", nargs="+", required=True)
    p.add_argument("--out-dir", required=True)


def _train_args(p):
    p.add_argument("--spec", required=True, type=json_arg, help="the run's spec: " + JSON)
    _required("train-tokens", "val-tokens", "out-dir")(p)
    p.add_argument("--preflight", help="the preflight record of this job's environment, kept in run.json")
    p.add_argument("--compile", choices=("auto", "true", "false"), default="auto",
                   help="train.compile: torch.compile the training loss and validation forward")
    p.add_argument("--compile-mode", default="default", help="train.compile_mode (torch.compile's mode)")


_DATA_ARGS = [_required("data", type=json_arg, help="its data section: " + JSON), _required("out-dir")]
_AGGREGATE_ARGS = [_required("preset", type=json_arg, help="the preset: " + JSON), _required("preset-name", "out-dir"),
                   _required("runs", nargs="+", help="run directories")]


# --- the commands of every task, made from its declaration (grassflow/<task>/task.py) ------------
def _task_train(a):
    # how the job runs, not what it computes (train.compile, train.compile_mode)
    a.execution = {"compile": {"true": True, "false": False}.get(a.compile, a.compile), "compile_mode": a.compile_mode}
    del a.compile, a.compile_mode
    return _call(a)


def _task_download(a):
    from grassflow.io import write_json

    records = {split: entry(a.entry)(a.data, split, Path(a.out_dir) / f"{split}.parquet") for split in a.splits}
    write_json(Path(a.out_dir) / "checksums.json", records)


def _task_tokenize(a):
    for raw in a.raw:
        meta = entry(a.entry)(a.tokenizer, raw, Path(a.out_dir) / Path(raw).name, a.artifact)
        print(f"{Path(raw).stem}: " + ", ".join(f"{k} {v}" for k, v in meta.items() if isinstance(v, int | float)),
              file=sys.stderr)


# stage → (help, handler, argument groups)
TASK_STAGES = {
    "train": ("train one run from its spec", _task_train, [_train_args]),
    "evaluate": ("evaluate a run's best weights (model.safetensors, config.json beside it)", _call,
                 [_required("weights", "run-json", "val-tokens", "test-tokens", "out")]),
    "aggregate": ("its tables and figures", _call, _AGGREGATE_ARGS),
    "data": ("its train/validation/test parquet files", _call, _DATA_ARGS),
    "download": ("raw splits to parquet", _task_download,
                 [*_DATA_ARGS, lambda p: p.add_argument("--splits", nargs="+", default=["train", "validation", "test"])]),
    "train_tokenizer": ("train a WordPiece tokenizer on the train split", _call,
                        [_required("train", "out"), _required("vocab-size", type=int)]),
    "tokenize": ("raw parquet files to token parquet files", _task_tokenize, [_tokenize_args]),
}


# (command, help, handler or "module:function" (_call), argument groups): the stages not made from a
# task's declaration; then
# (build_parser) each task's commands (train, evaluate, aggregate, data, download, tokenize, ...)
COMMANDS = [
    ("fetch-tokenizer", "save a hub tokenizer as one tokenizer.json (login node)", "grassflow.data.tokenizers:fetch_tokenizer",
     [_required("tokenizer", type=json_arg, help="a tokenizer section: " + JSON), _required("out")]),
    ("unigram", "the unigram-perplexity baseline of the validation and test tokens", "grassflow.lm.unigram:unigram_baseline",
     [_required("train-tokens", "val-tokens", "test-tokens", "out")]),
    ("aggregate", "one experiment's table and figures", "grassflow.report.aggregate:aggregate",
     [*_AGGREGATE_ARGS, _baseline_args, _required("experiment")]),
    ("gpus", "the flag that runs K GPU jobs per GPU: snakemake $(grassflow gpus); on SLURM, K runs per "
     "allocation: snakemake --profile profiles/slurm $(grassflow gpus --slurm)", _gpus,
     [lambda p: [p.add_argument("--preset"), p.add_argument("--configfile", nargs="*", default=[]),
                 p.add_argument("--project", default="."),
                 p.add_argument("--slurm", action="store_true", help="--group-components for profiles/slurm"),
                 p.add_argument("--runs-per-gpu", type=int, help="K (default: the preset's train.runs_per_gpu)")]]),
    ("summary", "summary.md of a preset's tables, and the scaling figure", "grassflow.report.aggregate:summary",
     [_required("preset-name", "out-dir"), _required("tables", nargs="+", help="the tables' .md files"),
      _required("bench", help="bench JSON for the scaling figure")]),
    ("ablations", "the ablation table and figure of a preset", "grassflow.report.ablations:aggregate_ablations",
     [_baseline_args, _required("preset", "grid", type=json_arg), _required("preset-name", "runs-dir", "out-dir")]),
    ("snli-fetch-backbone", "save the pretrained backbone's files (login node)", "grassflow.snli.backbone:fetch_backbone",
     [_required("backbone", type=json_arg, help="the snli.backbone section: " + JSON), _required("out-dir")]),
    ("preflight", "check the device, op backends and a training step before the GPU jobs", "grassflow.preflight:main",
     [_preflight_args]),
    ("estimates", "every training/evaluation job's estimated time beside its measured wall time", "grassflow.plan:estimates_report",
     [_required("preset", "estimate", type=json_arg), _required("preset-name", "results", "out")]),
    # a trained model outside the pipeline (docs/using-models.md); no rule runs these
    ("export", "a language-model run as a model directory: safetensors, config.json, tokenizer, model card",
     "grassflow.export:export_run",
     [lambda p: [p.add_argument("run_dir", help="results/<preset>/runs/<run>"), p.add_argument("out_dir"),
                 p.add_argument("--tokenizer", help="its tokenizer.json, where the pipeline's is not beside the run")]]),
    ("generate", "continue a prompt with a model (an export or a run directory)", "grassflow.decode:generate_text",
     [lambda p: [p.add_argument("model", help="an export (grassflow export) or a run directory"),
                 p.add_argument("--prompt", required=True), p.add_argument("--max-new-tokens", type=int, default=50),
                 p.add_argument("--temperature", type=float, default=1.0, help="0: greedy"),
                 p.add_argument("--top-k", type=int), p.add_argument("--top-p", type=float),
                 p.add_argument("--seed", type=int, default=0), p.add_argument("--device", default="cpu"),
                 p.add_argument("--recompute", action="store_true",
                                help="no cache: every step reads the whole prefix (for comparison)")]]),
]


# command → (help, "module:main"): commands with their own parsers (their options are not this one's)
OWN_PARSERS = {
    "bench": ("core benchmark (see python -m grassflow.bench -h)", "grassflow.bench:main"),
    "plan": ("a preset's jobs, estimated device-hours and memory before it runs (see grassflow plan -h)",
             "grassflow.plan:main"),
}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="grassflow", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, help_, fn, groups in COMMANDS:
        p = sub.add_parser(name, help=help_)
        for add in groups:
            add(p)
        p.set_defaults(**({"fn": _call, "entry": fn} if isinstance(fn, str) else {"fn": fn}))
    for name, (task, stage, ref) in TASK_COMMANDS.items():
        help_, fn, groups = TASK_STAGES[stage]
        p = sub.add_parser(name, help=f"{task.title}: {help_}")
        for add in groups:
            add(p)
        for d in task.dirs if stage in STAGES else ():
            p.add_argument(f"--{d}-dir", help=f"the run's {d} directory")
        p.set_defaults(fn=fn, task=task, entry=ref)
    for name, (help_, _) in OWN_PARSERS.items():  # listed here; main() hands them their arguments
        sub.add_parser(name, help=help_, add_help=False)
    return ap


RECORD_IMPORTS = "GRASSFLOW_RECORD_IMPORTS"  # a directory: each command writes the grassflow files it loaded


def _record_imports(directory: str, argv: list[str]) -> None:
    """For the staleness tests: what this command actually imported, beside its argv."""
    files = sorted({m.__file__ for n, m in list(sys.modules.items())
                    if n.split(".")[0] == "grassflow" and getattr(m, "__file__", None)})
    Path(directory).mkdir(parents=True, exist_ok=True)
    (Path(directory) / f"{os.getpid()}.json").write_text(json.dumps({"argv": argv, "files": files}))


def main(argv=None) -> int:
    from grassflow.errors import (
        CheckpointError,
        CommandError,
        ConfigError,
        DataError,
        DiskSpaceError,
        PreflightError,
    )

    argv = sys.argv[1:] if argv is None else list(argv)
    if RECORD_IMPORTS in os.environ:
        import atexit

        atexit.register(_record_imports, os.environ[RECORD_IMPORTS], argv)
    if argv[:1] and argv[0] in OWN_PARSERS:
        entry(OWN_PARSERS[argv[0]][1])(argv[1:])
        return 0
    args = build_parser().parse_args(argv)
    try:
        args.fn(args)
    except (CommandError, DataError, ConfigError, CheckpointError, DiskSpaceError, FileNotFoundError, PreflightError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
