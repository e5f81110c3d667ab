"""Benchmarks: `python -m grassflow.bench [--out DIR] [--quick]` (this package's main).

All figures are measured side by side in one run and reported as ratios (never as timed tests).
Parts, written to DIR/bench-<device>.json and .md:
  sgemm     achieved fp32 GEMM rate on this machine: the roof the others are measured against
  op        Plücker op forward+backward, reference vs fast (vs fused-cpu on a CPU, cupy on a GPU)
  settings  the training step at the shortest L, both models: default vs fused AdamW, the
            reference LM head + loss vs the head op, eager vs compiled: time, tokens/s, G/T, memory
  launches  per layer and training step: the Plücker op's kernel launches, ATen ops per block
  kernels   old (441a7fd) vs new Plücker kernels through the same interface (bench/kernels.py)
  graph     the training step eager vs captured as one CUDA graph, and bitwise? (bench/graph.py)
  head      the LM head and its loss: reference, chunked, and on CUDA chunked-bf16, fused
  (bench/graph.py)
  fused     a config's 3 seeds as one ensemble vs one seed: tokens/s per member and in all
  (bench/fused.py)
  --profile   instead of the parts: one step of each model under torch.profiler (bench/profile.py)
  peer      (--peer) kanenorman/grassmann's Grassmann step beside ours (bench/peer.py)
  --generate  instead of the parts: decoding, incremental vs recompute (bench/generate.py)
  --concurrency 1,2,4,8  instead of the parts: K Table 1 runs side by side on the device,
            aggregate tokens/s per K, with and (--mps) without CUDA MPS (bench/concurrency.py)
  step      one AdamW step as training takes it, GrassmannLM (with each op backend) vs
            TransformerLM (N=6, vocab 30,522) at a constant B·L tokens per step over a range
            of L: step time, tokens/s, peak memory; the same without the LM head ("trunk":
            loss on the final-LN states)

Peak memory: on CUDA, torch.cuda.max_memory_allocated over the step. On the CPU, PyTorch keeps no
allocator statistics, so we report the peak of the bytes held by tensors saved for backward (the
activation memory: the only term that differs between the models, since parameters, gradients and
AdamW states are the same size within 0.2 %).
"""

from __future__ import annotations

import platform
import time
from pathlib import Path

import torch

from grassflow import gpu_slots, markdown
from grassflow.bench.common import bench_step, grassmann_backends, timeit
from grassflow.bench.core import (
    bench_op,
    bench_settings,
    bench_sgemm,
    count_launches,
    step_table,
    to_markdown,
)
from grassflow.bench.fused import bench_fused
from grassflow.bench.graph import bench_graph, bench_head
from grassflow.bench.kernels import bench_kernels
from grassflow.bench.peer import peer_step
from grassflow.bench.shapes import QUICK, TABLE1
from grassflow.job import ArgumentParser
from grassflow.runtime import claim_device, configure_torch, device_name

PARTS = ("op", "step", "settings", "launches", "kernels", "graph", "head", "fused")


def main(argv=None):
    ap = ArgumentParser(prog="python -m grassflow.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="reports/bench", help="directory for bench-<device>.json/.md")
    ap.add_argument(
        "--device",
        default="auto",
        choices=("auto", "cpu", "cuda"),
        help="what to time: the device the training jobs use (train.device)",
    )
    ap.add_argument("--lengths", default="128,256,512,1024,2048,4096")
    ap.add_argument("--tokens", type=int, default=4096, help="B·L per training step")
    ap.add_argument(
        "--quick", action="store_true", help="tiny sizes: a smoke run, not a measurement"
    )
    ap.add_argument("--name", help="file stem (default bench-[quick-]<device>)")
    ap.add_argument(
        "--peer",
        help="a checkout of kanenorman/grassmann: its Grassmann step beside ours (L=128, "
        "B=32; with --quick the smoke sizes)",
    )
    ap.add_argument(
        "--parts",
        default=",".join(PARTS),
        help="comma-separated parts to run (op, step, settings, launches, kernels, graph, head, "
        "fused)",
    )
    ap.add_argument(
        "--kernel-tokens",
        default="4096,12288,32768",
        help="kernels: tokens per step (B·128) of old vs new kernels (the CPU shim: the first "
        "only)",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="instead of the parts: one training step of each model "
        "under torch.profiler (bench/profile.py)",
    )
    ap.add_argument(
        "--compile",
        default="auto",
        choices=("auto", "graph", "false"),
        help="--profile: train.compile of the profiled step",
    )
    ap.add_argument(
        "--concurrency",
        help="instead of the parts: K runs side by side for each K listed, e.g. "
        "1,2,4,8 (bench/concurrency.py)",
    )
    ap.add_argument("--steps", type=int, default=50, help="--concurrency: timed steps per run")
    ap.add_argument(
        "--mps", action="store_true", help="--concurrency: each K > 1 again under CUDA MPS"
    )
    ap.add_argument(
        "--generate",
        action="store_true",
        help="instead of the parts: decoding, incremental vs "
        "recompute, both models (bench/generate.py)",
    )
    args = ap.parse_args(argv)
    if set(args.parts.split(",")) - set(PARTS):
        ap.error(
            f"argument --parts: unknown part(s) {sorted(set(args.parts.split(',')) - set(PARTS))}; "
            f"choose from {', '.join(PARTS)}"
        )

    configure_torch()
    device = claim_device(args.device, log=True, exclusive=True)  # it times the device: alone on it
    if args.concurrency:
        from grassflow.bench.concurrency import run

        return run(
            device,
            [int(k) for k in args.concurrency.split(",")],
            args.steps,
            args.quick,
            args.mps,
            Path(args.out),
            args.name or "concurrency-" + ("quick-" if args.quick else "") + device.type,
        )
    if args.profile:
        from grassflow.bench.profile import run as run_profile

        return run_profile(
            device,
            args.quick,
            Path(args.out),
            args.name or "profile-" + ("quick-" if args.quick else "") + device.type,
            {"false": False}.get(args.compile, args.compile),
        )
    if args.generate:
        from grassflow.bench.generate import run as run_generate

        return run_generate(
            device,
            args.quick,
            Path(args.out),
            args.name or "generate-" + ("quick-" if args.quick else "") + device.type,
        )
    q = args.quick
    parts = set(args.parts.split(","))
    lengths = [32, 64] if q else [int(x) for x in args.lengths.split(",")]
    shape = QUICK if q else TABLE1
    tokens, n_layers, vocab = (128 if q else args.tokens), shape["n_layers"], shape["vocab"]
    res = {
        "device": device_name(device),
        "device_type": device.type,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "flush_denormal": device.type == "cpu",
        "platform": platform.platform(),
        "date": time.strftime("%Y-%m-%d"),
        "tokens": tokens,
        "n_layers": n_layers,
        "vocab": vocab,
        "quick": q,
    }
    res["sgemm"] = bench_sgemm(device, 256 if q else 2048)
    if "op" in parts:
        res["op"] = bench_op(device, *((2, 32, 8, 16) if q else (32, 256, 32, 256)))
    if "launches" in parts:
        res["launches"] = count_launches(device, *((8, 16, 32, 2) if q else (32, 256, 128, 2)))
    if "settings" in parts:
        res["settings"] = bench_settings(device, lengths[0], tokens, n_layers, vocab, compile=not q)
    if args.peer:  # the paper's Table 1 step (L=128, B=32); --quick: the smoke sizes
        L, B = shape["L"], shape["B"]
        res["peer"] = [peer_step(args.peer, device, L, B, vocab, n_layers, timeit)]
        for backend in grassmann_backends(device):
            res["peer"].append(
                {
                    "ours": True,
                    **bench_step(
                        device, "grassmann", L, B * L, n_layers, vocab, True, backend, dropout=0.1
                    ),
                }
            )
    if "kernels" in parts:
        counts = [int(x) for x in args.kernel_tokens.split(",")]
        res["kernels"] = bench_kernels(
            device, [256] if q else counts if device.type == "cuda" else counts[:1]
        )
    if "graph" in parts:
        res["graph"] = bench_graph(device, shape["L"], shape["B"], n_layers, vocab)
    if "head" in parts:
        res["head"] = bench_head(device, *((256, vocab, 32) if q else (tokens, vocab, 256)))
    if "fused" in parts:
        res["fused"] = bench_fused(
            device, shape["L"], shape["B"], n_layers, vocab, steps=3 if q else 10
        )
    if "step" in parts:
        rows = []
        for L in lengths:
            for with_head in (True, False):
                # side by side: the Transformer, then Grassmann with each op backend, same inputs
                for kind, backend in [("transformer", "auto")] + [
                    ("grassmann", b) for b in grassmann_backends(device)
                ]:
                    rows.append(
                        bench_step(device, kind, L, tokens, n_layers, vocab, with_head, backend)
                    )
                    print(
                        f"step {kind:11s} {backend:9s} L={L:5d} head={with_head}: "
                        f"{rows[-1]['seconds']:.3f}s",
                        flush=True,
                    )
        res["step_rows"] = rows
        res["step"] = step_table(rows)
    res["gpu_slot"] = gpu_slots.current()  # every slot of its GPU, for all the timing above
    if res["gpu_slot"]:
        res["gpu_slot"]["finished_at"] = time.time()
    markdown.save_report(
        args.out,
        args.name or "bench-" + ("quick-" if q else "") + device.type,
        res,
        to_markdown(res),
    )
    return res
