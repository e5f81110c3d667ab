"""K training runs side by side on one device: `python -m grassflow.bench --concurrency 1,2,4,8`.

Each of K worker processes builds the Table 1 step of one model (N=6, L=128, B=32, the 30,522-way
head, dropout 0.1, the loop's optimizer; --quick: smoke sizes), warms up, and reports ready; when
all K are ready they start at once on a word from the parent and time `steps` steps. Aggregate
tokens/s is all K runs' tokens over the span from the first start to the last end. The parent holds
every GPU slot (bench is exclusive), so no pipeline job shares the GPU being measured; the workers
take none. With `mps`, each K > 1 is measured again under CUDA MPS (a daemon started for the
measurement and stopped after it).

Results: concurrency-<device>.json/.md: per model, K and MPS, the aggregate and per-run tokens/s,
the gain over K=1 and each run's slowdown: what `train.runs_per_gpu`'s default is to be set from.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

from grassflow import markdown
from grassflow.bench import shapes

MODELS = ("transformer", "grassmann")
# a run's step: its shape (bench.common) and tokens per step (B·L; the quick one's 128)
TABLE1 = {k: shapes.TABLE1[k] for k in ("L", "n_layers", "vocab")} | {
    "tokens": shapes.TABLE1["B"] * shapes.TABLE1["L"]
}
QUICK = {k: shapes.QUICK[k] for k in ("L", "n_layers", "vocab")} | {"tokens": 128}


def worker(argv=None) -> None:
    """One run: build, warm up, print `ready`, wait for a line on stdin, time the steps, print
    JSON."""
    import argparse

    import torch

    from grassflow.bench.common import grassmann_backends, training_step
    from grassflow.bench.common import sync as _sync
    from grassflow.runtime import configure_torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--device", required=True)
    ap.add_argument("--kind", choices=MODELS, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    configure_torch()
    device = torch.device(a.device)
    size = QUICK if a.quick else TABLE1
    backend = grassmann_backends(device)[-1] if a.kind == "grassmann" else "auto"
    step, facts, _ = training_step(
        device,
        a.kind,
        size["L"],
        size["tokens"],
        size["n_layers"],
        size["vocab"],
        True,
        backend,
        dropout=0.1,
    )
    for _ in range(3):  # compile nothing, allocate AdamW's state, settle the allocator
        step()
    _sync(device)
    print("ready", flush=True)
    sys.stdin.readline()  # the parent's word: every worker is ready
    start = time.time()
    for _ in range(a.steps):
        step()
    _sync(device)
    end = time.time()
    print(
        json.dumps(
            {**facts, "start": start, "end": end, "tokens": a.steps * facts["B"] * size["L"]}
        ),
        flush=True,
    )


@contextmanager
def mps_daemon():
    """CUDA MPS for the processes started inside, in a private pipe directory; stopped after."""
    d = tempfile.mkdtemp(prefix="grassflow-mps-")
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": d, "CUDA_MPS_LOG_DIRECTORY": d}
    subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, check=True)
    try:
        yield env
    finally:
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, env=env, check=False)


def measure(device, kind: str, k: int, steps: int, quick: bool, env=None) -> dict:
    """K workers of `kind` started together: aggregate and per-run tokens/s."""
    cmd = [
        sys.executable,
        "-m",
        "grassflow.bench.concurrency",
        "--device",
        str(device),
        "--kind",
        kind,
        "--steps",
        str(steps),
    ] + (["--quick"] if quick else [])
    procs = [
        subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(k)
    ]
    try:
        for p in procs:
            line = p.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"a {kind} worker failed before it was ready (exit {p.wait()})")
        go = time.time()
        for p in procs:  # every worker is ready: all start now
            p.stdin.write("go\n")
            p.stdin.flush()
        runs = [json.loads(p.stdout.readline()) for p in procs]
        for p in procs:
            p.wait(timeout=120)
    finally:
        for p in procs:  # a worker that failed leaves the others waiting for the word: stop them
            if p.poll() is None:
                p.kill()
                p.wait()
    span = max(r["end"] for r in runs) - min(r["start"] for r in runs)
    return {
        "model": kind,
        "k": k,
        "go": go,
        "runs": runs,
        "aggregate_tokens_per_s": sum(r["tokens"] for r in runs) / span,
        "per_run_tokens_per_s": sum(r["tokens"] / (r["end"] - r["start"]) for r in runs) / k,
    }


def run(device, ks: list[int], steps: int, quick: bool, mps: bool, out: Path, stem: str) -> dict:
    from grassflow.runtime import device_name

    if 1 not in ks:
        raise SystemExit(
            f"error: --concurrency {','.join(map(str, ks))}: list 1, the baseline of the gains "
            "(e.g. 1,2,4,8)"
        )
    if mps and device.type != "cuda":
        raise SystemExit(f"error: --mps: MPS is CUDA's; the device here is {device.type}")
    rows = []
    for kind in MODELS:
        for use_mps in (False, True) if mps else (False,):
            for k in ks:
                if use_mps and k == 1:
                    continue
                with mps_daemon() if use_mps else nullcontext() as env:
                    m = measure(device, kind, k, steps, quick, env)
                rows.append({**m, "mps": use_mps})
                print(
                    f"concurrency {kind:11s} K={k} mps={use_mps}: "
                    f"{m['aggregate_tokens_per_s']:.0f} tokens/s",
                    flush=True,
                )
    for r in rows:  # against K=1 of the same model
        one = next(x for x in rows if x["model"] == r["model"] and x["k"] == 1)
        r["gain"] = r["aggregate_tokens_per_s"] / one["aggregate_tokens_per_s"]
        r["slowdown"] = one["per_run_tokens_per_s"] / r["per_run_tokens_per_s"]
    res = {
        "device": device_name(device),
        "device_type": device.type,
        "date": time.strftime("%Y-%m-%d"),
        "quick": quick,
        "steps": steps,
        "size": QUICK if quick else TABLE1,
        "rows": rows,
    }
    markdown.save_report(out, stem, res, to_markdown(res))
    return res


def to_markdown(res: dict) -> str:
    size = res["size"]
    lines = [
        f"# K training runs side by side on one device: {res['device']}",
        "",
        f"{res['date']}; each run the Table 1 step (N={size['n_layers']}, L={size['L']}, "
        f"{size['tokens']} tokens per step, vocab "
        f"{size['vocab']}){' — smoke sizes, not a measurement' if res['quick'] else ''}; "
        f"{res['steps']} timed steps per run after 3 warm-up steps, all K started at once. "
        "Aggregate: all runs' tokens over the span from the first start to the last end; gain: "
        "over K=1 of the same model; slowdown: a run's time at K over its time alone.",
        "",
        *markdown.table(
            [
                "model",
                "K",
                "MPS",
                "aggregate tokens/s",
                "gain",
                "per-run tokens/s",
                "per-run slowdown",
            ],
            [
                [
                    r["model"],
                    r["k"],
                    "yes" if r["mps"] else "no",
                    f"{r['aggregate_tokens_per_s']:,.0f}",
                    f"{r['gain']:.2f}×",
                    f"{r['per_run_tokens_per_s']:,.0f}",
                    f"{r['slowdown']:.2f}×",
                ]
                for r in res["rows"]
            ],
        ),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    worker()
