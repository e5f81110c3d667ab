"""Word-level perplexity as lm-evaluation-harness computes it, without lm-eval: each document
scored by its rolling log-likelihood, words counted by its regex (`len(re.split(r"\\s+", doc))`),
word_perplexity = exp(-Σ loglikelihood / Σ words) over the documents.

Its rolling windows (lm_eval.utils.get_rolling_token_windows with context_len=1, made disjoint),
for a document of n tokens t and a model of context L, written out: the first window reads the
prefix token and t[0:L-1] and scores t[0:L]; each later one scores the next ≤ L tokens t[p:e]
reading the L tokens before e (t[e-L-1:e-1]). So full windows are disjoint blocks of L scored
tokens whose first token sees one token of context; the last, shorter one sees a full window.
grassflow.lm.harness is the harness's model; tests/test_harness.py checks both give the same number.
"""

from __future__ import annotations

import math
import re

import torch
import torch.nn.functional as F

from grassflow.runtime import autocast

# what a document's first token is conditioned on (the harness's prefix token): the first of these
# the tokenizer has (bert-base-uncased: [SEP]; the pipeline's trained tokenizers: [PAD])
PREFIX_TOKENS = ("[SEP]", "[PAD]")


def prefix_id(tokenizer, name: str | None = None) -> int:
    """The prefix token's id: `name`'s, else the first of PREFIX_TOKENS the tokenizer has."""
    for candidate in [name] if name else PREFIX_TOKENS:
        if tokenizer.token_to_id(candidate) is not None:
            return tokenizer.token_to_id(candidate)
    raise ValueError(f"prefix_token: none of {[name] if name else list(PREFIX_TOKENS)} is in the model's tokenizer")


def encode(tokenizer, text: str) -> list[int]:
    """A text's token ids as the pipeline encodes its corpus: no special tokens."""
    return tokenizer.encode(text, add_special_tokens=False).ids


def harness_words(text: str) -> int:
    return len(re.split(r"\s+", text))


def windows(n: int, L: int) -> list[tuple[int, int]]:
    """(start, end) of each window over the document with the prefix token in front (seq =
    [prefix] + t): the model reads seq[start:end] and scores the targets seq[start+1:end+1] that
    no earlier window scored."""
    out = [(0, min(L, n))]
    for p in range(L, n, L):
        end = min(p + L, n)
        out.append((end - L, end))
    return out


@torch.no_grad()
def rolling_loglikelihood(model, ids: list[int], prefix: int, L: int, device) -> float:
    """Σ log p of a document's tokens, scored in the harness's windows."""
    seq = torch.tensor([prefix, *ids], device=device)
    total, done = 0.0, 0  # done: targets seq[1:done+1] scored
    for start, end in windows(len(ids), L):
        with autocast(device):
            logits = model(seq[start:end][None])[0]
        logp = F.log_softmax(logits.float(), dim=-1)
        skip = done - start  # inputs whose targets an earlier window scored
        targets = seq[start + 1 + skip : end + 1]
        total += logp[skip:].gather(1, targets[:, None]).sum().item()
        done = end
    return total


def harness_word_perplexity(model, tokenizer, docs: list[str], L: int, prefix: int, device="cpu") -> dict:
    """{word_perplexity, loglikelihood, words, tokens} of `docs`, each its own document."""
    model.eval()
    device = torch.device(device)
    ll = words = tokens = 0
    for doc in docs:
        ids = encode(tokenizer, doc)
        ll += rolling_loglikelihood(model, ids, prefix, L, device) if ids else 0.0
        words += harness_words(doc)
        tokens += len(ids)
    return {"word_perplexity": math.exp(-ll / words), "loglikelihood": ll, "words": words, "tokens": tokens}
