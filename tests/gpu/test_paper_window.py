"""`make gpu-paper-prepare` and `make gpu-paper-window`'s plumbing on the CPU
(bench/gpu_paper_prepare.sh, bench/gpu_paper_window.sh), with the demo preset in place of paper_v1,
at a lease's proportions: a table whose runs need several times the first command's deadline (30
epochs of the demo; the deadline a few epochs past the first minute) and a LEASE that covers them.

Prepared in one checkout, the window runs in a copy made as the GPU machine gets one: the files of
the prepared commit, a .git one commit behind them, the scripts without their run bit, every file's
time disturbed; only the carried tar restoring the results tree, Snakemake's records and the
commit's tree. Such a copy is accepted by its content and its runs record the prepared commit,
clean; one with a real edit (a changed module, a new one) is refused naming them, before anything
runs. Without the tar the window's dry-run gate stops it in one line. With it, only the preflight,
the fused training, the evaluations and the table are planned. A preflight that resolves another
device or op backend than the lease's (EXPECT: cuda cupy) stops the window before training, and so
does a pinned setting (COMPILE, HEAD_LOSS) that the first minute finds failing. The first minute
trains every seed, the lease covering what this command cannot; at the deadline its training
processes, and no other pipeline's, checkpoint and exit 75, each group's budget said against the
deadline and the lease; every started run's epochs so far come back (--keep-incomplete). The lease's
next command (CARRY=/none) reuses the choice, times nothing, resumes the runs and makes the table
from the fused groups (a completed row per run, with two parts: stopped at the deadline, finished).
What comes back holds no weights or checkpoints. A third window elsewhere, given seed 0's records as
the second packed them (FINISHED), adopts them and trains seed 1 alone: the same table. A fourth,
given every run's records, stops at its dry run (nothing to train). A tree with uncommitted changes,
where no prepared tree came, is refused before anything runs."""

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
from html import escape

import numpy as np
import pandas as pd
import pytest
from markdown_it import MarkdownIt

from grassflow import markdown
from helpers.dag import BIN, ROOT, copy_repo, pipeline_env
from helpers.latex import compile_tex, need_pdflatex
from helpers.procs import HANG

pytestmark = pytest.mark.slow
# nodrop.yaml: dropout 0, so that a fused group's member trains as its own run does (within fp32's
# rounding) and a table whose seeds two windows split equals the one window's; 30 epochs, the
# paper's (of 12 steps, a quarter of the demo's), several times what the first command's deadline
# leaves them
DEMO = {"PRESET": "demo", "TARGETS": "table1", "CONFIGFILES": "config.yaml nodrop.yaml"}
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]


def _copy(dst):
    """The repository's files in `dst`, committed to a git repository of their own (a lease runs
    committed code)."""
    dst.mkdir()
    work = copy_repo(dst)
    shutil.copytree(ROOT / "bench", work / "bench")
    shutil.copy(ROOT / ".gitignore", work / ".gitignore")
    (work / "nodrop.yaml").write_text(
        "presets: {demo: {model: {dropout: 0.0}, experiments: {table1: {epochs: 30}}, "
        "train: {max_steps_per_epoch: 12}}}\n"
    )
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "copy"]):
        subprocess.run([*GIT, *args], cwd=work, check=True, capture_output=True)
    return work


def _prepared(tmp_path):
    """A checkout whose last commit (a new file, a changed one) the device copies' .git will lack,
    prepared (make gpu-paper-prepare: the token files, Snakemake's records, the commit's tree in the
    tar)."""
    prep = _copy(tmp_path / "prep")
    (prep / "NOTES.md").write_text("A file of the commit a lagging copy's .git lacks.\n")
    with open(prep / "nodrop.yaml", "a") as f:
        f.write("# and a line of it\n")
    for args in (["add", "-A"], ["commit", "-q", "-m", "the last commit"]):
        subprocess.run([*GIT, *args], cwd=prep, check=True, capture_output=True)
    subprocess.run(
        ["bash", "bench/gpu_paper_prepare.sh"],
        cwd=prep,
        check=True,
        capture_output=True,
        env={
            **pipeline_env(prep),
            **DEMO,
            "SNAKEMAKE": str(BIN / "snakemake"),
            "PY": str(BIN / "python"),
        },
    )
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=prep, capture_output=True, text=True
    ).stdout.strip()
    return prep, commit


def _device_copy(prep, dst):
    """The working tree as a lease's machine gets it: the prepared commit's files and the carried
    tar (not the ignored results, records or tree), a .git one commit behind the files, the scripts
    without their run bit, every file's time disturbed."""
    shutil.copytree(
        prep,
        dst,
        symlinks=True,
        ignore=shutil.ignore_patterns("results", ".snakemake", ".gpu-tree.json"),
    )
    subprocess.run(["git", "reset", "-q", "--mixed", "HEAD~1"], cwd=dst, check=True)
    for script in dst.rglob("*.sh"):
        script.chmod(0o644)
    _disturb_times(dst)
    assert subprocess.run(
        ["git", "status", "--porcelain"], cwd=dst, capture_output=True, text=True
    ).stdout.strip()
    return dst


def _window(work, out, deadline=3000, **env):
    env = {
        **pipeline_env(work),
        **DEMO,
        "PY": str(BIN / "python"),
        "PREFLIGHT": "results/demo/preflight/cpu_auto.json",
        "DEADLINE": str(deadline),
        "THREADS": "1",
        "CANDIDATES": "false:chunked",
        "TIMED_STEPS": "2",
        "EXPECT": "cpu fast",
        "BENCH_ARGS": "--device cpu --quick --parts fused",
        "OUT": str(out),
        **env,
    }
    return subprocess.Popen(
        ["bash", "bench/gpu_paper_window.sh"],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _committed(pack, runs, dst):
    """`runs`' records from a window's pack, as a lease's are committed under reports/
    (FINISHED)."""
    with tarfile.open(pack) as tar:
        for r in runs:
            (dst / r).mkdir(parents=True)
            for f in ("run.json", "eval.json", "metrics.jsonl"):
                (dst / r / f).write_bytes(tar.extractfile(f"results/demo/runs/{r}/{f}").read())
    return dst


def _disturb_times(work):
    """What a copy to another machine may leave: every file's time now, in no particular order."""
    now = time.time()
    for i, p in enumerate(sorted(work.rglob("*"), key=lambda p: hash(p.name))):
        if p.is_file():
            os.utime(p, (now - i % 7, now - i % 7))


def _at(log: str, phrase: str) -> int:
    """The window's second at which it first said `phrase`."""
    line = next(line for line in log.splitlines() if phrase in line)
    return int(re.match(r"\[window (\d+) s\]", line).group(1))


def test_the_window_refuses_uncommitted_code_before_anything_runs(tmp_path):
    work = _copy(tmp_path / "work")
    loop = work / "src/grassflow/loop.py"
    loop.write_text(loop.read_text() + "\n# an edit not committed\n")
    proc = _window(work, tmp_path / "out")
    out, _ = proc.communicate(timeout=HANG)
    assert proc.returncode == 2, out[-3000:]
    assert "error: uncommitted changes to src/grassflow/loop.py: commit them first" in out, out[
        -3000:
    ]
    assert not (
        work / "results/demo/window.yaml"
    ).exists()  # nothing ran: not even the dry run's overlay
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


def test_a_lease_in_two_commands_trains_every_run_it_covers_and_resumes_them(tmp_path, request):
    need_pdflatex()  # its third lease compiles a table: skipped before the first, or not at all
    prep, commit = _prepared(tmp_path)
    # a real edit in the copy (a changed module, a new one) is refused by name, before anything runs
    edited = _device_copy(prep, tmp_path / "edited")
    with open(edited / "src/grassflow/loop.py", "a") as f:
        f.write("\n# an edit not committed\n")
    (edited / "src/grassflow/added.py").write_text("X = 1\n")
    proc = _window(edited, tmp_path / "edited-out")
    out, _ = proc.communicate(timeout=HANG)
    assert proc.returncode == 2, out[-3000:]
    assert (
        "error: src/grassflow/added.py, src/grassflow/loop.py differ from the prepared commit "
        f"{commit[:7]} "
        "(.gpu-tree.json, by content): commit them and run make gpu-paper-prepare again"
    ) in out, out[-3000:]
    assert not (
        edited / "results/demo/window.yaml"
    ).exists()  # nothing ran: not even the dry run's overlay

    work = _device_copy(prep, tmp_path / "work")
    # a lease is for CUDA and the CuPy kernels: what this preflight resolves (cpu, fast) stops it
    proc = _window(work, tmp_path / "expect", EXPECT="cuda cupy")
    out, _ = proc.communicate(timeout=HANG)
    assert proc.returncode == 2, out[-3000:]
    assert f"tree: the prepared commit {commit[:12]}, every file its own (by content)" in out, out[
        -3000:
    ]
    assert (
        "error: the preflight resolved 'cpu fast' (device, op backends), not 'cuda cupy'" in out
    ), out[-3000:]
    assert not (work / "results/demo/fused").exists()
    assert "planned: preflight 1, train_fused 2, evaluate 4, aggregate 1, table1 1\n" in out, out[
        -3000:
    ]
    # a grid is a target too (#108's first step: the sweep): its gate plans its runs and its table
    # (mutation: sweep_aggregate out of the window's rules refuses it)
    gate = subprocess.run(
        [str(BIN / "python"), "-m", "grassflow.lease", "gate", "--preset", "demo", "--configfile"]
        + DEMO["CONFIGFILES"].split()
        + ["--overlay", "results/demo/window.yaml", "--targets", "sweep", "--carry", "x"],
        cwd=work,
        env=pipeline_env(work),
        capture_output=True,
        text=True,
    )
    assert gate.returncode == 0, gate.stdout + gate.stderr
    assert re.fullmatch(
        r"planned: train_fused 6, evaluate 12, sweep_aggregate 1, sweep 1\n", gate.stdout
    )
    # a pinned setting trains only after the first minute has it computing the reference's loss on
    # the device: the fused head's kernels are not on this machine, so no training
    proc = _window(work, tmp_path / "head", COMPILE="false", HEAD_LOSS="fused")
    out, _ = proc.communicate(timeout=HANG)
    assert proc.returncode == 1, out[-3000:]
    assert "first minute: table1 transformer: dropped compile=false head_loss=fused: " in out, out[
        -3000:
    ]
    assert (
        "error: compile=false head_loss=fused does not compute the reference's loss here, or failed"
        in out
    )
    assert (
        not (work / "results/demo/fused").exists()
        and not (work / "results/demo/window-choice.json").exists()
    )
    # this machine's first minute
    chosen_by = _at((tmp_path / "head/window.log").read_text(), "first minute:")

    # the lease's first command: its deadline passed by the time its Snakemake starts (the runs
    # need many times its first minute), the lease ample. The window is held once its Snakemake has
    # started, until every group has checkpointed its first epoch: each run is then past its start
    # when the deadline stops it, however slowly this machine started them, and the window says
    # each group's projected finish once its jobs have stopped (a deadline among the first epochs
    # raced the hold: a CI run's window said no projection; mutation: the window's one call before
    # SIGTERM fails this)
    decoy = subprocess.Popen(  # another pipeline's training job, as it reads
        [
            sys.executable,
            "-c",
            "import time; time.sleep(3600)",
            "grassflow.lm.train ",
            "--out-dir",
            "another/pipeline",
        ]
    )
    request.addfinalizer(decoy.kill)  # a failed assertion below leaves no sleeper
    proc = _window(work, tmp_path / "first", deadline=chosen_by - 3, LEASE="3000")
    res = work / "results/demo"
    groups = ("table1-transformer", "table1-grassmann")
    t0 = time.time()
    while not (res / "logs/window-snakemake.log").exists():
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.time() - t0 < HANG
        time.sleep(0.05)
    proc.send_signal(signal.SIGSTOP)
    try:
        while not all((res / f"fused/{g}/last.pt").exists() for g in groups):
            assert time.time() - t0 < HANG, "no group finished an epoch"
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGCONT)
    out, _ = proc.communicate(timeout=HANG)
    assert proc.returncode != 0, out[-3000:]  # the interrupted jobs failed: Snakemake says so
    log = (tmp_path / "first/window.log").read_text()
    # every seed this lease: the lease covers what this command's deadline cannot
    fm = re.search(
        r"first minute: table1: seeds 0, 1 this lease \(about (\d+) s of training for 2 seed\(s\) "
        r"of 2 to "
        r"train; (\d+) s of the lease's training left, (\d+) s to this command's deadline: they "
        r"finish "
        r"in the lease's next command\)",
        log,
    )
    assert fm, log
    assert int(fm.group(1)) > 2 * int(fm.group(3)), log  # several times this command's deadline
    assert "deadline: SIGTERM to the training jobs" in log
    for g in groups:  # the budget: epoch time, projected finish, against the deadline and the lease
        assert re.search(
            rf"{g} budget: epoch \d+ took \d+ s; all 30 epochs done at about \d+ s of the window, "
            r"deadline \d+ s, lease 2940 s: fits in the lease: about \d+ of 30 epochs by the "
            r"deadline, "
            "the rest in its next command",
            log,
        ), log
    logs = "".join(p.read_text() for p in (res / "logs/train_fused").glob("*.log"))
    assert logs.count("SIGTERM: checkpointed at epoch") == 2
    assert not list((res / "runs").glob("*/run.json"))  # an interrupted run never looks complete
    assert decoy.poll() is None, "the deadline signalled a training job that was not the window's"
    decoy.kill()
    # the curves came back: in the pack, and each run's epochs and best PPL so far in the closing
    # lines
    with tarfile.open(tmp_path / "first/records.tar.gz") as tar:
        packed = {
            n: tar.extractfile(n).read().decode()
            for n in tar.getnames()
            if n.endswith("metrics.jsonl")
        }
    runs = [f"{g}-s{s}" for g in groups for s in range(2)]  # the demo's two seeds
    assert sorted(packed) == sorted(f"results/demo/runs/{r}/metrics.jsonl" for r in runs)
    for r in runs:
        rows = [
            json.loads(line) for line in packed[f"results/demo/runs/{r}/metrics.jsonl"].splitlines()
        ]
        best = min(row["val_ppl"] for row in rows)
        assert (
            1 <= len(rows) < 30
            and f"{r}: {len(rows)} epochs, best validation PPL so far {best:.1f}" in log
        ), log

    # the lease's next command, at once: the first's choice reused, nothing timed, the runs resumed
    proc = _window(work, tmp_path / "second", CARRY="/none")
    out, _ = proc.communicate(timeout=HANG)
    assert proc.returncode == 0, out[-3000:]
    assert re.search(
        r"reusing compile=false head_loss=chunked chosen at \d{4}-\d\d-\d\dT[\d:]+\+00:00 "
        r"\(table1 seeds 0, 1; the lease ends at ",
        out,
    ), out[-3000:]
    assert "first minute:" not in out and not (tmp_path / "second/choose-cpu.json").exists()
    logs = "".join(p.read_text() for p in (res / "logs/train_fused").glob("*.log"))
    assert logs.count("[train] resuming") == 2
    # the table from fused groups: a completed row each, linked to its run's record, which names its
    # group, its two parts and the prepared commit, clean (checked by content)
    one = pd.read_csv(res / "report/table1.csv").set_index("run_id")  # the one lease's table
    assert sorted(one.index) == sorted(runs) and (one.status == "completed").all()
    md = (res / "report/table1.md").read_text()
    for r in runs:
        group, seed = r.rsplit("-s", 1)
        rec = json.loads((res / "runs" / r / "run.json").read_text())
        assert rec["fused"] == {
            "runs": [f"{group}-s0", f"{group}-s1"],
            "work_dir": f"results/demo/fused/{group}",
            "index": int(seed),
        }
        assert [p["ended"] for p in rec["parts"]] == ["SIGTERM", "finished"], rec["parts"]
        assert rec["git"] == {"commit": commit, "dirty": False, "checked": "content"}
        assert all(p["commit"] == commit and p["dirty"] is False for p in rec["parts"])
        assert f"[{r}](../runs/{r}/run.json)" in md
    with tarfile.open(tmp_path / "second/records.tar.gz") as tar:
        names = tar.getnames()
    assert (
        "results/demo/report/table1.md" in names
        and "results/demo/runs/table1-grassmann-s1/run.json" in names
    )
    assert not [n for n in names if n.endswith((".pt", ".safetensors", ".parquet"))]
    assert all(p.stat().st_size < 16 * 2**20 for p in (tmp_path / "second").iterdir())
    assert len(list((tmp_path / "second").iterdir())) <= 8
    choice = (tmp_path / "first/choose-cpu.md").read_text()  # the first minute's figures came back
    assert "| table1 | grassmann | 2 | false | chunked | ok |" in choice
    assert "chosen: compile=false head_loss=chunked" in choice

    # seeds across leases: seed 0's records as the second window packed them (committed, as under
    # reports/), and a third window on another machine adopts them and trains seed 1 alone: the one
    # window's table. Their directory's name holds every character finished_runs allows that
    # Markdown or LaTeX would read
    records = _committed(
        tmp_path / "second/records.tar.gz",
        [f"{g}-s0" for g in groups],
        tmp_path / "_lease_+1@a,b~c",
    )
    third = _device_copy(prep, tmp_path / "third-work")
    proc = _window(third, tmp_path / "third", FINISHED=str(records))
    out, _ = proc.communicate(timeout=HANG)
    assert proc.returncode == 0, out[-3000:]
    assert "first minute: table1: seeds 1 this lease" in out, out[-3000:]
    assert (
        "planned: adopt_run 2, preflight 1, train 2, evaluate 2, aggregate 1, table1 1\n" in out
    ), out[-3000:]
    split = pd.read_csv(third / "results/demo/report/table1.csv").set_index("run_id")
    assert sorted(one.index) == sorted(split.index) == sorted(runs)
    # seed 1 alone vs as a fused member: equal within fp32's rounding
    for col in (
        "val_ppl",
        "test_ppl",
    ):
        assert np.allclose(split[col], one.loc[split.index, col], rtol=1e-4, atol=0), col
    assert (
        split.loc[[f"{g}-s0" for g in groups], "weights_sha256"]
        == one.loc[[f"{g}-s0" for g in groups], "weights_sha256"]
    ).all()
    md = (third / "results/demo/report/table1.md").read_text()
    assert (
        f"From records made elsewhere (finished_runs: {markdown.text(records)}): "
        "table1-grassmann-s0, table1-transformer-s0; the others trained in this tree."
    ) in md, md
    # and rendered (CommonMark, as a Markdown viewer or the report shows it) the path is that text,
    # no markup; the LaTeX table, whose comment names it, compiles
    html = MarkdownIt("commonmark").enable("table").render(md)
    assert f"(finished_runs: {escape(str(records), quote=False)}): table1-grassmann-s0" in html, (
        html
    )
    compile_tex(third / "results/demo/report/table1.tex", tmp_path / "tex")
    # seed 0 adopted, not evaluated again (the record's evaluation as it was); seed 1 trained here
    for g in groups:
        adopted = third / f"results/demo/runs/{g}-s0"
        assert json.loads((adopted / "adopted.json").read_text())["source"] == str(
            records / f"{g}-s0"
        )
        assert (adopted / "eval.json").read_bytes() == (records / f"{g}-s0/eval.json").read_bytes()
        assert split.loc[f"{g}-s0", "adopted_from"] == str(records / f"{g}-s0") and pd.isna(
            split.loc[f"{g}-s1", "adopted_from"]
        )

    # a lease whose target's runs are all finished in earlier leases trains nothing: it stops at the
    # dry run, in seconds, before the preflight and the first minute, and says what to do
    done = _committed(tmp_path / "second/records.tar.gz", runs, tmp_path / "all-seeds")
    fourth = _device_copy(prep, tmp_path / "fourth-work")
    proc = _window(fourth, tmp_path / "fourth", FINISHED=str(done))
    out, _ = proc.communicate(timeout=HANG)
    assert proc.returncode == 3, out[-3000:]
    assert (
        "error: the dry run of table1 plans no training or evaluation: its runs are all finished "
        f"({done}); name the next target (TARGETS="
    ) in out, out[-3000:]
    assert (
        not (fourth / "results/demo/preflight").exists()
        and not (fourth / "results/demo/runs").exists()
    )
