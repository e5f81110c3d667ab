# Helpers shared by the rules: the selected preset, the run grid, file names, and the
# source fingerprints that make a rule stale when the code it runs changes.
import functools
import json
import re
import sys
from pathlib import Path

from grassflow.lm.grid import tokenizer_spec
from grassflow.pipeline.presets import select_preset
from grassflow.pipeline.sections import exec_resources, run_train
from grassflow.snli.grid import snli_tokenizer_spec
from grassflow.pipeline.staleness import CODE_INDEX, fingerprint, job_code, kind_code, remember
from grassflow.pipeline.tasks import RUN_RULES, TASKS, pipeline_train

PRESET, PRESET_CFG = select_preset(config)  # checked by validate_or_exit in the Snakefile
RESULTS = f"results/{PRESET}"
REPORT = f"{RESULTS}/report"
SPLITS = ["train", "validation", "test"]
# {task: {run_id: spec}} of every task the preset has (grassflow.pipeline.tasks): one job of each stage per run
TASK_RUNS = {t.name: t.specs(PRESET, PRESET_CFG) for t in TASKS.values()}
ACTIVE_TASKS = [t for t in TASKS.values() if t.part(PRESET_CFG)]  # those this preset has a part of
# Every task's rules exist whatever the preset; a preset without a task's part plans none of its
# jobs (its run wildcard matches nothing), and its names below are empty.
THREADS = {
    t.name: ((t.part(PRESET_CFG) or {}).get("train") or {}).get("threads", 1)
    for t in TASKS.values()
}

# Each training and evaluation job's time limit and memory (grassflow.pipeline.estimate): resources of
# the job, computed from its spec and data; the token files' own counts once they exist
# (Snakemake evaluates resources again when a job's inputs are ready). Longer on every retry.
ESTIMATE = config.get("estimate") or {}


def estimated(rule):
    """{"runtime": minutes, "mem_mb": MB} as functions of (wildcards, attempt) for a run's `rule`,
    and what `grassflow plan` tables ("estimate_s": the wall-time estimate, "items": tokens or
    examples trained on); a fused group's job (train_fused): its runs' estimates summed, as if
    the ensemble were no faster than its runs one after another (what it measured on a CPU)."""
    from grassflow.pipeline.tasks import job_estimate

    fused = rule == "train_fused"
    task, stage = (TASKS["lm"], "train") if fused else RUN_RULES[rule]

    def ests(wc):
        runs = FUSED[wc.group] if fused else [getattr(wc, task.wildcard)]
        specs, files = TASK_RUNS[task.name], task.files(RESULTS, PRESET_CFG)
        return [job_estimate(task.rule(stage), specs[r], PRESET_CFG, ESTIMATE, files) for r in runs]

    return {
        "runtime": lambda wc, attempt: sum(e.minutes(ESTIMATE, attempt) for e in ests(wc)),
        "mem_mb": lambda wc, attempt: sum(e.request_mb(attempt) for e in ests(wc)),
        "estimate_s": lambda wc: round(sum(e.seconds for e in ests(wc))),
        "items": lambda wc: sum(e.items for e in ests(wc)),
    }


# How each task's training jobs run, not what they compute (train.compile, compile_mode, trackers): handed
# to the jobs as resources, which are not rerun triggers (params are), so changing them reruns
# nothing, as train.threads; a profile may set them per rule (set-resources).
EXECUTION = {
    t.name: exec_resources(t.part(PRESET_CFG)["train"]) if t.part(PRESET_CFG) else {}
    for t in TASKS.values()
}


def alternatives(names):
    """A wildcard's constraint: exactly these names (none: a pattern that matches nothing)."""
    return "|".join(map(re.escape, names)) or "(?!)"


wildcard_constraints:
    **{t.wildcard: alternatives(TASK_RUNS[t.name]) for t in TASKS.values()},
    **{f"{t.name}_cell": alternatives(t.cells(t.part(PRESET_CFG))) for t in ACTIVE_TASKS if t.cells},
    split=alternatives(SPLITS),


# --- code fingerprints -------------------------------------------------------------------
# Snakemake cannot see code imported by a command, so each rule carries, as a param, a hash of
# the code its job runs: its stage module's import closure (grassflow.pipeline.staleness), with of the
# models' code only the kind the job runs, each file by its syntax tree, not its text. Edit a
# file and exactly the jobs that run its code rerun: `python -m grassflow.pipeline.staleness <module>
# --kinds <kind>` lists a job's files. When jobs run (onstart, below), each fingerprint's per-file
# hashes are kept in .snakemake/grassflow/code/ (CODE_INDEX), so that `grassflow plan --why` can
# name the files a later edit changed.
MODEL_KINDS = tuple(kind_code())
CODE = {}  # fingerprint → {file: code hash}, of every fingerprint computed here


@functools.cache
def code_of(module, *kinds):
    code = job_code(module, kinds, Path(workflow.basedir))
    CODE[fingerprint(code)] = code
    return fingerprint(code)


# K GPU jobs share a GPU (train.runs_per_gpu, grassflow.gpu_slots): one K for the whole run. On
# SLURM, `--group-components lm_run=K ...` (`grassflow gpus --slurm`) packs K runs into one
# allocation; their time limits are sized from K (grassflow.pipeline.estimate).
RUNS_PER_GPU = pipeline_train(PRESET_CFG)["runs_per_gpu"]


onstart:
    remember(CODE, Path(CODE_INDEX))
    # the runs' time limits and GPU slots are sized from K: a packing other than K (of a run's
    # group, profiles/slurm: the only groups) is refused before any job starts (Snakemake hands
    # its --group-components to the workflow only here)
    for _group, _n in dict(workflow.group_settings.group_components).items():
        if _n != RUNS_PER_GPU:
            sys.exit(
                f"error: --group-components {_group}={_n} packs {_n} runs per allocation but "
                f"train.runs_per_gpu is {RUNS_PER_GPU} (it sizes their time limits and GPU slots): "
                f"set train.runs_per_gpu: {_n}, and print the flag with `grassflow gpus --slurm`"
            )


# --- specs --------------------------------------------------------------------------------
# What a job computes from (a run's spec, a data or tokenizer section, the slice of the preset a
# table reads), as a small JSON file that the local rule `spec` (specs.smk) writes from
# spec_objects() when its content changes: a job's command line stays short and can be pasted to
# rerun the job by hand, and the job reruns when its spec file is rewritten.
@functools.cache
def spec_objects():
    """Every spec file the rules read, by name (results/<preset>/specs/<name>.json): each task's
    runs, data and table's part (<task>/run/<run id>, <task>/data[/<cell>], <task>/aggregate; a
    new task's rules read theirs so), the LM's and the other inputs the rules compute from."""
    out = {
        "data": PRESET_CFG.get("data"),
        "tokenize": tokenizer_spec(PRESET_CFG) if LM else None,
        "ablations/preset": ABLATIONS_PRESET,
        "ablations/grid": ABLATIONS,
        "snli/backbone": SNLI.get("backbone"),
        "snli/tokenize": snli_tokenizer_spec(PRESET_CFG) if SNLI else None,
        **{f"aggregate/{exp}": part for exp, part in AGGREGATE_PRESETS.items()},
        **{f"fetch_tokenizer/{name}": tok for name, tok in FETCH_TOKENIZERS.items()},
    }
    for t in TASKS.values():
        out |= {f"{t.subdir}run/{run}": s for run, s in TASK_RUNS[t.name].items()}
        part = t.part(PRESET_CFG) or {}
        if t.part_key:  # the LM's data and tables: above
            out[f"{t.subdir}data"] = part.get("data")
            out[f"{t.subdir}aggregate"] = aggregate_part(part, t.part_key)
        if t.cells and part:
            out |= {f"{t.subdir}data/{c}": d for c, d in t.cells(part).items()}
    return out


def aggregate_part(part, key):
    """Another task's tables read its own part only, without execution keys."""
    return {key: {**part, "train": run_train(part["train"])}} if part else None


def spec_json(name):
    """Spec `name`'s file content: canonical JSON."""
    return json.dumps(spec_objects()[name], sort_keys=True, indent=1)


# --- input functions the rule files share -----------------------------------------------
def spec(name, wildcard=None):
    """The file of spec `name`, or with `wildcard` the pattern of family `name`'s (<name>/<key>)."""
    return (
        f"{RESULTS}/specs/{name}/{{{wildcard}}}.json"
        if wildcard
        else f"{RESULTS}/specs/{name}.json"
    )


def preflight_file(device, backend="auto"):
    return f"{RESULTS}/preflight/{device}_{backend}.json"


def run_preflight(task_name):
    """The preflight a run's jobs of this task depend on: its device's, with a Grassmann run's op
    backend (a fused group's: its first run's)."""
    task = TASKS[task_name]

    def of(wc):
        run = FUSED[wc.group][0] if hasattr(wc, "group") else getattr(wc, task.wildcard)
        spec = TASK_RUNS[task_name][run]
        grassmann = spec["model_kind"] == "grassmann"
        return preflight_file(
            spec["train"]["device"],
            spec[task.model_key].get("plucker_backend", "auto") if grassmann else "auto",
        )

    return of


# Hub files the jobs need are fetched first, where Snakemake runs (fetch.smk; on a cluster: the login
# node, the only one with internet): tokenizers named but not given a local `path`.
FETCH_TOKENIZERS = {
    tok["name"]: tok
    for tok in (t.part(PRESET_CFG)["tokenizer"] for t in ACTIVE_TASKS if t.tokenizer)
    if tok["name"] != "trained" and not tok.get("path")
}


def fetched_tokenizer(name):
    return f"{RESULTS}/tokenizers/{name}/tokenizer.json"


def tokenizer_artifact(part, results):
    """The tokenizer file a task's tokenize reads: trained here, fetched from the hub, or none (a
    `path`, or no such part)."""
    name = part["tokenizer"]["name"] if part else None
    if name == "trained":
        return [f"{results}/data/tokenizer/trained/tokenizer.json"]
    return [fetched_tokenizer(name)] if name in FETCH_TOKENIZERS else []


def artifact_args(part, results):
    return " ".join(f"--artifact {a}" for a in tokenizer_artifact(part, results))


# --- every task's files (grassflow.pipeline.tasks) -------------------------------------------------------
def task_run_outputs(name, file):
    """File `file` of each of task `name`'s runs."""
    task = TASKS[name]
    return [f"{task.results(RESULTS)}/runs/{run}/{file}" for run in TASK_RUNS[name]]


def task_outputs(name):
    """The tables and figures task `name`'s aggregate writes (not the LM's: lm.smk)."""
    task = TASKS[name]
    part = task.part(PRESET_CFG)
    return [f"{REPORT}/{f}" for f in task.outputs(part)] if task.outputs and part else []


def task_report(name):
    """task_outputs(name) as Snakemake's report shows them: under the task's title, captioned by
    workflow/report/<name>.rst where there is one."""
    task = TASKS[name]
    caption = Path(workflow.basedir, "workflow", "report", f"{name}.rst")
    captioned = {"caption": f"../report/{name}.rst"} if caption.is_file() else {}

    def shown(f):
        kind = "figure" if f.endswith(".png") else "table"
        return report(f, category=task.title, labels={kind: Path(f).name}, **captioned)

    return [shown(f) for f in task_outputs(name)]


def final_outputs():
    """The tables and figures, and every run's evaluation too: Snakemake (>= 7.7, by design,
    snakemake#1978) does not redo a deleted intermediate file whose consumers look up to date,
    so without these a deleted or failed run would leave the old tables standing."""
    tasks = [
        f
        for t in ACTIVE_TASKS
        for f in task_outputs(t.name) + task_run_outputs(t.name, "eval.json")
    ]
    return LM_OUTPUTS + tasks
