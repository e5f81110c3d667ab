"""Perplexities against brute force: every token scored, in a plain loop, with exactly the context
its definition gives it, on tiny models of both kinds (float64, so that the oracle and the batched
evaluation differ only by the evaluation's fp32 loss: ≤ 1e-6 relative).

  chunked   target t (1 ≤ t ≤ n_blocks·L) sees ids[s:t], s = L·⌊(t−1)/L⌋
  strided   target t (1 ≤ t < n) sees ids[s:t], s = 0 for t ≤ L, else stride·⌈(t−L)/stride⌉
  word      the strided NLL over lm-evaluation-harness's word count, len(re.split(r"\\s+", doc))
  (its
            aggregation, not its windows: grassflow.lm.evaluate says how the harness's number
            differs)
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from grassflow.data.sources import read_rows
from grassflow.lm.data import read_tokens
from grassflow.lm.evaluate import chunked_nll, perplexities, strided_nll
from grassflow.models import ModelConfig, build_model

CPU = torch.device("cpu")


def _model(kind, vocab, L, gen):
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    cfg = ModelConfig(
        vocab_size=vocab,
        context_len=L,
        n_layers=2,
        d_model=16,
        d_ff=32,
        n_heads=2,
        r=4,
        lags=tuple(d for d in (1, 2, 4) if d < L),
        dropout=0.0,
        plucker_backend="reference",
    )
    return build_model(kind, cfg).double().eval()


@torch.no_grad()
def brute_nll(model, ids, targets, start) -> tuple[float, int]:
    """Σ −log p(ids[t] | ids[start(t):t]) over `targets`, one forward per token."""
    total = 0.0
    for t in targets:
        x = torch.as_tensor(ids[start(t) : t], dtype=torch.long)[None]
        total -= torch.log_softmax(model(x)[0, -1].double(), -1)[ids[t]].item()
    return total, len(targets)


def chunked_oracle(model, ids, L):
    n_blocks = (len(ids) - 1) // L
    return brute_nll(model, ids, range(1, n_blocks * L + 1), lambda t: L * ((t - 1) // L))


def strided_oracle(model, ids, L):
    stride = max(1, L // 2)
    return brute_nll(
        model,
        ids,
        range(1, len(ids)),
        lambda t: 0 if t <= L else stride * math.ceil((t - L) / stride),
    )


@pytest.mark.parametrize("kind", ["transformer", "grassmann"])
@pytest.mark.parametrize(
    "L, n, batch",
    [(8, 41, 3), (8, 40, 2), (7, 30, 1), (5, 6, 4), (8, 9, 2), (2, 9, 2)],
    ids=["L8n41", "L8n40-ragged", "L7-odd", "short", "one-block", "L2-stride1"],
)
def test_chunked_and_strided_equal_brute_force(kind, L, n, batch, gen):
    vocab = 23
    model = _model(kind, vocab, L, gen)
    ids = torch.randint(0, vocab, (n,), generator=gen).numpy()
    got, want = chunked_nll(model, ids, L, batch, CPU), chunked_oracle(model, ids, L)
    assert got[1] == want[1] and got[0] == pytest.approx(want[0], rel=1e-6)
    got, want = (
        strided_nll(model, ids, L, max(1, L // 2), batch, CPU),
        strided_oracle(model, ids, L),
    )
    assert got[1] == want[1] == n - 1  # every token but the first, once
    assert got[0] == pytest.approx(want[0], rel=1e-6)


def test_strided_context_differs_from_chunked():
    """The oracles are not one definition twice: from L+1 on, strided targets keep ≥ L/2 of
    context."""
    L, stride = 8, 4
    chunk = [t - L * ((t - 1) // L) for t in range(1, 33)]
    strided = [t - (0 if t <= L else stride * math.ceil((t - L) / stride)) for t in range(1, 33)]
    assert min(chunk[L:]) == 1 and min(strided[L:]) == L - stride + 1 and max(strided) == L


def harness_word_perplexity(items: list[tuple[float, str]]) -> float:
    """lm-evaluation-harness: each document gives (loglikelihood, its original text); word count
    `len(re.split(r"\\s+", doc))`; aggregated by weighted_perplexity, exp(−Σ ll / Σ words)."""
    return math.exp(
        -sum(ll for ll, _ in items) / sum(len(re.split(r"\s+", doc)) for _, doc in items)
    )


@pytest.mark.parametrize("kind", ["transformer", "grassmann"])
def test_word_perplexity_is_the_strided_nll_over_the_harness_word_count(kind, tokens, gen):
    """Through the real token file of a split and its raw rows: the split as one document, its
    strided NLL aggregated as the harness aggregates a document's log-likelihood."""
    ids, meta = read_tokens(tokens / "test.parquet")
    rows = read_rows(tokens / "raw_test.parquet")
    ids = ids[:300]  # the oracle's loop is per token: a leading part of the stream
    meta = {**meta, "n_tokens": len(ids)}
    L = 16
    model = _model(kind, meta["vocab_size"], L, gen)
    res = perplexities(model, ids, meta, L, 4, CPU)
    nll, count = strided_oracle(model, ids, L)
    assert res["strided_tokens"] == count and res["strided_ppl"] == pytest.approx(
        math.exp(nll / count), rel=1e-6
    )
    # the word count in the token file's metadata is the harness's count of the split's text
    _, full_meta = read_tokens(tokens / "test.parquet")
    assert (
        full_meta["n_words"]
        == len(re.split(r"\s+", "".join(rows)))
        == sum(len(r.split()) for r in rows) + 2
    )
    doc = "".join(rows)
    assert res["strided_word_ppl"] == pytest.approx(math.exp(nll / meta["n_words"]), rel=1e-6)
    assert math.exp(nll / full_meta["n_words"]) == pytest.approx(
        harness_word_perplexity([(-nll, doc)]), rel=1e-12
    )


def test_harness_aggregates_documents_by_total_words():
    """Σ over documents, not a mean of per-document perplexities: two documents of 2 and 6 words
    with log-likelihoods −4 and −12 give exp(16 / 8), not the mean of exp(2) and exp(2)… nor of
    anything else."""
    assert harness_word_perplexity([(-4.0, "a b"), (-12.0, "c d e f g h")]) == pytest.approx(
        math.exp(2.0)
    )
    # '' a b ''
    assert harness_word_perplexity([(-1.0, " a b \n")]) == pytest.approx(math.exp(1 / 4))


def test_one_token_stream_has_nothing_to_score():
    model = _model("transformer", 5, 8, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="fewer than one block"):
        chunked_nll(model, np.array([1]), 4, 2, CPU)
