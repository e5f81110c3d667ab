"""The tasks, each declared once in its own package: `grassflow/<task>/task.py` holds `TASK`, a
`Task` (language modelling: lm/task.py, SNLI: snli/task.py, recall: recall/task.py). A new task
is one more such directory: this module finds it, and the Snakemake rules
(workflow/rules/common.smk, runs.smk), the CLI's commands, the config schema, `grassflow plan`,
the estimates and the tests read the declarations, not lists of their own.

A declaration names its entry points as "module:function" strings, so that it imports nothing
(the CLI loads every declaration; the code fingerprint of a task's command covers its own entry
module only: grassflow.staleness).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

STAGES = ("train", "evaluate")  # the jobs of one run, in order
# entry points called in the process that reads the declarations (the Snakefile, `grassflow plan`, the
# estimates report); the others are commands, each a job of its own
PLANNING_HOOKS = ("runs", "estimate", "check", "cells", "tokenize_section", "run_dirs")
BUILT_IN = ("lm", "snli", "recall")  # first, in this order (the first part a preset has sets its execution keys)


@dataclass(frozen=True)
class Task:
    name: str  # its package's name; "lm" | "snli" | "recall" | a new one
    part_key: str | None  # the preset key holding this task's part (None: the preset itself, the LM)
    runs: str  # (preset name, preset) → {run_id: spec}; every spec has run_id, task, model_kind, train
    # train, evaluate, aggregate, data, train_tokenizer: called by the CLI with its arguments by name
    # (grassflow.cli._call): their parameters are named as these, plus a `<dir>_dir` parameter for each
    # of `dirs` (SNLI's backbone_dir); a parameter the CLI has no argument for keeps its default
    train: str  # (spec, train_tokens, val_tokens, out_dir, preflight, execution, <dir>_dir...) → model.safetensors, config.json, metrics.jsonl, run.json
    evaluate: str  # (weights, run_json, val_tokens, test_tokens, out, <dir>_dir...) → eval.json
    estimate: str  # (stage, spec, preset, settings, files) → (Estimate, where the sizes came from)
    token_dir: Callable[[Path, dict], Path] | None = None  # (its results dir, preset) → its runs' token files' dir
    aggregate: str | None = None  # (preset, preset_name, runs, out_dir) → its tables (the LM's: report.smk)
    outputs: Callable[[dict], list[str]] | None = None  # (its part) → the files `aggregate` writes in report/
    data: str | None = None  # (data: its part's data section, out_dir) → {split}.parquet: the generic data rule
    # one data job per cell instead (recall: per (seq_len, kv)), into its results' data/<cell>/; a run's
    # spec names the cell it reads (`data_cell`)
    cells: str | None = None  # (its part) → {cell: its data section}
    # or a text corpus's three (workflow/rules/data.smk: the LM's, SNLI's), into its token_dir:
    download: str | None = None  # (data section, split, out path) → the split's checksum record
    train_tokenizer: str | None = None  # (train, vocab_size, out): the train split's, for tokenizer.name "trained"
    tokenize: str | None = None  # (tokenize section, raw split, out path, tokenizer file) → the token file's facts
    tokenize_section: str | None = None  # (preset) → the section `tokenize` gets (a spec file)
    check: str | None = None  # (key path, preset name, preset) → raises ConfigError naming the key
    # the JSON schema of its part: a dict, or a YAML file beside the declaration (snli/schema.yaml); its
    # `$defs` join the config schema's (the LM's part: workflow/schemas/config.schema.yaml)
    schema: dict | str | None = None
    model_key: str = "model"  # the spec key of the model's settings (SNLI: its head's)
    dirs: tuple[str, ...] = ()  # directories its jobs also get (`--<dir>-dir`; SNLI: its backbone)
    run_dirs: str | None = None  # (its part, a run's spec) → {dir: path under its results dir}, those the run needs
    title: str = ""  # its category in Snakemake's report

    @property
    def prefix(self) -> str:
        """Of its rule names ("snli_") and results subdirectory; "" for the LM."""
        return "" if self.part_key is None else f"{self.name}_"

    @property
    def subdir(self) -> str:
        """Of its specs', logs' and benchmarks' paths under a preset's ("snli/"; "" for the LM)."""
        return f"{self.name}/" if self.prefix else ""

    @property
    def wildcard(self) -> str:
        """Its run wildcard in the rules."""
        return f"{self.prefix}run"

    @property
    def group(self) -> str:
        """The cluster profile's group of a run's jobs (one allocation per run, or K: `--group-components`)."""
        return f"{self.name}_run"

    def part(self, preset: dict) -> dict | None:
        """This task's part of `preset`, or None where the preset has none."""
        if self.part_key is None:
            return preset if preset.get("experiments") else None
        return preset.get(self.part_key)

    def where(self, name: str) -> str:
        """The key path of its part in the config, for error messages."""
        return f"presets.{name}" + (f".{self.part_key}" if self.part_key else "")

    def rule(self, stage: str) -> str:
        return f"{self.prefix}{stage}"

    def command(self, stage: str) -> str:
        return self.rule(stage).replace("_", "-")

    def results(self, res) -> Path:
        """The task's results directory under a preset's (`results/<preset>`)."""
        return Path(res) / self.prefix.rstrip("_") if self.prefix else Path(res)

    def bench_file(self, res, stage: str, run_id: str) -> Path:
        """Snakemake's benchmark file (wall time) of one of its jobs."""
        return Path(res) / "benchmarks" / (f"{self.name}/{stage}" if self.prefix else stage) / f"{run_id}.tsv"

    def files(self, res, preset: dict, cell: str | None = None) -> dict | None:
        """The token files its jobs read, by split (their counts size the estimates), or None; of
        a task with cells, those of `cell` (None without one)."""
        if not self.part(preset) or (self.cells and cell is None) or (not self.cells and self.token_dir is None):
            return None
        d = self.results(res) / "data" / cell if self.cells else self.token_dir(self.results(res), preset)
        return {s: d / f"{s}.parquet" for s in ("train", "validation", "test")}

    def part_schema(self) -> dict | None:
        """The JSON schema of its part (a fresh copy), or None (the LM's is the config schema's)."""
        import copy

        import yaml

        if isinstance(self.schema, str):
            return yaml.safe_load((Path(__file__).resolve().parent / self.name / self.schema).read_text())
        return copy.deepcopy(self.schema)

    def specs(self, name: str, preset: dict) -> dict:
        return entry(self.runs)(name, preset) if self.part(preset) else {}

    def entries(self) -> dict[str, tuple[str, str]]:
        """{command: (stage, "module:function")} of the commands the CLI makes from this declaration."""
        named = {s: getattr(self, s) for s in ("train", "evaluate", "aggregate", "data", "download", "train_tokenizer",
                                               "tokenize")}
        return {self.command(stage): (stage, e) for stage, e in named.items() if e}


def entry(ref: str) -> Callable:
    """The function a "module:function" string names."""
    module, fn = ref.split(":")
    return getattr(importlib.import_module(module), fn)


def declarations() -> list[str]:
    """The packages that declare a task (have a task.py): the built-in ones, then the others by name."""
    found = {p.parent.name for p in Path(__file__).resolve().parent.glob("*/task.py")}
    return [n for n in BUILT_IN if n in found] + sorted(found - set(BUILT_IN))


def _load() -> dict[str, Task]:
    out = {}
    for pkg in declarations():
        task = importlib.import_module(f"grassflow.{pkg}.task").TASK
        if task.name != pkg:
            raise ValueError(f"grassflow/{pkg}/task.py declares task {task.name!r}: a task is named after its package")
        out[pkg] = task
    return out


TASKS = _load()

# {rule name: (task, stage)} of every run's jobs: train, evaluate, snli_train, ...
RUN_RULES = {t.rule(stage): (t, stage) for t in TASKS.values() for stage in STAGES}
# {command: (task, stage, "module:function")} of the commands made from the declarations
COMMANDS = {cmd: (t, *e) for t in TASKS.values() for cmd, e in t.entries().items()}


def pipeline_train(preset: dict) -> dict:
    """The train section whose execution keys hold for a whole pipeline run (`train.runs_per_gpu`:
    one K for every GPU job and every packed allocation; the preflight's threads): the first
    part the preset has, the LM's, else SNLI's, else recall's, else a new task's."""
    part = next((t.part(preset) for t in TASKS.values() if t.part(preset)), None)
    if part is None:
        raise ValueError(f"the preset has no part to run: none of {[t.part_key or 'experiments' for t in TASKS.values()]}")
    return part["train"]
