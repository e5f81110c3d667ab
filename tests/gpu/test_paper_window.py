"""`make gpu-paper-prepare` and `make gpu-paper-window`'s plumbing on the CPU
(bench/gpu_paper_prepare.sh, bench/gpu_paper_window.sh), with the demo preset in place of paper_v1.

Prepared in one copy, the window runs in another, as on the GPU machine: every file's time
disturbed, only the carried tar restoring the results tree and Snakemake's records. Without the tar
the window's dry-run gate stops it in one line before any work. With it, only the preflight, the
fused training, the evaluations and the table are planned; once a group's first epoch is in, the
window states its projected finish against the deadline. Stopped at its deadline (here: SIGUSR1
once every group has finished an epoch and checkpointed), its training processes, and no other
pipeline's, checkpoint and exit 75. A preflight that resolves another device or op backend than the
lease's (EXPECT: cuda cupy) stops the window before training, and so does a pinned setting
(COMPILE, HEAD_LOSS) that the first minute finds failing. Every started run's epochs so far come back
(--keep-incomplete), and the window's closing lines say them. The same command again resumes
them and makes the table from the fused groups (a completed row per run, whose record names its
group), with the first minute's choice and figures (grassflow.bench.choose). What
comes back holds no weights or checkpoints. A third window elsewhere, given seed 0's records as the
second packed them (FINISHED), adopts them and trains seed 1 alone: the same table. A tree with
uncommitted changes is refused before anything runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time

import numpy as np
import pandas as pd
import pytest

from helpers.dag import BIN, ROOT, copy_repo, pipeline_env
from helpers.procs import HANG

pytestmark = pytest.mark.slow
# nodrop.yaml: dropout 0, so that a fused group's member trains as its own run does (within fp32's rounding)
# and a table whose seeds two windows split equals the one window's; 4 epochs, so that no group finishes
# before the deadline the test sets once every group has one
DEMO = {"PRESET": "demo", "TARGETS": "table1", "CONFIGFILES": "config.yaml nodrop.yaml"}


def _copy(dst):
    """The repository's files in `dst`, committed to a git repository of their own (a lease runs
    committed code)."""
    dst.mkdir()
    work = copy_repo(dst)
    shutil.copytree(ROOT / "bench", work / "bench")
    shutil.copy(ROOT / ".gitignore", work / ".gitignore")
    (work / "nodrop.yaml").write_text("presets: {demo: {model: {dropout: 0.0}, experiments: {table1: {epochs: 4}}}}\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "copy"]):
        subprocess.run([*git, *args], cwd=work, check=True, capture_output=True)
    return work


def _window(work, out, deadline=3000, **env):
    env = {**pipeline_env(work), **DEMO, "PY": str(BIN / "python"), "PREFLIGHT": "results/demo/preflight/cpu_auto.json",
           "DEADLINE": str(deadline), "THREADS": "1", "CANDIDATES": "false:chunked", "TIMED_STEPS": "2", "EXPECT": "cpu fast",
           "BENCH_ARGS": "--device cpu --quick --parts fused", "OUT": str(out), **env}
    return subprocess.Popen(["bash", "bench/gpu_paper_window.sh"], cwd=work, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _disturb_times(work):
    """What a copy to another machine may leave: every file's time now, in no particular order."""
    now = time.time()
    for i, p in enumerate(sorted(work.rglob("*"), key=lambda p: hash(p.name))):
        if p.is_file():
            os.utime(p, (now - i % 7, now - i % 7))


def test_the_window_refuses_uncommitted_code_before_anything_runs(tmp_path):
    work = _copy(tmp_path / "work")
    loop = work / "src/grassflow/loop.py"
    loop.write_text(loop.read_text() + "\n# an edit not committed\n")
    proc = _window(work, tmp_path / "out")
    out, _ = proc.communicate(timeout=HANG)
    assert proc.returncode == 2, out[-3000:]
    assert "error: uncommitted changes to src/grassflow/loop.py: commit them first" in out, out[-3000:]
    assert not (work / "results/demo/window.yaml").exists()  # nothing ran: not even the dry run's overlay
    shutil.rmtree(work / ".git")  # and a tree outside git cannot trace to a commit at all
    proc = _window(work, tmp_path / "out")
    out, _ = proc.communicate(timeout=HANG)
    assert proc.returncode == 2 and "error: this tree is not a git checkout" in out, out[-3000:]


def test_the_window_refuses_a_tree_whose_data_stages_would_replan(tmp_path):
    work = _copy(tmp_path / "work")
    proc = _window(work, tmp_path / "out")
    out, _ = proc.communicate(timeout=HANG)
    assert proc.returncode == 2, out[-3000:]
    log = (tmp_path / "out/window.log").read_text()
    assert "error: the dry run plans" in log and "documents" in log, log
    assert "preflight done" not in log and not (work / "results/demo/preflight").exists()


def test_the_gpu_window_stops_at_its_deadline_keeps_the_curves_and_resumes(tmp_path):
    prep = _copy(tmp_path / "prep")
    subprocess.run(["bash", "bench/gpu_paper_prepare.sh"], cwd=prep, check=True, capture_output=True,
                   env={**pipeline_env(prep), **DEMO, "SNAKEMAKE": str(BIN / "snakemake")})
    work = _copy(tmp_path / "work")
    shutil.copy(prep / ".gpu-carry.tar", work / ".gpu-carry.tar")
    _disturb_times(work)
    # a lease is for CUDA and the CuPy kernels: what this preflight resolves (cpu, fast) stops it
    proc = _window(work, tmp_path / "expect", EXPECT="cuda cupy")
    out, _ = proc.communicate(timeout=HANG)
    assert proc.returncode == 2, out[-3000:]
    assert "error: the preflight resolved 'cpu fast' (device, op backends), not 'cuda cupy'" in out, out[-3000:]
    assert not (work / "results/demo/fused").exists()
    assert "planned: preflight 1, train_fused 2, evaluate 4, aggregate 1, table1 1," in out, out[-3000:]
    # a pinned setting trains only after the first minute has it computing the reference's loss on the
    # device: the fused head's kernels are not on this machine, so no training
    proc = _window(work, tmp_path / "head", COMPILE="false", HEAD_LOSS="fused")
    out, _ = proc.communicate(timeout=HANG)
    assert proc.returncode == 1, out[-3000:]
    assert "first minute: table1 grassmann: dropped compile=false head_loss=fused: " in out, out[-3000:]
    assert "error: compile=false head_loss=fused does not compute the reference's loss here, or failed" in out
    assert not (work / "results/demo/fused").exists()
    # another pipeline's training job on the same machine (here: a process whose command line reads as one)
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", "grassflow.lm.train ",
                              "--out-dir", "another/pipeline"])
    proc = _window(work, tmp_path / "first")
    res = work / "results/demo"
    t0 = time.time()
    groups = ("table1-transformer", "table1-grassmann")
    log = tmp_path / "first/window.log"
    # every group past its first epoch, budgeted and checkpointed (metrics.jsonl is written before last.pt)
    while not (log.exists() and all((res / f"fused/{g}/last.pt").exists() and f"{g} budget: epoch" in log.read_text()
                                     for g in groups)):
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.time() - t0 < HANG, "no group finished an epoch"
        time.sleep(0.5)
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=HANG)
    assert proc.returncode != 0, out[-3000:]  # the interrupted jobs failed: Snakemake says so
    log = log.read_text()
    assert "planned: train_fused 2, evaluate 4, aggregate 1, table1 1," in log, log  # the preflight ran above
    assert "deadline: SIGTERM to the training jobs" in log
    for g in groups:  # the budget before the end: epoch time, projected finish, against a deadline of 3000 s
        assert re.search(rf"{g} budget: epoch \d+ took \d+ s; all \d+ epochs done at about \d+ s of the window, "
                         r"deadline 3000 s: fits", log), log
        assert log.index(f"{g} budget:") < log.index("deadline: SIGTERM")
    logs = "".join(p.read_text() for p in (res / "logs/train_fused").glob("*.log"))
    assert "SIGTERM: checkpointed at epoch" in logs
    assert not list((res / "runs").glob("*/run.json"))  # an interrupted run never looks complete
    assert decoy.poll() is None, "the deadline signalled a training job that was not the window's"
    decoy.kill()
    # the curves came back: in the pack, and each run's epochs and best PPL so far in the closing lines
    with tarfile.open(tmp_path / "first/records.tar.gz") as tar:
        packed = {n: tar.extractfile(n).read().decode() for n in tar.getnames() if n.endswith("metrics.jsonl")}
    runs = [f"{g}-s{s}" for g in groups for s in range(2)]  # the demo's two seeds
    assert sorted(packed) == sorted(f"results/demo/runs/{r}/metrics.jsonl" for r in runs)
    for r in runs:
        rows = [json.loads(line) for line in packed[f"results/demo/runs/{r}/metrics.jsonl"].splitlines()]
        best = min(row["val_ppl"] for row in rows)
        assert f"{r}: {len(rows)} epochs, best validation PPL so far {best:.1f}" in log, log

    proc = _window(work, tmp_path / "second", CARRY="/none")
    out, _ = proc.communicate(timeout=HANG)
    assert proc.returncode == 0, out[-3000:]
    logs = "".join(p.read_text() for p in (res / "logs/train_fused").glob("*.log"))
    assert logs.count("[train] resuming") == 2
    # the table from fused groups: a completed row each, linked to its run's record, which names its group
    one = pd.read_csv(res / "report/table1.csv").set_index("run_id")  # the one window's table
    assert sorted(one.index) == sorted(runs) and (one.status == "completed").all()
    md = (res / "report/table1.md").read_text()
    for r in runs:
        group, seed = r.rsplit("-s", 1)
        fused = json.loads((res / "runs" / r / "run.json").read_text())["fused"]
        assert fused == {"runs": [f"{group}-s0", f"{group}-s1"], "work_dir": f"results/demo/fused/{group}", "index": int(seed)}
        assert f"[{r}](../runs/{r}/run.json)" in md
    with tarfile.open(tmp_path / "second/records.tar.gz") as tar:
        names = tar.getnames()
    assert "results/demo/report/table1.md" in names and "results/demo/runs/table1-grassmann-s1/run.json" in names
    assert not [n for n in names if n.endswith((".pt", ".safetensors", ".parquet"))]
    assert all(p.stat().st_size < 16 * 2**20 for p in (tmp_path / "second").iterdir())
    assert len(list((tmp_path / "second").iterdir())) <= 8
    choice = (tmp_path / "second/choose-cpu.md").read_text()  # the first minute's figures came back
    assert "| table1 | grassmann | 2 | false | chunked | ok |" in choice
    assert "chosen: compile=false head_loss=chunked" in choice
    assert "first minute: table1: seeds 0, 1 this lease" in out

    # seeds across leases: seed 0's records as the second window packed them (committed, as under reports/),
    # and a third window on another machine adopts them and trains seed 1 alone: the one window's table
    records = tmp_path / "records"
    with tarfile.open(tmp_path / "second/records.tar.gz") as tar:
        for g in groups:
            for f in ("run.json", "eval.json", "metrics.jsonl"):
                (records / f"{g}-s0").mkdir(parents=True, exist_ok=True)
                (records / f"{g}-s0" / f).write_bytes(tar.extractfile(f"results/demo/runs/{g}-s0/{f}").read())
    third = _copy(tmp_path / "third-work")
    shutil.copy(prep / ".gpu-carry.tar", third / ".gpu-carry.tar")
    proc = _window(third, tmp_path / "third", FINISHED=str(records))
    out, _ = proc.communicate(timeout=HANG)
    assert proc.returncode == 0, out[-3000:]
    assert "first minute: table1: seeds 1 this lease" in out, out[-3000:]
    assert "planned: adopt_run 2, preflight 1, train 2, evaluate 2, aggregate 1, table1 1," in out, out[-3000:]
    split = pd.read_csv(third / "results/demo/report/table1.csv").set_index("run_id")
    assert sorted(one.index) == sorted(split.index) == sorted(runs)
    for col in ("val_ppl", "test_ppl"):  # seed 1 alone vs as a fused member: equal within fp32's rounding
        assert np.allclose(split[col], one.loc[split.index, col], rtol=1e-4, atol=0), col
    assert (split.loc[[f"{g}-s0" for g in groups], "weights_sha256"] == one.loc[[f"{g}-s0" for g in groups],
                                                                                  "weights_sha256"]).all()
    md = (third / "results/demo/report/table1.md").read_text()
    assert (f"From records made elsewhere (finished_runs: {records}): table1-grassmann-s0, table1-transformer-s0; "
            "the others trained in this tree.") in md, md
    for g in groups:  # seed 0 adopted, not evaluated again (the record's evaluation as it was); seed 1 trained here
        adopted = third / f"results/demo/runs/{g}-s0"
        assert json.loads((adopted / "adopted.json").read_text())["source"] == str(records / f"{g}-s0")
        assert (adopted / "eval.json").read_bytes() == (records / f"{g}-s0/eval.json").read_bytes()
        assert split.loc[f"{g}-s0", "adopted_from"] == str(records / f"{g}-s0") and pd.isna(split.loc[f"{g}-s1", "adopted_from"])
