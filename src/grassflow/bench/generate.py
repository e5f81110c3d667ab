"""Decoding measured: `python -m grassflow.bench --generate [--quick]`.

Both models at the paper's Table 1 size (N=6, d=256, L=128, vocab 30,522; --quick: smoke sizes),
untrained (decoding time does not depend on the weights), batch 1, greedy: for each prompt length,
`new` tokens generated incrementally (grassflow.decode: a key/value cache, or Grassmann's last
max(offsets) reduced states) and by recomputing the whole prefix every step, side by side. Prompt
lengths run up to the trained context and one row goes past it (the window slides).

Reported per row: tokens/s of each way and their ratio; the state the incremental decoder holds
after the prompt and at the end (numbers and bytes, over all layers: it is what grows with the
text); on CUDA also the peak memory allocated (torch.cuda.max_memory_allocated). On the CPU PyTorch
keeps no allocator statistics: the state's bytes stand for the memory that differs. Results:
generate-<device>.json/.md.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from grassflow import markdown
from grassflow.bench.common import sync
from grassflow.bench.shapes import QUICK, TABLE1
from grassflow.decode import generate
from grassflow.io import write_json, write_text
from grassflow.models import ModelConfig, build_model
from grassflow.runtime import device_name


def _timed(device, fn):
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sync(device)
    t = time.perf_counter()
    out = fn()
    sync(device)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return time.perf_counter() - t, peak, out


def measure(model, device, prompt_len: int, new: int, repeats: int) -> dict:
    idx = torch.randint(
        0,
        model.cfg.vocab_size,
        (1, prompt_len),
        device=device,
        generator=torch.Generator(device=device).manual_seed(prompt_len),
    )
    states = []
    row = {
        "prompt": prompt_len,
        "new": new,
        "past_context": prompt_len + new > model.cfg.context_len,
    }
    for way, recompute in (("incremental", False), ("recompute", True)):
        generate(model, idx, 2, temperature=0, recompute=recompute)  # warm-up
        best, peak = float("inf"), None
        for _ in range(repeats):
            states.clear()
            seconds, peak, _ = _timed(
                device,
                lambda r=recompute: generate(
                    model,
                    idx,
                    new,
                    temperature=0,
                    recompute=r,
                    on_state=lambda d: states.append(d.state_numel()),
                ),
            )
            best = min(best, seconds)
        row[f"{way}_tokens_per_s"] = new / best
        row[f"{way}_peak_mb"] = peak / 2**20 if peak is not None else None
        if not recompute:
            row["state_after_prompt"], row["state_at_end"] = states[0], states[-1]
    row["speedup"] = row["incremental_tokens_per_s"] / row["recompute_tokens_per_s"]
    row["state_bytes_at_end"] = row["state_at_end"] * next(model.parameters()).element_size()
    return row


def run(device, quick: bool, out: Path, name: str) -> dict:
    shape = QUICK if quick else TABLE1
    vocab, L, n_layers, d = shape["vocab"], shape["L"], shape["n_layers"], shape["d"]
    prompts, new, repeats = ([4, 16, 28], 4, 1) if quick else ([8, 32, 64, 112], 16, 3)
    beyond = (32, 16) if quick else (128, 64)  # a full context, then past it: the window slides
    res = {
        "device": device_name(device),
        "device_type": device.type,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d"),
        "quick": quick,
        "vocab": vocab,
        "context_len": L,
        "n_layers": n_layers,
        "d_model": d,
        "rows": [],
    }
    for kind in ("transformer", "grassmann"):
        cfg = ModelConfig(
            vocab_size=vocab,
            context_len=L,
            n_layers=n_layers,
            d_model=d,
            d_ff=4 * d,
            r=8 if quick else 32,
            lags=(1, 2, 4, 8) if quick else (1, 2, 4, 8, 12, 16),
        )
        torch.manual_seed(0)
        model = build_model(kind, cfg).to(device).eval()
        for p, n in [(p, new) for p in prompts] + [beyond]:
            row = {"model": kind, **measure(model, device, p, n, repeats)}
            res["rows"].append(row)
            print(
                f"generate {kind:11s} prompt {p:4d} +{n}: incremental "
                f"{row['incremental_tokens_per_s']:.1f} tok/s, recompute "
                f"{row['recompute_tokens_per_s']:.1f} tok/s, state {row['state_at_end']:,}",
                flush=True,
            )
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / f"{name}.json", res)
    write_text(out / f"{name}.md", to_markdown(res))
    return res


def to_markdown(res: dict) -> str:
    lines = [
        f"# Decoding: incremental vs recompute — {res['device']}",
        "",
        f"torch {res['torch']}, {res['threads']} threads, {res['date']}; N={res['n_layers']}, "
        f"d={res['d_model']}, context {res['context_len']}, vocab {res['vocab']:,}, batch 1, "
        "greedy, untrained "
        "weights" + (" (--quick: smoke sizes, not a measurement)" if res["quick"] else "") + ". "
        "State: the numbers the incremental decoder holds across steps, over all layers (keys and "
        "values; "
        "Grassmann: the last max(offsets) reduced states). Past the context the window slides "
        "(grassflow.decode).",
        "",
        *markdown.table(
            [
                "model",
                "prompt",
                "new tokens",
                "incremental tok/s",
                "recompute tok/s",
                "speedup",
                "state after prompt",
                "state at end",
                "state at end (KiB)",
            ]
            + (["peak MB (incr. / recompute)"] if res["device_type"] == "cuda" else []),
            [
                [
                    r["model"],
                    r["prompt"],
                    f"{r['new']}" + (" (past the context)" if r["past_context"] else ""),
                    f"{r['incremental_tokens_per_s']:.1f}",
                    f"{r['recompute_tokens_per_s']:.1f}",
                    f"{r['speedup']:.2f}×",
                    f"{r['state_after_prompt']:,}",
                    f"{r['state_at_end']:,}",
                    f"{r['state_bytes_at_end'] / 1024:.0f}",
                ]
                + (
                    [f"{r['incremental_peak_mb']:.0f} / {r['recompute_peak_mb']:.0f}"]
                    if res["device_type"] == "cuda"
                    else []
                )
                for r in res["rows"]
            ],
        ),
    ]
    return "\n".join(lines) + "\n"
