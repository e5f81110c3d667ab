"""The tasks (language modelling, SNLI, recall), each declared once: its part of a preset, its
runs, its run wildcard, its rules and commands, where its results and token files live, and how
its jobs are estimated. The Snakemake rules (workflow/rules/common.smk), `grassflow plan`, the
`estimates` report and the estimate of a job's time limit read this table, not lists of their
own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from grassflow.config import recall_runs, runs, snli_runs

STAGES = ("train", "evaluate")  # the jobs of one run, in order


@dataclass(frozen=True)
class Task:
    name: str  # "lm" | "snli" | "recall"
    part_key: str | None  # the preset key holding this task's part (None: the preset itself)
    prefix: str  # of its rule names ("snli_") and results subdirectory; "" for the LM
    wildcard: str  # its run wildcard in the rules
    kind_key: str  # the spec key naming the model kind the run trains
    config_key: str  # the spec key of the model's settings
    runs: Callable[[str, dict], dict]  # (preset name, preset) → {run_id: spec}
    estimate: Callable  # (stage, spec, preset, settings, files) → (Estimate, where the sizes came from)
    token_dir: Callable[[Path, dict], Path] | None  # (the preset's results dir, preset) → token files' dir

    def part(self, preset: dict) -> dict | None:
        """This task's part of `preset`, or None where the preset has none."""
        if self.part_key is None:
            return preset if preset.get("experiments") else None
        return preset.get(self.part_key)

    def rule(self, stage: str) -> str:
        return f"{self.prefix}{stage}"

    @property
    def group(self) -> str:
        """The cluster profile's group of a run's jobs (one allocation per run, or K: `--group-components`)."""
        return f"{self.name}_run"

    def command(self, stage: str) -> str:
        return f"{self.prefix.replace('_', '-')}{stage}"

    def results(self, res) -> Path:
        """The task's results directory under a preset's (`results/<preset>`)."""
        return Path(res) / self.prefix.rstrip("_") if self.prefix else Path(res)

    def bench_file(self, res, stage: str, run_id: str) -> Path:
        """Snakemake's benchmark file (wall time) of one of its jobs."""
        return Path(res) / "benchmarks" / (f"{self.name}/{stage}" if self.prefix else stage) / f"{run_id}.tsv"

    def files(self, res, preset: dict) -> dict | None:
        """The token files its jobs read, by split (their counts size the estimates), or None."""
        if self.token_dir is None or not self.part(preset):
            return None
        d = self.token_dir(self.results(res), preset)
        return {s: d / f"{s}.parquet" for s in ("train", "validation", "test")}

    def specs(self, name: str, preset: dict) -> dict:
        return self.runs(name, preset) if self.part(preset) else {}


def _lm_estimate(stage, spec, preset, settings, files):
    from grassflow.estimate import lm_evaluate, lm_sizes, lm_train

    sizes, vocab, source = lm_sizes(preset, files)
    return (lm_train if stage == "train" else lm_evaluate)(spec, sizes, vocab, settings), source


def _snli_estimate(stage, spec, preset, settings, files):
    from grassflow.estimate import snli_sizes, snli_train

    pairs, source = snli_sizes(preset["snli"], files)
    return snli_train(spec, pairs, settings, evaluate=stage == "evaluate"), source


def _recall_estimate(stage, spec, preset, settings, files):
    from grassflow.estimate import recall_evaluate, recall_train

    r = preset["recall"]
    est = (recall_train if stage == "train" else recall_evaluate)(spec, dict(r["data"]["examples"]),
                                                                 r["data"]["vocab"], settings)
    return est, "config (recall.data.examples)"


TASKS = {t.name: t for t in (
    Task("lm", None, "", "run", "model_kind", "model", runs, _lm_estimate,
         lambda d, p: d / "data" / "tokens" / p["tokenizer"]["name"]),
    Task("snli", "snli", "snli_", "snli_run", "head_kind", "head", snli_runs, _snli_estimate,
         lambda d, p: d / "data" / "tokens" / p["snli"]["tokenizer"]["name"]),
    # one data directory per (seq_len, kv) cell: the estimates read the sizes from the config
    Task("recall", "recall", "recall_", "recall_run", "model_kind", "model", recall_runs, _recall_estimate, None),
)}

# {rule name: (task, stage)} of every run's jobs: train, evaluate, snli_train, ...
RUN_RULES = {t.rule(stage): (t, stage) for t in TASKS.values() for stage in STAGES}


def pipeline_train(preset: dict) -> dict:
    """The train section whose execution keys hold for a whole pipeline run (`train.runs_per_gpu`:
    one K for every GPU job and every packed allocation; the preflight's threads): the first
    part the preset has, the LM's, else SNLI's, else recall's."""
    part = next((t.part(preset) for t in TASKS.values() if t.part(preset)), None)
    if part is None:
        raise ValueError("the preset has no part to run: no experiments, snli or recall")
    return part["train"]

