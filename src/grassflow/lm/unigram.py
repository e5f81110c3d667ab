"""The unigram baseline: the perplexity of a split's tokens under the training split's token
frequencies, add-one smoothed over the vocabulary (so unseen tokens have a finite cost). A language
model whose perplexity is not below it has learned nothing beyond token counts; the tables mark such
runs "did not learn". Scored like the models: every token of the stream but the first (which has no
context)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

from grassflow import job
from grassflow.io import sha256_file, write_json
from grassflow.lm.data import read_tokens


def unigram_ppl(train_ids: np.ndarray, eval_ids: np.ndarray, vocab_size: int) -> float:
    counts = np.bincount(train_ids, minlength=vocab_size).astype(np.float64) + 1.0
    logp = np.log(counts) - math.log(counts.sum())
    scored = eval_ids[1:]
    return math.exp(-float(logp[scored].mean())) if scored.size else math.nan


def unigram_baseline(train_tokens, val_tokens, test_tokens, out) -> dict:
    """{split: {unigram_ppl, tokens, tokens_sha256}} for each evaluation split, into `out`."""
    train, meta = read_tokens(train_tokens)
    result = {
        "train_tokens": str(train_tokens),
        "train_tokens_sha256": sha256_file(train_tokens),
        "vocab_size": meta["vocab_size"],
        "smoothing": "add-one",
    }
    for split, path in (("validation", val_tokens), ("test", test_tokens)):
        ids, _ = read_tokens(path, vocab_size=meta["vocab_size"])
        result[split] = {
            "unigram_ppl": unigram_ppl(train, ids, meta["vocab_size"]),
            "tokens": int(ids.size) - 1,
            "tokens_sha256": sha256_file(path),
            "tokens_file": str(Path(path)),
        }
    write_json(out, result)
    return result


def main(argv=None) -> int:
    p = job.parser(__spec__.name, __doc__)
    for split in ("train", "val", "test"):
        p.add_argument(f"--{split}-tokens", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    return job.run(unigram_baseline, a.train_tokens, a.val_tokens, a.test_tokens, a.out)


if __name__ == "__main__":
    sys.exit(main())
