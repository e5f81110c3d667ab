"""The training step captured as one CUDA graph vs run eagerly, and the LM head's paths.

graph  the loop's own step (grassflow.train_step.TrainStep on the LM task, fused AdamW, the head
       op as training resolves it) at a table's size, eager and replayed, both models: time per
       step, tokens/s, G/T; and whether replay equals eager bitwise at dropout 0 after a few steps.
       CUDA only (a CPU cannot capture: its rehearsal is tests/gpu/test_capture.py).
head   the LM head and its loss (ops/linear_ce), forward + backward, each backend, under the
       device's autocast: reference (on CUDA: bf16 then fp32 logits), chunked (fp32), and on CUDA
       chunked-bf16 and fused (bytes by arithmetic: bench/head_bytes.py).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from grassflow.bench.common import sync, timeit
from grassflow.lm.train import LanguageModelObjective
from grassflow.loop import lr_at, make_optimizer, set_lr
from grassflow.models import ModelConfig, build_model
from grassflow.ops.linear_ce import BACKENDS as HEAD_BACKENDS
from grassflow.ops.linear_ce import linear_cross_entropy
from grassflow.runtime import autocast
from grassflow.train_config import TrainConfig
from grassflow.train_step import WARMUP, EpochLoss, TrainStep

CUDA_HEADS = ("chunked-bf16", "fused")
TCFG = TrainConfig(epochs=1, batch_size=1, lr=1e-3, warmup_frac=0.1)


def _run(device, kind, L, B, n_layers, vocab, capture, steps, dropout, backend="auto"):
    """(seconds per step over `steps` timed steps after the warm-up and capture, the model)."""
    torch.manual_seed(0)
    model = build_model(
        kind,
        ModelConfig(
            vocab_size=vocab,
            context_len=L,
            n_layers=n_layers,
            dropout=dropout,
            plucker_backend=backend,
        ),
    ).to(device)
    ids = np.random.default_rng(0).integers(0, vocab, B * L * 8 + 1)
    task = LanguageModelObjective(ids, ids[: L * 4 + 1], L, B, 0, B, device, "bench")
    opt, _ = make_optimizer(model, TCFG, device, capture=capture)
    losses = EpochLoss(device)
    losses.reset([0.0], 0)
    step = TrainStep(
        model, lambda b: task.loss(model, b), opt, 1.0, device, losses, capture=capture
    )
    total = WARMUP + 1 + steps

    def one(i):
        set_lr(opt, lr_at(i, total, TCFG))
        step(task.batch(0, i % task.steps_per_epoch))

    for i in range(WARMUP + 1):  # eager warm-up, then the capture step
        one(i)
    sync(device)
    t0 = time.perf_counter()
    for i in range(WARMUP + 1, total):
        one(i)
    sync(device)
    return (time.perf_counter() - t0) / steps, model


def bench_graph(device, L, B, n_layers, vocab, steps=30, backend="auto") -> list[dict]:
    if device.type != "cuda":
        return []
    rows = []
    for kind in ("transformer", "grassmann"):
        eager, m_eager = _run(device, kind, L, B, n_layers, vocab, False, steps, 0.0, backend)
        graph, m_graph = _run(device, kind, L, B, n_layers, vocab, True, steps, 0.0, backend)
        bitwise = all(torch.equal(p, q) for p, q in zip(m_eager.parameters(), m_graph.parameters()))
        rows.append(
            {
                "model": kind,
                "L": L,
                "B": B,
                "n_layers": n_layers,
                "eager_s": eager,
                "graph_s": graph,
                "speedup": eager / graph,
                "eager_tok_s": B * L / eager,
                "graph_tok_s": B * L / graph,
                "bitwise_at_dropout_0": bitwise,
            }
        )
        print(
            (
                f"graph {kind:11s}: eager {eager * 1e3:.2f} ms, graph {graph * 1e3:.2f} ms, "
                f"bitwise {bitwise}"
            ),
            flush=True,
        )
    return rows


def bench_head(device, N, V, d) -> list[dict]:
    gen = torch.Generator(device=device).manual_seed(0)
    h = torch.randn(N, d, device=device, generator=gen, requires_grad=True)
    W = (torch.randn(V, d, device=device, generator=gen) * 0.02).requires_grad_()
    y = torch.randint(0, V, (N,), device=device, generator=gen)
    rows, first = [], None
    # chunked-bf16 and fused are CUDA's candidates: a CPU without bf16 matrix units runs their GEMMs
    # many times slower, and fused's kernels run there only through the tests' shim
    for backend in (
        b for b in HEAD_BACKENDS if b != "auto" and (b not in CUDA_HEADS or device.type == "cuda")
    ):

        def step(backend=backend):
            with autocast(device):
                loss = linear_cross_entropy(h, W, y, backend=backend)
            loss.backward()

        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        t = timeit(step, device, repeat=5, best=True)
        peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
        # what it computes against the first backend's (the reference): the loss and both gradients
        with autocast(device):
            loss = linear_cross_entropy(h, W, y, backend=backend)
        got = [loss.detach().float(), *(g.float() for g in torch.autograd.grad(loss, (h, W)))]
        first = first or got
        diff = max(
            ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
            for a, b in zip(got, first)
        )
        rows.append(
            {
                "backend": backend,
                "N": N,
                "V": V,
                "d": d,
                "seconds": t,
                "peak_mem_mb": peak,
                "rel_diff_vs_reference": diff,
            }
        )
        print(
            f"head {backend:13s}: {t * 1e3:.2f} ms, rel. difference from the reference {diff:.1e}",
            flush=True,
        )
    return rows
