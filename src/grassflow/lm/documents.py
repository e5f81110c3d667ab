"""The LM's documents stage: the validation and test splits as lm-evaluation-harness's documents,
which its evaluate jobs score for the harness's word-level perplexity (grassflow.lm.rolling)."""

import sys

from grassflow import job
from grassflow.data.stages import tokenize_args, tokenize_splits
from grassflow.lm.rolling import documents_split


def main(argv=None) -> int:
    p = job.parser(__spec__.name, __doc__)
    tokenize_args(p)
    return job.run(tokenize_splits, documents_split, p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
