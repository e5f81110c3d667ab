"""After a finished demo (for the hub fetches, its data stages), one change (a code file, a preset
key) plans exactly the stages it touches: real edits, real dry runs."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from helpers.dag import (
    DEMO_GRASSMANN_RUNS,
    DEMO_LM_RUNS,
    ROOT,
    by_rule,
    edited,
    job_key,
    plan_jobs,
    planned,
    settings_changed,
)


def test_nothing_to_do_after_a_full_run(demo):
    assert planned(demo) == Counter()


RUN_JOBS = {f"grassflow.{t}.{s}" for t in ("lm", "snli", "recall") for s in ("train", "evaluate")}


def test_every_demo_job_loaded_only_fingerprinted_code(demo):
    """The import closure each rule fingerprints holds all that its job really loaded (less the
    other model kinds' code), for every job of the demo: the static reading misses nothing."""
    from helpers.dag import assert_closure_holds

    records = [json.loads(p.read_text()) for p in (demo / "imports").glob("*.json")]
    modules = Counter(r["module"] for r in records)
    assert {
        f"grassflow.{m}"
        for m in (
            "lm.download",
            "lm.tokenize",
            "lm.documents",
            "lm.train",
            "lm.evaluate",
            "lm.unigram",
            "lm.aggregate",
            "lm.summary",
            "lm.ablations",
            "bench",
            "snli.train",
            "recall.train",
            "snli.aggregate",
            "recall.aggregate",
            "preflight",
        )
    } <= set(modules), modules
    for r in records:
        module, line = r["module"], " ".join(r["argv"])
        # the machine's check: no fingerprint; a user's verb
        if module in (
            "grassflow.preflight",
            "grassflow",
        ):
            continue
        kinds = (
            ("transformer", "grassmann")
            if module == "grassflow.bench"
            else tuple(k for k in ("transformer", "grassmann") if k in line)
            if module in RUN_JOBS
            else ()
        )
        assert module not in RUN_JOBS or len(kinds) == 1, line
        r["files"] = [f.replace(str(demo), str(ROOT)) for f in r["files"]]
        assert_closure_holds(r, module, kinds)


@pytest.mark.parametrize("module", ["lm/aggregate.py", "lm/comparable.py"])
def test_editing_the_lm_table_code_plans_its_tables_and_no_other_tasks(demo, module):
    """The LM's table code (its tables' rows and verdicts, what a table can carry) is the LM's
    tables' alone: a code edit plans Tables 1-2, the ablation table and the sweep's (and the
    summary, which reads Tables 1-2), no SNLI or recall job."""
    with edited(demo / "src/grassflow" / module):
        assert planned(demo) == Counter(
            {
                ("aggregate", None): 2,
                ("summary", None): 1,
                ("ablation_aggregate", None): 1,
                ("sweep_aggregate", None): 1,
            }
        )


def test_editing_the_training_loop_plans_every_training_job_and_bench(demo):
    with edited(demo / "src/grassflow/loop.py"):
        rules = by_rule(planned(demo))
    assert (
        rules["train"] == DEMO_LM_RUNS
        and rules["snli_train"] == 4
        and rules["recall_train"] >= 2
        and rules["bench"] == 1
    )
    assert not {
        "download",
        "tokenize",
        "train_tokenizer",
        "unigram",
        "snli_download",
        "recall_data",
    } & set(rules)


def test_recall_model_setting_plans_only_its_runs(demo):
    jobs, changed = _changes(
        demo, {"recall": {"models": {"grassmann": {"switches": {"lags": [1, 3]}}}}}
    )
    assert changed == {("recall_train", "L32-kv4-d32-grassmann-lr0.001-s0")}
    assert jobs == Counter(
        {
            ("recall_train", "L32-kv4-d32-grassmann-lr0.001-s0"): 1,
            ("recall_evaluate", "L32-kv4-d32-grassmann-lr0.001-s0"): 1,
            ("recall_aggregate", None): 1,
        }
    )


def test_editing_one_variant_plans_only_its_runs_and_the_ablation_table(demo):
    jobs, changed = _changes(demo, {"ablations": {"variants": {"pre_norm": {"init": "small"}}}})
    assert changed == {
        ("train", "table1_pre_norm-transformer-s0"),
        ("train", "table1_pre_norm-grassmann-s0"),
    }
    assert jobs == Counter(
        {
            ("train", "table1_pre_norm-transformer-s0"): 1,
            ("evaluate", "table1_pre_norm-transformer-s0"): 1,
            ("train", "table1_pre_norm-grassmann-s0"): 1,
            ("evaluate", "table1_pre_norm-grassmann-s0"): 1,
            ("ablation_aggregate", None): 1,
        }
    )


def test_a_variants_training_key_plans_only_its_runs_and_the_ablation_table(demo):
    """An ablation variant may switch a training key (its runs' spec): the learning rate, for both
    models."""
    jobs, changed = _changes(
        demo, {"ablations": {"variants": {"pre_norm": {"norm": "pre", "train": {"lr": 0.01}}}}}
    )
    assert changed == {
        ("train", "table1_pre_norm-transformer-s0"),
        ("train", "table1_pre_norm-grassmann-s0"),
    }
    assert jobs == Counter(
        {
            ("train", "table1_pre_norm-transformer-s0"): 1,
            ("evaluate", "table1_pre_norm-transformer-s0"): 1,
            ("train", "table1_pre_norm-grassmann-s0"): 1,
            ("evaluate", "table1_pre_norm-grassmann-s0"): 1,
            ("ablation_aggregate", None): 1,
        }
    )


def test_editing_snli_report_code_plans_only_snli_aggregate(demo):
    with edited(demo / "src/grassflow/snli/aggregate.py"):
        assert planned(demo) == Counter({("snli_aggregate", None): 1})


def test_editing_preflight_code_reruns_nothing(demo):
    """The preflight is a check of the machine, rerun only when its record is missing: never a
    reason to retrain (and never masking another job's own reason to rerun)."""
    with edited(demo / "src/grassflow/preflight.py"):
        assert planned(demo) == Counter()


# a Grassmann-only setting changes the specs of the Grassmann runs (the tables that show them rerun
# after them: Snakemake gives a job whose inputs rerun that reason only)
GRASSMANN_SETTING_JOBS = {("train", r) for r in DEMO_GRASSMANN_RUNS}


def _changes(demo, overlay) -> tuple[Counter, set]:
    """(the jobs planned after a preset edit, those planned for their own settings: their
    params)."""
    jobs = plan_jobs(demo, overlay)
    return Counter(job_key(j) for j in jobs), settings_changed(jobs)


def test_grassmann_backend_switch_plans_its_runs_and_one_preflight(demo):
    jobs, changed = _changes(
        demo, {"model_overrides": {"grassmann": {"plucker_backend": "fused-cpu"}}}
    )
    assert changed == GRASSMANN_SETTING_JOBS
    assert {run for (rule, run) in jobs if rule == "train"} == DEMO_GRASSMANN_RUNS
    assert jobs[("preflight", None)] == 1
    assert {rule for rule, _ in jobs} == {
        "preflight",
        "train",
        "evaluate",
        "aggregate",
        "summary",
        "ablation_aggregate",
        "sweep_aggregate",
    }


def test_execution_keys_rerun_nothing(demo):
    """train.threads, compile, compile_mode, trackers and head_loss say how to run, not what to
    compute:
    changing them on a finished demo (run with trackers: [tensorboard]) plans nothing."""
    assert (
        planned(
            demo,
            {
                "train": {
                    "threads": 2,
                    "compile": True,
                    "compile_mode": "reduce-overhead",
                    "trackers": ["wandb"],
                    "head_loss": "reference",
                }
            },
        )
        == Counter()
    )


def test_editing_report_code_plans_only_aggregate(demo):
    with edited(demo / "src/grassflow/report/figures.py"):
        assert planned(demo) == Counter(
            {
                ("aggregate", None): 2,
                ("summary", None): 1,
                ("ablation_aggregate", None): 1,
                ("sweep_aggregate", None): 1,
                ("snli_aggregate", None): 1,
                ("recall_aggregate", None): 1,
            }
        )


def test_grassmann_setting_plans_only_grassmann_runs(demo):
    jobs, changed = _changes(demo, {"model_overrides": {"grassmann": {"empty_offsets": "bias"}}})
    assert changed == GRASSMANN_SETTING_JOBS
    runs = {run for (rule, run) in jobs if run}
    assert runs == DEMO_GRASSMANN_RUNS
    assert {rule for rule, _ in jobs} == {
        "train",
        "evaluate",
        "aggregate",
        "summary",
        "ablation_aggregate",
        "sweep_aggregate",
    }


def test_editing_grassmann_model_file_never_touches_transformer_or_data(demo):
    with edited(demo / "src/grassflow/models/grassmann.py"):
        jobs = planned(demo)
    assert not any(run and "transformer" in run for _, run in jobs)
    assert not {"download", "tokenize", "train_tokenizer"} & {rule for rule, _ in jobs}
    assert {run for (rule, run) in jobs if rule == "train"} == DEMO_GRASSMANN_RUNS
    assert jobs[("bench", None)] == 1  # the benchmark times the model: re-timed
    assert {rule for rule, _ in jobs} <= {
        "train",
        "evaluate",
        "snli_train",
        "snli_evaluate",
        "recall_train",
        "recall_evaluate",
        "aggregate",
        "summary",
        "ablation_aggregate",
        "sweep_aggregate",
        "snli_aggregate",
        "recall_aggregate",
        "bench",
    }
    assert not any(run and "transformer" in run for _, run in jobs)  # its runs, its tables, bench
    # the SNLI Grassmann head is built on the same block: its runs rerun too, its data does not
    assert {run for rule, run in jobs if rule == "snli_train"} == {
        "table3-grassmann-s0",
        "table3_scratch-grassmann-s0",
    }
    assert not {"snli_download", "snli_tokenize", "snli_train_tokenizer"} & {
        rule for rule, _ in jobs
    }


def test_snli_head_setting_plans_only_snli_grassmann_runs(demo):
    jobs, changed = _changes(demo, {"snli": {"head_overrides": {"grassmann": {"pairs": "causal"}}}})
    assert changed == {
        ("snli_train", "table3-grassmann-s0"),
        ("snli_train", "table3_scratch-grassmann-s0"),
    }
    assert jobs == Counter(
        {
            ("snli_train", "table3-grassmann-s0"): 1,
            ("snli_evaluate", "table3-grassmann-s0"): 1,
            ("snli_train", "table3_scratch-grassmann-s0"): 1,
            ("snli_evaluate", "table3_scratch-grassmann-s0"): 1,
            ("snli_aggregate", None): 1,
        }
    )


def test_snli_backbone_setting_never_touches_scratch_runs(demo):
    jobs, changed = _changes(demo, {"snli": {"backbone": {"random": {"seed": 1}}}})
    assert changed == {
        ("snli_train", "table3-transformer-s0"),
        ("snli_train", "table3-grassmann-s0"),
    }
    assert {run for _, run in jobs if run} == {"table3-transformer-s0", "table3-grassmann-s0"}
    assert {rule for rule, _ in jobs} == {"snli_train", "snli_evaluate", "snli_aggregate"}


def test_editing_tokenizer_code_plans_tokenize_and_everything_downstream(demo):
    with edited(demo / "src/grassflow/data/tokenizers.py"):
        rules = by_rule(planned(demo))
    assert rules["tokenize"] == 1 and rules["train_tokenizer"] == 1
    # a table each
    assert rules["train"] == rules["evaluate"] == DEMO_LM_RUNS and rules["aggregate"] == 2
    assert "download" not in rules


# --- edits that cannot change a result plan nothing; a task's edits plan its own jobs only --------
UNUSED_FUNCTION = "\n\ndef _never_called():\n    return 1\n"
REFORMATTED = ('"""`grassflow <verb>`', '"""  `grassflow <verb>`')  # a docstring edit


def test_edits_that_cannot_change_a_result_plan_nothing(demo):
    """A comment in the files every job imports, a docstring, a reworded error, any edit to the
    user's command line (no job imports cli.py): code fingerprints cover code (syntax trees);
    planning code, which reaches the jobs only through their params."""
    from helpers.dag import COMMENT_EDIT, replaced

    for f in (
        "job.py",
        "pipeline/presets.py",
        "loop.py",
        "pipeline/tasks.py",
        "models/grassmann.py",
    ):
        with edited(demo / "src/grassflow" / f, COMMENT_EDIT):
            assert planned(demo) == Counter(), f
    with replaced(demo / "src/grassflow/cli.py", *REFORMATTED):
        assert planned(demo) == Counter()
    with edited(demo / "src/grassflow/cli.py", UNUSED_FUNCTION):
        assert planned(demo) == Counter()
    # a reworded error in a module every data job imports (#70's rewording replanned a whole grid)
    with replaced(
        demo / "src/grassflow/data/sources.py",
        "not a readable parquet file",
        "an unreadable parquet file",
    ):
        assert planned(demo) == Counter()
    # planning code: what it decides reaches jobs through their params, and no job runs it
    for f in (
        "pipeline/presets.py",
        "lm/grid.py",
        "lm/layout.py",
        "pipeline/tasks.py",
        "planning/estimate.py",
    ):
        with edited(demo / "src/grassflow" / f):
            assert planned(demo) == Counter(), f


def test_editing_one_task_plans_none_of_anothers_runs(demo):
    with edited(demo / "src/grassflow/recall/data.py"):
        rules = by_rule(planned(demo))
    assert set(rules) == {"recall_data", "recall_train", "recall_evaluate", "recall_aggregate"}, (
        rules
    )


def test_a_new_task_directory_plans_nothing_of_the_existing_tasks(demo):
    import shutil

    toy = demo / "src/grassflow/toy"
    shutil.copytree(ROOT / "tests/data/toy_task", toy, ignore=shutil.ignore_patterns("__pycache__"))
    try:
        assert planned(demo) == Counter()
    finally:
        shutil.rmtree(toy)


def test_editing_one_stages_command_line_plans_only_that_stages_jobs(demo):
    """A job's code is its stage module's closure: the tokenize stages' shared loop
    (grassflow.data.stages) is the tokenize and documents jobs' code, no other job's; one stage
    module's edit plans its own jobs (and what they feed), not its task's other stages'."""
    from helpers.dag import replaced

    loop = "    for raw in a.raw:\n"
    with replaced(demo / "src/grassflow/data/stages.py", loop, loop + "        _edited = 1\n"):
        rules = by_rule(planned(demo))
    assert {"tokenize", "documents", "snli_tokenize"} <= set(rules)
    assert not {
        "download",
        "snli_download",
        "recall_data",
        "train_tokenizer",
        "snli_train_tokenizer",
    } & set(rules)
    # the text tasks' runs: downstream of tokenize
    assert not {"recall_train", "recall_evaluate"} & set(rules)
    with edited(demo / "src/grassflow/lm/documents.py"):
        # what reads them
        assert by_rule(planned(demo)) == Counter(
            {
                "documents": 1,
                "evaluate": DEMO_LM_RUNS,
                "aggregate": 2,
                "summary": 1,
                "ablation_aggregate": 1,
                "sweep_aggregate": 1,
            }
        )


def test_plan_why_names_the_files_whose_code_changed(demo):
    """`grassflow plan --why`: a job planned after a code edit names the file (its fingerprint's
    per-file hashes were kept when the demo ran); after a comment edit nothing is planned."""
    import subprocess
    import sys

    from helpers.dag import COMMENT_EDIT, pipeline_env

    def why():
        res = subprocess.run(
            [sys.executable, "-m", "grassflow", "plan", "--why", "--preset", "demo"],
            cwd=demo,
            env=pipeline_env(demo),
            capture_output=True,
            text=True,
        )
        assert res.returncode == 0, res.stderr[-3000:]
        return res.stdout

    with edited(demo / "src/grassflow/ops/plucker/cupy_backend.py", COMMENT_EDIT):
        assert why().startswith("Nothing to do")
    with edited(demo / "src/grassflow/ops/plucker/cupy_backend.py"):
        out = why()
    rows = [line for line in out.splitlines() if line.startswith("| train ")]
    assert len(rows) == len(DEMO_GRASSMANN_RUNS)
    assert all("code changed: src/grassflow/ops/plucker/cupy_backend.py" in r for r in rows), rows
    assert "| evaluate " in out and "| aggregate " in out and "grassmann" in rows[0]


def fake_hub_cache(home, repo: str, files: dict[str, str]) -> None:
    """A Hugging Face cache holding `repo`'s files (HF_HOME=home): what a fetch reads offline."""
    snapshot = home / "hub" / f"models--{repo}" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    for name, text in files.items():
        (snapshot / name).write_text(text)


@pytest.mark.slow  # default tier under 5 min: a scratch repository's own demo data stages
def test_a_hub_fetch_holds_its_own_code_only(tmp_path):
    """The hub fetches feed every run of the LM and SNLI (fetch_tokenizer → tokenize → train): a
    code edit to the planning of the tasks or to another stage's handler plans no fetch and none of
    what it feeds; an edit to the tokenizer code does (the positive control). On the demo with its
    tokenizer taken from the hub (here an offline cache): the paper preset's case."""
    from helpers.dag import copy_repo, snakemake

    work = copy_repo(tmp_path)
    fake_hub_cache(
        tmp_path / ".hf",
        "bert-base-uncased",
        {
            "vocab.txt": "\n".join(
                [
                    "[PAD]",
                    "[UNK]",
                    "[CLS]",
                    "[SEP]",
                    "[MASK]",
                    *"abcdefghijklmnopqrstuvwxyz",
                    "the",
                    "of",
                    "and",
                ]
            )
            + "\n"
        },
    )
    (work / "hub.yaml").write_text(
        json.dumps(
            {"presets": {"demo": {"tokenizer": {"name": "bert-base-uncased", "vocab_size": None}}}}
        )
    )
    tokens = [
        f"results/demo/data/tokens/bert-base-uncased/{s}.parquet"
        for s in ("train", "validation", "test")
    ]

    def run(*args) -> str:  # the token files, their jobs only
        return snakemake(
            work, *tokens, *args, "--configfile", "hub.yaml", env={"HF_HOME": str(tmp_path / ".hf")}
        ).stdout

    def plan() -> Counter:
        return Counter(re.findall(r"^(?:local)?rule (\w+):", run("-n"), re.M))

    run()
    assert (work / "results/demo/tokenizers/bert-base-uncased/tokenizer.json").is_file()
    assert plan() == Counter()
    with edited(work / "src/grassflow/pipeline/tasks.py"):
        assert plan() == Counter()
    with edited(work / "src/grassflow/lm/download.py"):
        # its stage's job, and what it feeds
        assert plan() == Counter({"download": 1, "tokenize": 1})
    with edited(work / "src/grassflow/data/tokenizers.py"):
        assert plan() == Counter({"fetch_tokenizer": 1, "tokenize": 1})
        # a rerun the user judges cannot change a result, accepted as docs/use/pipeline.md says:
        # recorded, not run
        run("--touch")
        assert plan() == Counter()


def test_a_release_that_replans_everything_needs_one_touch(demo):
    """docs/use/pipeline.md's step after a release that changes every job's fingerprint or params
    (here a code line in a module every job runs, as the switch from spec files to params did): one
    `snakemake --touch` records every finished job as current, and nothing is planned; then one
    `batch_size` edit replans only the runs it reaches (their train jobs' settings, before and
    after, as `grassflow plan --why` says), their evaluations and their table."""
    from helpers.dag import snakemake

    table2 = {f"table2-{m}-s{s}" for m in ("transformer", "grassmann") for s in (0, 1)}
    try:
        with edited(demo / "src/grassflow/io.py"):
            rules = by_rule(planned(demo))
            assert (
                rules["train"] == DEMO_LM_RUNS
                and rules["snli_train"] == 4
                and rules["download"] == 1
            ), rules
            snakemake(demo, "--touch")
            assert planned(demo) == Counter()
            jobs = plan_jobs(demo, {"experiments": {"table2": {"batch_size": 8}}})
            assert settings_changed(jobs) == {("train", r) for r in table2}
            assert Counter(job_key(j) for j in jobs) == Counter(
                {
                    **{(s, r): 1 for s in ("train", "evaluate") for r in table2},
                    ("aggregate", None): 1,
                    ("summary", None): 1,
                }
            )
            said = [w for j in jobs if j["rule"] == "train" for w in j["why"]]
            assert said == ["settings changed: train.batch_size: 16 → 8"] * 4, said
    finally:
        snakemake(demo, "--touch")  # the demo as it was: its own code recorded as current again
    assert planned(demo) == Counter()
