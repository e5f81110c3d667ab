"""SNLI's tokenize stage: raw pairs to token-id parquet files (grassflow.snli.data)."""

import sys

from grassflow import job
from grassflow.data.stages import tokenize_args, tokenize_splits
from grassflow.snli.data import tokenize_split


def main(argv=None) -> int:
    p = job.parser(__spec__.name, __doc__)
    tokenize_args(p)
    return job.run(tokenize_splits, tokenize_split, p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
