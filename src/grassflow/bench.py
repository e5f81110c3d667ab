"""Benchmarks of the core: `python -m grassflow.bench [--out DIR] [--quick]`.

All figures are measured side by side in one run and reported as ratios (never as timed
tests). Parts, written to DIR/bench-<device>.json and .md:
  sgemm     achieved fp32 GEMM rate on this machine: the roof the others are measured against
  op        Plücker op forward+backward, reference vs fast (vs fused-cpu on a CPU, cupy on a GPU)
  settings  the training step at the shortest L, both models: default vs fused AdamW, the
            reference LM head + loss vs the head op, eager vs compiled: time, tokens/s, G/T, memory
  launches  per layer and training step: the Plücker op's kernel launches, ATen ops per block
  peer      (--peer) kanenorman/grassmann's Grassmann step beside ours (bench_peer.py)
  --generate  instead of the parts: decoding, incremental vs recompute (bench_generate.py)
  --concurrency 1,2,4,8  instead of the parts: K Table 1 runs side by side on the device,
            aggregate tokens/s per K, with and (--mps) without CUDA MPS (bench_concurrency.py)
  step      one AdamW step as training takes it, GrassmannLM (with each op backend) vs
            TransformerLM (N=6, vocab 30,522) at a constant B·L tokens per step over a range
            of L: step time, tokens/s, peak memory; the same without the LM head ("trunk":
            loss on the final-LN states)

Peak memory: on CUDA, torch.cuda.max_memory_allocated over the step. On the CPU, PyTorch
keeps no allocator statistics, so we report the peak of the bytes held by tensors saved for
backward (the activation memory: the only term that differs between the models, since
parameters, gradients and AdamW states are the same size within 0.2 %).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import time
from pathlib import Path

import torch

from grassflow import gpu_slots, markdown
from grassflow.bench_peer import peer_step
from grassflow.compiled import Compiled
from grassflow.loop import make_optimizer
from grassflow.models import ModelConfig, build_model
from grassflow.ops.linear_ce import linear_cross_entropy
from grassflow.ops.linear_ce import resolve as resolve_head_loss
from grassflow.ops.plucker import cupy_backend, plucker_mix
from grassflow.ops.plucker.kernel_stages import KernelStages
from grassflow.runtime import autocast, claim_device, configure_torch, device_name

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


def training_step(device, kind, L, tokens, n_layers, vocab, with_head, backend="auto", *, compile=False,
                  optimizer="train", head_loss="auto", dropout=0.0):
    """One training step as the training loop takes it, as a function: make_optimizer's AdamW
    (`train`: fused where the loop uses it; `default`: PyTorch's default form), the LM loss of
    the LM task (its head and loss as one op, ops.linear_ce, `head_loss` backend) or, without the
    head, a loss on the final-LN states; eager or compiled (grassflow.compiled). Returns
    (step, facts about it, the saved-bytes meter)."""
    torch.manual_seed(0)
    B = max(1, tokens // L)
    model = build_model(kind, ModelConfig(vocab_size=vocab, context_len=L, n_layers=n_layers,
                                          dropout=dropout, plucker_backend=backend)).to(device)
    tcfg = {"lr": 1e-4, "betas": (0.9, 0.95), "weight_decay": 0.01}
    if optimizer == "train":
        opt, opt_impl = make_optimizer(model, tcfg, device)
    else:
        opt, opt_impl = torch.optim.AdamW(model.parameters(), lr=1e-4), "default"
    x = torch.randint(0, vocab, (B, L + 1), device=device)
    meter = SavedBytes(model.parameters())

    class StepTask:
        def loss(self, model, x):
            h = model.hidden(x[:, :-1])
            if not with_head:
                return h.float().square().mean()
            return linear_cross_entropy(h.reshape(B * L, -1), model.head.weight, x[:, 1:].reshape(-1),
                                        backend=head_loss)

    compiled = Compiled(model, StepTask(), compile, "default", device)

    def step():
        with autocast(device), meter.hooks():
            loss = compiled.loss(x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        meter.end_step()

    facts = {"model": kind, "backend": backend if kind == "grassmann" else None, "L": L, "B": B, "head": with_head,
             "compile": compiled.enabled, "optimizer": opt_impl,
             "head_loss": resolve_head_loss(head_loss, device) if with_head else None}
    return step, facts, meter


def bench_step(device, kind, L, tokens, n_layers, vocab, with_head, backend="auto", **kw) -> dict:
    """The time, tokens/s and peak memory of training_step (same arguments)."""
    step, facts, meter = training_step(device, kind, L, tokens, n_layers, vocab, with_head, backend, **kw)
    step()  # the first step compiles (if it does) and allocates AdamW's state
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    # best of 5: the 30,522-way head's ~0.5 GB of logits and gradients makes single steps
    # on a shared 2-core machine vary by ±20 %; the minimum is the stable estimate.
    t = timeit(step, device, repeat=5, best=True, warmup=0)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else meter.peak
    return {**facts, "seconds": t, "tokens_per_s": facts["B"] * L / t, "peak_mem_mb": peak / 2**20,
            "peak_mem_kind": "cuda_max_allocated" if device.type == "cuda" else "saved_activations"}


def bench_settings(device, L, tokens, n_layers, vocab, compile=True) -> list[dict]:
    """The training step's settings side by side (with the head, dropout 0.1 as in training):
    before this project's step work (default AdamW, reference head), then each change."""
    backend = grassmann_backends(device)[-1]
    settings = [("default AdamW, reference head", {"optimizer": "default", "head_loss": "reference"}),
                ("fused AdamW, reference head", {"head_loss": "reference"}),
                ("fused AdamW, head op auto", {})]
    if compile:  # not in a --quick smoke run: compiling costs a minute on 2 cores
        settings.append(("compiled, fused AdamW, head op auto", {"compile": True}))
    rows = []
    for label, kw in settings:
        for kind in ("transformer", "grassmann"):
            row = bench_step(device, kind, L, tokens, n_layers, vocab, True, backend if kind == "grassmann" else "auto",
                             dropout=0.1, **kw)
            rows.append({"setting": label, **row})
            print(f"settings {label:38s} {kind:11s}: {row['seconds']:.3f}s", flush=True)
    return rows


def count_launches(device, r=32, d=256, T=128, B=2) -> dict:
    """Per layer and training step (forward + backward): the Plücker op's own kernel launches,
    and every ATen op (each one kernel launch, or more, on a GPU) of one Grassmann block and
    one Transformer block, views excluded."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view:
                self.n += 1
            return func(*args, **(kwargs or {}))

    backend = "cupy" if device.type == "cuda" and cupy_backend.usable(device) else "kernel-cpu"
    out = {"plucker_backend": backend}
    for kind in ("grassmann", "transformer"):
        cfg = ModelConfig(vocab_size=64, context_len=T, n_layers=1, d_model=d, r=r, dropout=0.0,
                          lags=tuple(lag for lag in LAGS if lag < T), plucker_backend=backend)
        block = build_model(kind, cfg).blocks[0].to(device)
        h = torch.randn(B, T, d, device=device, requires_grad=True)
        block(h).square().mean().backward()  # warm-up: what is made once per shape is not counted
        block.zero_grad(set_to_none=True)
        h.grad = None
        before = KernelStages.launches.copy()
        with Ops() as ops:
            block(h).square().mean().backward()
        out[kind] = {"aten_ops": ops.n}
        if kind == "grassmann":
            out[kind]["plucker_kernels"] = dict(KernelStages.launches - before)
    return out


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
             "op: median of 3, training step: best of 5, after one step that compiles (where it does) "
             f"and allocates AdamW's state. Generated by `python -m grassflow.bench` ({res['date']}).", "",
             f"**sgemm roof**: {res['sgemm']['gflops']:.1f} GFLOP/s (fp32, n={res['sgemm']['n']}).", ""]
    if res.get("op"):
        lines += ["## Plücker op, forward + backward", "", *markdown.table(
            ["backend", "B", "T", "r", "d", "time (ms)", "speed-up vs reference", "GEMM GFLOP/s", "% of sgemm"],
            [[r["backend"], r["B"], r["T"], r["r"], r["d"], f"{r['seconds'] * 1e3:.1f}", f"{r['speedup_vs_reference']:.2f}×",
              f"{r['gflops']:.1f}", f"{100 * r['gflops'] / res['sgemm']['gflops']:.0f} %"] for r in res["op"]]), ""]
    if res.get("settings"):
        rows = res["settings"]
        r0 = rows[0]
        lines += [f"## The training step's settings, side by side (L={r0['L']}, B={r0['B']}, N={res['n_layers']}, "
                  f"vocab {res['vocab']}, with the LM head, dropout 0.1)", "",
                  "Each row changes one thing from the row above. Head op: the LM head and its loss as one "
                  "op (`ops/linear_ce`); `auto` is what training uses on this device.", ""]
        first = {r["model"]: r["seconds"] for r in rows if r["setting"] == r0["setting"]}
        pairs = [[next(r for r in rows if r["setting"] == label and r["model"] == m) for m in ("transformer", "grassmann")]
                 for label in dict.fromkeys(r["setting"] for r in rows)]
        lines += [*markdown.table(
            ["setting", "Transformer (s)", "Grassmann (s)", "G/T", "Transformer tok/s", "Grassmann tok/s",
             "speed-up vs first row (T / G)", "Grassmann mem (MB)"],
            [[f"{g['setting']} ({g['optimizer']}, head {g['head_loss']}, {'compiled' if g['compile'] else 'eager'}, "
              f"op {g['backend']})", f"{t['seconds']:.3f}", f"{g['seconds']:.3f}", f"**{g['seconds'] / t['seconds']:.2f}**",
              f"{t['tokens_per_s']:.0f}", f"{g['tokens_per_s']:.0f}",
              f"{first['transformer'] / t['seconds']:.2f}× / {first['grassmann'] / g['seconds']:.2f}×",
              f"{g['peak_mem_mb']:.1f}"] for t, g in pairs]), ""]
    if res.get("peer"):
        peer = res["peer"][0]
        lines += ["## Against a public reimplementation (same machine, same run)", "",
                  "kanenorman/grassmann's GrassmannLM step as its train.py takes it, beside ours as our training "
                  "loop takes it (N=6, L=128, B=32, vocab 30,522, dropout 0.1).", "", *markdown.table(
                      ["Grassmann step", "time (s)", "tokens/s", "speed-up vs kanenorman"],
                      [[peer["model"], f"{peer['seconds']:.3f}", f"{peer['tokens_per_s']:.0f}", "1.00×"]]
                      + [[f"ours, op {r['backend']} ({r['optimizer']}, head {r['head_loss']})", f"{r['seconds']:.3f}",
                          f"{r['tokens_per_s']:.0f}", f"**{peer['seconds'] / r['seconds']:.2f}×**"] for r in res["peer"][1:]]),
                  ""]
    if res.get("launches"):
        la = res["launches"]
        g = la["grassmann"]
        kernels = ", ".join(f"{k} {v}" for k, v in g["plucker_kernels"].items())
        lines += ["## Launches per layer and training step (forward + backward)", "",
                  f"The Plücker op's own kernels ({la['plucker_backend']}, the `cupy` backend's launch plan): "
                  f"{sum(g['plucker_kernels'].values())} ({kernels}). ATen ops of one block (each at least one "
                  f"kernel on a GPU; views excluded): Grassmann {g['aten_ops']}, Transformer "
                  f"{la['transformer']['aten_ops']}.", ""]
    if res.get("step"):
        lines += [f"## Training step (AdamW), N={res['n_layers']}, vocab {res['vocab']}, "
                  f"{res['tokens']} tokens per step", "",
                  "With the training loop's settings (the last eager row above), dropout 0.", "",
                  f"Peak memory: {res['step_rows'][0]['peak_mem_kind'] if res['step_rows'] else ''}.", "", *markdown.table(
                      ["L", "B", "LM head", "Grassmann op backend", "Transformer (s)", "Grassmann (s)", "time ratio G/T",
                       "Transformer tok/s", "Grassmann tok/s", "Transformer mem (MB)", "Grassmann mem (MB)", "mem ratio"],
                      [[r["L"], r["B"], "yes" if r["head"] else "no", r.get("backend"), f"{r['transformer_s']:.3f}",
                        f"{r['grassmann_s']:.3f}", f"**{r['time_ratio']:.2f}**", f"{r['transformer_tok_s']:.0f}",
                        f"{r['grassmann_tok_s']:.0f}", f"{r['transformer_mem_mb']:.1f}", f"{r['grassmann_mem_mb']:.1f}",
                        f"{r['mem_ratio']:.2f}"] for r in res["step"]])]
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
    ap.add_argument("--peer", help="a checkout of kanenorman/grassmann: its Grassmann step beside ours (L=128, "
                                   "B=32; with --quick the smoke sizes)")
    ap.add_argument("--parts", default="op,step,settings,launches",
                    help="comma-separated parts to run (op, step, settings, launches)")
    ap.add_argument("--concurrency", help="instead of the parts: K runs side by side for each K listed, e.g. "
                                          "1,2,4,8 (bench_concurrency.py)")
    ap.add_argument("--steps", type=int, default=50, help="--concurrency: timed steps per run")
    ap.add_argument("--mps", action="store_true", help="--concurrency: each K > 1 again under CUDA MPS")
    ap.add_argument("--generate", action="store_true", help="instead of the parts: decoding, incremental vs "
                                                            "recompute, both models (bench_generate.py)")
    args = ap.parse_args(argv)

    configure_torch()
    device = claim_device(args.device, log=True, exclusive=True)  # it times the device: alone on it
    if args.concurrency:
        from grassflow.bench_concurrency import run

        return run(device, [int(k) for k in args.concurrency.split(",")], args.steps, args.quick, args.mps,
                   Path(args.out), args.name or "concurrency-" + ("quick-" if args.quick else "") + device.type)
    if args.generate:
        from grassflow.bench_generate import run as run_generate

        return run_generate(device, args.quick, Path(args.out),
                            args.name or "generate-" + ("quick-" if args.quick else "") + device.type)
    q = args.quick
    parts = set(args.parts.split(","))
    lengths = [32, 64] if q else [int(x) for x in args.lengths.split(",")]
    tokens, n_layers, vocab = (128, 2, 500) if q else (args.tokens, 6, 30522)
    res = {"device": device_name(device), "device_type": device.type, "torch": torch.__version__,
           "threads": torch.get_num_threads(), "flush_denormal": device.type == "cpu",
           "platform": platform.platform(), "date": time.strftime("%Y-%m-%d"),
           "tokens": tokens, "n_layers": n_layers, "vocab": vocab, "quick": q}
    res["sgemm"] = bench_sgemm(device, 256 if q else 2048)
    if "op" in parts:
        res["op"] = bench_op(device, *((2, 32, 8, 16) if q else (32, 256, 32, 256)))
    if "launches" in parts:
        res["launches"] = count_launches(device, *((8, 16, 32, 2) if q else (32, 256, 128, 2)))
    if "settings" in parts:
        res["settings"] = bench_settings(device, lengths[0], tokens, n_layers, vocab, compile=not q)
    if args.peer:  # the paper's Table 1 step (L=128, B=32); --quick: the smoke sizes
        L, B = (32, 4) if q else (128, 32)
        res["peer"] = [peer_step(args.peer, device, L, B, vocab, n_layers, timeit)]
        for backend in grassmann_backends(device):
            res["peer"].append({"ours": True, **bench_step(device, "grassmann", L, B * L, n_layers, vocab, True,
                                                            backend, dropout=0.1)})
    if "step" in parts:
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
    res["gpu_slot"] = gpu_slots.current()  # every slot of its GPU, for all the timing above
    if res["gpu_slot"]:
        res["gpu_slot"]["finished_at"] = time.time()
    markdown.save_report(args.out, args.name or "bench-" + ("quick-" if q else "") + device.type, res, to_markdown(res))
    return res


if __name__ == "__main__":
    main()
