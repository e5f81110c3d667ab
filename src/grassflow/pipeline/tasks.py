"""The tasks, one row each of TASKS: a `Task` naming what only Python can say of it (its runs, their
checks and estimates, its part's schema), all of it planning code in its own package
(<task>/grid.py). Its files, rules, wildcards and outputs are its rule file's
(workflow/rules/<task>.smk, included by the Snakefile). A new task is one more row: the config
schema, the rules' helpers (common.smk: TASK_RUNS) and the tests read this table, not lists of their
own. The tasks' planning is below this module: none of it imports it back (tested).

This module is planning. No job imports it, so editing it reruns no job.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from grassflow.lm import grid as lm
from grassflow.planning.estimate import STARTUP_S, Estimate
from grassflow.planning.schema import read_yaml
from grassflow.recall import grid as recall
from grassflow.snli import grid as snli


@dataclass(frozen=True)
class Task:
    """What a task declares for planning; its jobs are its stage modules
    (`python -m grassflow.<task>.<stage>`), which its rule file names."""

    name: str  # its package's name; "lm" | "snli" | "recall" | a new one
    # the preset key holding this task's part (None: the preset itself, the LM)
    part_key: str | None
    # (preset name, preset) → {run_id: spec}; every spec has run_id, task, model_kind, train
    runs: Callable
    # (stage, spec, preset, settings, files) → (Estimate, where the sizes came from)
    estimate: Callable
    # (key path, preset name, preset) → raises ConfigError naming the key
    check: Callable | None = None
    # (a run's spec, preset) → raises ValueError: its model as its dataclass takes it
    check_model: Callable | None = None
    # the JSON schema of its part: a dict, or a YAML file of its package (snli/schema.yaml); its
    # `$defs` join the config schema's (the LM's part: workflow/schemas/config.schema.yaml)
    schema: dict | str | None = None

    def part(self, preset: dict) -> dict | None:
        """This task's part of `preset`, or None where the preset has none."""
        if self.part_key is None:
            return preset if preset.get("experiments") else None
        return preset.get(self.part_key)

    def part_schema(self) -> dict | None:
        """The JSON schema of its part (a fresh copy), or None (the LM's is the config schema's)."""
        if isinstance(self.schema, str):
            return read_yaml(Path(__file__).resolve().parents[1] / self.name / self.schema)
        return copy.deepcopy(self.schema)

    def threads(self, preset: dict) -> int:
        """Its jobs' threads: its part's train.threads (1 where the preset has no such part)."""
        return ((self.part(preset) or {}).get("train") or {}).get("threads", 1)

    def specs(self, name: str, preset: dict) -> dict:
        """Its runs' specs ({run_id: spec}; {} where the preset has no part of it)."""
        return self.runs(name, preset) if self.part(preset) else {}


# the tasks, in this order (the first part a preset has sets its execution keys)
TASKS = {
    t.name: t
    for t in (
        Task("lm", None, lm.runs, lm.estimate, lm.check_lm, lm.check_model),
        Task(
            "snli",
            "snli",
            snli.snli_runs,
            snli.estimate,
            snli.check_snli,
            snli.check_model,
            "schema.yaml",
        ),
        Task(
            "recall",
            "recall",
            recall.recall_runs,
            recall.estimate,
            recall.check_recall,
            recall.check_model,
            "schema.yaml",
        ),
    )
}


def pipeline_train(preset: dict) -> dict:
    """The train section whose execution keys hold for a whole pipeline run (`train.runs_per_gpu`:
    one K for every GPU job and every packed allocation; the preflight's threads): the first part
    the preset has, the LM's, else SNLI's, else recall's, else a new task's."""
    part = next((t.part(preset) for t in TASKS.values() if t.part(preset)), None)
    if part is None:
        raise ValueError(
            "the preset has no part to run: none of "
            f"{[t.part_key or 'experiments' for t in TASKS.values()]}"
        )
    return part["train"]


def job_estimate(
    task: str,
    stage: str,
    spec: dict,
    preset: dict,
    settings: dict | None = None,
    files: dict | None = None,
) -> Estimate:
    """The estimate of one job (`stage`: train or evaluate) of a run of `task` for its spec, by the
    task's hook (its grid's `estimate`); `settings`: the config's `estimate` section; `files`: the
    job's token files by split (their counts are exact once they exist)."""
    t = TASKS[task]
    # one K for the whole pipeline run, every task's jobs
    k = pipeline_train(preset).get("runs_per_gpu", 1)
    # execution keys are not in the spec (changing them reruns nothing): the preset's threads
    est, source = t.estimate(
        stage,
        {**spec, "train": {**spec["train"], "threads": t.threads(preset)}},
        preset,
        settings,
        files,
    )
    # K runs per GPU: side by side locally, one after another in a SLURM allocation (the executor
    # plugin runs a group job's jobs one at a time: snakemake-executor-plugin-slurm#469). ×K is the
    # time of the latter and the bound of the former (sharing gains nothing).
    shared = f"; {k} runs per GPU: ×{k}"
    return Estimate(
        (est.seconds + STARTUP_S) * k,
        est.items,
        est.mem_mb,
        f"{est.basis}; data: {source}" + (shared if k > 1 else ""),
        k,
    )
