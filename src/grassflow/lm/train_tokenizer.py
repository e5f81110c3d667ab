"""The LM's train_tokenizer stage (tokenizer.name: trained): a WordPiece tokenizer over the rows of
the raw train split."""

import sys

from grassflow import job
from grassflow.data.sources import read_rows
from grassflow.data.tokenizers import build_wordpiece


def train_tokenizer(train, vocab_size: int, out) -> None:
    build_wordpiece(read_rows(train), vocab_size, out, source=train)


def main(argv=None) -> int:
    p = job.parser(__spec__.name, __doc__)
    p.add_argument("--train", required=True, help="the raw train split")
    p.add_argument("--vocab-size", required=True, type=int)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    return job.run(train_tokenizer, a.train, a.vocab_size, a.out)


if __name__ == "__main__":
    sys.exit(main())
