"""The hub fetches' command line: `python -m grassflow.fetch <command> --...`, what the fetch
rules run where Snakemake runs (workflow/rules/fetch.smk; on a cluster, the login node: the only
one with internet). What they save is an input of every language-model and SNLI run, so a fetch
job's code must be its own alone (grassflow.staleness): not the CLI's dispatch, which loads
every task's planning (grassflow.tasks) and every stage's handlers (grassflow.stage) to list
them, so that an edit there replanned the fetches and, after them, every run they feed.
`grassflow <command>` runs the same rows (cli.py lists them)."""

from __future__ import annotations

import argparse
import sys

from grassflow.command import JSON, call, json_arg, record, required, run

# (command, help, handler or "module:function" (command.call), argument groups), as cli.COMMANDS'
COMMANDS = [
    ("fetch-tokenizer", "save a hub tokenizer as one tokenizer.json (login node)", "grassflow.data.tokenizers:fetch_tokenizer",
     [required("tokenizer", type=json_arg, help="a tokenizer section: " + JSON), required("out")]),
    ("snli-fetch-backbone", "save the pretrained backbone's files (login node)", "grassflow.snli.backbone:fetch_backbone",
     [required("backbone", type=json_arg, help="the snli.backbone section: " + JSON), required("out-dir")]),
]


def add_commands(sub, rows) -> None:
    """A subparser per row (this module's, and the CLI's: grassflow.cli.build_parser)."""
    for name, help_, fn, groups in rows:
        p = sub.add_parser(name, help=help_)
        for add in groups:
            add(p)
        p.set_defaults(**({"fn": call, "entry": fn} if isinstance(fn, str) else {"fn": fn}))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    record(argv)
    ap = argparse.ArgumentParser(prog="python -m grassflow.fetch", description=__doc__.split("\n")[0])
    add_commands(ap.add_subparsers(dest="cmd", required=True), COMMANDS)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
