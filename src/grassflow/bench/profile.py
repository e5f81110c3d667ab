"""One training step of each model under torch.profiler (`python -m grassflow.bench --profile`): the
top kernels by device time, the kernels launched per step, and the host's share of the step (the
part of its wall time in which the device had no kernel running). The step is the loop's own
(TrainStep on the LM task at the paper's Table 1 size), after the warm-up (and the capture, under
train.compile graph); on a CPU the top ops by CPU time."""

from __future__ import annotations

import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from grassflow import markdown
from grassflow.bench.common import sync
from grassflow.bench.shapes import QUICK, TABLE1
from grassflow.compiled import resolve
from grassflow.lm.train import LanguageModelObjective
from grassflow.loop import make_optimizer, set_lr
from grassflow.models import ModelConfig, build_model
from grassflow.train_config import TrainConfig
from grassflow.train_step import WARMUP, EpochLoss, TrainStep

TOP = 15


def _step(device, kind, L, B, n_layers, vocab, capture):
    torch.manual_seed(0)
    model = build_model(kind, ModelConfig(vocab_size=vocab, context_len=L, n_layers=n_layers)).to(
        device
    )
    ids = np.random.default_rng(0).integers(0, vocab, B * L * 8 + 1)
    task = LanguageModelObjective(ids, ids[: L * 4 + 1], L, B, 0, B, device, "profile")
    opt, _ = make_optimizer(
        model, TrainConfig(epochs=1, batch_size=1, lr=1e-4), device, capture=capture
    )
    losses = EpochLoss(device)
    losses.reset([0.0], 0)
    step = TrainStep(
        model, lambda b: task.loss(model, b), opt, 1.0, device, losses, capture=capture
    )
    counter = iter(range(10**9))

    def one():
        set_lr(opt, 1e-4)
        step(task.batch(0, next(counter) % task.steps_per_epoch))

    return one


def profile_step(device, kind, L, B, n_layers, vocab, compile_setting="auto", steps=3) -> dict:
    capture = resolve(compile_setting, device) == "graph"
    one = _step(device, kind, L, B, n_layers, vocab, capture)
    for _ in range(WARMUP + 2):
        one()
    sync(device)
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            one()
        sync(device)
        wall = (time.perf_counter() - t0) / steps
    avg = prof.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    top = sorted(avg, key=lambda e: getattr(e, key), reverse=True)[:TOP]
    total = sum(getattr(e, key) for e in avg) / steps / 1e6
    kernels = [e for e in prof.events() if cuda and e.device_type.name == "CUDA"]
    busy = sum(e.device_time for e in kernels) / steps / 1e6 if cuda else None
    return {
        "model": kind,
        "L": L,
        "B": B,
        "n_layers": n_layers,
        "vocab": vocab,
        "capture": capture,
        "wall_s": wall,
        "tokens_per_s": B * L / wall,
        "device_busy_s": busy,
        "host_share": None if busy is None else max(0.0, 1 - busy / wall),
        "launches_per_step": len(kernels) / steps if cuda else None,
        "top": [
            {
                "name": e.key,
                "s_per_step": getattr(e, key) / steps / 1e6,
                "share": getattr(e, key) / steps / 1e6 / max(total, 1e-12),
                "calls_per_step": e.count / steps,
            }
            for e in top
        ],
    }


def to_markdown(res) -> str:
    lines = [
        f"# One training step under torch.profiler — {res['device']}",
        "",
        f"torch {res['torch']}, {res['date']}; `python -m grassflow.bench --profile` "
        f"(train.compile {res['compile']}). Table 1 size: N={res['rows'][0]['n_layers']}, "
        f"L={res['rows'][0]['L']}, B={res['rows'][0]['B']}, vocab {res['rows'][0]['vocab']}; the "
        "mean over the profiled steps.",
        "",
    ]
    for row in res["rows"]:
        head = (
            f"## {row['model']}{' (captured)' if row['capture'] else ''}: "
            f"{row['wall_s'] * 1e3:.2f} ms per step, {row['tokens_per_s']:,.0f} tokens/s"
        )
        lines += [head, ""]
        if row["launches_per_step"] is not None:
            lines += [
                f"{row['launches_per_step']:.0f} kernels per step; the device busy "
                f"{row['device_busy_s'] * 1e3:.2f} ms of it, the host's share "
                f"{100 * row['host_share']:.0f} %.",
                "",
            ]
        lines += [
            *markdown.table(
                ["op / kernel", "ms per step", "share", "calls per step"],
                [
                    [
                        f"`{t['name'][:80]}`",
                        f"{t['s_per_step'] * 1e3:.3f}",
                        f"{100 * t['share']:.1f} %",
                        f"{t['calls_per_step']:.0f}",
                    ]
                    for t in row["top"]
                ],
            ),
            "",
        ]
    return "\n".join(lines) + "\n"


def run(device, quick, out, name, compile_setting):
    from grassflow.runtime import device_name

    shape = QUICK if quick else TABLE1
    L, B, n_layers, vocab = shape["L"], shape["B"], shape["n_layers"], shape["vocab"]
    rows = [
        profile_step(device, kind, L, B, n_layers, vocab, compile_setting)
        for kind in ("transformer", "grassmann")
    ]
    res = {
        "device": device_name(device),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "compile": compile_setting,
        "quick": quick,
        "rows": rows,
    }
    markdown.save_report(out, name, res, to_markdown(res))
    return res
