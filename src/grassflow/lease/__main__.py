"""`python -m grassflow.lease <verb>`: the window's verbs (grassflow.lease's docstring)."""

from __future__ import annotations

import sys

from grassflow import job
from grassflow.lease import Stop


def _preset_args(p, targets=True) -> None:
    p.add_argument(
        "--configfile", nargs="*", default=[], help="as snakemake's (config.yaml first, always)"
    )
    p.add_argument("--preset", required=True)
    p.add_argument("--overlay", required=True, help="the window's config overlay (YAML)")
    if targets:
        p.add_argument(
            "--targets",
            nargs="+",
            required=True,
            help="the tables the window makes (table1, table2)",
        )


def parser():
    p = job.parser("grassflow.lease", __doc__)
    verbs = p.add_subparsers(dest="verb", required=True)
    v = verbs.add_parser("tree", help="the copy is the prepared commit's, or a clean checkout")
    v.add_argument(
        "--manifest", default=".gpu-tree.json", help="make gpu-paper-prepare's tree, where it came"
    )
    v = verbs.add_parser("overlay", help="the window's overlay before the first minute")
    _preset_args(v, targets=False)
    v.add_argument("--runs-per-gpu", type=int, required=True)
    v.add_argument("--threads", type=int, required=True)
    v.add_argument("--compile", default="choose")
    v.add_argument("--head-loss", default="choose")
    v.add_argument(
        "--finished", default="", help="records of runs finished in earlier leases (finished_runs)"
    )
    v = verbs.add_parser(
        "gate", help="Snakemake's dry run: only the window's jobs, and something to train"
    )
    _preset_args(v)
    v.add_argument("--finished", default="")
    v.add_argument("--carry", default=".gpu-carry.tar")
    v = verbs.add_parser("device", help="the preflight resolved the lease's device and op backends")
    v.add_argument("--preflight", required=True)
    v.add_argument(
        "--expect", required=True, help="'<device type> <backend>…', as the preflight resolves them"
    )
    for name, help_ in (
        ("choose", "the first minute"),
        ("reuse", "the first command's decision, timing nothing"),
    ):
        v = verbs.add_parser(name, help=help_)
        _preset_args(v)
        v.add_argument(
            "--record", required=True, help="the decision, kept for the lease's next command (JSON)"
        )
        if name == "reuse":
            continue
        v.add_argument("--train-tokens", required=True, help="the tables' training token file")
        v.add_argument(
            "--results", help="the preset's results directory (its last.pt files: progress so far)"
        )
        v.add_argument(
            "--finished",
            nargs="*",
            default=[],
            help="finished_runs: records of runs finished elsewhere",
        )
        v.add_argument(
            "--seconds",
            type=float,
            required=True,
            help="the lease's training time left, across its commands",
        )
        v.add_argument("--deadline", type=float, help="the seconds to this command's deadline")
        v.add_argument(
            "--lease-end",
            type=float,
            help="when the lease's last command must end (Unix time), recorded",
        )
        v.add_argument("--box", type=float, default=90.0, help="seconds for the candidates in all")
        v.add_argument(
            "--timed-steps", type=int, default=10, help="steps each candidate is timed over"
        )
        v.add_argument(
            "--candidates",
            nargs="*",
            help="compile:head_loss pairs (default: the device's CANDIDATES)",
        )
        v.add_argument(
            "--pinned",
            action="store_true",
            help="the one candidate is the user's: its failure is one",
        )
        v.add_argument(
            "--seeds", help="this lease's seeds, comma-separated, instead of those that fit"
        )
        v.add_argument("--device", default="auto")
        v.add_argument("--out", required=True, help="directory for choose-<device>.json and .md")
    v = verbs.add_parser("targets", help="the tables the decision trains")
    v.add_argument("--record", required=True)
    v = verbs.add_parser("left", help="the lease's seconds left, by the first command's record")
    v.add_argument("--record", required=True)
    v.add_argument("--start", type=float, required=True, help="this command's start (Unix time)")
    v = verbs.add_parser("budget", help="each group's projected finish, once its first epoch is in")
    _preset_args(v, targets=False)
    v.add_argument("--results", required=True)
    v.add_argument("--said", required=True, help="a file of the groups said so far")
    v.add_argument("--start", type=float, required=True, help="the window's start (Unix time)")
    v.add_argument(
        "--deadline",
        type=float,
        required=True,
        help="this command's deadline, seconds of the window",
    )
    v.add_argument(
        "--lease",
        type=float,
        required=True,
        help="the lease's end for training, seconds of the window",
    )
    v = verbs.add_parser("runs", help="each run's epochs and best validation PPL so far")
    v.add_argument("--results", required=True)
    return p


def _verb(name: str):
    """The verb's function, importing only what it needs (torch for choose alone)."""
    if name in ("choose", "reuse"):
        from grassflow.lease import first_minute

        return {"choose": first_minute.decide, "reuse": first_minute.reuse}[name]
    from grassflow.lease import window

    return {
        "tree": window.check_tree,
        "overlay": window.write_overlay,
        "gate": window.gate,
        "device": window.check_device,
        "targets": window.targets,
        "left": window.lease_left,
        "budget": window.budget,
        "runs": window.run_progress,
    }[name]


def main(argv=None) -> int:
    a = parser().parse_args(argv)

    def verb():
        try:
            _verb(a.verb)(a)
        except Stop as e:
            job.say_error(f"error: {e}")
            return e.code
        return 0

    return job.run(verb)


if __name__ == "__main__":
    sys.exit(main())
