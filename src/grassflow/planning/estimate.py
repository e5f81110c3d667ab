"""What a job will cost before it runs: wall time and host memory of each training and evaluation
job, from the run's spec, the size of its data and a table of measured throughputs.

Data, not code: `workflow/resources/throughput.csv` (training tokens/s per device kind, model kind,
depth, width, context, from our bench records) and `workflow/resources/datasets.csv` (token or pair
counts of the splits; once the token files exist their own counts are used).

Model. A training step's arithmetic is ~6 FLOPs per parameter and token (forward + backward) plus
attention's 6·N·L·d per token; a throughput row gives the rate the device reached on a measured
model (tokens/s × its FLOPs per token), and a run's time is its FLOPs at the rate of the nearest row
(in FLOPs per token and context), never faster than the row's step time scaled by depth (GPUs are
launch-bound at these sizes: per-step overhead, not arithmetic). Validation (every epoch) and
evaluation are forward passes: a third of a training token each; evaluation reads validation and
test chunked and strided (three passes). Each job adds STARTUP_S. A device kind missing from the
table takes the H100's rows slowed by UNKNOWN_DEVICE_SLOWDOWN. The request pads the estimate by
`estimate.safety`, with a floor, and grows with Snakemake's attempt, so a job stopped at its limit
(it checkpoints on SIGTERM) is retried with a longer one and resumes. With K runs per GPU
(`train.runs_per_gpu`) a job's time is ×K (the runs of a packed SLURM allocation run one after
another; locally K share the GPU, which is at most K times slower) and its device-hours 1/K.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from grassflow.models.config import ModelConfig

ROOT = Path(__file__).resolve().parents[3]
THROUGHPUT = ROOT / "workflow" / "resources" / "throughput.csv"
DATASETS = ROOT / "workflow" / "resources" / "datasets.csv"
# an unlisted GPU: the H100's rates ÷ 3 (an A100-class card is ~2× slower)
UNKNOWN_DEVICE_SLOWDOWN = 3.0
# Every job: process start, imports (torch, CUDA), reading its data, building the model. The demo's
# tiny jobs measured 6-25 s end to end on the CPU with almost no arithmetic (`grassflow plan
# --measured`).
STARTUP_S = 20.0
DEFAULTS = {"device": "h100", "safety": 2.0, "min_minutes": 5, "base_mem_mb": 3000}


@dataclass(frozen=True)
class Estimate:
    seconds: float  # expected wall time
    items: int  # training tokens (or examples) seen, 0 for evaluation
    mem_mb: int  # expected peak host memory
    basis: str  # the throughput row (or assumption) it rests on
    share: int = 1  # runs sharing its GPU (train.runs_per_gpu): a job holds 1/share of a device

    def minutes(self, settings: dict, attempt: int = 1) -> int:
        """The time limit to request: padded, floored, longer on every retry."""
        s = {**DEFAULTS, **(settings or {})}
        return int(math.ceil(max(s["min_minutes"], self.seconds / 60 * s["safety"]) * attempt))

    def request_mb(self, attempt: int = 1) -> int:
        """The memory to request: rounded up to 500 MB, half as much again on every retry."""
        return int(math.ceil(self.mem_mb * (1 + 0.5 * (attempt - 1)) / 500) * 500)


# --- FLOPs ---------------------------------------------------------------------------------------
def layer_params(kind: str, d: int, d_ff: int, r: int, ffn: bool = True) -> int:
    ff = 2 * d * d_ff if ffn else 0
    if kind == "grassmann":
        return d * r + r * (r - 1) // 2 * d + 2 * d * d + ff
    return 4 * d * d + ff


def train_flops_per_token(
    kind: str, n_layers: int, d: int, d_ff: int, L: int, vocab: int, r: int = 32, ffn: bool = True
) -> float:
    """FLOPs of one training token (forward + backward) of an LM with its head."""
    attention = 6 * n_layers * L * d if kind == "transformer" else 0
    return 6 * (n_layers * layer_params(kind, d, d_ff, r, ffn) + d * vocab) + attention


@cache
def _rows(path=THROUGHPUT) -> tuple[dict, ...]:
    with open(path, newline="") as f:
        return tuple(dict(r) for r in csv.DictReader(f))


def rate(
    device: str, kind: str, flops: float, L: int, n_layers: int, threads: int = 1
) -> tuple[float, float, str]:
    """(FLOP/s, seconds per step at least, the row's source) for a model of `flops` per token."""
    rows = [r for r in _rows() if r["device"] == device and r["model"] == kind]
    slow = 1.0
    if not rows:
        rows = [r for r in _rows() if r["device"] == DEFAULTS["device"] and r["model"] == kind]
        slow = UNKNOWN_DEVICE_SLOWDOWN
    if not rows:
        raise ValueError(f"{THROUGHPUT}: no throughput row for model {kind!r}")

    def flops_of(r):
        return train_flops_per_token(
            kind,
            int(r["n_layers"]),
            int(r["d_model"]),
            4 * int(r["d_model"]),
            int(r["context_len"]),
            int(r["vocab"]),
        )

    row = min(
        rows,
        key=lambda r: abs(math.log(flops_of(r) / flops)) + abs(math.log(int(r["context_len"]) / L)),
    )
    tok_s = float(row["tokens_per_s"]) / slow
    if row["threads"]:  # CPU rows: the rate scales with the job's threads
        tok_s *= threads / int(row["threads"])
    step_floor = (
        int(row["tokens_per_step"]) / tok_s * n_layers / int(row["n_layers"])
        if device != "cpu"
        else 0.0
    )
    where = device if slow == 1 else f"{device} (unlisted: {DEFAULTS['device']} ÷ {slow})"
    basis = f"{where}: {row['source']}"
    return tok_s * flops_of(row), step_floor, basis


# --- data sizes -----------------------------------------------------------------------------------
def split_sizes(
    task: str, dataset: str, tokenizer: str, files: dict | None = None
) -> tuple[dict, str]:
    """({split: tokens or pairs}, where from): the token files' metadata where they exist and can be
    read, else the datasets table (its `*` rows for data it does not list). A damaged token file is
    the job's to refuse, by name, when it reads it: planning only sizes a time limit."""
    if files and all(Path(p).is_file() for p in files.values()):
        from grassflow.data.sources import token_meta

        try:
            return {
                split: (m := token_meta(p)).get("n_tokens", m.get("n_pairs"))
                for split, p in files.items()
            }, "token files"
        except Exception:  # pyarrow's errors, metadata that is not ours
            pass
    with open(DATASETS, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["task"] == task]
    for r in rows:
        if r["dataset"] in (dataset, "*") and r["tokenizer"] in (tokenizer, "*"):
            return {
                s: int(r[s]) for s in ("train", "validation", "test")
            }, f"datasets.csv ({r['source']})"
    raise ValueError(f"{DATASETS}: no row for task {task!r}")


def device_kind(spec: dict, settings: dict) -> tuple[str, int]:
    """(device kind, threads): a CPU run's rows are `cpu`; a GPU run's `estimate.device`."""
    s = {**DEFAULTS, **(settings or {})}
    return (
        ("cpu", spec["train"].get("threads", 1))
        if spec["train"]["device"] == "cpu"
        else (s["device"], 1)
    )


# --- jobs ---------------------------------------------------------------------------------------
def _lm_model(spec: dict, vocab: int, L: int | None = None) -> tuple:
    m = ModelConfig.from_dict(spec["model"])  # the defaults the model will run with
    return (
        spec["model_kind"],
        m.n_layers,
        m.d_model,
        m.d_ff,
        L or m.context_len,
        vocab,
        m.r,
        m.ffn,
    )


def memory(settings, params: int, items_host: int, activations: float) -> int:
    """Host memory: the runtime, the model with AdamW's state and a checkpoint being written (5
    copies of fp32 parameters), the data as int64 (twice: read, then copied), and on the CPU the
    activations."""
    s = {**DEFAULTS, **(settings or {})}
    return int(s["base_mem_mb"] + (5 * 4 * params + 16 * items_host + activations) / 2**20)


def _params(kind, n_layers, d, d_ff, L, vocab, r, ffn) -> int:
    return n_layers * layer_params(kind, d, d_ff, r, ffn) + 2 * d * vocab + L * d


def _lm_rate(spec: dict, vocab: int, settings: dict):
    """(device kind, model tuple, FLOPs per training token, FLOP/s, step floor, basis)."""
    dev, threads = device_kind(spec, settings)
    model = _lm_model(spec, vocab)
    kind, n_layers, _, _, L, *_ = model
    flops = train_flops_per_token(*model)
    return (dev, model, flops, *rate(dev, kind, flops, L, n_layers, threads))


def lm_train(spec: dict, sizes: dict, vocab: int, settings: dict) -> Estimate:
    dev, model, flops, fps, floor, basis = _lm_rate(spec, vocab, settings)
    _, n_layers, d, _, L, *_ = model
    t = spec["train"]
    B = t["batch_size"]
    steps = min(sizes["train"] // (B * L), t.get("max_steps_per_epoch") or sizes["train"])
    tokens = steps * B * L * t["epochs"]
    seconds = max(tokens * flops / fps, steps * t["epochs"] * floor)
    seconds += t["epochs"] * sizes["validation"] * flops / 3 / fps  # validation, every epoch
    # bytes saved for backward (bench-cpu.md)
    act = 70 * B * L * n_layers * d * 4 if dev == "cpu" else 0
    return Estimate(seconds, tokens, memory(settings, _params(*model), sizes["train"], act), basis)


def lm_evaluate(spec: dict, sizes: dict, vocab: int, settings: dict, passes: int = 3) -> Estimate:
    """Forward passes over validation and test: the LM reads them chunked once and strided (twice
    over), recall once."""
    _, model, flops, fps, floor, basis = _lm_rate(spec, vocab, settings)
    L = model[4]
    tokens = passes * (sizes["validation"] + sizes["test"])
    seconds = max(
        tokens * flops / 3 / fps, tokens / (spec["train"]["eval_batch_size"] * L) * floor / 3
    )
    return Estimate(
        seconds, 0, memory(settings, _params(*model), sizes["validation"] + sizes["test"], 0), basis
    )
