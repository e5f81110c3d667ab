"""Command line of the pipeline: `python -m grassflow <command> ...` (or `grassflow`).

The Snakemake rules are thin shells over these commands; a task's stages (train, snli-train,
recall-data, ...) are its own command lines (grassflow.stage), which the rules run directly, so
that no job imports this module. Expected failures (bad data, bad config, missing files) print
one `error:` line naming the file or key, and exit 1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grassflow import fetch, stage
from grassflow.command import ArgumentParser, json_arg, record, required, run, run_expected
from grassflow.stage import AGGREGATE_ARGS, STAGE_COMMANDS
from grassflow.tasks import COMMANDS as TASK_COMMANDS
from grassflow.tasks import TASKS, entry


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


def _baseline_args(p):
    p.add_argument("--unigram", required=True, help="unigram.json of the evaluation tokens")
    p.add_argument("--checksums", required=True, help="the download stage's checksums.json")
    p.add_argument("--published", required=True, help="workflow/resources/published.yaml")


def _checked(kind, allowed: str, ok):
    """An argparse type: `kind` of the value, refused (naming what is allowed) unless ok(value)."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {kind.__name__}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{text!r}: must be {allowed}")
        return value

    return parse


def _preflight_args(p):
    from grassflow.models.config import PLUCKER_BACKENDS

    p.add_argument("--device", nargs="+", default=["auto"], dest="devices", choices=("auto", "cpu", "cuda"),
                   help="train.device value(s)")
    p.add_argument("--backend", nargs="+", default=["auto"], dest="backends", choices=PLUCKER_BACKENDS,
                   help="the Plücker op backend(s) the jobs use")
    p.add_argument("--snli", action="store_true", help="also step both SNLI heads")
    p.add_argument("--out", required=True, help="the JSON record the training jobs keep")


# (command, help, handler or "module:function" (command.call), argument groups): the commands not
# made from a task's declaration; each task's (train, evaluate, aggregate, data, download, tokenize, ...)
# are its stages' command lines (grassflow.stage), and the hub fetches' their own (grassflow.fetch),
# listed by build_parser
COMMANDS = [
    ("unigram", "the unigram-perplexity baseline of the validation and test tokens", "grassflow.lm.unigram:unigram_baseline",
     [required("train-tokens", "val-tokens", "test-tokens", "out")]),
    ("aggregate", "one experiment's table and figures", "grassflow.report.aggregate:aggregate",
     [*AGGREGATE_ARGS, _baseline_args, required("experiment")]),
    ("gpus", "the flag that runs K GPU jobs per GPU: snakemake $(grassflow gpus); on SLURM, K runs per "
     "allocation: snakemake --profile profiles/slurm $(grassflow gpus --slurm)", _gpus,
     [lambda p: [p.add_argument("--preset"), p.add_argument("--configfile", nargs="*", default=[]),
                 p.add_argument("--project", default="."),
                 p.add_argument("--slurm", action="store_true", help="--group-components for profiles/slurm"),
                 p.add_argument("--runs-per-gpu", type=int, help="K (default: the preset's train.runs_per_gpu)")]]),
    ("summary", "summary.md of a preset's tables, and the scaling figure", "grassflow.report.aggregate:summary",
     [required("preset-name", "out-dir"), required("tables", nargs="+", help="the tables' .md files"),
      required("bench", help="bench JSON for the scaling figure")]),
    ("ablations", "the ablation table and figure of a preset", "grassflow.report.ablations:aggregate_ablations",
     [_baseline_args, required("preset", "grid", type=json_arg), required("preset-name", "runs-dir", "out-dir")]),
    ("preflight", "check the device, op backends and a training step before the GPU jobs", "grassflow.preflight:main",
     [_preflight_args]),
    ("estimates", "every training/evaluation job's estimated time beside its measured wall time", "grassflow.plan:estimates_report",
     [required("preset", "estimate", type=json_arg), required("preset-name", "results", "out")]),
    # a trained model outside the pipeline (docs/use/using-models.md); no rule runs these
    ("export", "a language-model run as a model directory: safetensors, config.json, tokenizer, model card",
     "grassflow.export:export_run",
     [lambda p: [p.add_argument("run_dir", help="results/<preset>/runs/<run>"), p.add_argument("out_dir"),
                 p.add_argument("--tokenizer", help="its tokenizer.json, where the pipeline's is not beside the run")]]),
    ("generate", "continue a prompt with a model (an export or a run directory); a prompt longer than the "
     "model's context is cropped to its last context_len tokens, said on stderr", "grassflow.decode:generate_text",
     [lambda p: [p.add_argument("model", help="an export (grassflow export) or a run directory"),
                 p.add_argument("--prompt", required=True, type=_checked(str, "a non-empty text", lambda v: v.strip())),
                 p.add_argument("--max-new-tokens", type=_checked(int, "≥ 1", lambda v: v >= 1), default=50),
                 p.add_argument("--temperature", type=_checked(float, "≥ 0", lambda v: v >= 0), default=1.0,
                                help="0: greedy"),
                 p.add_argument("--top-k", type=_checked(int, "≥ 1", lambda v: v >= 1)),
                 p.add_argument("--top-p", type=_checked(float, "in (0, 1]", lambda v: 0 < v <= 1)),
                 p.add_argument("--seed", type=int, default=0), p.add_argument("--device", default="cpu",
                                                                                 choices=("cpu", "cuda")),
                 p.add_argument("--tokenizer", help="its tokenizer.json, where none is beside the model (an export) "
                                                    "or where the pipeline keeps it (a run directory)"),
                 p.add_argument("--recompute", action="store_true",
                                help="no cache: every step reads the whole prefix (for comparison)")]]),
]


# command → (help, "module:main"): commands with their own parsers (their options are not this one's)
OWN_PARSERS = {
    "bench": ("core benchmark (see python -m grassflow.bench -h)", "grassflow.bench:main"),
    "plan": ("a preset's jobs, estimated device-hours and memory before it runs (see grassflow plan -h)",
             "grassflow.plan:main"),
    "lm-eval": ("lm-evaluation-harness's command line with --model grassflow (pip install grassflow[eval]; "
                "docs/use/lm-eval.md)", "grassflow.lm.harness:main"),
}


def build_parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="grassflow", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    fetch.add_commands(sub, [*COMMANDS, *fetch.COMMANDS])
    # listed here; main() hands their arguments to their own parsers (grassflow.stage's, bench's, plan's)
    for name, (task, stage_, _) in TASK_COMMANDS.items():
        sub.add_parser(name, help=f"{task.title}: {STAGE_COMMANDS[stage_][0]}", add_help=False)
    for name, (help_, _) in OWN_PARSERS.items():
        sub.add_parser(name, help=help_, add_help=False)
    return ap


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] and argv[0] in TASK_COMMANDS:
        task, stage_, _ = TASK_COMMANDS[argv[0]]
        return stage.main([task.name, stage_, *argv[1:]], prog=f"grassflow {argv[0]}")
    record(argv)
    if argv[:1] and argv[0] in OWN_PARSERS:
        from grassflow.errors import MissingExtra

        try:
            command = entry(OWN_PARSERS[argv[0]][1])
        except MissingExtra as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        return run_expected(command, argv[1:])
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
