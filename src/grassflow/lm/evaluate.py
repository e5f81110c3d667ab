"""Stage 4, evaluate: perplexities of the best checkpoint on validation and test.

  chunked   the paper's: non-overlapping blocks of L inputs, each predicting its next L tokens
  strided   windows of L moved by L/2; each token is scored once, with ≥ L/2 tokens of context
            (except in the first window)
  word      exp(strided NLL / words), the words counted as lm-evaluation-harness counts them
            (lm.tokenize.harness_word_count), over the split taken as one document. NOT the
            harness's word perplexity, which differs in three ways: it scores disjoint windows of
            L tokens (its rolling loglikelihood, context 1), not windows moved by L/2; it scores
            each article as its own document (so its count has two more empty fields per article,
            and each article restarts its context); and it scores the first token after a prefix
            token, which we do not have (our stream's first token is never scored).
The stream's first token has no context and is never scored; token counts are recorded.
Each definition is checked against a brute-force loop that scores every token with exactly the
context its definition gives it (tests/test_perplexity.py).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from grassflow.io import sha256_file, write_json
from grassflow.lm.data import read_tokens
from grassflow.loop import load_trained
from grassflow.models import build_model, config_from_json
from grassflow.runs import open_for_evaluation
from grassflow.runtime import autocast


@torch.no_grad()
def chunked_nll(model, ids: np.ndarray, L: int, batch_size: int, device) -> tuple[float, int]:
    """(sum of NLL, tokens scored) over non-overlapping blocks of L."""
    n_blocks = (len(ids) - 1) // L
    if n_blocks == 0:
        raise ValueError(f"split has {len(ids)} tokens, fewer than one block of {L}+1")
    data = torch.as_tensor(ids[: n_blocks * L + 1], dtype=torch.long)
    x_all = data[:-1].view(n_blocks, L)
    y_all = data[1:].view(n_blocks, L)
    total = 0.0
    model.eval()
    for i in range(0, n_blocks, batch_size):
        x, y = x_all[i : i + batch_size].to(device), y_all[i : i + batch_size].to(device)
        with autocast(device):
            logits = model(x)
        total += F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1),
                                 reduction="sum").item()
    return total, n_blocks * L


@torch.no_grad()
def strided_nll(model, ids: np.ndarray, L: int, stride: int, batch_size: int, device) -> tuple[float, int]:
    """(sum of NLL, tokens scored) with sliding windows; each target scored exactly once."""
    n = len(ids)
    data = torch.as_tensor(ids, dtype=torch.long)
    windows = []  # (start, first target index scored within the window)
    prev_end = 0  # targets 1..prev_end already scored
    for start in range(0, max(n - 1, 1), stride):
        end = min(start + L, n - 1)  # inputs ids[start:end], targets ids[start+1:end+1]
        if end <= prev_end:
            break
        windows.append((start, end, prev_end - start))
        prev_end = end
        if end == n - 1:
            break
    total, count = 0.0, 0

    def score(logits, start, end, skip):
        nonlocal total, count
        y = data[start + 1 : end + 1].to(device)
        total += F.cross_entropy(logits.float()[skip:], y[skip:], reduction="sum").item()
        count += end - start - skip

    model.eval()
    full = [w for w in windows if w[1] - w[0] == L]  # all but possibly the last window
    for i in range(0, len(full), batch_size):
        part = full[i : i + batch_size]
        with autocast(device):
            logits = model(torch.stack([data[s:e] for s, e, _ in part]).to(device))
        for j, w in enumerate(part):
            score(logits[j], *w)
    for start, end, skip in windows[len(full):]:
        with autocast(device):
            score(model(data[start:end].unsqueeze(0).to(device))[0], start, end, skip)
    return total, count


def perplexities(model, ids, meta, L, batch_size, device) -> dict:
    c_nll, c_n = chunked_nll(model, ids, L, batch_size, device)
    s_nll, s_n = strided_nll(model, ids, L, max(1, L // 2), batch_size, device)
    return {"chunked_ppl": math.exp(c_nll / c_n), "chunked_tokens": c_n,
            "strided_ppl": math.exp(s_nll / s_n), "strided_tokens": s_n,
            "word_ppl": math.exp(s_nll / meta["n_words"]), "n_words": meta["n_words"],
            "n_tokens": meta["n_tokens"]}


def evaluate_run(weights, run_json, val_tokens, test_tokens, out, batch_size=None) -> dict:
    """eval.json for one run: perplexities of its best weights, or its divergence."""
    ckpt, result, evaluable, device = open_for_evaluation(weights, run_json, out)
    if not evaluable:
        return result
    spec = ckpt["spec"]
    cfg = config_from_json(ckpt)
    model = build_model(spec["model_kind"], cfg)
    load_trained(model, ckpt["model"])
    model = model.to(device)
    bs = batch_size or spec["train"]["eval_batch_size"]
    for split, path in (("validation", val_tokens), ("test", test_tokens)):
        ids, meta = read_tokens(path, vocab_size=cfg.vocab_size)
        result[split] = {**perplexities(model, ids, meta, cfg.context_len, bs, device),
                         "tokens_file": str(path), "tokens_sha256": sha256_file(path)}
    write_json(out, result)
    return result
