"""The fetch_tokenizer stage: save a hub tokenizer as one tokenizer.json where Snakemake runs (on a
cluster, the login node: the only one with internet); every LM and SNLI run reads it."""

import sys

from grassflow import job
from grassflow.data.tokenizers import fetch_tokenizer


def main(argv=None) -> int:
    p = job.parser(__spec__.name, __doc__)
    p.add_argument(
        "--tokenizer", required=True, type=job.json_arg, help="a tokenizer section: " + job.JSON
    )
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    return job.run(fetch_tokenizer, a.tokenizer, a.out)


if __name__ == "__main__":
    sys.exit(main())
