"""What the DAG plans before anything runs: the paper preset's grids, a target per table, the v1
overlay, `grassflow plan`, the login-node rules, lint."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from grassflow.pipeline.presets import select_preset
from grassflow.pipeline.preview import load_config
from helpers.dag import (
    BIN,
    ROOT,
    copy_repo,
    job_stats,
    pipeline_env,
    plan_rows,
    run_snakemake,
    snakemake,
)
from helpers.procs import needs


def test_paper_preset_plans_zoologys_figure2_grid(tmp_path):
    """`snakemake -n recall` on the paper preset: 3 (L, kv) cells × 3 widths × 5 models × 4 learning
    rates × 2 seeds, one data job per cell, one table."""
    work = copy_repo(tmp_path)
    res = snakemake(work, "-n", "recall", preset="paper")
    jobs = Counter(re.findall(r"^(?:local)?rule (\w+):", res.stdout, re.M))
    assert jobs == Counter(
        {
            "recall_train": 360,
            "recall_evaluate": 360,
            "recall_data": 3,
            "recall_aggregate": 1,
            "preflight": 1,
            "recall": 1,
        }
    ), jobs
    cells = set(re.findall(r"wildcards: recall_cell=(\S+)", res.stdout))
    assert {"L64-kv4", "L256-kv16"} <= cells, cells
    runs = set(re.findall(r"wildcards: recall_run=(\S+)", res.stdout))
    assert len(runs) == 360 and "L256-kv16-d256-grassmann_geometric-lr0.01-s1" in runs


@pytest.mark.slow
def test_every_preset_is_lint_clean(tmp_path):
    """snakemake --lint (the snakemake-workflow-catalog's bar for a standardized workflow)."""

    work = copy_repo(tmp_path)
    env = pipeline_env(work)
    for preset in yaml.safe_load((work / "config.yaml").read_text())["presets"]:
        res = run_snakemake(["--lint", "--config", f"preset={preset}"], work, env, timeout=1200)
        assert res.returncode == 0 and "Congratulations" in res.stdout + res.stderr, (
            preset,
            res.stdout[-3000:],
        )


def test_paper_preset_plans_the_whole_ablation_grid(tmp_path):
    """`snakemake ablations` on the paper preset: 10 variants × 2 models × 3 seeds at Table 1 size,
    each distinct run once: the `paper` variant is the main table's runs, a Transformer under a
    Grassmann-only switch (offsets, r, the schedule, empty offsets) is the paper variant's
    Transformer, and the learning rate's variant (`lr_1e-3`, a training key) trains both models.
    laptop_v1_ablations: laptop_v1's runs, the offsets and rank variants (Grassmann only) and the
    learning rate's (both models), on the v1 files (the overlay's laptop_v1 settings, inherited)."""
    work = copy_repo(tmp_path)
    env = pipeline_env(work)
    res = run_snakemake(["-n", "--cores", "2", "ablations"], work, env, timeout=1200)
    assert res.returncode == 0, res.stderr[-3000:]
    trained = re.findall(r"wildcards: run=(\S+)", res.stdout)
    train_jobs = Counter(re.findall(r"rule (train|evaluate):", res.stdout))
    assert train_jobs == Counter({"train": 45, "evaluate": 45}) and len(set(trained)) == 45
    assert {f"table1-{m}-s{s}" for m in ("transformer", "grassmann") for s in (0, 1, 2)} <= set(
        trained
    )
    assert {
        f"table1_lr_1e-3-{m}-s{s}" for m in ("transformer", "grassmann") for s in (0, 1, 2)
    } <= set(trained)
    grassmann_only = ("per_layer_lags", "bias_empty", "lags_124", "r64", "lags_124_r64")
    assert {f"table1_{v}-grassmann-s{s}" for v in grassmann_only for s in (0, 1, 2)} <= set(trained)
    assert not any(
        r.startswith(("table1_paper", *(f"table1_{v}-transformer" for v in grassmann_only)))
        for r in trained
    )
    assert not any(r.startswith("table2") for r in trained)  # just the grid
    # planning writes nothing of ours: the code index is kept when jobs run (onstart), not while
    # parsing
    assert not (work / ".snakemake" / "grassflow").exists()
    assert res.stdout.count("rule ablation_aggregate:") == 1 and "rule aggregate:" not in res.stdout
    res = run_snakemake(
        [
            "-n",
            "--cores",
            "2",
            "ablations",
            "--configfile",
            "config.yaml",
            "workflow/overlays/wikitext2-v1-local.yaml",
            "--config",
            "preset=laptop_v1_ablations",
        ],
        work,
        env,
        timeout=1200,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    variants = {"": ""} | {v: f"_{v}" for v in ("lags_124", "r64", "lags_124_r64", "lr_1e-2")}
    _, lap = select_preset(
        load_config(work, ["workflow/overlays/wikitext2-v1-local.yaml"], "laptop_v1_ablations")
    )
    # the overlay's, inherited
    assert lap["data"]["source"] == "local" and lap["data"]["name"] == "wikitext-2-v1"
    assert set(re.findall(r"wildcards: run=(\S+)", res.stdout)) == (
        {f"table1-transformer-s{s}" for s in (0, 1, 2)}
        | {f"table1_lr_1e-2-transformer-s{s}" for s in (0, 1, 2)}
        | {f"table1{suffix}-grassmann-s{s}" for suffix in variants.values() for s in (0, 1, 2)}
    )


@pytest.mark.slow
def test_a_target_per_table_plans_only_its_runs(tmp_path):
    """`snakemake table1` (and table2, lm, snli, ablations, recall): that table, its runs and their
    data, nothing else; on Wikitext-2 v1 without the hub (the local overlay), Table 1's 6 runs."""
    work = copy_repo(tmp_path)
    env = pipeline_env(work)

    def stats(*args):
        res = run_snakemake([*args, "-n", "--cores", "2"], work, env, timeout=1200)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        return job_stats(res.stdout)

    for table, other in (("table1", "table2"), ("table2", "table1")):
        got = stats(table, "--config", "preset=demo")
        assert got["train"] == got["evaluate"] == 4 and got["aggregate"] == 1 and got[table] == 1
        assert not {
            r
            for r in got
            if r.startswith(("snli", "recall", "ablation", "bench", "summary", other))
        }
    got = stats("snli", "--config", "preset=demo")
    assert (
        got["snli_train"] == 4
        and got["snli_aggregate"] == 1
        and not {"train", "recall_train", "aggregate"} & set(got)
    )
    # every LM table: the whole demo's LM jobs, no other
    got = stats("lm", "--config", "preset=demo")
    every = stats("--config", "preset=demo")
    lm = {r: n for r, n in every.items() if not r.startswith(("snli", "recall", "all"))}
    assert {r: n for r, n in got.items() if r != "lm"} == lm and lm["aggregate"] == 2, (got, lm)
    got = stats("table1", "--configfile", "workflow/overlays/wikitext2-v1-local.yaml")
    assert got["train"] == got["evaluate"] == 6 and got["aggregate"] == 1 and got["download"] == 1
    assert not {r for r in got if r.startswith(("snli", "recall", "ablation", "fetch"))}, got


@pytest.mark.slow
def test_v1_overlay_plans_the_paper_grid_on_v1_files(tmp_path):
    """`snakemake -n --configfile workflow/overlays/wikitext2-v1-local.yaml`: the paper preset's
    jobs, rule for rule (Tables 1-2, the ablation grid, SNLI, recall), on Wikitext-2 v1 from a local
    directory with `<unk>` mapped; bert-base-uncased read from its local copy instead of fetched."""
    work = copy_repo(tmp_path)
    env = pipeline_env(work)

    def dry(*args):
        res = run_snakemake(["-n", "-p", "--cores", "2", *args], work, env, timeout=1200)
        assert res.returncode == 0, res.stderr[-3000:]
        return res.stdout

    paper, v1 = dry(), dry("--configfile", "workflow/overlays/wikitext2-v1-local.yaml")
    a, b = job_stats(paper), job_stats(v1)
    # lr_1e-3's 6, the sweep's 1e-4 6
    assert a["train"] == b["train"] == 57 and a["evaluate"] == b["evaluate"] == 57
    # bert from tokenizer.path
    assert a.pop("fetch_tokenizer") == 2 and b.pop("fetch_tokenizer") == 1
    assert a == b
    assert "results/paper_v1/" in v1 and "results/paper/" not in v1
    # the sections the data jobs read: their params, on their command lines as `snakemake -p` prints
    # them
    data, tokenize = (
        json.loads(
            shlex.split(re.search(rf"grassflow\.lm\.{stage} {flag} ('.*?')", v1).group(1))[0]
        )
        for stage, flag in (("download", "--data"), ("tokenize", "--tokenizer"))
    )
    assert data["name"] == "wikitext-2-v1" and data["local_dir"] == "../shared/data/wikitext-2-v1"
    assert tokenize["map_unk"] is True
    paper_tokenize = re.search(r"grassflow\.lm\.tokenize --tokenizer ('.*?')", paper).group(1)
    assert json.loads(shlex.split(paper_tokenize)[0])["map_unk"] is False


@pytest.mark.slow
def test_plan_counts_what_snakemake_will_schedule(tmp_path):
    """`grassflow plan` on the demo and on the paper preset (dry): per rule the job counts of
    `snakemake -n`, the profile's partitions, device-hours for the training and evaluation rules."""
    work = copy_repo(tmp_path)
    env = pipeline_env(work)
    for preset in ("demo", "paper"):
        # without the venv on PATH (not activated): plan runs the Snakemake beside its Python
        bare = {
            **env,
            "PATH": os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if Path(p) != BIN),
        }
        res = subprocess.run(
            [sys.executable, "-m", "grassflow", "plan", "--preset", preset],
            cwd=work,
            env=bare,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert res.returncode == 0, res.stderr[-3000:]
        rows = plan_rows(res.stdout)
        dry = run_snakemake(
            ["-n", "--cores", "1", "--config", f"preset={preset}"], work, env, timeout=1800
        )
        stats = job_stats(dry.stdout)
        stats.pop("all")
        assert {rule: int(cells[1]) for rule, cells in rows.items()} == dict(stats), preset
        assert (
            rows["train"][2] == "gpu"
            and float(rows["train"][3]) > 0
            and rows["download"][2] == "login node (local)"
        )
        assert f"Total: {sum(stats.values())} jobs" in res.stdout
    # a dry run does not say where a job runs: plan asks the workflow Snakemake parsed for its local
    # rules
    local = {rule for rule, cells in rows.items() if cells[2] == "login node (local)"}
    assert local == {"download", "fetch_tokenizer", "snli_download", "snli_fetch_backbone"}, local
    # tokens trained
    assert rows["recall_train"][1] == "360" and int(rows["train"][6].replace(",", "")) > 10**9
    # K = 2 runs per GPU: each job's time limit is sized for two runs on its GPU, and a job holds
    # half a GPU, so the device-hours stay those of one run at a time
    (work / "k2.yaml").write_text(
        yaml.safe_dump({"presets": {"paper": {"train": {"runs_per_gpu": 2}}}})
    )
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "grassflow",
            "plan",
            "--preset",
            "paper",
            "--configfile",
            str(work / "k2.yaml"),
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    packed = plan_rows(res.stdout)
    for rule in ("train", "evaluate", "snli_train", "recall_train"):
        assert packed[rule][3] == rows[rule][3], rule  # estimated device-hours
    # limits above the floor (estimate.min_minutes), where ×2 shows
    for rule in (
        "train",
        "snli_train",
    ):
        assert float(packed[rule][4]) == pytest.approx(2 * float(rows[rule][4]), rel=0.05), rule


def test_a_preset_with_snli_alone_fetches_its_hub_tokenizer(tmp_path):
    """The text tasks' data rules and the hub fetches are made for every task a preset has: with the
    paper's SNLI part alone (its LM and recall parts removed), SNLI's hub tokenizer is fetched
    (before, the fetch rule came with the LM's data rules, and such a preset failed to plan)."""
    work = copy_repo(tmp_path)
    (work / "snli_only.yaml").write_text(
        yaml.safe_dump(
            {
                "presets": {
                    "paper_snli": {
                        "base": "paper",
                        "experiments": None,
                        "ablations": None,
                        "sweep": None,
                        "recall": None,
                    }
                }
            }
        )
    )
    res = snakemake(work, "-n", "--configfile", "snli_only.yaml", preset="paper_snli")
    jobs = Counter(re.findall(r"^rule (\w+):", res.stdout, re.M))
    assert (
        jobs["fetch_tokenizer"],
        jobs["snli_download"],
        jobs["snli_tokenize"],
        jobs["snli_train"],
    ) == (1, 1, 1, 12)
    assert not jobs["tokenize"] and not jobs["train"]
    assert (
        "--artifact results/paper_snli/tokenizers/distilbert-base-uncased/tokenizer.json"
        in res.stdout
    )


def test_paper_preset_fetches_hub_files_on_the_login_node(tmp_path):
    """The paper preset's hub tokenizers and backbone are fetched by localrules (on a cluster the
    login node has the internet); the jobs on compute nodes read the fetched files."""
    work = copy_repo(tmp_path)
    env = pipeline_env(work)
    res = run_snakemake(["-n", "-p", "--cores", "2"], work, env, timeout=1200)
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout
    for name in ("bert-base-uncased", "distilbert-base-uncased"):
        assert f"results/paper/tokenizers/{name}/tokenizer.json" in out
    assert out.count("rule fetch_tokenizer:") == 2 and out.count("rule snli_fetch_backbone:") == 1
    assert "--artifact results/paper/tokenizers/bert-base-uncased/tokenizer.json" in out
    train = [c for c in out.splitlines() if "grassflow.snli.train --spec" in c]
    assert len(train) == 12
    assert (
        sum(
            "--backbone-dir results/paper/snli/backbone/distilbert-base-uncased" in c for c in train
        )
        == 6
    )


def test_plan_measured_puts_each_rules_wall_time_beside_its_estimate(demo):
    """After a finished run: every rule of the preset, with the measured hours of its jobs: the sum
    of its jobs' Snakemake benchmark files (their `s` column), read here from the files each rule's
    `benchmark:` names, to the rounding of the table; and of every task's run jobs (those estimated)
    the ratio measured / estimated."""
    import csv

    env = pipeline_env(demo)
    res = subprocess.run(
        [sys.executable, "-m", "grassflow", "plan", "--preset", "demo", "--measured"],
        cwd=demo,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    rows = plan_rows(res.stdout)
    assert "| measured hours | measured / estimated |" in res.stdout
    bench = demo / "results/demo/benchmarks"
    files = {
        "train": "train/*.tsv",
        "evaluate": "evaluate/*.tsv",
        "snli_train": "snli/train/*.tsv",
        "recall_train": "recall/train/*.tsv",
        "bench": "bench.tsv",
        "aggregate": "aggregate/*.tsv",
        "download": "download.tsv",
        "tokenize": "tokenize.tsv",
        "snli_download": "snli/download.tsv",
        "snli_tokenize": "snli/tokenize.tsv",
        "snli_train_tokenizer": "snli/train_tokenizer.tsv",
    }
    for rule, pattern in files.items():
        found = sorted(bench.glob(pattern))
        assert found, rule
        seconds = sum(float(list(csv.reader(f.open(), delimiter="\t"))[-1][0]) for f in found)
        assert float(rows[rule][-2]) == pytest.approx(seconds / 3600, abs=6e-4), rule
    for rule in (
        "train",
        "evaluate",
        "snli_train",
        "snli_evaluate",
        "recall_train",
        "recall_evaluate",
    ):
        assert float(rows[rule][-1]) > 0, rows[rule]  # estimated, and ran
    assert rows["aggregate"][-1] == rows["download"][-1] == "—"  # not estimated: no ratio
    assert "snli" not in rows  # never a path read back as a rule
    assert int(rows["train"][1]) == len(list(bench.glob("train/*.tsv"))) == 18


def test_the_slurm_profile_sends_every_tasks_run_jobs_to_a_gpu_as_one_allocation_per_run():
    """The profile is YAML: it is checked against the tasks' declaration
    (grassflow.pipeline.tasks)."""
    from grassflow.pipeline.tasks import TASKS

    prof = yaml.safe_load((ROOT / "profiles/slurm/profile.yaml").read_text())
    groups = dict(g.split("=") for g in prof["groups"])
    # each task's run jobs (the LM's rules unprefixed), and a fused group's job (train.fuse_seeds)
    # with its runs' evaluations: one allocation per run or group
    rules = {
        f"{t}_{stage}" if TASKS[t].part_key else stage: t
        for t in TASKS
        for stage in ("train", "evaluate")
    }
    rules["train_fused"] = "lm"
    assert set(groups) == set(rules)
    for rule, task in rules.items():
        assert groups[rule] == f"{task}_run", rule  # what `grassflow gpus --slurm` packs
        assert (
            prof["set-resources"][rule]["slurm_partition"] == "gpu" and rule in prof["set-threads"]
        ), rule
        # one GPU per allocation however many runs it packs: a string, which a group job shares
        assert (
            prof["set-resources"][rule]["gres"] == "gpu:1"
            and prof["set-resources"][rule]["gpu"] == 0
        ), rule


def test_fuse_seeds_plans_one_job_per_config_and_the_same_evaluations(tmp_path):
    """train.fuse_seeds on the demo: each table's and each sweep value's config of each model (its 2
    seeds) one train_fused job; the ablation's one-seed runs train alone; every run evaluated as
    before; `grassflow plan` sums a group's runs' estimates. Off (auto on a CPU): the demo
    unchanged."""
    from helpers.dag import by_rule, planned

    work = copy_repo(tmp_path)
    off = planned(work)
    assert by_rule(off)["train"] == 18 and "train_fused" not in by_rule(off)
    on = planned(work, {"train": {"fuse_seeds": True}})
    assert by_rule(on)["evaluate"] == by_rule(off)["evaluate"] == 18
    assert by_rule(on)["train"] == 2 and {r for (rule, r) in on if rule == "train"} == {
        "table1_pre_norm-transformer-s0",
        "table1_pre_norm-grassmann-s0",
    }
    res = snakemake(work, "-n", "--configfile", "overlay.yaml")
    groups = set(re.findall(r"wildcards: group=(\S+)", res.stdout))
    assert groups == {
        f"{t}-{m}"
        for t in ("table1", "table2", "table1_lr_1e-3", "table1_lr_1e-2")
        for m in ("transformer", "grassmann")
    }
    command = snakemake(
        work,
        "results/demo/runs/table1-grassmann-s1/run.json",
        "-np",
        "--configfile",
        "overlay.yaml",
    ).stdout
    words = shlex.split(re.search(r"(--spec .*?) --train-tokens", command).group(1))
    assert [json.loads(w)["run_id"] for w in words[1:]] == [
        "table1-grassmann-s0",
        "table1-grassmann-s1",
    ]
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "grassflow",
            "plan",
            "--preset",
            "demo",
            "--configfile",
            str(work / "overlay.yaml"),
        ],
        cwd=work,
        env=pipeline_env(work),
        capture_output=True,
        text=True,
        timeout=600,
    )
    rows = plan_rows(res.stdout)
    assert (
        rows["train_fused"][1] == "8"
        and rows["train_fused"][2] == "gpu"
        and float(rows["train_fused"][3]) > 0
    )


def test_an_overlay_is_merged_as_snakemake_merges_it(tmp_path):
    """A --configfile is merged into config.yaml as Snakemake merges it, a null kept as a null: what
    `grassflow plan` reads (load_config) refuses what the Snakefile refuses, in the same words."""
    from grassflow.pipeline.preview import load_config

    work = copy_repo(tmp_path)
    (work / "overlay.yaml").write_text("presets: {demo: {experiments: {table2: null}}}\n")
    line = "error: config presets.demo.experiments.table2: None is not of type 'object'"
    res = snakemake(work, "-n", "--configfile", "overlay.yaml", check=False)
    assert res.returncode != 0 and line in res.stderr.splitlines(), res.stderr[-2000:]
    with pytest.raises(SystemExit) as e:
        load_config(work, [work / "overlay.yaml"], preset="demo")
    assert line in str(e.value).splitlines()


def test_a_packing_other_than_runs_per_gpu_is_refused_before_any_job(tmp_path):
    """`--group-components lm_run=2` with train.runs_per_gpu 1: the runs' time limits would be sized
    for one run per GPU; Snakemake stops before its first job with one error naming both."""
    work = copy_repo(tmp_path)
    res = snakemake(work, "--group-components", "lm_run=2", check=False)
    assert res.returncode != 0 and not (work / "results").exists()
    assert (
        "error: --group-components lm_run=2 packs 2 runs per allocation but train.runs_per_gpu is 1"
        in res.stdout + res.stderr
    )


def test_every_rule_is_a_named_block_you_can_grep():
    """`grep '^rule \\|^use rule'` over the Snakefile and workflow/rules/ finds every rule Snakemake
    lists for the paper preset (which has every task's part), and no rule is made unnamed, in a
    loop, a function or under an `if`."""
    texts = [(ROOT / "Snakefile").read_text()] + [
        f.read_text() for f in sorted((ROOT / "workflow/rules").glob("*.smk"))
    ]
    grepped = [
        name
        for text in texts
        for name in re.findall(r"(?m)^(?:rule|use rule \w+ as) (\w+)(?::| with:)", text)
    ]
    res = run_snakemake(
        ["--list-rules", "--config", "preset=paper"], ROOT, pipeline_env(ROOT), timeout=600
    )
    assert res.returncode == 0, res.stderr[-2000:]
    listed = [line.strip() for line in res.stdout.splitlines() if line.strip()]
    assert (
        len(listed) > 25 and sorted(listed) == sorted(grepped) and len(set(grepped)) == len(grepped)
    )
    assert not [
        line
        for text in texts
        for line in re.findall(r"(?m)^[ \t]*rule\b.*$", text)
        if not line.startswith("rule ")
    ]


def test_the_rule_files_mean_the_same_in_any_include_order(tmp_path):
    """Every rule file reads only common.smk's names at parse time, and the rules it reuses (`use
    rule
    ... with:`, whose file must come first): with the rule files included in the reverse order, but
    for those, the demo plans the same jobs with the same commands."""
    work = copy_repo(tmp_path)
    snakefile = (work / "Snakefile").read_text()
    includes = re.findall(r'(?m)^include: "workflow/rules/(\w+)\.smk"\n', snakefile)
    assert includes[0] == "common" and len(includes) >= 6
    texts = {name: (work / f"workflow/rules/{name}.smk").read_text() for name in includes}
    home = {
        rule: name for name, text in texts.items() for rule in re.findall(r"(?m)^rule (\w+):", text)
    }
    needs = {
        name: {home[r] for r in re.findall(r"(?m)^use rule (\w+) as", text)}
        for name, text in texts.items()
    }
    order = []
    # reversed, each file after the files whose rules it reuses
    while len(order) < len(includes) - 1:
        order.append(
            next(
                n
                for n in reversed(includes[1:])
                if n not in order and needs[n] - {n} <= {*order, "common"}
            )
        )
    assert order != includes[1:] and order[0] != includes[1], order
    plan = snakemake(work, "-n", "--forceall", "-p").stdout
    body = re.sub(r'(?m)^include: "workflow/rules/(?!common)\w+\.smk"\n', "", snakefile)
    body = body.replace(
        'include: "workflow/rules/common.smk"\n',
        'include: "workflow/rules/common.smk"\n'
        + "".join(f'include: "workflow/rules/{name}.smk"\n' for name in order),
    )
    (work / "Snakefile").write_text(body)
    replan = snakemake(work, "-n", "--forceall", "-p").stdout

    def jobs(out):  # each job's rule, wildcards and command, without its job id and time stamp
        return sorted(
            re.sub(r"\n\s+jobid: \d+|\n?\[\w{3} \w{3} [ \d:]+\]", "", block)
            for block in out.split("\n\n")
            if "rule " in block
        )

    assert job_stats(replan) == job_stats(plan) and jobs(replan) == jobs(plan)


@needs((ROOT.parent / "shared/data/wikitext-2-v1").is_dir(), "needs ../shared/data (Wikitext-2 v1)")
def test_the_laptop_seeds_presets_plan_their_runs_and_nothing_else(tmp_path):
    """laptop_v1 and laptop_v1_paper_settings offline (the v1 overlay): three seeds of both models,
    their table, nothing of SNLI, recall or the ablations."""
    work = copy_repo(tmp_path)
    overlay = str(ROOT / "workflow/overlays/wikitext2-v1-local.yaml")
    for preset in ("laptop_v1", "laptop_v1_paper_settings"):
        out = snakemake(work, "-n", "--configfile", overlay, preset=preset).stdout
        jobs = job_stats(out)
        assert jobs["train"] == jobs["evaluate"] == 6 and jobs["aggregate"] == 1, (preset, jobs)
        assert set(re.findall(r"runs/(table1-\w+-s\d)/run.json", out)) == {
            f"table1-{m}-s{s}" for m in ("transformer", "grassmann") for s in (0, 1, 2)
        }
        assert not {r for r in jobs if r.startswith(("snli", "recall", "ablation"))}, jobs


def test_runs_finished_elsewhere_leave_the_others_fused():
    """train.fuse_seeds with finished_runs (grassflow.lm.grid.fused_groups): Table 1 finished in
    full (the H200's committed records) leaves Table 2's groups fused over every seed; Table 2's
    seed 0 finished for both models leaves its groups fused over seeds 1 and 2, and no group holds a
    finished run (adopt_run makes those)."""
    from grassflow.lm.grid import fused_groups, runs
    from grassflow.pipeline.presets import select_preset
    from grassflow.pipeline.preview import load_config

    name, p = select_preset(
        load_config(ROOT, ["workflow/overlays/wikitext2-v1-local.yaml"], "paper_v1")
    )
    p = {**p, "train": {**p["train"], "fuse_seeds": True}}
    specs = runs(name, p)
    table1 = [r for r in specs if r.startswith("table1-")]
    groups = fused_groups(p, specs, table1)
    assert groups["table2-grassmann"] == [f"table2-grassmann-s{s}" for s in (0, 1, 2)]
    assert not any(g.startswith("table1-") for g in groups)
    t2s0 = ["table2-grassmann-s0", "table2-transformer-s0"]
    groups = fused_groups(p, specs, table1 + t2s0)
    assert groups["table2-transformer"] == ["table2-transformer-s1", "table2-transformer-s2"]
    assert not {r for rs in groups.values() for r in rs} & set(table1 + t2s0)


@pytest.mark.parametrize("preset", ["demo", "paper"])
def test_a_real_parse_plans_one_run_per_distinct_spec(preset, tmp_path):
    """Snakemake's own parse and plan of the Snakefile (grassflow.pipeline.preview.dry_run, through
    its API, in this process): one evaluation per run of the LM's specs, an ablation cell or a sweep
    value whose spec equals a main table's run (or an ablation's) being that run, and every cell of
    the ablation grid and the sweep among them."""
    from grassflow.lm.grid import ablation_grid, main_run_ids, sweep_grid
    from grassflow.pipeline.preview import dry_run
    from grassflow.pipeline.tasks import TASKS

    for name in ("Snakefile", "config.yaml", "workflow", "src", "kernels", "envs"):
        # the checkout itself (its package is the one imported)
        (tmp_path / name).symlink_to(ROOT / name)
    jobs, _ = dry_run(tmp_path, preset=preset)
    p = select_preset(load_config(ROOT, preset=preset))[1]
    main = len(p["experiments"]) * len(p["models"]) * len(p["seeds"])
    cells = len(p["ablations"]["variants"]) * len(p["models"]) * len(p["ablations"]["seeds"])
    sweep = sweep_grid(preset, p)
    values = len(sweep["values"]) * len(p["models"]) * len(p["sweep"]["seeds"])
    runs = {j["wildcards"]["run"] for j in jobs if j["rule"] in ("evaluate", "adopt_run")}
    assert runs == set(TASKS["lm"].specs(preset, p)) and main < len(runs) < main + cells + values
    grid = {r for models in ablation_grid(preset, p).values() for rs in models.values() for r in rs}
    swept = {r for cell in sweep["runs"] for rs in cell.values() for r in rs}
    assert grid <= runs and swept <= runs and runs == grid | swept | set(main_run_ids(p))


def test_plan_why_reads_a_params_change_as_its_settings_keys_and_code(tmp_path):
    """Snakemake's reason for a params change (the exclusive params before and now, as their reprs)
    read by `grassflow plan --why`: a spec's changed keys with their values before and after, a
    fused group's specs (shell words) alike, a code fingerprint as its own line, another param as it
    is."""
    from grassflow.pipeline.preview import explain

    def reason(before, now):
        fmt = lambda vs: ",".join(map(repr, vs))  # noqa: E731  (Snakemake's ParamsChange.__str__)
        return (
            "Params have changed since last execution: Union of exclusive params before and now "
            f"across all output: before: {fmt(before)} now: {fmt(now)} "
        )

    old = {"run_id": "r", "train": {"batch_size": 16, "lr": 0.1}, "model": {"lags": [1, 2]}}
    new = {"run_id": "r", "train": {"batch_size": 8, "lr": 0.1}, "model": {"lags": [1, 3]}}
    said = explain(
        reason([json.dumps(old, sort_keys=True)], [json.dumps(new, sort_keys=True)]),
        tmp_path,
        tmp_path,
    )
    assert said == ["settings changed: model.lags: [1, 2] → [1, 3]; train.batch_size: 16 → 8"], said
    fused = [
        " ".join(shlex.quote(json.dumps(d, sort_keys=True)) for d in (x, x)) for x in (old, new)
    ]
    said = explain(
        reason([fused[0], "0123456789abcdef"], [fused[1], "fedcba9876543210"]), tmp_path, tmp_path
    )
    assert said[0].startswith("code changed (which files: not known") and said[1].startswith(
        "settings changed: model.lags: [1, 2] → [1, 3]; train.batch_size: 16 → 8"
    ), said
    assert explain(
        reason(["grassflow.lm.download"], ["grassflow.snli.download"]), tmp_path, tmp_path
    ) == ["params changed: before grassflow.lm.download; now grassflow.snli.download"]
