"""Benchmarks of the core: `python -m grassflow.bench [--out DIR] [--quick]`.

All figures are measured side by side in one run and reported as ratios (never as timed
tests). Three parts, written to DIR/bench-<device>.json and .md:
  sgemm  achieved fp32 GEMM rate on this machine: the roof the others are measured against
  op     Plücker op forward+backward, reference vs fast (vs fused-cpu on a CPU, cupy on a GPU)
  step   one AdamW step, GrassmannLM (with each of those op backends) vs TransformerLM
         (N=6, vocab 30,522) at a constant
         B·L tokens per step over a range of L: step time, tokens/s, peak memory; the same
         without the LM head ("trunk": loss on the final-LN states)

Peak memory: on CUDA, torch.cuda.max_memory_allocated over the step. On the CPU, PyTorch
keeps no allocator statistics, so we report the peak of the bytes held by tensors saved for
backward (the activation memory: the only term that differs between the models, since
parameters, gradients and AdamW states are the same size within 0.2 %).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from grassflow.models import ModelConfig, build_model
from grassflow.ops.plucker import cupy_backend, plucker_mix
from grassflow.runtime import autocast, configure_torch, device_name, pick_device

LAGS = (1, 2, 4, 8, 12, 16)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timeit(fn, device, repeat=3, warmup=1, best=False) -> float:
    """Median (or, with best=True, minimum) wall time of fn() in seconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return min(times) if best else statistics.median(times)


def bench_sgemm(device, n) -> dict:
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    t = timeit(lambda: a @ b, device, repeat=5)
    return {"n": n, "seconds": t, "gflops": 2 * n**3 / t / 1e9}


def op_flops(B, T, r, d, n_lags, backend) -> float:
    """Nominal FLOPs of forward+backward: the projections (GEMMs), which dominate."""
    P = r * (r - 1) // 2
    gemm = 2 * B * T * P * d
    return 3 * gemm * (n_lags if backend == "reference" else 1)


def bench_op(device, B, T, r, d) -> list[dict]:
    gen = torch.Generator(device=device).manual_seed(0)
    z = torch.randn(B, T, r, device=device, generator=gen, requires_grad=True)
    W = (torch.randn(d, r * (r - 1) // 2, device=device, generator=gen) / 20).requires_grad_()
    b = torch.zeros(d, device=device, requires_grad=True)
    backends = ["reference", "fast"] + grassmann_backends(device)[1:]
    rows = []
    for backend in backends:
        def step(backend=backend):
            g = plucker_mix(z, LAGS, W, b, backend=backend)
            g.backward(torch.ones_like(g))
        t = timeit(step, device)
        rows.append({"backend": backend, "B": B, "T": T, "r": r, "d": d, "seconds": t,
                     "gflops": op_flops(B, T, r, d, len(LAGS), backend) / t / 1e9})
    ref = rows[0]["seconds"]
    for row in rows:
        row["speedup_vs_reference"] = ref / row["seconds"]
    return rows


class SavedBytes:
    """Bytes of the distinct storages saved for backward, parameters excluded: the CPU
    activation memory, all of which is alive at the end of the forward pass."""

    def __init__(self, params):
        self.params = {p.untyped_storage().data_ptr() for p in params}
        self.saved, self.peak = {}, 0

    def end_step(self):
        self.peak = max(self.peak, sum(self.saved.values()))
        self.saved.clear()

    def pack(self, t):
        key = t.untyped_storage().data_ptr()
        if key not in self.params:
            self.saved[key] = t.untyped_storage().nbytes()
        return t

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)


def grassmann_backends(device) -> list[str]:
    """The op backends worth timing here: `fast` everywhere, plus the device's fused path."""
    if device.type == "cuda":
        return ["fast"] + (["cupy"] if cupy_backend.usable(device) else [])
    return ["fast"] + (["fused-cpu"] if shutil.which(os.environ.get("CXX", "g++")) else [])


def bench_step(device, kind, L, tokens, n_layers, vocab, with_head, backend="auto") -> dict:
    torch.manual_seed(0)
    B = max(1, tokens // L)
    model = build_model(kind, ModelConfig(vocab_size=vocab, context_len=L, n_layers=n_layers,
                                          dropout=0.0, plucker_backend=backend)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, vocab, (B, L + 1), device=device)
    meter = SavedBytes(model.parameters())

    def step():
        with autocast(device), meter.hooks():
            if with_head:
                logits = model(x[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, vocab).float(), x[:, 1:].reshape(-1))
            else:
                loss = model.hidden(x[:, :-1]).float().square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        meter.end_step()

    if device.type == "cuda":
        step()
        torch.cuda.reset_peak_memory_stats(device)
    # best of 5: the 30,522-way head's ~0.5 GB of logits and gradients makes single steps
    # on a shared 2-core machine vary by ±20 %; the minimum is the stable estimate.
    t = timeit(step, device, repeat=5, best=True)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else meter.peak
    return {"model": kind, "backend": backend if kind == "grassmann" else None, "L": L, "B": B,
            "head": with_head, "seconds": t,
            "tokens_per_s": B * L / t, "peak_mem_mb": peak / 2**20,
            "peak_mem_kind": "cuda_max_allocated" if device.type == "cuda" else "saved_activations"}


def step_table(rows) -> list[dict]:
    out = []
    for L in sorted({r["L"] for r in rows}):
        for head in (True, False):
            pick = [r for r in rows if r["L"] == L and r["head"] == head]
            ts = [r for r in pick if r["model"] == "transformer"]
            for g in (r for r in pick if r["model"] == "grassmann"):
                if not ts:
                    continue
                t = ts[0]
                out.append({"L": L, "B": g["B"], "head": head, "backend": g["backend"],
                            "transformer_s": t["seconds"], "grassmann_s": g["seconds"],
                            "time_ratio": g["seconds"] / t["seconds"],
                            "transformer_tok_s": t["tokens_per_s"], "grassmann_tok_s": g["tokens_per_s"],
                            "transformer_mem_mb": t["peak_mem_mb"], "grassmann_mem_mb": g["peak_mem_mb"],
                            "mem_ratio": g["peak_mem_mb"] / max(t["peak_mem_mb"], 1e-9)})
    return out


def to_markdown(res) -> str:
    lines = [f"# Core benchmark — {res['device']}", "",
             f"torch {res['torch']}, {res['threads']} threads, flush-denormal {res['flush_denormal']}; "
             "op: median of 3, training step: best of 5. "
             f"Generated by `python -m grassflow.bench` ({res['date']}).", "",
             f"**sgemm roof**: {res['sgemm']['gflops']:.1f} GFLOP/s (fp32, n={res['sgemm']['n']}).", "",
             "## Plücker op, forward + backward", "",
             "| backend | B | T | r | d | time (ms) | speed-up vs reference | GEMM GFLOP/s | % of sgemm |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in res["op"]:
        lines.append(f"| {r['backend']} | {r['B']} | {r['T']} | {r['r']} | {r['d']} | "
                     f"{r['seconds'] * 1e3:.1f} | {r['speedup_vs_reference']:.2f}× | {r['gflops']:.1f} | "
                     f"{100 * r['gflops'] / res['sgemm']['gflops']:.0f} % |")
    lines += ["", f"## Training step (AdamW), N={res['n_layers']}, vocab {res['vocab']}, "
              f"{res['tokens']} tokens per step", "",
              f"Peak memory: {res['step_rows'][0]['peak_mem_kind'] if res['step_rows'] else ''}.", "",
              "| L | B | LM head | Grassmann op backend | Transformer (s) | Grassmann (s) | time ratio G/T | "
              "Transformer tok/s | Grassmann tok/s | Transformer mem (MB) | Grassmann mem (MB) | mem ratio |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["step"]:
        lines.append(f"| {r['L']} | {r['B']} | {'yes' if r['head'] else 'no'} | {r.get('backend')} | "
                     f"{r['transformer_s']:.3f} | "
                     f"{r['grassmann_s']:.3f} | **{r['time_ratio']:.2f}** | {r['transformer_tok_s']:.0f} | "
                     f"{r['grassmann_tok_s']:.0f} | {r['transformer_mem_mb']:.1f} | "
                     f"{r['grassmann_mem_mb']:.1f} | {r['mem_ratio']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m grassflow.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="reports/bench", help="directory for bench-<device>.json/.md")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                    help="what to time: the device the training jobs use (train.device)")
    ap.add_argument("--lengths", default="128,256,512,1024,2048,4096")
    ap.add_argument("--tokens", type=int, default=4096, help="B·L per training step")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run, not a measurement")
    ap.add_argument("--name", help="file stem (default bench-[quick-]<device>)")
    args = ap.parse_args(argv)

    configure_torch()
    device = pick_device(args.device, log=True)
    q = args.quick
    lengths = [32, 64] if q else [int(x) for x in args.lengths.split(",")]
    tokens, n_layers, vocab = (128, 2, 500) if q else (args.tokens, 6, 30522)
    res = {"device": device_name(device), "device_type": device.type, "torch": torch.__version__,
           "threads": torch.get_num_threads(), "flush_denormal": device.type == "cpu",
           "platform": platform.platform(), "date": time.strftime("%Y-%m-%d"),
           "tokens": tokens, "n_layers": n_layers, "vocab": vocab, "quick": q}
    res["sgemm"] = bench_sgemm(device, 256 if q else 2048)
    res["op"] = bench_op(device, *((2, 32, 8, 16) if q else (32, 256, 32, 256)))
    rows = []
    for L in lengths:
        for with_head in (True, False):
            # side by side: the Transformer, then Grassmann with each op backend, same inputs
            for kind, backend in [("transformer", "auto")] + [("grassmann", b) for b in grassmann_backends(device)]:
                rows.append(bench_step(device, kind, L, tokens, n_layers, vocab, with_head, backend))
                print(f"step {kind:11s} {backend:9s} L={L:5d} head={with_head}: {rows[-1]['seconds']:.3f}s",
                      flush=True)
    res["step_rows"] = rows
    res["step"] = step_table(rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = args.name or "bench-" + ("quick-" if q else "") + device.type
    (out / f"{stem}.json").write_text(json.dumps(res, indent=2))
    (out / f"{stem}.md").write_text(to_markdown(res))
    print(to_markdown(res))
    return res


if __name__ == "__main__":
    main()
