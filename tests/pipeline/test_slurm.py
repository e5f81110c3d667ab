"""The same DAG through profiles/slurm on a real single-node SLURM cluster (`make test-slurm`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import yaml

from grassflow.pipeline.tasks import RUN_RULES as TASK_RULES
from helpers.dag import (
    BIN,
    ROOT,
    RUN_WILDCARDS,
    assert_same_tables,
    copy_repo,
    pipeline_env,
)
from helpers.procs import skip_or_fail_in_ci

# --- SLURM: the same DAG through profiles/slurm on a real single-node cluster ----------------
SLURM = ROOT / "tests" / "slurm"
SMALL = SLURM / "demo-small.yaml"  # preset demo_small: 4 of the demo's runs, every rule, partition and group
SMALL_TABLES = ["table1", "ablations", "snli_table3", "recall"]  # its tables


@pytest.fixture(scope="module")
def slurm_cluster():
    res = subprocess.run(["bash", str(SLURM / "start.sh")], capture_output=True, text=True, timeout=2700)
    if res.returncode == 3:
        skip_or_fail_in_ci(f"SLURM did not start: {res.stdout.strip()[-1500:]} {res.stderr.strip()[-1500:]}")
    assert res.returncode == 0, res.stdout + res.stderr
    yield
    subprocess.run(["bash", str(SLURM / "stop.sh")], timeout=120)


def site_profile(work: Path) -> str:
    """profiles/slurm as shipped, with only what a 2-core test cluster without accounting
    needs changed: smaller requests, no account, squeue for status, kept logs."""

    prof = yaml.safe_load((ROOT / "profiles/slurm/profile.yaml").read_text())
    for rule, res in [("default", prof["default-resources"]), *prof["set-resources"].items()]:
        res.update(cpus_per_task=1)
        if rule not in RUN_RULES:  # the run jobs ask for their estimates: as shipped
            res.update(mem_mb=1000)
    prof["set-threads"] = {rule: 1 for rule in prof["set-threads"]}
    prof.update({"slurm-no-account": True, "slurm-status-command": "squeue",
                 "slurm-init-seconds-before-status-checks": 8, "slurm-keep-successful-logs": True,
                 "latency-wait": 5})
    (work / "profiles/slurm-site").mkdir(parents=True)
    (work / "profiles/slurm-site/profile.yaml").write_text(yaml.safe_dump(prof))
    return "profiles/slurm-site"


RUN_RULES = tuple(TASK_RULES)  # train, evaluate, snli_train, ... (grassflow.pipeline.tasks)


def rule_and_run(comment: str):
    """The executor plugin's job comment: rule_<rule>[_wildcards_<values>]."""
    m = re.match(r"rule_(.+?)(?:_wildcards_(.+))?$", comment)
    return (m.group(1), m.group(2)) if m else (None, None)


def scontrol_jobs() -> dict[str, dict]:
    out = subprocess.run(["scontrol", "show", "job", "-o"], capture_output=True, text=True).stdout
    jobs = {}
    for line in out.splitlines():
        fields = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
        if "JobId" in fields:
            jobs[fields["JobId"]] = fields
    return jobs


GROUPS = {rule: f"{task.name}_run" for rule, (task, _) in TASK_RULES.items()}  # a run's jobs: one allocation


def _minutes(limit: str) -> int:
    """SLURM's TimeLimit ([days-]hours:minutes:seconds, or minutes:seconds) in minutes."""
    days, _, hms = limit.rpartition("-")
    parts = [int(x) for x in hms.split(":")]
    h, m, sec = ([0] * (3 - len(parts)) + parts) if len(parts) > 2 else (0, *parts)
    return int(days or 0) * 1440 + h * 60 + m + (sec > 0)


SPLITS = ("train", "validation", "test")


def one_gpu(fields: dict) -> bool:
    """The SLURM job asked for one GPU: --gpus=1 (TresPerJob) or --gres=gpu:1 (TresPerNode)."""
    return any(re.search(r"gpu[:=]1\b", fields.get(k, "")) for k in ("TresPerJob", "TresPerNode", "TRES"))


def _group(comment: str) -> str | None:
    """The executor plugin's comment of a group job: rule_<group>_<its rules> (no wildcards)."""
    return next((g for g in set(GROUPS.values()) if comment.startswith(f"rule_{g}_")), None)


def training_pids(work: Path, run: str) -> list[str]:
    """The training processes of `run` in this pipeline run (their working directory is `work`):
    the run ids repeat in every demo-like run on this machine (other pytest workers' tests)."""
    pids = subprocess.run(["pgrep", "-f", f"grassflow.lm.train .*runs/{run} "], capture_output=True, text=True).stdout.split()
    here = []
    for pid in pids:
        try:
            if Path(os.readlink(f"/proc/{pid}/cwd")) == work.resolve():
                here.append(pid)
        except OSError:  # ended meanwhile
            pass
    return here


class Watcher:
    """`poll()` every `every` seconds in a thread while a pipeline runs; stop() re-raises in the
    test's thread whatever the thread raised (it would otherwise die silently, and the test go on
    without its watcher) and then calls `final()` once, synchronously: the final states, which a
    last poll racing the pipeline's end might have missed."""

    def __init__(self, poll, every: float, final):
        import threading

        self.poll, self.every, self.final = poll, every, final
        self.done, self.errors = threading.Event(), []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        try:
            while not self.done.is_set():
                self.poll()
                self.done.wait(self.every)
        except BaseException as e:  # noqa: BLE001  (handed to the test's thread)
            self.errors.append(e)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        if not self.done.is_set():  # left by an exception before stop(): end the thread, raise that one
            self.done.set()
            self.thread.join()

    def stop(self):
        self.done.set()
        self.thread.join()
        if self.errors:
            raise self.errors[0]
        self.final()


def _signal_all(pids, sig) -> list[str]:
    """Send `sig` to each pid; those that ended meanwhile are skipped (returns those signalled)."""
    sent = []
    for pid in pids:
        try:
            os.kill(int(pid), sig)
            sent.append(pid)
        except ProcessLookupError:  # ended between pgrep and now
            pass
    return sent


def _jobs_of_allocation(work: Path, jid: str) -> set[tuple[str, str]]:
    """(rule, run) of every job Snakemake ran inside SLURM job `jid`, from its kept log."""
    (log,) = list((work / ".snakemake/slurm_logs").glob(f"**/{jid}.log")) or [None]
    if log is None:
        return set()
    text = log.read_text()
    return {(m.group(1), m.group(2)) for m in
            re.finditer(rf"^(?:local)?rule (\w+):\n(?:\s+.*\n)*?\s+wildcards: (?:{RUN_WILDCARDS})=(\S+)", text, re.M)}


@pytest.mark.slurm
def test_demo_through_slurm_profile(slurm_cluster, demo, tmp_path):
    """4 of the demo's runs (SMALL) through profiles/slurm: every job on its partition; each run's
    training and evaluation in one allocation whose time limit is the sum of their estimates; a
    group job preempted mid-training by a job of a higher partition tier is requeued by SLURM (the
    same job) and resumes from its checkpoint, its run.json saying the part preempted; one killed at
    its time limit is retried with a longer limit and resumes; every run's row of every table
    equals the local demo's. From a fresh tree: every rule a SLURM job. It takes the demo at its
    set-up although it compares with it only at the end: the demo's build (--cores 5) fills both of
    CI's cores, and this DAG beside it slowed both (CI's pytest 1,605 s against 1,480 s; measured again:
    1,279 s against 1,151 s, the demo's build 241 s against 145 s)."""
    import signal

    from grassflow.lm.grid import runs
    from grassflow.pipeline.plan import load_config
    from grassflow.pipeline.presets import select_preset
    from grassflow.pipeline.tasks import job_estimate
    from grassflow.recall.grid import recall_runs
    from grassflow.snli.grid import snli_runs

    work = copy_repo(tmp_path)
    profile = site_profile(work)
    env = pipeline_env(work)
    seen, preempted, urgent, timed, limit_before = {}, {}, [], {}, {}  # urgent: the preempting job's id
    before = set(scontrol_jobs())  # jobs of earlier runs on this cluster are not ours

    def lm_run(jid, fields):
        """The LM run training in group job `jid`, once it has a checkpoint."""
        if _group(fields.get("Comment", "")) != "lm_run":
            return None
        run = next((r for rule, r in _jobs_of_allocation(work, jid) if rule == "train"), None)
        return run if run and (work / "results/demo_small/runs" / run / "last.pt").exists() else None

    def record():  # job records straight from slurmctld, while they exist (MinJobAge=30 s)
        jobs = {jid: fields for jid, fields in scontrol_jobs().items() if jid not in before}
        for jid, fields in jobs.items():
            seen.setdefault(jid, {}).update(fields)
        return jobs

    def watch():
        for jid, fields in record().items():
            if int(fields.get("Restarts", 0)) and (fields.get("JobState"), fields.get("Reason")) == ("PENDING", "BeginTime"):
                # SLURM holds a requeued job (each job the urgent one preempted) about two minutes (its
                # BeginTime): released now, as an admin can
                subprocess.run(["scontrol", "update", f"JobId={jid}", "StartTime=now"], capture_output=True)
            run = lm_run(jid, fields) if fields.get("JobState") == "RUNNING" else None
            if run and not preempted:  # mid-training, after a checkpoint
                # a colleague's job on the higher tier wants both GPUs: SLURM preempts the GPU jobs (this
                # one, and any other running) and requeues them
                sub = subprocess.run(["sbatch", "--parsable", "-p", "urgent", "--gres=gpu:2", "-c", "1",
                                      "--mem=100", "-o", "/dev/null", "--wrap", "sleep 2"], capture_output=True, text=True)
                if sub.returncode == 0:
                    preempted[jid] = run
                    urgent.append(sub.stdout.strip())
            elif (run and preempted and not timed and jid not in preempted
                  and seen.get(urgent[0], {}).get("JobState") == "COMPLETED"):  # it preempts no more
                # hold the training process so that it is still running when SLURM's limit
                # (one minute, set now) ends the allocation: SIGCONT, SIGTERM, then SIGKILL
                pids = _signal_all(training_pids(work, run), signal.SIGSTOP)
                if pids:
                    if subprocess.run(["scontrol", "update", f"JobId={jid}", "TimeLimit=1"]).returncode == 0:
                        timed[jid] = run
                        limit_before[jid] = fields["TimeLimit"]
                    else:  # the allocation ended first: let the process go, and try another
                        _signal_all(pids, signal.SIGCONT)

    with Watcher(watch, 0.5, record) as watcher:
        res = subprocess.run([str(BIN / "snakemake"), "--profile", profile, "--configfile", str(SMALL),
                              "--config", "preset=demo_small"], cwd=work, env=env, capture_output=True, text=True,
                             timeout=3600)
        watcher.stop()
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]

    by_rule = {}  # rule, or group: [(SLURM job id, run, its record)]
    for jid, f in seen.items():
        group = _group(f.get("Comment", ""))
        if group:
            ran = _jobs_of_allocation(work, jid)
            run = next((r for rule, r in ran if rule.endswith("train")), next((r for _, r in ran), None))
            by_rule.setdefault(group, []).append((jid, run, f))
            continue
        rule, run = rule_and_run(f.get("Comment", ""))
        if rule:
            by_rule.setdefault(rule, []).append((jid, run, f))
    runs_ = {f"table1-{m}-s0" for m in ("transformer", "grassmann")}
    for group, expected in (("lm_run", runs_), ("snli_run", {"table3-grassmann-s0"}), ("recall_run", {"L32-kv4-d32-grassmann-lr0.001-s0"}),
                            ("preflight", {"cpu_auto"}), ("bench", {None})):  # bench times the training jobs' device
        assert {run for _, run, _ in by_rule[group]} == expected, group
        for _jid, run, f in by_rule[group]:
            assert f["Partition"] == "gpu", (group, run, f["Partition"])
            assert one_gpu(f), (group, run, f)
    for rule in RUN_RULES:  # never an allocation of their own: each run's pair shares one
        assert rule not in by_rule, rule
    for rule in ("train_tokenizer", "tokenize", "unigram", "aggregate", "ablation_aggregate", "snli_train_tokenizer",
                 "snli_tokenize", "snli_aggregate", "recall_data", "recall_aggregate", "summary"):
        assert by_rule[rule], f"{rule} did not run as a SLURM job"
        for _jid, _, f in by_rule[rule]:
            assert f["Partition"] == "cpu" and "gpu" not in f.get("TresPerJob", ""), (rule, f)
    assert "download" not in by_rule and "snli_download" not in by_rule  # localrules: runs where Snakemake runs (login node)

    # one allocation per run, asking for the sum of its jobs' estimates (longer on a retry)
    config = load_config(work, [SMALL], preset="demo_small")
    name, P = select_preset(config)
    specs = {"lm_run": runs(name, P), "snli_run": snli_runs(name, P), "recall_run": recall_runs(name, P)}
    tokens = {"lm_run": work / "results/demo_small/data/tokens/trained",
              "snli_run": work / "results/demo_small/snli/data/tokens/trained"}
    attempts = Counter()
    for group in ("lm_run", "snli_run", "recall_run"):
        for jid, run, f in sorted(by_rule[group], key=lambda x: int(x[0])):
            attempts[run] += 1
            pair = {(rule, run) for rule, g in GROUPS.items() if g == group}
            if f["JobState"] == "COMPLETED":
                assert _jobs_of_allocation(work, jid) == pair, (jid, run)
            files = {s: tokens[group] / f"{s}.parquet" for s in SPLITS} if group in tokens else None
            want = sum(job_estimate(rule, specs[group][run], P, config["estimate"], files)
                       .minutes(config["estimate"], attempts[run]) for rule, _ in pair)
            if jid not in timed:
                assert abs(_minutes(f["TimeLimit"]) - want) <= 1, (jid, run, f["TimeLimit"], want)

    # preempted: SLURM requeued the job, which ran again (the same job id) from the run's checkpoint, and
    # the run's record says so; its evaluation was never run on weights of half a run
    assert len(preempted) == len(urgent) == len(timed) == 1, (preempted, urgent, timed)
    ((jid, run),) = preempted.items()
    assert seen[jid]["JobState"] == "COMPLETED" and int(seen[jid]["Restarts"]) >= 1, seen[jid]
    assert "[train] resuming " + run in (work / f"results/demo_small/logs/train/{run}.log").read_text()
    parts = json.loads((work / "results/demo_small/runs" / run / "run.json").read_text())["parts"]
    assert [p["ended"] for p in parts] == ["preempted", "finished"] and parts[0]["stopped_by"] == "SIGTERM", parts
    assert parts[0]["slurm_job"] == parts[1]["slurm_job"] == jid and parts[1]["from"] == parts[0]["to"], parts
    # killed at the time limit: retried (another job) with a longer limit, resumed
    ((jid, run),) = timed.items()
    assert seen[jid]["JobState"] == "TIMEOUT", seen[jid]["JobState"]
    again = [(j, f) for j, r, f in by_rule["lm_run"] if r == run and int(j) > int(jid)]
    assert again and again[-1][1]["JobState"] == "COMPLETED", run
    assert _minutes(again[-1][1]["TimeLimit"]) > _minutes(limit_before[jid]), (run, limit_before[jid])
    assert "[train] resuming " + run in (work / f"results/demo_small/logs/train/{run}.log").read_text()

    # the cluster run produced the same numbers as the local run, run by run
    assert_same_tables(demo, work, names=SMALL_TABLES, subset="demo_small")


@pytest.mark.slurm
def test_k_runs_packed_into_one_allocation_and_resumed_after_scancel(slurm_cluster, demo, tmp_path):
    """train.runs_per_gpu: 2 with `grassflow gpus --slurm`'s flag, Table 1's two runs of seed 0
    redone in a copy of the finished demo (its data, preflight and other runs as they are):
    one SLURM job, one allocation with one GPU (gres, not two) running both runs' training and
    evaluation, whose time limit is the sum over the train and evaluate layers of the pair's
    longest job estimate ×2 (the executor plugin runs a group's jobs one after another:
    snakemake-executor-plugin-slurm#469). The allocation is cancelled once both of its runs have
    a checkpoint: it is retried with a longer limit and both runs resume. Table 1's rows equal the
    local run's."""
    import shutil

    from grassflow.lm.grid import runs
    from grassflow.pipeline.plan import load_config
    from grassflow.pipeline.presets import select_preset
    from grassflow.pipeline.tasks import job_estimate

    work = tmp_path / "work"
    shutil.copytree(demo, work, symlinks=True)  # copy2: mtimes kept, so only what is removed reruns
    runs_dir = work / "results/demo/runs"
    redo = ["table1-grassmann-s0", "table1-transformer-s0"]
    for run in redo:
        shutil.rmtree(runs_dir / run)
    profile = site_profile(work)
    (work / "pool.yaml").write_text("presets: {demo: {seeds: [0], train: {runs_per_gpu: 2}}}\n")
    env = pipeline_env(work)
    flag = subprocess.run([str(BIN / "python"), "-m", "grassflow", "gpus", "--slurm", "--preset", "demo",
                           "--configfile", str(work / "pool.yaml")], cwd=work, capture_output=True, text=True,
                          check=True, env=env).stdout.split()
    assert flag == ["--group-components", "lm_run=2", "snli_run=2", "recall_run=2"]
    seen, cancelled = {}, {}
    before = set(scontrol_jobs())

    def training(run):
        return training_pids(work, run)

    def record():
        jobs = {jid: fields for jid, fields in scontrol_jobs().items() if jid not in before}
        for jid, fields in jobs.items():
            seen.setdefault(jid, {}).update(fields)
        return jobs

    def watch():
        for jid, fields in record().items():
            if cancelled or fields.get("JobState") != "RUNNING" or _group(fields.get("Comment", "")) != "lm_run":
                continue
            pair = sorted(r for rule, r in _jobs_of_allocation(work, jid) if rule == "train")
            if len(pair) == 2 and all((runs_dir / r / "last.pt").exists() for r in pair) and any(
                    training(r) for r in pair):
                if subprocess.run(["scancel", jid]).returncode == 0:  # preempted mid-training, both checkpointed
                    cancelled[jid] = pair

    with Watcher(watch, 0.3, record) as watcher:
        res = subprocess.run([str(BIN / "snakemake"), "table1", "--profile", profile, "--configfile",
                              str(work / "pool.yaml"), *flag, "--config", "preset=demo"], cwd=work, env=env,
                             capture_output=True, text=True, timeout=3600)
        watcher.stop()
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]

    packed = sorted(((jid, f) for jid, f in seen.items() if _group(f.get("Comment", "")) == "lm_run"),
                    key=lambda x: int(x[0]))
    config = load_config(work, [work / "pool.yaml"], preset="demo")
    _, P = select_preset(config)
    specs, settings = runs("demo", P), config["estimate"]
    tokens = work / "results/demo/data/tokens/trained"
    files = {s: tokens / f"{s}.parquet" for s in SPLITS}
    attempts, completed = Counter(), set()
    for jid, f in packed:
        ran = _jobs_of_allocation(work, jid)
        pair = tuple(sorted(r for rule, r in ran if rule == "train"))
        assert one_gpu(f) and f["Partition"] == "gpu", f  # one GPU for both runs
        attempts[pair] += 1
        want = sum(max(job_estimate(rule, specs[r], P, settings, files).minutes(settings, attempts[pair]) for r in pair)
                   for rule in ("train", "evaluate"))
        if f["JobState"] == "COMPLETED":
            assert len(pair) == 2 and ran == {(rule, r) for r in pair for rule in ("train", "evaluate")}, (jid, ran)
            assert abs(_minutes(f["TimeLimit"]) - want) <= 1, (jid, pair, f["TimeLimit"], want)
            completed.add(pair)
    assert completed == {tuple(redo)}
    ((jid, pair),) = cancelled.items()
    assert seen[jid]["JobState"] == "CANCELLED"
    again = [f for j, f in packed if int(j) > int(jid) and f["JobState"] == "COMPLETED" and tuple(sorted(
        r for rule, r in _jobs_of_allocation(work, j) if rule == "train")) == tuple(pair)]
    assert again and _minutes(again[-1]["TimeLimit"]) > _minutes(seen[jid]["TimeLimit"])
    for run in pair:
        assert "[train] resuming " + run in (work / f"results/demo/logs/train/{run}.log").read_text(), run
    assert_same_tables(demo, work, names=["table1"], subset="demo")
