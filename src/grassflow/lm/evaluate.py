"""Stage 4, evaluate: perplexities of the best checkpoint on validation and test.

  chunked   the paper's: non-overlapping blocks of L inputs, each predicting its next L tokens
  strided   windows of L moved by L/2; each token is scored once, with ≥ L/2 tokens of context
            (except in the first window)
  word      exp(strided NLL / words), the words counted as lm-evaluation-harness counts them
            (lm.tokenize.harness_word_count), over the split taken as one document. NOT the
            harness's word perplexity, which differs in four ways: it scores disjoint windows of
            L tokens (its rolling loglikelihood, context 1), not windows moved by L/2; it scores
            each article as its own document (so its count has two more empty fields per article,
            and each article restarts its context); it scores the first token after a prefix
            token (our stream's first token is never scored); and it scores detokenized text.
  harness   lm-evaluation-harness's word-level perplexity itself (its wikitext task's, on our
            documents: grassflow.lm.rolling), where the documents stage gave the split's
            documents: what the tables' "word-level (lm-eval)" column shows.
The stream's first token has no context and is never scored; token counts are recorded. Each
definition is checked against a brute-force loop that scores every token with exactly the context
its definition gives it (tests/lm/test_perplexity.py).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from grassflow import job, runs
from grassflow.data import DataError
from grassflow.io import sha256_file, write_json
from grassflow.lm.data import read_tokens
from grassflow.lm.perplexity import chunked_nll, strided_nll
from grassflow.lm.rolling import read_documents, word_perplexity
from grassflow.loop import load_trained
from grassflow.models import build_model, config_from_json
from grassflow.run_spec import RunSpec
from grassflow.runs import open_for_evaluation


def perplexities(model, ids, meta, L, batch_size, device) -> dict:
    c_nll, c_n = chunked_nll(model, ids, L, batch_size, device)
    s_nll, s_n = strided_nll(model, ids, L, max(1, L // 2), batch_size, device)
    return {
        "chunked_ppl": math.exp(c_nll / c_n),
        "chunked_tokens": c_n,
        "strided_ppl": math.exp(s_nll / s_n),
        "strided_tokens": s_n,
        "strided_word_ppl": math.exp(s_nll / meta["n_words"]),
        "n_words": meta["n_words"],
        "n_tokens": meta["n_tokens"],
    }


def harness_perplexity(model, docs, token_meta: dict, cfg, batch_size, device) -> dict:
    """lm-evaluation-harness's word-level perplexity of a split's documents file, which must come
    from the same tokenizer as its token file (the model's vocabulary)."""
    ids, words, meta = read_documents(docs)
    if meta.get("tokenizer_sha256") != token_meta.get("tokenizer_sha256"):
        raise DataError(
            f"{docs}: documents of tokenizer {meta.get('tokenizer_sha256')}, not the token "
            f"file's {token_meta.get('tokenizer_sha256')}"
        )
    if any(i >= cfg.vocab_size for d in ids for i in d):
        raise DataError(f"{docs}: token ids beyond the model's vocabulary ({cfg.vocab_size})")
    return word_perplexity(
        model, ids, words, cfg.context_len, meta["prefix_token_id"], batch_size, device
    )


def evaluate_run(
    weights, run_json, val_tokens, test_tokens, out, val_docs=None, test_docs=None, batch_size=None
) -> dict:
    """eval.json for one run: perplexities of its best weights, or its divergence; with the splits'
    documents (the documents stage), each split's `harness` block: lm-evaluation-harness's
    word-level perplexity (grassflow.lm.rolling)."""
    ckpt, result, evaluable, device = open_for_evaluation(weights, run_json, out)
    if not evaluable:
        return result
    spec = RunSpec.from_dict(ckpt["spec"])
    cfg = config_from_json(
        {k: v for k, v in ckpt.items() if k != "model"}, Path(weights).parent / "config.json"
    )
    model = build_model(spec.model_kind, cfg)
    load_trained(model, ckpt["model"])
    model = model.to(device)
    bs = batch_size or spec.train.eval_batch_size
    for split, path, docs in (
        ("validation", val_tokens, val_docs),
        ("test", test_tokens, test_docs),
    ):
        ids, meta = read_tokens(path, vocab_size=cfg.vocab_size)
        result[split] = {
            **perplexities(model, ids, meta, cfg.context_len, bs, device),
            "tokens_file": str(path),
            "tokens_sha256": sha256_file(path),
        }
        if docs:
            result[split]["harness"] = {
                **harness_perplexity(model, docs, meta, cfg, bs, device),
                "docs_file": str(docs),
                "docs_sha256": sha256_file(docs),
            }
    write_json(out, result)
    return result


def main(argv=None) -> int:
    p = job.parser(__spec__.name, __doc__)
    runs.evaluate_args(p)
    for split in ("val", "test"):
        p.add_argument(
            f"--{split}-docs",
            help="the split's documents (the documents stage): its word-level "
            "perplexity as lm-evaluation-harness's (without them, eval.json has none)",
        )
    a = p.parse_args(argv)
    return job.run(
        evaluate_run,
        a.weights,
        a.run_json,
        a.val_tokens,
        a.test_tokens,
        a.out,
        a.val_docs,
        a.test_docs,
    )


if __name__ == "__main__":
    sys.exit(main())
