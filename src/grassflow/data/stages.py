"""What the tokenize stages share (the LM's tokenize and documents, SNLI's tokenize): their options
and their loop over the raw splits."""

import sys
from pathlib import Path

from grassflow.job import JSON, json_arg


def tokenize_args(p) -> None:
    p.add_argument(
        "--tokenizer",
        required=True,
        type=json_arg,
        help=(
            "its tokenizer section, with the cut of its splits (LM: eval_max_tokens, SNLI: "
            "max_tokens): "
        )
        + JSON,
    )
    p.add_argument("--artifact", help="trained tokenizer.json (tokenizer.name: trained)")
    p.add_argument("--raw", nargs="+", required=True)
    p.add_argument("--out-dir", required=True)


def tokenize_splits(tokenize, a) -> None:
    """Each raw split by `tokenize(section, raw, out, artifact)`, its counts on stderr."""
    for raw in a.raw:
        meta = tokenize(a.tokenizer, raw, Path(a.out_dir) / Path(raw).name, a.artifact)
        print(
            f"{Path(raw).stem}: "
            + ", ".join(f"{k} {v}" for k, v in meta.items() if isinstance(v, int | float)),
            file=sys.stderr,
        )
