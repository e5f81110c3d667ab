"""What every task's training and evaluation jobs share around grassflow.loop: setting up a run
(directory, torch, device), reading its train/validation files, the op backend that runs, the
provenance record (run.json), and opening a run's best weights for evaluation."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from grassflow import gpu_slots
from grassflow.checkpoint import CONFIG, WEIGHTS, CheckpointError, load_weights, state_sha256
from grassflow.data import DataError
from grassflow.io import sha256_file, spec_hash, write_json
from grassflow.job import JSON, json_arg
from grassflow.ops.plucker import resolve_backend
from grassflow.provenance import git_state, machine, package_versions
from grassflow.run_spec import RunSpec
from grassflow.runtime import claim_device, configure_torch, device_name


def run_record(
    spec: RunSpec,
    out,
    model,
    status,
    metrics,
    best,
    device,
    files,
    t_start,
    *,
    preflight=None,
    **extra,
) -> dict:
    """run.json: what this run is, how it ended, and where every input came from (`files`: {split:
    (token file, its metadata)}); also the device asked for and the one used, the Plücker op backend
    that ran (what `auto` became) and the preflight record of the job's environment, if the pipeline
    made one."""
    grassmann = spec.model_kind == "grassmann"
    record = {
        "run_id": spec.run_id,
        "spec": spec.source,
        "spec_hash": spec_hash(spec.source),
        **extra,
        "n_params": model.num_params(),
        "status": status,
        "epochs_completed": len(metrics),
        "best_epoch": best["epoch"] if best else None,
        "git": git_state(Path(__file__).parent),
        "packages": package_versions(),
        "machine": machine(),
        "device": device_name(device),
        "device_requested": spec.train.device,
        "device_type": device.type,
        "plucker_backend": resolve_backend(model.cfg.plucker_backend, device)
        if grassmann
        else None,
        "threads": torch.get_num_threads(),
        "gpu_slot": gpu_slots.current(),
        "finished_at": time.time(),
        "preflight": json.loads(Path(preflight).read_text()) if preflight else None,
        "seed": spec.seed,
        "data": {
            split: {"path": str(p), **meta, "file_sha256": sha256_file(p)}
            for split, (p, meta) in files.items()
        },
        "wall_seconds": wall_seconds(extra.get("parts"), t_start),
        "weights_sha256": json.loads((Path(out) / CONFIG).read_text())["weights_sha256"],
        "weights_file_sha256": sha256_file(Path(out) / WEIGHTS),
    }
    write_json(Path(out) / "run.json", record)
    return record


def wall_seconds(parts, t_start: float) -> float:
    """A run's wall time: the sum of its parts' (grassflow.loop: each start or resume to its stop,
    those whose times were recorded), or, without parts, this job's since `t_start`."""
    if not parts:
        return time.time() - t_start
    return sum(
        p["ended_at"] - p["started_at"] for p in parts if p.get("ended_at") and p.get("started_at")
    )


def start_run(spec: RunSpec, out_dir) -> tuple[float, Path, torch.device]:
    """(start time, run directory, device) of a training job, torch set up for it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    configure_torch(deterministic=True)
    return time.time(), out, claim_device(spec.train.device, log=True)


def read_train_val(read, train_tokens, val_tokens):
    """Both token files through `read`, checked to come from one tokenizer."""
    train, train_meta = read(train_tokens)
    val, val_meta = read(val_tokens, vocab_size=train_meta["vocab_size"])
    if train_meta["tokenizer_sha256"] != val_meta["tokenizer_sha256"]:
        raise DataError(f"{train_tokens} and {val_tokens} were made by different tokenizers")
    return train, train_meta, val, val_meta


def open_for_evaluation(
    weights, run_json, out_path
) -> tuple[dict, dict, bool, torch.device | None]:
    """(the run's config.json, beside `weights` (model.safetensors), with the weights under "model";
    the start of eval.json; whether there is a model to evaluate; the device it runs on: its GPU
    slot taken and recorded). A run that diverged before its first validation has none: its
    eval.json is written here. The weights' sha256 is checked against config.json's."""
    configure_torch()
    # a damaged record refused naming its file
    from grassflow.report.records import read_record, require

    record = require(read_record(run_json), run_json, ("status",))
    config = Path(weights).parent / CONFIG
    ckpt = require(read_record(config), config, ("spec.run_id", "epoch", "weights_sha256"))
    ckpt["model"] = load_weights(weights) if ckpt["weights_sha256"] else None
    if state_sha256(ckpt["model"]) != ckpt["weights_sha256"]:
        raise CheckpointError(
            f"{weights}: its weights' sha256 is not {Path(weights).parent / CONFIG}'s "
            "weights_sha256"
        )
    result = {
        "run_id": ckpt["spec"]["run_id"],
        "status": record["status"],
        "best_epoch": ckpt["epoch"],
        "weights_sha256": ckpt["weights_sha256"],
        "weights_file_sha256": sha256_file(weights),
        "run_record": str(run_json),
    }
    if ckpt["model"] is None:
        result.update(validation=None, test=None)
        write_json(out_path, result)
        return ckpt, result, False, None
    device = claim_device(require(ckpt, config, ("spec.train.device",))["spec"]["train"]["device"])
    result["gpu_slot"] = gpu_slots.current()
    return ckpt, result, True, device


# --- the command line of a run's jobs (train, evaluate: grassflow.<task>.train, .evaluate) --------
def run_spec_arg(value: str) -> RunSpec:
    """A training job's --spec (JSON text or a file of it), read as a RunSpec."""
    try:
        return RunSpec.from_dict(json_arg(value))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{value}: {e}") from None


def train_args(p, fused: bool = False) -> None:
    """A run's training job; `fused`: also runs that differ only in their seed, as one ensemble
    (train.fuse_seeds: a spec and an output directory per run, the resume state in --work-dir)."""
    many = {"nargs": "+"} if fused else {}
    p.add_argument(
        "--spec", required=True, type=run_spec_arg, **many, help="the run's spec: " + JSON
    )
    p.add_argument("--train-tokens", required=True)
    p.add_argument("--val-tokens", required=True)
    p.add_argument(
        "--out-dir",
        required=True,
        **many,
        help="the run's directory" + (", in the specs' order" if fused else ""),
    )
    if fused:
        p.add_argument(
            "--work-dir", help="the resume state of fused runs (default: the one run's directory)"
        )
    p.add_argument(
        "--preflight", help="the preflight record of this job's environment, kept in run.json"
    )
    p.add_argument(
        "--compile",
        choices=("auto", "true", "false", "graph", "compiled-graph"),
        default="auto",
        help="train.compile: torch.compile the training loss and validation forward, or (graph) "
        "capture the training step as one CUDA graph",
    )
    p.add_argument(
        "--compile-mode", default="default", help="train.compile_mode (torch.compile's mode)"
    )
    p.add_argument(
        "--trackers",
        default="none",
        help="train.trackers, comma-separated (tensorboard,wandb), or none",
    )
    p.add_argument(
        "--code",
        help="the job's code fingerprint (its rule's `code` param): a last.pt written under "
        "another is not resumed",
    )


def execution(a) -> dict:
    """How a training job runs, not what it computes (train.compile, compile_mode, trackers), and
    the code it runs (`code`: only a checkpoint of the same code resumes)."""
    return {
        "compile": {"true": True, "false": False}.get(a.compile, a.compile),
        "compile_mode": a.compile_mode,
        "trackers": [t for t in a.trackers.split(",") if t != "none"],
        "code": a.code,
    }


def evaluate_args(p) -> None:
    p.add_argument(
        "--weights",
        required=True,
        help="the run's best weights (model.safetensors, config.json beside it)",
    )
    p.add_argument("--run-json", required=True)
    p.add_argument("--val-tokens", required=True)
    p.add_argument("--test-tokens", required=True)
    p.add_argument("--out", required=True)
