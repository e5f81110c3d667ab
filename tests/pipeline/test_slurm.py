"""The same DAG through profiles/slurm on a real single-node SLURM cluster (`make test-slurm`)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from helpers.dag import (
    BIN,
    ROOT,
    RUN_WILDCARDS,
    assert_same_tables,
    copy_demo,
    copy_repo,
    pipeline_env,
)
from helpers.procs import skip_or_fail_in_ci

# --- SLURM: the same DAG through profiles/slurm on a real single-node cluster ----------------
SLURM = ROOT / "tests" / "slurm"
# preset demo_small: 4 of the demo's runs, every rule, partition and group
SMALL = SLURM / "demo-small.yaml"
SMALL_TABLES = ["table1", "ablations", "snli_table3", "recall"]  # its tables


@pytest.fixture(scope="module")
def slurm_cluster():
    res = subprocess.run(
        ["bash", str(SLURM / "start.sh")], capture_output=True, text=True, timeout=2700
    )
    if res.returncode == 3:
        skip_or_fail_in_ci(
            f"SLURM did not start: {res.stdout.strip()[-1500:]} {res.stderr.strip()[-1500:]}"
        )
    assert res.returncode == 0, res.stdout + res.stderr
    yield
    subprocess.run(["bash", str(SLURM / "stop.sh")], timeout=120)


def site_profile(work: Path) -> str:
    """profiles/slurm as shipped, with only what a 2-core test cluster without accounting needs
    changed: smaller requests, no account, squeue for status, kept logs."""

    prof = yaml.safe_load((ROOT / "profiles/slurm/profile.yaml").read_text())
    for rule, res in [("default", prof["default-resources"]), *prof["set-resources"].items()]:
        res.update(cpus_per_task=1)
        if rule not in RUN_RULES:  # the run jobs ask for their estimates: as shipped
            res.update(mem_mb=1000)
    prof["set-threads"] = {rule: 1 for rule in prof["set-threads"]}
    prof.update(
        {
            "slurm-no-account": True,
            "slurm-status-command": "squeue",
            "slurm-init-seconds-before-status-checks": 8,
            "slurm-keep-successful-logs": True,
            "latency-wait": 5,
        }
    )
    (work / "profiles/slurm-site").mkdir(parents=True)
    (work / "profiles/slurm-site/profile.yaml").write_text(yaml.safe_dump(prof))
    return "profiles/slurm-site"


# {rule: (task, stage)} of every run's jobs (the rule files' train and evaluate rules of each task)
RUN_RULES = {
    "train": ("lm", "train"),
    "evaluate": ("lm", "evaluate"),
    "snli_train": ("snli", "train"),
    "snli_evaluate": ("snli", "evaluate"),
    "recall_train": ("recall", "train"),
    "recall_evaluate": ("recall", "evaluate"),
}


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


# a run's jobs: one allocation
GROUPS = {rule: f"{task}_run" for rule, (task, _) in RUN_RULES.items()}


def _minutes(limit: str) -> int:
    """SLURM's TimeLimit ([days-]hours:minutes:seconds, or minutes:seconds) in minutes."""
    days, _, hms = limit.rpartition("-")
    parts = [int(x) for x in hms.split(":")]
    h, m, sec = ([0] * (3 - len(parts)) + parts) if len(parts) > 2 else (0, *parts)
    return int(days or 0) * 1440 + h * 60 + m + (sec > 0)


SPLITS = ("train", "validation", "test")


def one_gpu(fields: dict) -> bool:
    """The SLURM job asked for one GPU: --gpus=1 (TresPerJob) or --gres=gpu:1 (TresPerNode)."""
    return any(
        re.search(r"gpu[:=]1\b", fields.get(k, "")) for k in ("TresPerJob", "TresPerNode", "TRES")
    )


def _group(comment: str) -> str | None:
    """The executor plugin's comment of a group job: rule_<group>_<its rules> (no wildcards)."""
    return next((g for g in set(GROUPS.values()) if comment.startswith(f"rule_{g}_")), None)


def training_pids(work: Path, run: str) -> list[str]:
    """The training processes of `run` in this pipeline run (their working directory is `work`): the
    run ids repeat in every demo-like run on this machine (other pytest workers' tests)."""
    pids = subprocess.run(
        ["pgrep", "-f", f"grassflow.lm.train .*runs/{run} "], capture_output=True, text=True
    ).stdout.split()
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
        # left by an exception before stop(): end the thread, raise that one
        if not self.done.is_set():
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


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
        return True
    except ProcessLookupError:
        return False


def _stopped_after_next_checkpoint(
    pids, last: Path, before: int, timeout: float = 120
) -> list[str]:
    """SIGSTOP `pids` (a resumed run's training processes) as soon as its checkpoint `last` differs
    from the one the preemption left (mtime `before`): at once if it already does; returns those
    stopped ([] if they ended first, or it took over `timeout` s). Watched every 2 ms, not at the
    watcher's
    0.3 s: a demo epoch takes 0.6 s on an idle machine, and a later look found the last epoch's
    checkpoint, written as the run ended (its parts then [preempted, finished])."""
    end = time.time() + timeout
    while time.time() < end and any(_alive(pid) for pid in pids):
        if last.stat().st_mtime_ns != before:
            return _signal_all(pids, signal.SIGSTOP)
        time.sleep(0.002)
    return []


def _signalled(pid: str) -> bool:
    """SIGTERM is pending for the frozen `pid`, or it runs again (SLURM sends SIGCONT before
    SIGTERM), or it ended."""
    try:
        status = dict(
            line.split(":", 1)
            for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            if ":" in line
        )
    except OSError:
        return True
    pending = int(status["SigPnd"], 16) | int(status["ShdPnd"], 16)
    return bool(pending & 1 << (signal.SIGTERM - 1)) or not status["State"].strip().startswith("T")


def _preempted_frozen(pids, timeout: float = 120) -> None:
    """The frozen `pids`, once SLURM's preemption signalled them: continued (they checkpoint at
    their next step and exit), and awaited."""
    end = time.time() + timeout
    while time.time() < end and not all(_signalled(pid) for pid in pids):
        time.sleep(0.01)
    _signal_all(pids, signal.SIGCONT)
    while time.time() < end and any(_alive(pid) for pid in pids):
        time.sleep(0.05)


def _jobs_of_allocation(work: Path, jid: str) -> set[tuple[str, str]]:
    """(rule, run) of every job Snakemake ran inside SLURM job `jid`, from its kept log."""
    (log,) = list((work / ".snakemake/slurm_logs").glob(f"**/{jid}.log")) or [None]
    if log is None:
        return set()
    text = log.read_text()
    return {
        (m.group(1), m.group(2))
        for m in re.finditer(
            rf"^(?:local)?rule (\w+):\n(?:\s+.*\n)*?\s+wildcards: (?:{RUN_WILDCARDS})=(\S+)",
            text,
            re.M,
        )
    }


@pytest.mark.slurm
def test_demo_through_slurm_profile(slurm_cluster, demo, tmp_path):
    """4 of the demo's runs (SMALL) through profiles/slurm, with train.runs_per_gpu: 2 and
    `grassflow gpus --slurm`'s flag: every job on its partition; Table 1's two runs packed in one
    allocation with one GPU (gres, not two), SNLI's and recall's runs one each, each allocation
    running its runs' training and evaluation, its time limit the sum over the train and evaluate
    layers of its longest job estimate (the executor plugin runs a group's jobs one after another:
    snakemake-executor-plugin-slurm#469). The packed allocation is preempted by a job of a higher
    partition tier while its second run trains: SLURM requeues it (the same job), the run resumes
    from its checkpoint, its record saying the part preempted, and the first run, finished, keeps
    its one-part record. Once the run has checkpointed again, the allocation is killed at its time
    limit:
    retried (another job) with a longer limit, the run resumes again. Every run's row of every table
    equals the local demo's. From a fresh tree: every rule a SLURM job. It takes the demo at its
    set-up although it compares with it only at the end: the demo's build (--cores 5) fills both of
    CI's cores, and this DAG beside it slowed both (CI's pytest 1,605 s against 1,480 s; measured
    again: 1,279 s against 1,151 s, the demo's build 241 s against 145 s)."""
    from grassflow.lm.grid import runs
    from grassflow.pipeline.presets import select_preset
    from grassflow.pipeline.preview import load_config
    from grassflow.pipeline.tasks import job_estimate
    from grassflow.recall.grid import recall_runs
    from grassflow.snli.grid import snli_runs

    work = copy_repo(tmp_path)
    profile = site_profile(work)
    env = pipeline_env(work)
    flag = subprocess.run(
        [
            str(BIN / "python"),
            "-m",
            "grassflow",
            "gpus",
            "--slurm",
            "--preset",
            "demo_small",
            "--configfile",
            str(SMALL),
        ],
        cwd=work,
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout.split()
    assert flag == ["--group-components", "lm_run=2", "snli_run=2", "recall_run=2"]
    runs_dir = work / "results/demo_small/runs"
    # urgent: the preempting job's id
    seen, preempted, urgent, timed, limit_before, requeued = (
        {},
        {},
        [],
        {},
        {},
        set(),
    )
    # run: last.pt's mtime as the preemption left it; (run, epochs done) seen too late
    left, missed = (
        {},
        [],
    )
    config = load_config(work, [SMALL], preset="demo_small")
    name, P = select_preset(config)
    specs = {
        "lm_run": runs(name, P),
        "snli_run": snli_runs(name, P),
        "recall_run": recall_runs(name, P),
    }
    epochs = {r: spec["train"]["epochs"] for r, spec in specs["lm_run"].items()}
    before = set(scontrol_jobs())  # jobs of earlier runs on this cluster are not ours

    def training_pack(jid, fields):
        """The run training now in LM group job `jid`, once both of its runs have a checkpoint."""
        if _group(fields.get("Comment", "")) != "lm_run" or fields.get("JobState") != "RUNNING":
            return None
        pack = sorted(r for rule, r in _jobs_of_allocation(work, jid) if rule == "train")
        if len(pack) < 2 or not all((runs_dir / r / "last.pt").exists() for r in pack):
            return None
        return next((r for r in pack if training_pids(work, r)), None)

    def record():  # job records straight from slurmctld, while they exist (MinJobAge=300 s)
        jobs = {jid: fields for jid, fields in scontrol_jobs().items() if jid not in before}
        for jid, fields in jobs.items():
            seen.setdefault(jid, {}).update(fields)
        return jobs

    def watch():
        for jid, fields in record().items():
            if int(fields.get("Restarts", 0)) and (
                fields.get("JobState"),
                fields.get("Reason"),
            ) == ("PENDING", "BeginTime"):
                # SLURM holds a requeued job (each job the urgent one preempted) about two minutes
                # (its BeginTime): released now, as an admin can
                subprocess.run(
                    ["scontrol", "update", f"JobId={jid}", "StartTime=now"], capture_output=True
                )
            run = training_pack(jid, fields)
            if run and not preempted and not missed:  # mid-training, both runs checkpointed
                # frozen where it is, so that the preemption cannot land after its next epoch's end
                # (the resumed part must checkpoint before its last: a demo epoch can take 1.5 s,
                # the preemption longer under load); then a colleague's job on the higher tier wants
                # both GPUs: SLURM preempts the GPU jobs (this one, and any other running) and
                # requeues them
                pids = _signal_all(training_pids(work, run), signal.SIGSTOP)
                done = (runs_dir / run / "metrics.jsonl").read_text().count("\n")  # epochs done
                # seen too late: the resumed part would be its last epoch alone
                if pids and done >= epochs[run] - 1:
                    missed.append((run, done))
                sub = (
                    None
                    if not pids or missed
                    else subprocess.run(
                        [
                            "sbatch",
                            "--parsable",
                            "-p",
                            "urgent",
                            "--gres=gpu:2",
                            "-c",
                            "1",
                            "--mem=100",
                            "-o",
                            "/dev/null",
                            "--wrap",
                            "sleep 2",
                        ],
                        capture_output=True,
                        text=True,
                    )
                )
                if sub is not None and sub.returncode == 0:
                    preempted[jid] = run
                    urgent.append(sub.stdout.strip())
                    _preempted_frozen(pids)
                    # the checkpoint the preemption left
                    left[run] = (runs_dir / run / "last.pt").stat().st_mtime_ns
                else:
                    _signal_all(pids, signal.SIGCONT)
            if preempted and int(fields.get("Restarts", 0)) and fields.get("JobState") == "RUNNING":
                requeued.add(jid)
            # resumed in the requeued job
            if run and run == preempted.get(jid) and not timed and jid in requeued:
                # hold the training process right after its next checkpoint (which keeps this part),
                # so that it is still training when SLURM's limit (one minute, set now) ends the
                # allocation:
                # SIGCONT, SIGTERM and soon SIGKILL, before or after it checkpoints again
                pids = _stopped_after_next_checkpoint(
                    training_pids(work, run), runs_dir / run / "last.pt", left[run]
                )
                if pids:
                    if (
                        subprocess.run(
                            ["scontrol", "update", f"JobId={jid}", "TimeLimit=1"]
                        ).returncode
                        == 0
                    ):
                        timed[jid] = run
                        limit_before[jid] = fields["TimeLimit"]
                    else:  # the allocation ended first: let the process go, and try again
                        _signal_all(pids, signal.SIGCONT)

    with Watcher(watch, 0.3, record) as watcher:
        res = subprocess.run(
            [
                str(BIN / "snakemake"),
                "--profile",
                profile,
                "--configfile",
                str(SMALL),
                *flag,
                "--config",
                "preset=demo_small",
            ],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=3600,
        )
        watcher.stop()
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]

    by_rule = {}  # rule, or group: [(SLURM job id, its runs, its record)]
    for jid, f in seen.items():
        group = _group(f.get("Comment", ""))
        if group:
            by_rule.setdefault(group, []).append(
                (jid, frozenset(r for _, r in _jobs_of_allocation(work, jid)), f)
            )
            continue
        rule, run = rule_and_run(f.get("Comment", ""))
        if rule:
            by_rule.setdefault(rule, []).append((jid, frozenset({run}), f))
    lm_pack = frozenset(f"table1-{m}-s0" for m in ("transformer", "grassmann"))
    # bench times the training jobs' device
    for group, expected in (
        ("lm_run", {lm_pack}),
        ("snli_run", {frozenset({"table3-grassmann-s0"})}),
        ("recall_run", {frozenset({"L32-kv4-d32-grassmann-lr0.001-s0"})}),
        ("preflight", {frozenset({"cpu_auto"})}),
        ("bench", {frozenset({None})}),
    ):
        completed = {pack for _, pack, f in by_rule[group] if f["JobState"] == "COMPLETED"}
        assert completed == expected, (group, completed)
        for _jid, pack, f in by_rule[group]:
            assert f["Partition"] == "gpu", (group, pack, f["Partition"])
            assert one_gpu(f), (group, pack, f)  # one GPU for the pack's two runs too
    for rule in RUN_RULES:  # never an allocation of their own: each run's pair shares one
        assert rule not in by_rule, rule
    for rule in (
        "train_tokenizer",
        "tokenize",
        "unigram",
        "aggregate",
        "ablation_aggregate",
        "snli_train_tokenizer",
        "snli_tokenize",
        "snli_aggregate",
        "recall_data",
        "recall_aggregate",
        "summary",
    ):
        assert by_rule[rule], f"{rule} did not run as a SLURM job"
        for _jid, _, f in by_rule[rule]:
            assert f["Partition"] == "cpu" and "gpu" not in f.get("TresPerJob", ""), (rule, f)
    # localrules: runs where Snakemake runs (login node)
    assert "download" not in by_rule and "snli_download" not in by_rule

    # one allocation per pack of runs, asking for the sum over its layers of the longest estimate
    # (longer on a retry)
    tokens = {
        "lm_run": work / "results/demo_small/data/tokens/trained",
        "snli_run": work / "results/demo_small/snli/data/tokens/trained",
    }
    settings = config["estimate"]
    attempts = Counter()
    for group in ("lm_run", "snli_run", "recall_run"):
        rules = [rule for rule, g in GROUPS.items() if g == group]
        files = {s: tokens[group] / f"{s}.parquet" for s in SPLITS} if group in tokens else None
        for jid, pack, f in sorted(by_rule[group], key=lambda x: int(x[0])):
            if jid not in seen or not pack:
                continue
            attempts[pack] += 1
            if f["JobState"] == "COMPLETED":
                assert _jobs_of_allocation(work, jid) == {
                    (rule, r) for rule in rules for r in pack
                }, (jid, pack)
            want = sum(
                max(
                    job_estimate(*RUN_RULES[rule], specs[group][r], P, settings, files).minutes(
                        settings, attempts[pack]
                    )
                    for r in pack
                )
                for rule in rules
            )
            if jid not in timed:
                assert abs(_minutes(f["TimeLimit"]) - want) <= 1, (jid, pack, f["TimeLimit"], want)

    # preempted: SLURM requeued the pack's job, which ran again (the same job id) from the runs'
    # checkpoints, the run it stopped saying so in its record; then killed at its time limit while
    # that run trained again: retried (another job) with a longer limit, both runs resumed
    assert len(preempted) == len(urgent) == len(timed) == 1, (preempted, urgent, timed, missed)
    ((jid, run),) = preempted.items()
    assert timed.keys() == {jid}, timed
    assert seen[jid]["JobState"] == "TIMEOUT" and int(seen[jid]["Restarts"]) >= 1, seen[jid]
    again = [(j, f) for j, pack, f in by_rule["lm_run"] if int(j) > int(jid)]
    assert again and again[-1][1]["JobState"] == "COMPLETED", again
    assert _minutes(again[-1][1]["TimeLimit"]) > _minutes(limit_before[jid]), limit_before[jid]
    # the run training at both ends
    parts = json.loads((runs_dir / run / "run.json").read_text())["parts"]
    assert parts[0]["ended"] == "preempted" and parts[0]["stopped_by"] == "SIGTERM", parts
    assert parts[1]["ended"] in ("SIGTERM", "killed") and parts[2]["ended"] == "finished", parts
    assert [p["slurm_job"] for p in parts] == [jid, jid, again[-1][0]], parts
    assert all(b["from"] == a["to"] for a, b in zip(parts, parts[1:])), parts
    assert (
        "[train] resuming " + run in (work / f"results/demo_small/logs/train/{run}.log").read_text()
    )
    # the pack's other run had finished before the preemption: the requeued job and the retry ran
    # its job again, which wrote its outputs again and left its record as it was
    (done,) = lm_pack - {run}
    parts = json.loads((runs_dir / done / "run.json").read_text())["parts"]
    assert [(p["ended"], p["slurm_job"]) for p in parts] == [("finished", jid)], parts
    assert (
        f"[train] {done} had ended (finished)"
        in (work / f"results/demo_small/logs/train/{done}.log").read_text()
    )

    # the cluster run produced the same numbers as the local run, run by run
    assert_same_tables(demo, work, names=SMALL_TABLES, subset="demo_small")


@pytest.mark.slurm
def test_under_slurm_the_line_lands_in_the_rules_log_and_the_slurm_jobs_output(
    slurm_cluster, demo, tmp_path
):
    """A table job on SLURM failing on a damaged record: its one line in the rule's log and in the
    SLURM job's output (.snakemake/slurm_logs/), both named by the login node's `Error in rule` and
    shown under it (docs/scale/cluster.md says so)."""
    run = "table1-grassmann-s0"
    work = tmp_path / "copy"
    copy_demo(demo, work)
    profile = site_profile(work)
    metrics = work / "results/demo/runs" / run / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + "{damaged\n")
    res = subprocess.run(
        [str(BIN / "snakemake"), "table1", "--profile", profile, "--config", "preset=demo"],
        cwd=work,
        env=pipeline_env(work),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "Error in rule aggregate:" in out, out[-3000:]
    line = f"error: results/demo/runs/{run}/metrics.jsonl:4: not a JSON line"
    assert line in (work / "results/demo/logs/aggregate/table1.log").read_text()
    # the login node's `Error in rule` names the rule's log and the SLURM job's output, and shows
    # both (show-failed-logs, profiles/default)
    named = re.search(
        r"Error in rule aggregate:\n(?:.*\n)*?\s+log: (\S+), (\S+/slurm_logs/\S+\.log) \(check log",
        out,
    )
    assert named and named.group(1) == "results/demo/logs/aggregate/table1.log", out[-3000:]
    slurm = Path(named.group(2)).read_text()
    # in the SLURM job's output, from the job itself (the job step's Snakemake shows no log): before
    # its `Error in rule` (mutation: the job writes its line to its log only: the SLURM output lacks
    # it)
    assert line in slurm and slurm.index(line) < slurm.index("Error in rule aggregate:"), slurm[
        -3000:
    ]
    assert out.count(line) >= 2  # the two logs as the login node shows them
