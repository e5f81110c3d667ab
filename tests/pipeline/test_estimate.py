"""Job estimates (grassflow.planning.estimate): time limits and memory from a run's spec, the size
of its data and the throughput table. Through SLURM (requested limits equal the estimates, one
allocation per run, a retry at a longer limit) in tests/pipeline/test_slurm.py."""

from __future__ import annotations

import json
import math

import pyarrow.parquet as pq
import pytest
import yaml

from grassflow.lm.grid import runs
from grassflow.pipeline.presets import select_preset
from grassflow.pipeline.tasks import job_estimate
from grassflow.planning.estimate import (
    STARTUP_S,
    UNKNOWN_DEVICE_SLOWDOWN,
    train_flops_per_token,
)
from helpers import ROOT
from helpers.specs import LM_SPEC

SCHEMA = ROOT / "workflow/schemas/config.schema.yaml"


def _paper(preset="paper_v1"):
    from grassflow.pipeline.presets import validate_or_exit

    cfg = yaml.safe_load((ROOT / "config.yaml").read_text())
    cfg["preset"] = preset
    # the schema's defaults (each task's part too), as the Snakefile sees them
    validate_or_exit(cfg, SCHEMA)
    name, p = select_preset(cfg)
    return name, p, cfg["estimate"]


def test_a_table1_run_on_the_h100_is_its_tokens_at_the_measured_rate():
    """The paper's Table 1 Transformer is the benchmarked model: its estimate is its tokens at the
    H100 row's tokens/s, plus a third of a token per validation token every epoch, plus start-up."""
    name, p, settings = _paper()
    spec = runs(name, p)["table1-transformer-s0"]
    est = job_estimate("lm", "train", spec, p, settings)
    steps = 2_228_766 // (32 * 128)  # v1's training tokens (datasets.csv), blocks of B·L
    want = (steps * 32 * 128 * 30 + 30 * 225_018 / 3) / 228_946 + STARTUP_S
    assert est.seconds == pytest.approx(want, rel=1e-9)
    assert est.items == steps * 32 * 128 * 30
    assert est.minutes(settings) == math.ceil(want / 60 * settings["safety"])
    assert "bench-cuda.md" in est.basis and "datasets.csv" in est.basis


def test_grassmann_and_longer_runs_cost_more_and_retries_ask_for_longer():
    name, p, settings = _paper()
    r = runs(name, p)
    t1, g1, g2 = (
        job_estimate("lm", "train", r[k], p, settings)
        for k in ("table1-transformer-s0", "table1-grassmann-s0", "table2-grassmann-s0")
    )
    assert t1.seconds < g1.seconds < g2.seconds
    assert g1.minutes(settings, 2) >= 2 * g1.minutes(settings, 1) - 1 and g1.request_mb(
        2
    ) > g1.request_mb(1)
    assert (
        job_estimate("lm", "evaluate", r["table1-grassmann-s0"], p, settings).minutes(settings)
        == settings["min_minutes"]
    )


def test_an_unlisted_device_takes_the_h100_rates_slowed_down():
    name, p, settings = _paper()
    spec = runs(name, p)["table1-grassmann-s0"]
    h100 = job_estimate("lm", "train", spec, p, settings).seconds - STARTUP_S
    other = job_estimate("lm", "train", spec, p, {**settings, "device": "a40"})
    assert other.seconds - STARTUP_S == pytest.approx(UNKNOWN_DEVICE_SLOWDOWN * h100)
    assert "unlisted" in other.basis


def test_cpu_runs_scale_with_their_threads():
    name, p, settings = _paper("laptop")
    spec = runs(name, p)["table1-grassmann-s0"]
    one = job_estimate("lm", "train", spec, p, settings).seconds - STARTUP_S
    two = (
        job_estimate(
            "lm", "train", spec, {**p, "train": {**p["train"], "threads": 2}}, settings
        ).seconds
        - STARTUP_S
    )
    assert (
        spec["train"]["device"] == "cpu"
        and p["train"]["threads"] == 1
        and two == pytest.approx(one / 2)
    )


def test_existing_token_files_give_exact_counts(tokens):
    """Once tokenized (Snakemake evaluates resources again when a job's inputs exist), the token
    files' own counts replace the table's."""
    files = {s: tokens / f"{s}.parquet" for s in ("train", "validation", "test")}
    n = {
        s: json.loads(pq.ParquetFile(f).schema_arrow.metadata[b"grassflow"])["n_tokens"]
        for s, f in files.items()
    }
    preset = {
        "data": {"source": "synthetic"},
        "tokenizer": {"name": "trained", "vocab_size": 300},
        "train": {"runs_per_gpu": 1},
        "experiments": {"table1": {}},
    }
    spec = {**LM_SPEC, "train": {**LM_SPEC["train"], "max_steps_per_epoch": None}}
    est = job_estimate("lm", "train", spec, preset, {}, files)
    L, B = spec["model"]["context_len"], spec["train"]["batch_size"]
    assert (
        est.items == n["train"] // (B * L) * B * L * spec["train"]["epochs"]
        and "token files" in est.basis
    )
    # the table's Wikitext-2-sized default
    assert job_estimate("lm", "train", spec, preset, {}).items != est.items


def test_flops_per_token_counts_the_head_and_attention():
    t = train_flops_per_token("transformer", 6, 256, 1024, 128, 30522)
    g = train_flops_per_token("grassmann", 6, 256, 1024, 128, 30522)
    head = 6 * 256 * 30522
    assert t - head == pytest.approx(6 * 6 * (4 * 256**2 + 2 * 256 * 1024) + 6 * 6 * 128 * 256)
    assert g > t - 6 * 6 * 128 * 256  # the Plücker projection and the gate outweigh attention's 4d²


def test_k_runs_per_gpu_each_take_k_times_as_long():
    """K runs per GPU: one after another in a packed SLURM allocation, side by side locally (at most
    K times slower): each job's time (and so its SLURM limit) ×K, its device-hours unchanged (a job
    holds 1/K of the GPU); the basis says so."""
    name, p, settings = _paper()
    spec = runs(name, p)["table1-grassmann-s0"]
    solo = job_estimate("lm", "train", spec, p, settings)
    packed = job_estimate(
        "lm", "train", spec, {**p, "train": {**p["train"], "runs_per_gpu": 4}}, settings
    )
    assert packed.seconds == pytest.approx(4 * solo.seconds)
    assert packed.minutes(settings) >= 4 * solo.minutes(settings) - 3
    assert packed.share == 4 and packed.seconds / packed.share == pytest.approx(solo.seconds)
    assert packed.basis.endswith("; 4 runs per GPU: ×4") and "runs per GPU" not in solo.basis


def test_one_k_for_the_whole_pipeline_run():
    """K is the pipeline run's (the LM's train section, else SNLI's, else recall's), as the
    Snakefile's slots and packing use it: an SNLI job of a preset whose LM part says K=2 is ×2."""
    from grassflow.snli.grid import snli_runs

    name, p, settings = _paper()
    run_id, spec = next(iter(snli_runs(name, p).items()))
    solo = job_estimate("snli", "train", spec, p, settings)
    assert p["snli"]["train"]["runs_per_gpu"] == 1
    packed = job_estimate(
        "snli", "train", spec, {**p, "train": {**p["train"], "runs_per_gpu": 2}}, settings
    )
    assert packed.seconds == pytest.approx(2 * solo.seconds) and packed.share == 2, run_id
