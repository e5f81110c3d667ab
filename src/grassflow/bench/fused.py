"""A config's seeds fused into one ensemble vs one seed alone (train.fuse_seeds): the loop's own
step (TrainStep on the LM task, fused AdamW, the head op as training resolves it) at a table's size,
S = 1 and S fused members, both models: time per step, tokens/s per member and in all, and the
speed-up per member (S × t₁ / t_S). Measured side by side in one run."""

from __future__ import annotations

import time

import numpy as np

from grassflow.bench.common import sync
from grassflow.lm.train import LanguageModelObjective, build_group
from grassflow.loop import lr_at, make_optimizer, set_lr
from grassflow.models import ModelConfig
from grassflow.train_config import TrainConfig
from grassflow.train_step import EpochLoss, TrainStep

TCFG = TrainConfig(epochs=1, batch_size=1, lr=1e-3, warmup_frac=0.1)


def _seconds_per_step(device, kind, members, L, B, n_layers, vocab, steps, warmup=2) -> float:
    model, _ = build_group(
        kind,
        ModelConfig(vocab_size=vocab, context_len=L, n_layers=n_layers, dropout=0.1),
        range(members),
        device,
    )
    ids = np.random.default_rng(0).integers(0, vocab, B * L * 8 + 1)
    task = LanguageModelObjective(
        ids, ids[: L * 4 + 1], L, B, 0 if members == 1 else list(range(members)), B, device, "bench"
    )
    opt, _ = make_optimizer(model, TCFG, device)
    losses = EpochLoss(device, members)
    losses.reset([0.0] * members, 0)
    step = TrainStep(model, lambda b: task.loss(model, b), opt, 1.0, device, losses)
    for i in range(warmup + steps):
        if i == warmup:
            sync(device)
            t0 = time.perf_counter()
        set_lr(opt, lr_at(i, warmup + steps, TCFG))
        step(task.batch(0, i % task.steps_per_epoch))
    sync(device)
    return (time.perf_counter() - t0) / steps


def bench_fused(device, L, B, n_layers, vocab, members=3, steps=5) -> list[dict]:
    rows = []
    for kind in ("transformer", "grassmann"):
        one = _seconds_per_step(device, kind, 1, L, B, n_layers, vocab, steps)
        fused = _seconds_per_step(device, kind, members, L, B, n_layers, vocab, steps)
        rows.append(
            {
                "model": kind,
                "L": L,
                "B": B,
                "n_layers": n_layers,
                "members": members,
                "one_s": one,
                "fused_s": fused,
                "one_tok_s": B * L / one,
                "fused_tok_s_per_member": B * L / fused,
                "fused_tok_s": members * B * L / fused,
                "speedup_per_member": members * one / fused,
            }
        )
        print(
            f"fused {kind:11s}: 1 seed {one * 1e3:.1f} ms, {members} fused {fused * 1e3:.1f} ms "
            f"({members * one / fused:.2f}x per member)",
            flush=True,
        )
    return rows
