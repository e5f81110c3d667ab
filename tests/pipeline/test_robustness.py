"""The demo's DAG when things go wrong or run elsewhere: a SIGKILLed pipeline, a run rerun for a
code edit beside its old checkpoint, crafted checkpoints in a shared results tree, a stand-in pool
of GPU slots."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from helpers.dag import (
    BIN,
    assert_same_tables,
    copy_demo,
    pipeline_env,
    planned,
    snakemake,
)


@pytest.mark.slow
def test_sigkilled_pipeline_reruns_incomplete_jobs_and_ends_identical(demo, tmp_path):
    """Kill the whole Snakemake process group mid-training: half-written run directories
    (metrics.jsonl exists after an epoch, run.json not yet) are never taken as done; the rerun
    resumes them and the tables equal the uninterrupted run's. It starts from a copy of the finished
    demo elsewhere (outputs, mtimes, Snakemake metadata), which plans nothing, with two runs
    deleted, so only those runs and what reads them are redone, without the demo's stand-in GPU
    pool: the same weights as the packed runs'."""
    import signal
    import time

    work = tmp_path / "work"
    copy_demo(demo, work)
    assert not planned(work), "a moved project directory made jobs look changed"
    redo = ["table1-grassmann-s1", "table1-transformer-s1"]
    for name in redo:
        shutil.rmtree(work / "results/demo/runs" / name)
    jobs = planned(work)
    assert {run for (rule, run) in jobs if rule == "train"} == set(redo), jobs
    assert {("evaluate", name) for name in redo} | {("aggregate", None)} <= set(jobs), jobs
    table = work / "results/demo/report/table1.csv"
    old_table = table.stat().st_mtime_ns
    env = pipeline_env(work)
    proc = subprocess.Popen(
        [str(BIN / "snakemake"), "--cores", "2", "--config", "preset=demo"],
        cwd=work,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    runs = [work / "results/demo/runs" / name for name in redo]
    deadline = time.time() + 1200
    while (
        time.time() < deadline
        and proc.poll() is None
        and not any((d / "metrics.jsonl").exists() for d in runs)
    ):
        time.sleep(0.05)
    # frozen: the state the kill is for cannot change before it lands
    os.killpg(proc.pid, signal.SIGSTOP)
    half = [d for d in runs if (d / "metrics.jsonl").exists() and not (d / "run.json").exists()]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert half, "the kill did not land inside a training job"
    jobs = planned(work)
    for d in half:
        assert ("train", d.name) in jobs
    snakemake(work, "--unlock")  # a SIGKILLed Snakemake leaves its lock, as it documents
    snakemake(work)
    assert table.stat().st_mtime_ns > old_table, (
        "the tables were not rewritten from the redone runs"
    )
    assert_same_tables(demo, work)


@pytest.mark.slow
def test_a_run_rerun_because_its_code_changed_trains_anew(demo, tmp_path):
    """A real edit of the Grassmann model's code reruns its runs' training (their code fingerprint
    changed); such a job trains from its first step, never from the finished run's last.pt still in
    its directory: that was written by other code (the job's fingerprint, --code), and finishing it
    would give the old numbers as the new code's."""
    work = tmp_path / "work"
    copy_demo(demo, work)
    model = work / "src/grassflow/models/grassmann.py"
    block = "    def forward(self, h, *mix_args):\n"
    assert model.read_text().count(block) == 1
    model.write_text(model.read_text().replace(block, block + "        h = 0.5 * h\n"))
    run = "table1-grassmann-s0"
    snakemake(work, f"results/demo/runs/{run}/model.safetensors")  # its training job only
    log = (work / f"results/demo/logs/train/{run}.log").read_text()
    assert (
        "was written by other code" in log and "resuming" not in log and "had ended" not in log
    ), log[-2000:]
    old, new = (
        json.loads((d / f"results/demo/runs/{run}/run.json").read_text()) for d in (demo, work)
    )
    assert [(p["from"], p["ended"]) for p in new["parts"]] == [
        ({"epoch": 0, "step": 0}, "finished")
    ], new["parts"]
    assert (
        new["parts"][0]["started_at"] > old["finished_at"]
        and new["weights_sha256"] != old["weights_sha256"]
    )


@pytest.mark.slow
def test_crafted_checkpoints_in_a_shared_results_tree_fail_their_jobs_and_run_nothing(
    demo, tmp_path
):
    """A results tree is shared: whoever can write one file in it must not run code as the next
    user. Crafted pickles (they would create a marker file) as the weights (model.safetensors) of an
    LM, an SNLI and a recall run, and as last.pt (with a valid checksum) of an LM run to be resumed:
    each job fails with one `error:` line naming its file, the marker is never created, and the
    other jobs still run (--keep-going). With the real files back, the same tree (a copy of the
    demo's: a results tree copied from another user) completes those jobs, without the demo's GPU
    pool, and its tables are the demo's."""
    from helpers.payload import crafted_last, crafted_weights

    work = tmp_path / "work"
    copy_demo(demo, work)
    marker = tmp_path / "marker"
    res = work / "results/demo"
    evaluated = {
        "evaluate/table1-grassmann-s0": res / "runs/table1-grassmann-s0",
        "snli/evaluate/table3-grassmann-s0": res / "snli/runs/table3-grassmann-s0",
        "recall/evaluate/L32-kv4-d32-grassmann_geometric-lr0.001-s0": res
        / "recall/runs/L32-kv4-d32-grassmann_geometric-lr0.001-s0",
    }
    for run_dir in evaluated.values():
        crafted_weights(
            run_dir / "model.safetensors", marker, header={"spec": {"run_id": run_dir.name}}
        )
        (run_dir / "eval.json").unlink()
    resumed = res / "runs/table1-transformer-s1"
    crafted_last(resumed / "last.pt", marker)
    (resumed / "run.json").unlink()
    out = snakemake(work, "--keep-going", check=False)
    assert out.returncode != 0
    assert not marker.exists(), "a crafted checkpoint ran its code"
    for log, path, why in [
        *(
            (k, v / "model.safetensors", "not a readable safetensors file")
            for k, v in evaluated.items()
        ),
        ("train/table1-transformer-s1", resumed / "last.pt", "refused: not a data-only checkpoint"),
    ]:
        errors = [
            x
            for x in (res / "logs" / f"{log}.log").read_text().splitlines()
            if x.startswith("error:")
        ]
        assert len(errors) == 1 and f"{path.relative_to(work)}: {why}" in errors[0], errors
    assert (res / "runs/table2-grassmann-s0/eval.json").exists()  # the other jobs ran

    # the real files back: the refused jobs (an evaluation of each task, a resumed training) run
    for path in [
        *(v / f for v in evaluated.values() for f in ("model.safetensors", "config.json")),
        resumed / "last.pt",
    ]:
        shutil.copy2(demo / path.relative_to(work), path)
    jobs = planned(work)
    assert {run for (rule, run) in jobs if rule.endswith("evaluate")} == {
        *(v.name for v in evaluated.values()),
        resumed.name,
    }, jobs
    snakemake(work)
    assert_same_tables(demo, work)


def test_the_demo_ran_on_its_stand_in_pool_of_two_gpus_with_two_runs_each(demo):
    """The demo fixture ran with GRASSFLOW_GPUS=0,1, train.runs_per_gpu: 2 and `grassflow gpus`'s
    flag, with 5 cores for 4 slots: every GPU job took a slot; jobs that ran at the same time held
    distinct (GPU, slot) pairs, never more than 4 at once; the benchmark had its GPU to itself. (Its
    tables equal unpacked runs': the SIGKILL and crafted-checkpoint tests above redo training and
    every evaluation without the pool, the SLURM test the whole demo.)"""
    res = demo / "results/demo"
    held = []  # (gpu, slot, start, end) of every run's training and evaluation
    for rec in res.glob("**/runs/*/run.json"):
        r = json.loads(rec.read_text())
        ev = json.loads(rec.with_name("eval.json").read_text())
        s = r["gpu_slot"]
        assert s["source"] == "override" and s["runs_per_gpu"] == 2 and r["device_type"] == "cpu"
        held.append((s["gpu"], s["slot"], s["acquired_at"], r["finished_at"]))
        assert ev["gpu_slot"]["slot"] in (0, 1)
    assert len(held) == 26  # the LM's 18 runs (the sweep's 8 among them), SNLI's 4, recall's 4
    bench = json.loads((res / "bench/bench.json").read_text())["gpu_slot"]
    assert bench["slot"] == "all"
    for g, _slot, a, b in held:  # the jobs holding a slot at the moment each one took its own
        at_once = [h for h in held if h[2] <= a < h[3]]
        assert len(at_once) <= 4
        assert len({(h[0], h[1]) for h in at_once}) == len(at_once), at_once  # a slot each
        assert not (g == bench["gpu"] and a < bench["finished_at"] and bench["acquired_at"] < b)


@pytest.mark.slow
def test_damaged_files_the_jobs_read_back_fail_them_by_name_and_change_no_table(demo, tmp_path):
    """Files of a finished demo damaged as a full disk, an interrupted copy or an editor leave them.
    First a run's config.json emptied, another's holding no fields ({}), another's model.safetensors
    cut short, a third's last.pt cut short (its run.json and eval.json gone, so it resumes); then,
    those restored, the LM's test token file cut short; then the documents file lm-eval's perplexity
    reads zeroed; then the records the tables read (a run.json, a metrics.jsonl, an SNLI and a
    recall eval.json); last, a raw split. `snakemake
    --keep-going`
    fails each job that reads one with one `error:` line naming the file (and how to rebuild it),
    and no table is rewritten from them."""
    work = tmp_path / "work"
    copy_demo(demo, work)
    res = work / "results/demo"
    tables = {p: p.read_bytes() for p in (res / "report").glob("table*.csv")}

    def written():
        return {p: p.stat().st_mtime_ns for p in (res / "logs").rglob("*.log")}

    # the error lines of the logs this run wrote (not by time: the last run's may be
    def errors(
        *targets,
    ):
        before = written()  # within any margin of this one's start)
        out = snakemake(work, "--keep-going", *targets, check=False)
        assert out.returncode != 0
        logs = {
            p.relative_to(res / "logs").as_posix(): p.read_text()
            for p, t in written().items()
            if before.get(p) != t
        }
        return {k: [x for x in v.splitlines() if x.startswith("error:")] for k, v in logs.items()}

    def cut(path, keep):
        path.write_bytes(path.read_bytes()[:keep])

    config = res / "runs/table2-transformer-s0/config.json"
    # JSON, but none of a config.json's fields
    fieldless = res / "runs/table2-transformer-s1/config.json"
    weights = res / "runs/table2-grassmann-s1/model.safetensors"
    last = res / "runs/table1-transformer-s1/last.pt"
    config.write_text("")
    fieldless.write_text("{}")
    cut(weights, 1000)
    cut(last, last.stat().st_size // 2)
    # eval.json too: Snakemake replans no job whose outputs all exist
    for f in (
        "run.json",
        "eval.json",
    ):
        (res / "runs/table1-transformer-s1" / f).unlink()
    found = errors()
    for log, path, why in [
        ("train/table1-transformer-s1.log", last, "checksum mismatch"),
        ("evaluate/table2-grassmann-s1.log", weights, "not a readable safetensors file"),
        ("evaluate/table2-transformer-s0.log", config, "not JSON"),
        (
            "evaluate/table2-transformer-s1.log",
            fieldless,
            "lacks spec.run_id, epoch, weights_sha256",
        ),
    ]:
        assert len(found[log]) == 1 and f"{path.relative_to(work)}: {why}" in found[log][0], (
            log,
            found[log],
        )
    assert {
        p: p.read_bytes() for p in (res / "report").glob("table*.csv")
    } == tables  # no table from them

    for path in (config, fieldless, weights, last):
        shutil.copy2(demo / path.relative_to(work), path)
    tokens = next(res.glob("data/tokens/*/test.parquet"))
    cut(tokens, tokens.stat().st_size // 2)
    one_evaluation = "results/demo/runs/table1-grassmann-s0/eval.json"  # as every LM run's: one job
    found = errors(one_evaluation)
    failed = [k for k, e in found.items() if e]
    assert failed == ["evaluate/table1-grassmann-s0.log"] and len(found[failed[0]]) == 1, found
    assert (
        f"{tokens.relative_to(work)}: unreadable token file" in found[failed[0]][0]
        and "snakemake again" in found[failed[0]][0]
    )
    assert {p: p.read_bytes() for p in (res / "report").glob("table*.csv")} == tables

    # and the documents lm-eval's perplexity reads
    shutil.copy2(demo / tokens.relative_to(work), tokens)
    docs = next(res.glob("data/tokens/*/docs/test.parquet"))
    docs.write_bytes(b"\0" * 64)
    found = errors(one_evaluation)
    failed = [k for k, e in found.items() if e]
    assert failed == ["evaluate/table1-grassmann-s0.log"] and len(found[failed[0]]) == 1, found
    assert f"{docs.relative_to(work)}: unreadable documents file" in found[failed[0]][0]
    assert {p: p.read_bytes() for p in (res / "report").glob("table*.csv")} == tables

    # the records the tables read: a run.json cut short (its evaluation reads it first), a line of
    # metrics.jsonl that is not JSON, an SNLI eval.json emptied, a recall eval.json cut short
    shutil.copy2(demo / docs.relative_to(work), docs)
    every_table = {p: p.read_bytes() for p in (res / "report").glob("*.csv")}
    record = res / "runs/table1-grassmann-s0/run.json"
    metrics = res / "runs/table2-grassmann-s0/metrics.jsonl"
    snli_eval = next(res.glob("snli/runs/table3-grassmann-s0/eval.json"))
    recall_eval = next(res.glob("recall/runs/*/eval.json"))
    cut(record, record.stat().st_size // 2)
    metrics.write_text(metrics.read_text() + "{not json\n")
    snli_eval.write_text("")
    cut(recall_eval, recall_eval.stat().st_size // 3)
    found = errors()
    for log, why in [
        ("evaluate/table1-grassmann-s0.log", f"{record.relative_to(work)}: not JSON"),
        ("aggregate/table2.log", f"{metrics.relative_to(work)}:"),
        ("snli/aggregate.log", f"{snli_eval.relative_to(work)}: not JSON"),
        ("recall/aggregate.log", f"{recall_eval.relative_to(work)}: not JSON"),
    ]:
        assert (
            len(found[log]) == 1 and why in found[log][0] and "run snakemake again" in found[log][0]
        ), (log, found[log])
    # a failed job's tables are gone (Snakemake removes the outputs of a job it runs), none
    # rewritten
    assert {p: p.read_bytes() for p in (res / "report").glob("*.csv")} == {
        p: b
        for p, b in every_table.items()
        if p.name not in ("table2.csv", "snli_table3.csv", "snli_table3_scratch.csv", "recall.csv")
    }

    # last, the raw text every token file is made from, cut short: each job that reads it fails
    # naming it
    for path in (record, metrics, snli_eval, recall_eval):
        shutil.copy2(demo / path.relative_to(work), path)
    raw = res / "data/raw/test.parquet"
    cut(raw, raw.stat().st_size // 2)
    found = errors()
    for log in ("tokenize.log", "documents.log"):
        assert (
            len(found[log]) == 1
            and f"{raw.relative_to(work)}: not a readable parquet file" in found[log][0]
        ), found
    assert all(
        every_table[p] == p.read_bytes()
        for p in (res / "report").glob("*.csv")  # the LM's: none rewritten
        if p.name.startswith(("table", "ablations"))
    )
