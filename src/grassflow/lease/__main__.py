"""`python -m grassflow.lease <verb>`: the window's verbs (grassflow.lease's docstring says each one
and its exit codes; bench/gpu_paper_window.sh passes every flag)."""

from __future__ import annotations

import sys

from grassflow import job
from grassflow.lease import Stop

REQ, INT, FLOAT = (
    {"required": True},
    {"type": int, "required": True},
    {"type": float, "required": True},
)
MANY = {"nargs": "*", "default": []}
# the preset as the window's Snakemake reads it: config.yaml first, the overlays, the window's own
PRESET = {"--configfile": MANY, "--preset": REQ, "--overlay": REQ}
TARGETS = {"--targets": {"nargs": "+", "required": True}}
# each verb's flags (argparse's keyword arguments)
VERBS = {
    "tree": {"--manifest": {"default": ".gpu-tree.json"}},
    "overlay": {
        **PRESET,
        "--runs-per-gpu": INT,
        "--threads": INT,
        "--compile": {"default": "choose"},
        "--head-loss": {"default": "choose"},
        "--finished": {"default": ""},
    },
    "gate": {**PRESET, **TARGETS, "--finished": {"default": ""}, "--carry": REQ},
    "device": {"--preflight": REQ, "--expect": REQ},
    "choose": {
        **PRESET,
        **TARGETS,
        "--record": REQ,
        "--train-tokens": REQ,
        "--results": {},
        "--finished": MANY,
        "--seconds": FLOAT,  # the lease's training time left, across its commands
        "--deadline": {"type": float},  # seconds to this command's deadline
        "--lease-end": {"type": float},  # Unix time, recorded for the next command
        "--box": {"type": float, "default": 90.0},
        "--timed-steps": {"type": int, "default": 10},
        "--candidates": {"nargs": "*"},  # compile:head_loss pairs (default: trials.CANDIDATES)
        "--pinned": {"action": "store_true"},  # the one candidate is the user's: its failure is one
        "--seeds": {},  # comma-separated, instead of those that fit
        "--device": {"default": "auto"},
        "--out": REQ,
    },
    "reuse": {**PRESET, **TARGETS, "--record": REQ},
    "targets": {"--record": REQ},
    "left": {"--record": REQ, "--start": FLOAT},
    "budget": {
        **PRESET,
        "--results": REQ,
        "--said": REQ,  # a file of the groups said so far
        "--start": FLOAT,  # the window's start (Unix time)
        "--deadline": FLOAT,  # this command's deadline, seconds of the window
        "--lease": FLOAT,  # the lease's end for training, seconds of the window
    },
    "runs": {"--results": REQ},
}


def parser():
    p = job.parser("grassflow.lease", __doc__)
    verbs = p.add_subparsers(dest="verb", required=True)
    for verb, flags in VERBS.items():
        v = verbs.add_parser(verb)
        for flag, kwargs in flags.items():
            v.add_argument(flag, **kwargs)
    return p


def _verb(name: str):
    """The verb's function, importing only what it needs (torch for choose alone)."""
    if name in ("choose", "reuse"):
        from grassflow.lease import first_minute

        return {"choose": first_minute.decide, "reuse": first_minute.reuse}[name]
    from grassflow.lease import window

    return {
        "tree": window.check_tree,
        "overlay": window.initial_overlay,
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
