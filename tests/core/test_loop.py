"""Training through its real interfaces: resume after SIGTERM, divergence, bad checkpoints."""

import json
import math
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch

from grassflow.checkpoint import CheckpointError, load_weights
from grassflow.io import KILL_WRITING
from grassflow.lm.evaluate import evaluate_run
from grassflow.lm.train import train
from grassflow.lm.unigram import unigram_baseline
from helpers.procs import HANG, _wait_for, _wait_for_checkpoints, stop_then_signal
from helpers.specs import LM_SPEC, PUBLISHED

SPEC = LM_SPEC


def _cmd(tokens, out, spec=SPEC):
    return [
        sys.executable,
        "-m",
        "grassflow.lm.train",
        "--spec",
        json.dumps(spec),
        "--train-tokens",
        str(tokens / "train.parquet"),
        "--val-tokens",
        str(tokens / "validation.parquet"),
        "--out-dir",
        str(out),
    ]


def _metrics(out):
    return [
        {k: m[k] for k in ("epoch", "train_loss", "val_loss", "val_ppl", "lr")}
        for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    ]


@pytest.fixture(scope="module")
def uninterrupted(tokens, tmp_path_factory):
    """The run the interrupted ones must end identical to (one for the file)."""
    out = tmp_path_factory.mktemp("full")
    subprocess.run(_cmd(tokens, out), check=True, capture_output=True)
    return out


# SIGUSR1 (SLURM's warning signal) and two of the three kills: slow (make test-slow)
@pytest.mark.parametrize(
    "sig",
    [signal.SIGTERM, pytest.param(signal.SIGUSR1, marks=pytest.mark.slow)],
    ids=["SIGTERM", "SIGUSR1"],
)
def test_sigterm_then_rerun_resumes_bitwise(sig, tokens, uninterrupted, tmp_path):
    """SIGTERM (preemption) and SIGUSR1 (SLURM's warning before a time limit, --signal=USR1): a
    checkpoint at the next step boundary, exit 75, and a rerun that resumes bitwise. Each part keeps
    its SLURM job: a rerun in another job (Snakemake's retry) leaves the first part ended by its
    signal; in the same job (SLURM requeued it: a preemption) the first part is said preempted. One
    interrupted run, copied, resumes both ways (SIGTERM's: a requeue follows a preemption)."""
    full, cut = uninterrupted, tmp_path / "cut"
    env = {k: v for k, v in os.environ.items() if k != "SLURM_JOB_ID"}
    proc = subprocess.Popen(
        _cmd(tokens, cut), stderr=subprocess.PIPE, text=True, env={**env, "SLURM_JOB_ID": "7"}
    )
    _wait_for(cut / "last.pt", proc)
    stop_then_signal(proc, sig)
    _, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 75, err[-2000:]
    assert "checkpointed at epoch" in err
    assert not (cut / "run.json").exists()  # an interrupted run never looks complete
    a = load_weights(full / "model.safetensors")
    reruns = {cut: ("7", "8")}  # retried by Snakemake: another job
    if sig == signal.SIGTERM:  # requeued by SLURM: the same job
        shutil.copytree(cut, tmp_path / "requeued")
        reruns[tmp_path / "requeued"] = ("7", "7")
    for out, jobs in reruns.items():
        res = subprocess.run(
            _cmd(tokens, out),
            capture_output=True,
            text=True,
            check=True,
            env={**env, "SLURM_JOB_ID": jobs[1]},
        )
        assert "resuming" in res.stderr
        assert _metrics(out) == _metrics(full)
        b = load_weights(out / "model.safetensors")
        assert all(torch.equal(a[k], b[k]) for k in a)
        # run.json keeps both parts: the first to the signal, the second from there to the end
        rec = json.loads((out / "run.json").read_text())
        first, second = rec["parts"]
        assert (
            first["from"] == {"epoch": 0, "step": 0}
            and (first["slurm_job"], second["slurm_job"]) == jobs
        )
        assert (first["ended"], first.get("stopped_by")) == (
            ("preempted", sig.name) if jobs[0] == jobs[1] else (sig.name, None)
        )
        assert second["from"] == first["to"] and second["ended"] == "finished"
        assert second["to"] == {"epoch": SPEC["train"]["epochs"], "step": 0}
        assert first["started_at"] < first["ended_at"] <= second["started_at"] < second["ended_at"]
        assert all(p["device"] and {"commit", "dirty"} <= set(p) for p in (first, second))
        assert rec["wall_seconds"] == pytest.approx(
            sum(p["ended_at"] - p["started_at"] for p in (first, second))
        )


@pytest.mark.parametrize("lr", [SPEC["train"]["lr"], 1e6], ids=["finished", "diverged"])
def test_a_rerun_of_an_ended_run_keeps_its_record_and_other_code_trains_anew(
    lr, tokens, tmp_path, monkeypatch, capfd
):
    """A job that reruns a run that had ended (SLURM requeues a group job, or Snakemake retries one,
    after one of its runs finished) writes the same outputs and the same record: one part, ended as
    it ended, in its first job; never "killed" nor "preempted". Under other code (the job's code
    fingerprint: Snakemake reruns the job because its code changed) it trains anew."""
    spec = {**SPEC, "train": {**SPEC["train"], "epochs": 1, "lr": lr, "checkpoint_every": 0}}
    paths = (tokens / "train.parquet", tokens / "validation.parquet")
    import grassflow.loop

    # last.pt written once for one epoch: the run's end goes into its epoch's checkpoint
    writes = []
    monkeypatch.setattr(
        grassflow.loop,
        "save_checkpoint",
        lambda *a, f=grassflow.loop.save_checkpoint: writes.append(f(*a)),
    )
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    first = train(spec, *paths, tmp_path, execution={"code": "c0"})
    ended = "finished" if lr == SPEC["train"]["lr"] else "diverged"
    assert [(p["ended"], p["slurm_job"]) for p in first["parts"]] == [(ended, "7")] and len(
        writes
    ) == 1
    metrics, weights = (
        (tmp_path / "metrics.jsonl").read_text(),
        load_weights(tmp_path / "model.safetensors"),
    )
    for job in ("7", "8"):  # requeued (the same job), retried (another)
        monkeypatch.setenv("SLURM_JOB_ID", job)
        capfd.readouterr()
        again = train(spec, *paths, tmp_path, execution={"code": "c0"})
        assert f"had ended ({ended}): its outputs written again" in capfd.readouterr().err
        assert (
            again["parts"] == first["parts"] and again["wall_seconds"] == first["wall_seconds"]
        ), job
        assert again["status"] == first["status"]
        assert (tmp_path / "metrics.jsonl").read_text() == metrics
        again_weights = load_weights(tmp_path / "model.safetensors")
        assert again_weights.keys() == weights.keys() and all(
            torch.equal(again_weights[k], weights[k]) for k in weights
        )
    anew = train(spec, *paths, tmp_path, execution={"code": "c1"})
    err = capfd.readouterr().err
    assert (
        f"{tmp_path / 'last.pt'} was written by other code (fingerprint c0 ≠ c1); starting fresh"
        in err
    ), err[-2000:]
    assert "had ended" not in err and "resuming" not in err
    (part,) = anew["parts"]
    assert (
        part["from"] == {"epoch": 0, "step": 0}
        and part["started_at"] > first["parts"][0]["ended_at"]
    )


def test_divergence_is_recorded_not_raised(tokens, tmp_path):
    spec = {**SPEC, "train": {**SPEC["train"], "lr": 1e6, "checkpoint_every": 0}}
    rec = train(spec, tokens / "train.parquet", tokens / "validation.parquet", tmp_path)
    assert rec["status"]["state"] == "diverged"
    assert rec["status"]["epoch"] >= 1
    last = rec["status"]["last_finite_loss"]
    assert last is None or math.isfinite(last)
    ev = evaluate_run(
        tmp_path / "model.safetensors",
        tmp_path / "run.json",
        tokens / "validation.parquet",
        tokens / "test.parquet",
        tmp_path / "eval.json",
    )
    assert ev["status"]["state"] == "diverged"


def test_corrupt_checkpoint_is_reported(tokens, tmp_path):
    spec = {**SPEC, "train": {**SPEC["train"], "epochs": 1}}
    train(spec, tokens / "train.parquet", tokens / "validation.parquet", tmp_path)
    data = (tmp_path / "last.pt").read_bytes()
    (tmp_path / "last.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="last.pt: checksum mismatch"):
        train(spec, tokens / "train.parquet", tokens / "validation.parquet", tmp_path)
    res = subprocess.run(_cmd(tokens, tmp_path, spec), capture_output=True, text=True)
    assert res.returncode == 1 and res.stderr.startswith("error:") and "Traceback" not in res.stderr


def test_a_same_shape_foreign_spec_is_not_resumed(tokens, tmp_path, capfd):
    """last.pt of another spec whose tensors have the same shapes (another lr): loading it would
    work, silently, and continue the other run. It is refused with its message and the run starts
    fresh: its metrics equal a fresh run's in an empty directory."""
    spec = {**SPEC, "train": {**SPEC["train"], "epochs": 1}}
    paths = (tokens / "train.parquet", tokens / "validation.parquet")
    train(spec, *paths, tmp_path / "run")
    assert (tmp_path / "run" / "last.pt").exists()
    other = {**spec, "train": {**spec["train"], "lr": spec["train"]["lr"] / 3}}
    capfd.readouterr()
    train(other, *paths, tmp_path / "run")
    err = capfd.readouterr().err
    assert (
        f"[train] {tmp_path / 'run' / 'last.pt'} belongs to another spec" in err
        and "starting fresh" in err
    )
    assert "resuming" not in err
    train(other, *paths, tmp_path / "fresh")
    assert _metrics(tmp_path / "run") == _metrics(tmp_path / "fresh")


def test_evaluate_writes_all_perplexities(tokens, tmp_path):
    spec = {**SPEC, "train": {**SPEC["train"], "epochs": 1}}
    train(spec, tokens / "train.parquet", tokens / "validation.parquet", tmp_path)
    ev = evaluate_run(
        tmp_path / "model.safetensors",
        tmp_path / "run.json",
        tokens / "validation.parquet",
        tokens / "test.parquet",
        tmp_path / "eval.json",
    )
    for split in ("validation", "test"):
        r = ev[split]
        assert (
            1 < r["chunked_ppl"] < 300 and 1 < r["strided_ppl"] < 300 and r["strided_word_ppl"] > 1
        )
        assert r["strided_tokens"] == r["n_tokens"] - 1 and r["chunked_tokens"] <= r["n_tokens"] - 1
    assert os.path.exists(tmp_path / "eval.json")


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_a_run_directory_is_a_model_directory(tie, tokens, tmp_path):
    """A run's best weights: model.safetensors (tensors only; a tied head stored once) and
    config.json (the model, its tokenizer, the spec, the best epoch); load_model opens the run
    directory itself, with the weights run.json records."""
    from safetensors import safe_open

    from grassflow.checkpoint import state_sha256
    from grassflow.pretrained import load_model

    spec = {
        **SPEC,
        "model": {**SPEC["model"], "tie_weights": tie},
        "train": {**SPEC["train"], "epochs": 2},
    }
    rec = train(spec, tokens / "train.parquet", tokens / "validation.parquet", tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "tok_emb.weight" in keys and ("head.weight" in keys) is not tie
    config = json.loads((tmp_path / "config.json").read_text())
    assert (
        config["model_kind"] == "grassmann"
        and config["tie_weights"] is tie
        and config["spec"] == rec["spec"]
    )
    assert (
        config["vocab_size"] == rec["data"]["train"]["vocab_size"]
        and config["epoch"] == rec["best_epoch"]
    )
    assert config["tokenizer"] == {
        "name": "trained",
        "sha256": rec["data"]["train"]["tokenizer_sha256"],
    }
    model = load_model(tmp_path)
    assert state_sha256(model.state_dict()) == rec["weights_sha256"] == config["weights_sha256"]
    assert (model.head.weight is model.tok_emb.weight) is tie


def test_too_little_disk_fails_before_training(tokens, tmp_path, monkeypatch):
    import shutil as _shutil

    import grassflow.checkpoint as ckpt

    monkeypatch.setattr(
        ckpt.shutil, "disk_usage", lambda p: _shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000)
    )
    with pytest.raises(ckpt.DiskSpaceError, match="MiB free, but this run's checkpoints need"):
        train(SPEC, tokens / "train.parquet", tokens / "validation.parquet", tmp_path)
    assert not any(tmp_path.iterdir())  # failed before writing anything


def test_stray_temp_file_from_a_killed_write_is_ignored(tokens, tmp_path):
    spec = {**SPEC, "train": {**SPEC["train"], "epochs": 1}}
    (tmp_path / ".last.pt.abc123.tmp").write_bytes(b"half a checkpoint")
    rec = train(spec, tokens / "train.parquet", tokens / "validation.parquet", tmp_path)
    assert rec["status"]["state"] == "completed"
    assert not list(tmp_path.glob(".*.tmp"))


def test_aggregate_reports_diverged_runs_beside_the_others(tokens, tmp_path):
    from grassflow.bench import main as bench_main
    from grassflow.lm.aggregate import aggregate
    from grassflow.lm.summary import summary

    base = {**SPEC, "train": {**SPEC["train"], "epochs": 1, "checkpoint_every": 0}}
    variants = {
        "t-transformer-s0": {**base, "run_id": "t-transformer-s0", "model_kind": "transformer"},
        "t-grassmann-s0": {**base, "run_id": "t-grassmann-s0"},
        "t-grassmann-s1": {
            **base,
            "run_id": "t-grassmann-s1",
            "seed": 1,
            "train": {**base["train"], "lr": 1e6},
        },
    }
    dirs = []
    for run_id, spec in variants.items():
        d = tmp_path / "runs" / run_id
        train(spec, tokens / "train.parquet", tokens / "validation.parquet", d)
        evaluate_run(
            d / "model.safetensors",
            d / "run.json",
            tokens / "validation.parquet",
            tokens / "test.parquet",
            d / "eval.json",
        )
        dirs.append(d)
    bench_main(["--quick", "--device", "cpu", "--out", str(tmp_path), "--name", "bench"])
    unigram_baseline(
        tokens / "train.parquet",
        tokens / "validation.parquet",
        tokens / "test.parquet",
        tmp_path / "unigram.json",
    )
    (tmp_path / "checksums.json").write_text(json.dumps({"test": {"content_sha256": "0" * 64}}))
    preset = {
        "data": {"source": "synthetic"},
        "tokenizer": {"name": "trained"},
        "models": ["transformer", "grassmann"],
        "model": SPEC["model"],
        "experiments": {"t": {"n_layers": 1, "context_len": 16, "batch_size": 8, "epochs": 1}},
        "seeds": [0, 1],
    }
    aggregate(
        preset,
        "test",
        "t",
        dirs,
        tmp_path / "report",
        tmp_path / "unigram.json",
        tmp_path / "checksums.json",
        PUBLISHED,
    )
    md = (tmp_path / "report" / "t.md").read_text()
    assert "| grassmann | " in md and "/ 1 / 2 (1 diverged)" in md and "| transformer | " in md
    # another task's figure in the directory (its aggregate ran first) is not the summary's: its
    # Figures line does not depend on the order the jobs ran in
    (tmp_path / "report" / "snli_curves_x.png").write_bytes(b"")
    summary("test", [tmp_path / "report" / "t.md"], tmp_path / "bench.json", tmp_path / "report")
    whole = (tmp_path / "report" / "summary.md").read_text()
    assert (
        whole.startswith("# grassflow results — preset `test`\n\nPreset **test**: data")
        and md.split("\n\n", 1)[1] in whole
    )
    assert whole.rstrip().endswith(
        "Figures: `best_ppl_t.png`, `curves_t.png`, `gap_t.png`, `scaling.png`"
    )
    assert "Grassmann vs Transformer" in md  # the completed runs are still compared
    assert "Unigram baseline" in md
    # one seed per model, synthetic data, not the paper's scale: no verdict, and why not
    assert "**not comparable: not the paper's data" in md and "fewer than 2 seeds" in md
    # the diverged seed named where the verdict is
    assert "left out: t-grassmann-s1 (diverged)" in md
    import pandas as pd

    df = pd.read_csv(tmp_path / "report" / "t.csv")
    assert dict(zip(df.run_id, df.status)) == {
        "t-transformer-s0": "completed",
        "t-grassmann-s0": "completed",
        "t-grassmann-s1": "diverged",
    }


@pytest.mark.parametrize(
    "how",
    [
        "mid-epoch",
        *(pytest.param(h, marks=pytest.mark.slow) for h in ("during-write", "random-3x")),
    ],
)
def test_sigkill_then_rerun_ends_bitwise_identical(how, tokens, uninterrupted, tmp_path):
    """SIGKILL gives the process no chance to checkpoint: the rerun resumes from the last complete
    checkpoint and replays the same batches with the same RNG states. A kill during a checkpoint
    write leaves the previous last.pt (rename is atomic) and a stray temp file; 'during-write'
    reproduces exactly that state, 'random-3x' kills three times, each right after a checkpoint
    drawn from the test's seed (1st to 4th new one: replayable). The part that stopped without a
    word is recorded as killed at its last checkpoint ('mid-epoch'); and a last.pt written before
    checkpoints kept their parts (the killed run's, its parts removed) resumes, its earlier part
    said unrecorded."""
    import random

    from grassflow.checkpoint import load_checkpoint, save_checkpoint

    out, old = tmp_path / "cut", tmp_path / "old"
    kills, landed = 3 if how == "random-3x" else 1, 0
    for _ in range(kills):
        proc = subprocess.Popen(
            _cmd(tokens, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        _wait_for_checkpoints(
            out / "last.pt", proc, random.randint(1, 4) if how == "random-3x" else 1
        )
        proc.kill()
        proc.wait()
        # run.json is the run's last write: absent, the run is incomplete whatever happened; a kill
        # that lands after it (returncode −9 all the same) found a finished run
        if not (out / "run.json").exists():
            landed += 1
    assert landed >= 1, "every kill came after the run had finished"
    if how == "during-write":
        (out / ".last.pt.killed.tmp").write_bytes((out / "last.pt").read_bytes()[:1000])
    if how == "mid-epoch":
        state = load_checkpoint(out / "last.pt")
        saved = state["parts"][0]["saved_to"]
        old.mkdir()
        save_checkpoint(old / "last.pt", {k: v for k, v in state.items() if k != "parts"})
    subprocess.run(_cmd(tokens, out), check=True, capture_output=True)
    assert _metrics(out) == _metrics(uninterrupted)
    a = load_weights(uninterrupted / "model.safetensors")
    b = load_weights(out / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    if how != "mid-epoch":
        return
    killed, resumed = json.loads((out / "run.json").read_text())["parts"]
    assert (
        killed["ended"] == "killed"
        and killed["to"] == saved == resumed["from"]
        and killed["ended_at"]
    )
    assert "saved_at" not in killed and "saved_to" not in killed
    res = subprocess.run(_cmd(tokens, old), capture_output=True, text=True)
    assert res.returncode == 0 and "resuming" in res.stderr, res.stderr[-2000:]
    unrecorded, resumed = json.loads((old / "run.json").read_text())["parts"]
    assert (
        unrecorded["ended"] == "unrecorded"
        and resumed["from"] == saved
        and resumed["ended"] == "finished"
    )


def test_killed_evaluation_leaves_no_partial_output(tokens, uninterrupted, tmp_path):
    """A kill inside the write of eval.json (half its bytes down: io's fault hook) leaves no
    eval.json, nor a temporary file that looks like one; the rerun writes it whole. A write that
    were not atomic would leave the half file in place and fail this."""
    args = [
        "--weights",
        str(uninterrupted / "model.safetensors"),
        "--run-json",
        str(uninterrupted / "run.json"),
        "--val-tokens",
        str(tokens / "validation.parquet"),
        "--test-tokens",
        str(tokens / "test.parquet"),
    ]
    ref = tmp_path / "ref" / "eval.json"
    subprocess.run(
        [sys.executable, "-m", "grassflow.lm.evaluate", *args, "--out", str(ref)], check=True
    )
    out = tmp_path / "eval.json"
    out.write_text("stale")  # an earlier result must survive a failed run untouched
    res = subprocess.run(
        [sys.executable, "-m", "grassflow.lm.evaluate", *args, "--out", str(out)],
        env={**os.environ, KILL_WRITING: "eval.json"},
        capture_output=True,
    )
    assert res.returncode == -signal.SIGKILL
    assert out.read_text() == "stale"
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".eval.json.")]
    assert all(p.suffix == ".tmp" for p in leftovers)  # a killed process leaves at most a *.tmp
    out.unlink()
    res = subprocess.run(
        [sys.executable, "-m", "grassflow.lm.evaluate", *args, "--out", str(out)],
        env={**os.environ, KILL_WRITING: "eval.json"},
        capture_output=True,
    )
    assert res.returncode == -signal.SIGKILL and not out.exists()
    subprocess.run(
        [sys.executable, "-m", "grassflow.lm.evaluate", *args, "--out", str(out)], check=True
    )
    assert json.loads(out.read_text()) == json.loads(ref.read_text())


def test_the_fault_hook_would_catch_a_non_atomic_write(tmp_path, monkeypatch):
    """The premise of the test above: with the write going straight to the file, the same kill
    leaves a half-written file behind."""
    import grassflow.io as gio

    code = (
        "import grassflow.io as io, pathlib, sys\nio.write_text = lambda p, t: "
        "io._write_bytes(pathlib.Path(p), t.encode(), "
        "pathlib.Path(p).name)\nio.write_json(sys.argv[1], {'k': list(range(100))})\n"
    )
    out = tmp_path / "eval.json"
    res = subprocess.run(
        [sys.executable, "-c", code, str(out)], env={**os.environ, gio.KILL_WRITING: "eval.json"}
    )
    assert res.returncode == -signal.SIGKILL and out.exists()
    with pytest.raises(json.JSONDecodeError):
        json.loads(out.read_text())


def test_resume_after_outputs_were_deleted_still_produces_them(tokens, tmp_path):
    """Snakemake deletes a failed attempt's declared outputs (model.safetensors, config.json,
    metrics.jsonl) before the retry; the resumed run must write them again, with the best epoch's
    weights even when that epoch came before the interruption."""
    proc = subprocess.Popen(
        _cmd(tokens, tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    # an epoch done, the run not: frozen, checked, then SIGTERM
    _wait_for(tmp_path / "metrics.jsonl", proc)
    stop_then_signal(
        proc,
        signal.SIGTERM,
        still=lambda: proc.poll() is None and not (tmp_path / "run.json").exists(),
    )
    assert proc.wait() == 75
    for name in ("model.safetensors", "config.json", "metrics.jsonl"):
        (tmp_path / name).unlink(missing_ok=True)
    rec = train(SPEC, tokens / "train.parquet", tokens / "validation.parquet", tmp_path)
    metrics = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == SPEC["train"]["epochs"]
    best = json.loads((tmp_path / "config.json").read_text())
    assert best["epoch"] == rec["best_epoch"] == min(metrics, key=lambda m: m["val_loss"])["epoch"]


def test_max_steps_per_epoch_caps_every_epoch(tmp_path):
    """train.max_steps_per_epoch: each epoch runs that many steps of its own shuffled order."""
    from grassflow.loop import fit

    class Counting:
        steps_per_epoch, items_per_step, rate_key = 10, 4, "items_per_s"

        def __init__(self):
            self.calls = []

        def batch(self, epoch, step):
            self.calls.append((epoch, step))
            return torch.ones(4, 3)

        def loss(self, model, batch):
            return model(batch).square().mean()

        def validate(self, model):
            return {"val_loss": 1.0}

        def score(self, row):
            return row["val_loss"]

    model = torch.nn.Linear(3, 1)
    task = Counting()
    spec = {
        **SPEC,
        "run_id": "cap",
        "train": {**SPEC["train"], "epochs": 2, "max_steps_per_epoch": 3, "checkpoint_every": 0},
    }
    status, metrics, _ = fit(model, task, spec, tmp_path, torch.device("cpu"), header={})
    assert status == {"state": "completed"} and len(metrics) == 2
    assert task.calls == [(e, s) for e in range(2) for s in range(3)]


def test_head_loss_is_the_jobs_flag_recorded_and_fused_refused_on_the_cpu(tokens, tmp_path):
    """train.head_loss, handed to the job by the rules (--head-loss): recorded in run.json; `fused`
    on a CPU job refused in one error line naming the key, before any training or output."""
    spec = {**SPEC, "train": {**SPEC["train"], "epochs": 1}}
    res = subprocess.run(
        _cmd(tokens, tmp_path / "fused", spec) + ["--head-loss", "fused"],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 1, res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()
    assert (
        lines[-1].startswith("error:")
        and "train.head_loss 'fused'" in lines[-1]
        and "chunked" in lines[-1]
    )
    assert (
        not (tmp_path / "fused" / "last.pt").exists()
        and not (tmp_path / "fused" / "run.json").exists()
    )
    subprocess.run(
        _cmd(tokens, tmp_path / "ref", spec) + ["--head-loss", "reference"],
        check=True,
        capture_output=True,
    )
    assert json.loads((tmp_path / "ref" / "run.json").read_text())["head_loss"] == "reference"


def test_a_checkpoint_from_before_fused_runs_resumes_as_one_member(tmp_path, capsys):
    """last.pt as a single run wrote it before fused runs (its metrics, best_val and status at the
    top, one loss sum) is read as a fit of one member; another spec's is not read at all."""
    from grassflow.checkpoint import resume_state, save_checkpoint

    rows = [{"epoch": 1, "train_loss": 5.0, "val_loss": 4.0}]
    old = {
        "spec_hash": "abc",
        "model": {"w": torch.ones(2)},
        "optimizer": {},
        "rng": {},
        "pos": {"epoch": 1, "step": 0, "loss_sum": 3.5, "seconds": 0.0},
        "metrics": rows,
        "best_val": 4.0,
        "status": {"state": "running"},
    }
    save_checkpoint(tmp_path / "last.pt", old)
    state = resume_state(tmp_path / "last.pt", "abc")
    assert state["members"] == [{"metrics": rows, "best": 4.0, "status": {"state": "running"}}]
    assert state["pos"]["loss_sum"] == [3.5]
    assert resume_state(tmp_path / "last.pt", "another") is None
    assert "belongs to another spec (abc ≠ another); starting fresh" in capsys.readouterr().err
    assert resume_state(tmp_path / "absent.pt", "abc") is None


def test_checkpoints_are_written_beside_training_from_snapshots(tokens, tmp_path, monkeypatch):
    """The loop's checkpoints and best weights are serialized, checksummed, written and fsynced by
    the checkpoint writer's thread, not the training thread, from a snapshot the next steps (which
    update the weights in place) leave as it was, in the order saved; a write that fails is raised
    at the next save or wait, naming its file."""
    import threading
    import time as _time

    from grassflow import loop
    from grassflow.checkpoint import CheckpointWriter, load_checkpoint, save_checkpoint
    from grassflow.errors import DiskSpaceError

    threads = []
    real = loop.save_checkpoint

    def recorded(path, state):
        threads.append(threading.current_thread().name)
        real(path, state)

    monkeypatch.setattr(loop, "save_checkpoint", recorded)
    train(
        {**SPEC, "train": {**SPEC["train"], "epochs": 2}},
        tokens / "train.parquet",
        tokens / "validation.parquet",
        tmp_path / "run",
    )
    assert threads and all(t.startswith("checkpoint") for t in threads), threads

    w = torch.zeros(4)
    writer, order = CheckpointWriter(), []

    def slow(path, state):
        _time.sleep(0.2)
        order.append(path.name)
        save_checkpoint(path, state)

    writer.save(slow, tmp_path / "a.pt", {"w": w, "pos": {"step": 1}})
    w += 1  # the next step, in place, while the first write is still waiting
    writer.save(slow, tmp_path / "b.pt", {"w": w, "pos": {"step": 2}})
    writer.wait()
    assert order == ["a.pt", "b.pt"]
    assert torch.equal(load_checkpoint(tmp_path / "a.pt")["w"], torch.zeros(4))
    assert torch.equal(load_checkpoint(tmp_path / "b.pt")["w"], torch.ones(4))

    def full(path, state):
        raise DiskSpaceError(f"{path}: no space left on its file system")

    writer.save(full, tmp_path / "c.pt", {"w": w})
    with pytest.raises(DiskSpaceError, match="c.pt: no space left"):
        writer.wait()
    writer.close()
