# Helpers shared by the rules: the selected preset, the runs, file names, and the source
# fingerprints that make a rule stale when the code it runs changes. Each task's own names (its
# paths, runs, outputs) are planned in its package (grassflow.<task>.plan) and read by its rule file.
import functools
import json
import os
import re
import shlex
import sys
from pathlib import Path

from grassflow.pipeline.presets import select_preset
from grassflow.planning.sections import SPLITS, exec_resources, run_train
from grassflow.planning.staleness import CODE_INDEX, fingerprint, job_code, kind_code, remember
from grassflow.pipeline.tasks import TASKS, job_estimate, pipeline_train

PRESET, PRESET_CFG = select_preset(config)  # checked by validate_or_exit in the Snakefile
RESULTS = f"results/{PRESET}"
REPORT = f"{RESULTS}/report"
# {task: {run_id: spec}} of every task (grassflow.pipeline.tasks): one job of each stage per run.
# Every task's rules exist whatever the preset; a preset without a task's part plans none of its
# jobs (its run wildcard matches nothing).
TASK_RUNS = {name: t.specs(PRESET, PRESET_CFG) for name, t in TASKS.items()}
THREADS = {name: t.threads(PRESET_CFG) for name, t in TASKS.items()}  # each task's jobs' threads

# Each training and evaluation job's time limit and memory (grassflow.planning.estimate): resources
# of the job, computed from its spec and data; the token files' own counts once they exist
# (Snakemake evaluates resources again when a job's inputs are ready). Longer on every retry.
ESTIMATE = config.get("estimate") or {}


def run_resources(task, stage, specs, wildcard, files=None, groups=None):
    """A run's `stage` job's resources (train or evaluate; `wildcard` names a run of `specs` of `task`
    reading token `files`): its GPU slot (GPU); a training job's execution keys (train.compile,
    compile_mode, trackers: how it runs, not what it computes, as resources, which are not rerun
    triggers, params are, so changing them reruns nothing; a profile may set them per rule); and
    its estimate: "runtime" (minutes) and "mem_mb" as functions of (wildcards, attempt), and what
    `grassflow plan` tables ("estimate_ms": the wall-time estimate, "trained_items": tokens or
    examples trained on). With `groups` the wildcard names a fused group (train_fused): its runs'
    estimates summed, as if the ensemble were no faster than its runs one after another (what it
    measured on a CPU)."""
    part = TASKS[task].part(PRESET_CFG)

    def ests(wc):
        key = getattr(wc, wildcard)
        runs = groups[key] if groups else [key]
        return [job_estimate(task, stage, specs[r], PRESET_CFG, ESTIMATE, files) for r in runs]

    return {
        **(exec_resources(part["train"]) if part and stage == "train" else {}),
        **GPU,
        "runtime": lambda wc, attempt: sum(e.minutes(ESTIMATE, attempt) for e in ests(wc)),
        "mem_mb": lambda wc, attempt: sum(e.request_mb(attempt) for e in ests(wc)),
        "estimate_ms": lambda wc: round(1000 * sum(e.seconds for e in ests(wc))),
        "trained_items": lambda wc: sum(e.items for e in ests(wc)),
    }


def run_outputs(run_dir):
    """A run's training outputs, in its directory (every task's train rule)."""
    names = ("model.safetensors", "config.json", "metrics.jsonl", "run.json")
    return {k: f"{run_dir}/{f}" for k, f in zip(("weights", "config", "metrics", "record"), names)}


def alternatives(names):
    """A wildcard's constraint: exactly these names (none: a pattern that matches nothing)."""
    return "|".join(map(re.escape, names)) or "(?!)"


wildcard_constraints:
    split=alternatives(SPLITS),


# --- settings ---------------------------------------------------------------------------------
# What a job computes from (a run's spec, a data or tokenizer section, the slice of the preset a
# table reads) reaches it as a param: canonical JSON, on its command line (`--spec '{...}'`, which
# `snakemake -p` and its log show, and which reruns it by hand). Snakemake reruns a job whose params
# changed, saying before and after (`grassflow plan --why` names the keys).
def as_json(value):
    return json.dumps(value, sort_keys=True)


def quoted_json(values):
    """Several settings as shell words (a fused group's specs)."""
    return " ".join(shlex.quote(as_json(v)) for v in values)


def table_part(part, key):
    """Another task's tables read its own part only, without execution keys."""
    return {key: {**part, "train": run_train(part["train"])}} if part else None


# --- code fingerprints -------------------------------------------------------------------
# Snakemake cannot see code imported by a command, so each rule carries, as a param, a hash of the
# code its job runs: its stage module's import closure (grassflow.planning.staleness), with of the
# models' code only the kind the job runs, each file by its syntax tree, not its text. Edit a file
# and exactly the jobs that run its code rerun: `python -m grassflow.planning.staleness <module>
# --kinds <kind>` lists a job's files. When jobs run (onstart, below), each fingerprint's per-file
# hashes are kept in .snakemake/grassflow/code/ (CODE_INDEX), so that `grassflow plan --why` can
# name the files a later edit changed.
MODEL_KINDS = tuple(kind_code())
CODE = {}  # fingerprint → {file: code hash}, of every fingerprint computed here


@functools.cache
def code_of(module, *kinds):
    code = job_code(module, kinds, CHECKOUT)
    CODE[fingerprint(code)] = code
    return fingerprint(code)


# K GPU jobs share a GPU (train.runs_per_gpu, grassflow.gpu_slots): one K for the whole run. On
# SLURM, `--group-components lm_run=K ...` (`grassflow gpus --slurm`) packs K runs into one
# allocation; their time limits are sized from K (grassflow.planning.estimate).
RUNS_PER_GPU = pipeline_train(PRESET_CFG)["runs_per_gpu"]
GPU = {"gpu": 1, "runs_per_gpu": RUNS_PER_GPU}  # a GPU job's resources: its slot, one of K per GPU

# Every job's environment, said once: K (grassflow.gpu_slots), and its shell's own stderr (Snakemake's
# output) kept on descriptor 3 before the rule sends the job's to its log, where a failing job writes
# its one error line too (grassflow.job.say_error). Snakemake sets OMP_NUM_THREADS to a job's threads.
shell.prefix(
    f"set -euo pipefail; exec 3>&2; export GRASSFLOW_ERROR_FD=3 GRASSFLOW_RUNS_PER_GPU={RUNS_PER_GPU}; "
)


onstart:
    remember(CODE, Path(CODE_INDEX))
    # the runs' time limits and GPU slots are sized from K: a packing other than K (of a run's
    # group, profiles/slurm: the only groups) is refused before any job starts (Snakemake hands its
    # --group-components to the workflow only here)
    for _group, _n in dict(workflow.group_settings.group_components).items():
        if _n != RUNS_PER_GPU:
            sys.exit(
                f"error: --group-components {_group}={_n} packs {_n} runs per allocation but "
                f"train.runs_per_gpu is {RUNS_PER_GPU} (it sizes their time limits and GPU slots): "
                f"set train.runs_per_gpu: {_n}, and print the flag with `grassflow gpus --slurm`"
            )


# --- input functions the rule files share -----------------------------------------------
def preflight_file(device, backend="auto"):
    return f"{RESULTS}/preflight/{device}_{backend}.json"


def run_preflight(specs, wildcard, model_key="model"):
    """The preflight a run's jobs depend on (`wildcard` names a run of `specs`): its device's,
    with a Grassmann run's op backend (its model's settings under `model_key`)."""

    def of(wc):
        spec = specs[getattr(wc, wildcard)]
        grassmann = spec["model_kind"] == "grassmann"
        return preflight_file(
            spec["train"]["device"],
            spec[model_key].get("plucker_backend", "auto") if grassmann else "auto",
        )

    return of


def fetched_tokenizer(name):
    return f"{RESULTS}/tokenizers/{name}/tokenizer.json"


def tokenizer_artifact(part, results):
    """The tokenizer file a task's tokenize reads: trained here, fetched from the hub (a name
    without a local `path`: fetch.smk, where Snakemake runs; on a cluster the login node, the
    only one with internet), or none (a `path`, or no such part)."""
    tok = part["tokenizer"] if part else {"name": None, "path": None}
    if tok["name"] == "trained":
        return [f"{results}/data/tokenizer/trained/tokenizer.json"]
    if tok["name"] and not tok.get("path"):
        return [fetched_tokenizer(tok["name"])]
    return []


def artifact_args(part, results):
    return " ".join(f"--artifact {a}" for a in tokenizer_artifact(part, results))


def own_file(rel):
    """A file of this checkout (its resources) as a rule's input: relative to the working
    directory, as Snakemake records inputs (in the checkout: `rel` itself, so that a results tree
    moved with its checkout plans nothing)."""
    return os.path.relpath(CHECKOUT / rel)


def run_files(res, runs, file):
    """File `file` of each of `runs` (under `res`/runs/)."""
    return [f"{res}/runs/{run}/{file}" for run in runs]


def shown(files, category):
    """Files as Snakemake's report shows them: under `category`, captioned by
    workflow/report/<category, lower case>.rst where there is one."""
    caption = CHECKOUT / "workflow" / "report" / f"{category.lower()}.rst"
    captioned = {"caption": f"../report/{caption.name}"} if caption.is_file() else {}

    def one(f):
        kind = "figure" if f.endswith(".png") else "table"
        return report(f, category=category, labels={kind: Path(f).name}, **captioned)

    return [one(f) for f in files]
