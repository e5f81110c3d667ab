"""The token-level perplexities' windows (grassflow.lm.evaluate defines them): a module of their own
because training's validation (lm/train.py) scores chunked windows too, and what a training job
imports is its code (grassflow.planning.staleness): the evaluation's other code is not."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from grassflow.runtime import autocast


@torch.no_grad()
def chunked_nll(model, ids: np.ndarray, L: int, batch_size: int, device) -> tuple[float, int]:
    """(sum of NLL, tokens scored) over non-overlapping blocks of L."""
    n_blocks = (len(ids) - 1) // L
    if n_blocks == 0:
        raise ValueError(f"split has {len(ids)} tokens, fewer than one block of {L}+1")
    data = torch.as_tensor(ids[: n_blocks * L + 1], dtype=torch.long).to(device)
    x_all = data[:-1].view(n_blocks, L)
    y_all = data[1:].view(n_blocks, L)
    # summed on the device in float64, read once: the same sum as the batches' fp32 sums added on
    # the host, without a wait for the GPU per batch
    total = torch.zeros((), dtype=torch.float64, device=device)
    model.eval()
    for i in range(0, n_blocks, batch_size):
        x, y = x_all[i : i + batch_size], y_all[i : i + batch_size]
        with autocast(device):
            logits = model(x)
        total += F.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum"
        ).double()
    return total.item(), n_blocks * L


@torch.no_grad()
def strided_nll(
    model, ids: np.ndarray, L: int, stride: int, batch_size: int, device
) -> tuple[float, int]:
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
    for start, end, skip in windows[len(full) :]:
        with autocast(device):
            score(model(data[start:end].unsqueeze(0).to(device))[0], start, end, skip)
    return total, count
