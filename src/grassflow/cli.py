"""`grassflow <verb>`: the user's verbs (plan, gpus, runs, diff, check, export, generate, lm-eval,
bench, preflight).

The pipeline's jobs are not here: each stage is its own command line,
`python -m grassflow.<task>.<stage>` (grassflow.job), which its rule's shell runs. Expected failures
(bad data, bad config, missing files) print one `error:` line naming the file or key, and exit 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grassflow.job import ArgumentParser, run


def _gpus(a):
    """Snakemake's flag for K = the preset's train.runs_per_gpu runs per GPU: locally --resources
    for this machine's GPUs × K; on SLURM (--slurm) --group-components packing K runs into each
    allocation, for each group the profile names (nothing for K = 1: one run per allocation, the
    profile's default)."""
    import yaml

    from grassflow.gpu_slots import flag
    from grassflow.pipeline.presets import select_preset
    from grassflow.pipeline.preview import load_config
    from grassflow.pipeline.tasks import pipeline_train

    project = Path(a.project).resolve()
    _, p = select_preset(load_config(project, a.configfile, a.preset))
    k = a.runs_per_gpu or pipeline_train(p)["runs_per_gpu"]
    if a.slurm:
        groups = yaml.safe_load((project / "profiles/slurm/profile.yaml").read_text())["groups"]
        # a run's jobs' group, in the profile's order
        names = dict.fromkeys(g.split("=", 1)[1] for g in groups)
        print(" ".join(["--group-components", *(f"{g}={k}" for g in names)]) if k > 1 else "")
    else:
        print(flag(k))


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


def _mode(a) -> str:
    """How to print: as asked, else a terminal table on a terminal and Markdown where piped."""
    return next(
        (m for m in ("md", "csv", "json") if getattr(a, m, False)),
        "tty" if sys.stdout.isatty() else "md",
    )


def _runs(a):
    from grassflow import compare, terminal

    rows, differ = compare.list_runs(Path(a.dir), a.preset, a.where or ())
    if a.sort:
        rows = compare.sort_rows(rows, a.sort)
    mode, tasks = _mode(a), compare.run_tasks(rows)
    if a.group:
        groups = compare.group_rows(rows)
        if a.sort:
            groups = (
                compare.sort_rows(groups, a.sort) if any(a.sort in g for g in groups) else groups
            )
        if mode == "tty":
            terminal.group_table(
                groups,
                {
                    g["group"]: tasks.get(r["run"])
                    for g in groups
                    for r in rows
                    if Path(r["run"]).name.startswith(g["group"])
                },
            )
        else:
            print(
                json.dumps(groups, indent=1)
                if mode == "json"
                else compare.runs_csv(groups)
                if mode == "csv"
                else compare.runs_markdown(groups, []),
                end="\n" if mode == "json" else "",
            )
        return
    if mode == "tty":
        terminal.runs_table(rows, differ, tasks)
    else:
        print(
            {"json": compare.runs_json, "csv": compare.runs_csv}.get(
                mode, lambda r: compare.runs_markdown(r, differ)
            )(rows),
            end="",
        )


def _diff(a):
    from grassflow import compare, terminal

    if len(a.runs) < 2:
        from grassflow.errors import CommandError

        raise CommandError("diff: give two or more run directories")
    data = compare.diff_data([Path(r) for r in a.runs])
    mode = _mode(a)
    if mode == "tty":
        terminal.diff_table(data)
    elif mode == "json":
        print(json.dumps(data, indent=1))
    else:
        print(compare.diff_markdown(data), end="")


def _check(a):
    """Every run of a results tree, its records checked against each other
    (grassflow.report.agreement): one line per run that disagrees; exit 1 if any does."""
    from grassflow.errors import CommandError
    from grassflow.report.agreement import check_tree

    if not Path(a.dir).is_dir():
        raise CommandError(
            f"{a.dir}: no such directory (a results tree: results/, or a directory of runs)"
        )
    ok, bad, pending = check_tree(a.dir)
    for line in bad:
        print(f"error: {line}")
    for d in pending:
        print(f"not evaluated yet (no eval.json): {d}")
    print(
        f"{len(ok) + len(bad)} evaluated run(s) under {a.dir}: {len(ok)} agree, {len(bad)} do not"
        + (f"; {len(pending)} not evaluated yet" if pending else "")
        + "."
    )
    return 1 if bad else 0


def _export(a):
    from grassflow.export import export_run

    export_run(a.run_dir, a.out_dir, a.tokenizer)


def _generate(a):
    from grassflow.decode import generate_text

    generate_text(
        a.model,
        a.prompt,
        a.max_new_tokens,
        a.temperature,
        a.top_k,
        a.top_p,
        a.seed,
        a.device,
        a.recompute,
        a.tokenizer,
    )


def _modes(p) -> None:
    """The output modes of runs and diff: a terminal table on a terminal, Markdown where piped."""
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--md",
        action="store_true",
        help="Markdown (the default where the output is not a terminal)",
    )
    g.add_argument("--csv", action="store_true", help="CSV")
    g.add_argument(
        "--json", action="store_true", help="JSON: every field of every record, at full precision"
    )


# (command, help, handler, argument groups): the verbs parsed here; a job of the pipeline is its
# stage's own command line (`python -m grassflow.<task>.<stage>`, grassflow.job), never this one
COMMANDS = [
    (
        "gpus",
        "the flag that runs K GPU jobs per GPU: snakemake $(grassflow gpus); on SLURM, K runs per "
        "allocation: snakemake --profile profiles/slurm $(grassflow gpus --slurm)",
        _gpus,
        [
            lambda p: [
                p.add_argument("--preset"),
                p.add_argument("--configfile", nargs="*", default=[]),
                p.add_argument("--project", default="."),
                p.add_argument(
                    "--slurm", action="store_true", help="--group-components for profiles/slurm"
                ),
                p.add_argument(
                    "--runs-per-gpu",
                    type=_checked(int, "≥ 1", lambda v: v >= 1),
                    help="K (default: the preset's train.runs_per_gpu)",
                ),
            ]
        ],
    ),
    # comparing runs, from their records (grassflow.compare)
    (
        "runs",
        "every run under a results tree, a row each: its settings that differ, status, epochs, "
        "parts, figures, commit",
        _runs,
        [
            lambda p: [
                p.add_argument(
                    "dir", nargs="?", default="results", help="a results tree (default results/)"
                ),
                p.add_argument("--preset"),
                p.add_argument(
                    "--where",
                    action="append",
                    metavar="KEY=VALUE",
                    help="keep the runs whose column or dotted spec key is VALUE",
                ),
                p.add_argument(
                    "--sort", metavar="KEY", help="order by a column or a dotted spec key"
                ),
                p.add_argument(
                    "--group",
                    action="store_true",
                    help="pool the runs that differ only in their seed: n, ok, mean ± std",
                ),
            ],
            _modes,
        ],
    ),
    (
        "diff",
        "runs side by side: spec keys that differ, the figures with their differences from the "
        "first run, records, the environment each ran in, the curves",
        _diff,
        [
            lambda p: [
                p.add_argument(
                    "runs", nargs="+", metavar="RUN", help="run directories (two or more)"
                )
            ],
            _modes,
        ],
    ),
    (
        "check",
        "every run of a results tree, its records checked against each other (what a table prints "
        "against what training recorded): vet a shared tree before tabling it",
        _check,
        [
            lambda p: [
                p.add_argument(
                    "dir", nargs="?", default="results", help="a results tree (default results/)"
                )
            ]
        ],
    ),
    # a trained model outside the pipeline (docs/use/using-models.md); no rule runs these
    (
        "export",
        "a language-model run as a model directory: safetensors, config.json, tokenizer, model "
        "card",
        lambda a: _export(a),
        [
            lambda p: [
                p.add_argument("run_dir", help="results/<preset>/runs/<run>"),
                p.add_argument("out_dir"),
                p.add_argument(
                    "--tokenizer",
                    help="its tokenizer.json, where the pipeline's is not beside the run",
                ),
            ]
        ],
    ),
    (
        "generate",
        "continue prompts with a model (an export or a run directory); a prompt longer than the "
        "model's context is cropped to its last context_len tokens, said on stderr",
        lambda a: _generate(a),
        [
            lambda p: [
                p.add_argument("model", help="an export (grassflow export) or a run directory"),
                p.add_argument(
                    "--prompt",
                    required=True,
                    action="append",
                    type=_checked(str, "a non-empty text", lambda v: v.strip()),
                    help="a text to continue; several --prompt: each continued, one batch per "
                    "token length",
                ),
                p.add_argument(
                    "--max-new-tokens", type=_checked(int, "≥ 1", lambda v: v >= 1), default=50
                ),
                p.add_argument(
                    "--temperature",
                    type=_checked(float, "≥ 0", lambda v: v >= 0),
                    default=1.0,
                    help="0: greedy",
                ),
                p.add_argument("--top-k", type=_checked(int, "≥ 1", lambda v: v >= 1)),
                p.add_argument("--top-p", type=_checked(float, "in (0, 1]", lambda v: 0 < v <= 1)),
                p.add_argument("--seed", type=int, default=0),
                p.add_argument("--device", default="cpu", choices=("cpu", "cuda")),
                p.add_argument(
                    "--tokenizer",
                    help="its tokenizer.json, where none is beside the model (an export) "
                    "or where the pipeline keeps it (a run directory)",
                ),
                p.add_argument(
                    "--recompute",
                    action="store_true",
                    help="no cache: every step reads the whole prefix (for comparison)",
                ),
            ]
        ],
    ),
]


def _bench(argv):
    from grassflow.bench import main

    return main(argv)


def _plan(argv):
    from grassflow.pipeline.preview import main

    return main(argv)


def _preflight(argv):
    from grassflow.preflight import main

    return main(argv, prog="grassflow preflight")


def _lm_eval(argv):
    from grassflow.harness import (
        main,  # without the eval extra: MissingExtra, naming the install
    )

    return main(argv)


# command → (help, main): the verbs with their own parsers (their options are not this one's)
OWN_PARSERS = {
    "bench": ("core benchmark (see python -m grassflow.bench -h)", _bench),
    "plan": (
        "a preset's jobs, estimated device-hours and memory before it runs (see grassflow plan -h)",
        _plan,
    ),
    "preflight": (
        "check the device, op backends and a training step before the GPU jobs "
        "(see grassflow preflight -h)",
        _preflight,
    ),
    "lm-eval": (
        "lm-evaluation-harness's command line with --model grassflow (pip install grassflow[eval]; "
        "docs/use/lm-eval.md)",
        _lm_eval,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="grassflow", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, help_, fn, groups in COMMANDS:
        p = sub.add_parser(name, help=help_)
        for add in groups:
            add(p)
        p.set_defaults(fn=fn)
    for name, (help_, _) in OWN_PARSERS.items():  # listed here; main() hands them their arguments
        sub.add_parser(name, help=help_, add_help=False)
    return ap


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] and argv[0] in OWN_PARSERS:
        from grassflow.errors import MissingExtra

        try:
            return run(OWN_PARSERS[argv[0]][1], argv[1:])
        except MissingExtra as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    args = build_parser().parse_args(argv)
    return run(args.fn, args)


if __name__ == "__main__":
    sys.exit(main())
