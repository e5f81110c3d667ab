"""The core parts of the benchmark: the sgemm roof, the Plücker op, the training step's settings,
launches per layer, and the step over sequence lengths (grassflow.bench)."""

from __future__ import annotations

import torch

from grassflow import markdown
from grassflow.bench.common import LAGS, bench_step, grassmann_backends, timeit
from grassflow.bench.shapes import TABLE1
from grassflow.models import ModelConfig, build_model
from grassflow.ops.plucker import cupy_backend, plucker_mix
from grassflow.ops.plucker.kernel_stages import KernelStages


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
        rows.append(
            {
                "backend": backend,
                "B": B,
                "T": T,
                "r": r,
                "d": d,
                "seconds": t,
                "gflops": op_flops(B, T, r, d, len(LAGS), backend) / t / 1e9,
            }
        )
    ref = rows[0]["seconds"]
    for row in rows:
        row["speedup_vs_reference"] = ref / row["seconds"]
    return rows


def bench_settings(device, L, tokens, n_layers, vocab, compile=True) -> list[dict]:
    """The training step's settings side by side (with the head, dropout 0.1 as in training): before
    this project's step work (default AdamW, reference head), then each change."""
    backend = grassmann_backends(device)[-1]
    settings = [
        ("default AdamW, reference head", {"optimizer": "default", "head_loss": "reference"}),
        ("fused AdamW, reference head", {"head_loss": "reference"}),
        ("fused AdamW, head op auto", {}),
    ]
    if compile:  # not in a --quick smoke run: compiling costs a minute on 2 cores
        settings.append(("compiled, fused AdamW, head op auto", {"compile": True}))
    rows = []
    for label, kw in settings:
        for kind in ("transformer", "grassmann"):
            row = bench_step(
                device,
                kind,
                L,
                tokens,
                n_layers,
                vocab,
                True,
                backend if kind == "grassmann" else "auto",
                dropout=0.1,
                **kw,
            )
            rows.append({"setting": label, **row})
            print(f"settings {label:38s} {kind:11s}: {row['seconds']:.3f}s", flush=True)
    return rows


def count_launches(device, r=TABLE1["r"], d=TABLE1["d"], T=TABLE1["L"], B=2) -> dict:
    """Per layer and training step (forward + backward): the Plücker op's own kernel launches, and
    every ATen op (each one kernel launch, or more, on a GPU) of one Grassmann block and one
    Transformer block, views excluded."""
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
        cfg = ModelConfig(
            vocab_size=64,
            context_len=T,
            n_layers=1,
            d_model=d,
            r=r,
            dropout=0.0,
            lags=tuple(lag for lag in LAGS if lag < T),
            plucker_backend=backend,
        )
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
                out.append(
                    {
                        "L": L,
                        "B": g["B"],
                        "head": head,
                        "backend": g["backend"],
                        "transformer_s": t["seconds"],
                        "grassmann_s": g["seconds"],
                        "time_ratio": g["seconds"] / t["seconds"],
                        "transformer_tok_s": t["tokens_per_s"],
                        "grassmann_tok_s": g["tokens_per_s"],
                        "transformer_mem_mb": t["peak_mem_mb"],
                        "grassmann_mem_mb": g["peak_mem_mb"],
                        "mem_ratio": g["peak_mem_mb"] / max(t["peak_mem_mb"], 1e-9),
                    }
                )
    return out


def to_markdown(res) -> str:
    lines = [
        f"# Core benchmark — {res['device']}",
        "",
        f"torch {res['torch']}, {res['threads']} threads, flush-denormal {res['flush_denormal']}; "
        "op: median of 3, training step: best of 5, after one step that compiles (where it does) "
        f"and allocates AdamW's state. Generated by `python -m grassflow.bench` ({res['date']}).",
        "",
        f"**sgemm roof**: {res['sgemm']['gflops']:.1f} GFLOP/s (fp32, n={res['sgemm']['n']}).",
        "",
    ]
    if res.get("op"):
        lines += [
            "## Plücker op, forward + backward",
            "",
            *markdown.table(
                [
                    "backend",
                    "B",
                    "T",
                    "r",
                    "d",
                    "time (ms)",
                    "speed-up vs reference",
                    "GEMM GFLOP/s",
                    "% of sgemm",
                ],
                [
                    [
                        r["backend"],
                        r["B"],
                        r["T"],
                        r["r"],
                        r["d"],
                        f"{r['seconds'] * 1e3:.1f}",
                        f"{r['speedup_vs_reference']:.2f}×",
                        f"{r['gflops']:.1f}",
                        f"{100 * r['gflops'] / res['sgemm']['gflops']:.0f} %",
                    ]
                    for r in res["op"]
                ],
            ),
            "",
        ]
    if res.get("settings"):
        rows = res["settings"]
        r0 = rows[0]
        lines += [
            f"## The training step's settings, side by side (L={r0['L']}, B={r0['B']}, "
            f"N={res['n_layers']}, vocab {res['vocab']}, with the LM head, dropout 0.1)",
            "",
            "Each row changes one thing from the row above. Head op: the LM head and its loss as "
            "one op (`ops/linear_ce`); `auto` is what training uses on this device.",
            "",
        ]
        first = {r["model"]: r["seconds"] for r in rows if r["setting"] == r0["setting"]}
        pairs = [
            [
                next(r for r in rows if r["setting"] == label and r["model"] == m)
                for m in ("transformer", "grassmann")
            ]
            for label in dict.fromkeys(r["setting"] for r in rows)
        ]
        lines += [
            *markdown.table(
                [
                    "setting",
                    "Transformer (s)",
                    "Grassmann (s)",
                    "G/T",
                    "Transformer tok/s",
                    "Grassmann tok/s",
                    "speed-up vs first row (T / G)",
                    "Grassmann mem (MB)",
                ],
                [
                    [
                        f"{g['setting']} ({g['optimizer']}, head {g['head_loss']}, "
                        f"{'compiled' if g['compile'] else 'eager'}, op {g['backend']})",
                        f"{t['seconds']:.3f}",
                        f"{g['seconds']:.3f}",
                        f"**{g['seconds'] / t['seconds']:.2f}**",
                        f"{t['tokens_per_s']:.0f}",
                        f"{g['tokens_per_s']:.0f}",
                        f"{first['transformer'] / t['seconds']:.2f}× / "
                        f"{first['grassmann'] / g['seconds']:.2f}×",
                        f"{g['peak_mem_mb']:.1f}",
                    ]
                    for t, g in pairs
                ],
            ),
            "",
        ]
    if res.get("peer"):
        peer = res["peer"][0]
        lines += [
            "## Against a public reimplementation (same machine, same run)",
            "",
            "kanenorman/grassmann's GrassmannLM step as its train.py takes it, beside ours as our "
            "training loop takes it (N=6, L=128, B=32, vocab 30,522, dropout 0.1).",
            "",
            *markdown.table(
                ["Grassmann step", "time (s)", "tokens/s", "speed-up vs kanenorman"],
                [[peer["model"], f"{peer['seconds']:.3f}", f"{peer['tokens_per_s']:.0f}", "1.00×"]]
                + [
                    [
                        f"ours, op {r['backend']} ({r['optimizer']}, head {r['head_loss']})",
                        f"{r['seconds']:.3f}",
                        f"{r['tokens_per_s']:.0f}",
                        f"**{peer['seconds'] / r['seconds']:.2f}×**",
                    ]
                    for r in res["peer"][1:]
                ],
            ),
            "",
        ]
    if res.get("launches"):
        la = res["launches"]
        g = la["grassmann"]
        kernels = ", ".join(f"{k} {v}" for k, v in g["plucker_kernels"].items())
        lines += [
            "## Launches per layer and training step (forward + backward)",
            "",
            f"The Plücker op's own kernels ({la['plucker_backend']}, the `cupy` backend's launch "
            f"plan): {sum(g['plucker_kernels'].values())} ({kernels}). ATen ops of one block (each "
            f"at least one kernel on a GPU; views excluded): Grassmann {g['aten_ops']}, "
            f"Transformer {la['transformer']['aten_ops']}.",
            "",
        ]
    if res.get("kernels"):
        lines += [
            "## Plücker kernels, old (441a7fd) vs new, forward + backward through the same "
            "interface",
            "",
            "The op with its stages run by each set of kernels (the projections by W are torch "
            "GEMMs in both). "
            + (
                "On a CPU the kernels run through the serial CUDA-on-CPU shim: this times their "
                "total work, not their parallelism (the new ones recompute each pair's scalars per "
                "component)."
                if res["device_type"] == "cpu"
                else ""
            ),
            "",
            *markdown.table(
                ["tokens", "B × T", "r", "dtype", "old (ms)", "new (ms)", "speed-up"],
                [
                    [
                        r["tokens"],
                        f"{r['B']} × {r['T']}",
                        r["r"],
                        r["dtype"],
                        f"{r['old_s'] * 1e3:.2f}",
                        f"{r['new_s'] * 1e3:.2f}",
                        f"**{r['speedup']:.2f}×**",
                    ]
                    for r in res["kernels"]
                ],
            ),
            "",
        ]
    if res.get("graph"):
        lines += [
            "## The training step: eager vs one CUDA graph",
            "",
            "The loop's own step (TrainStep, fused AdamW, the head op as training resolves it), "
            "mean over the timed steps after the warm-up and the capture; bitwise: the parameters "
            "after them, eager vs replayed, at dropout 0.",
            "",
            *markdown.table(
                [
                    "model",
                    "L × B",
                    "eager (ms)",
                    "graph (ms)",
                    "speed-up",
                    "graph tokens/s",
                    "bitwise",
                ],
                [
                    [
                        r["model"],
                        f"{r['L']} × {r['B']}",
                        f"{r['eager_s'] * 1e3:.2f}",
                        f"{r['graph_s'] * 1e3:.2f}",
                        f"**{r['speedup']:.2f}×**",
                        f"{r['graph_tok_s']:,.0f}",
                        "yes" if r["bitwise_at_dropout_0"] else "NO",
                    ]
                    for r in res["graph"]
                ],
            ),
            "",
        ]
    if res.get("fused"):
        lines += [
            "## A config's seeds as one ensemble (train.fuse_seeds) vs one seed",
            "",
            "The loop's own step at a table's size, dropout 0.1; per member: the ensemble's step "
            "time / its members; speed-up per member = members × (one seed's step) / (the "
            "ensemble's step).",
            "",
            *markdown.table(
                [
                    "model",
                    "L × B, N",
                    "members",
                    "1 seed (ms)",
                    "fused step (ms)",
                    "tokens/s, 1 seed",
                    "tokens/s per member, fused",
                    "tokens/s in all, fused",
                    "speed-up per member",
                ],
                [
                    [
                        r["model"],
                        f"{r['L']} × {r['B']}, {r['n_layers']}",
                        r["members"],
                        f"{r['one_s'] * 1e3:.1f}",
                        f"{r['fused_s'] * 1e3:.1f}",
                        f"{r['one_tok_s']:,.0f}",
                        f"{r['fused_tok_s_per_member']:,.0f}",
                        f"{r['fused_tok_s']:,.0f}",
                        f"**{r['speedup_per_member']:.2f}×**",
                    ]
                    for r in res["fused"]
                ],
            ),
            "",
        ]
    if res.get("head"):
        lines += [
            "## The LM head and its loss, forward + backward",
            "",
            *markdown.table(
                ["backend", "N × V × d", "time (ms)", "peak memory (MB)"],
                [
                    [
                        r["backend"],
                        f"{r['N']} × {r['V']} × {r['d']}",
                        f"{r['seconds'] * 1e3:.2f}",
                        "–" if r["peak_mem_mb"] is None else f"{r['peak_mem_mb']:.0f}",
                    ]
                    for r in res["head"]
                ],
            ),
            "",
        ]
    if res.get("step"):
        lines += [
            f"## Training step (AdamW), N={res['n_layers']}, vocab {res['vocab']}, "
            f"{res['tokens']} tokens per step",
            "",
            "With the training loop's settings (the last eager row above), dropout 0.",
            "",
            f"Peak memory: {res['step_rows'][0]['peak_mem_kind'] if res['step_rows'] else ''}.",
            "",
            *markdown.table(
                [
                    "L",
                    "B",
                    "LM head",
                    "Grassmann op backend",
                    "Transformer (s)",
                    "Grassmann (s)",
                    "time ratio G/T",
                    "Transformer tok/s",
                    "Grassmann tok/s",
                    "Transformer mem (MB)",
                    "Grassmann mem (MB)",
                    "mem ratio",
                ],
                [
                    [
                        r["L"],
                        r["B"],
                        "yes" if r["head"] else "no",
                        r.get("backend"),
                        f"{r['transformer_s']:.3f}",
                        f"{r['grassmann_s']:.3f}",
                        f"**{r['time_ratio']:.2f}**",
                        f"{r['transformer_tok_s']:.0f}",
                        f"{r['grassmann_tok_s']:.0f}",
                        f"{r['transformer_mem_mb']:.1f}",
                        f"{r['grassmann_mem_mb']:.1f}",
                        f"{r['mem_ratio']:.2f}",
                    ]
                    for r in res["step"]
                ],
            ),
        ]
    return "\n".join(lines) + "\n"
