"""What a task declares (`grassflow/<task>/task.py` holds `TASK = Task(...)`): the record alone,
and `entry`, which turns its "module:function" strings into functions. A job reads its own task's
declaration; everything that plans with the declarations (their rule names, files, runs) is in
grassflow.tasks, which no job imports, so that editing it reruns no job (grassflow.staleness).

A declaration names its entry points as "module:function" strings, so that it imports nothing
(the CLI loads every declaration; the code fingerprint of a task's job covers its own entry
module only).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

STAGES = ("train", "evaluate")  # the jobs of one run, in order


@dataclass(frozen=True)
class Task:
    name: str  # its package's name; "lm" | "snli" | "recall" | a new one
    part_key: str | None  # the preset key holding this task's part (None: the preset itself, the LM)
    runs: str  # (preset name, preset) → {run_id: spec}; every spec has run_id, task, model_kind, train
    # train, evaluate, aggregate, data, train_tokenizer: called by the stage's command line with its
    # arguments by name (grassflow.command.call): their parameters are named as these, plus a
    # `<dir>_dir` parameter for each of `dirs` (SNLI's backbone_dir); a parameter the command line
    # has no argument for keeps its default
    train: str  # (spec, train_tokens, val_tokens, out_dir, preflight, execution, <dir>_dir...) → model.safetensors, config.json, metrics.jsonl, run.json
    evaluate: str  # (weights, run_json, val_tokens, test_tokens, out, <dir>_dir...) → eval.json
    estimate: str  # (stage, spec, preset, settings, files) → (Estimate, where the sizes came from)
    # (specs, train_tokens, val_tokens, out_dirs, work_dir, preflight, execution) → each run's train
    # outputs: runs that differ only in their seed as one ensemble (train.fuse_seeds; the LM's)
    train_fused: str | None = None
    token_dir: Callable[[Path, dict], Path] | None = None  # (its results dir, preset) → its runs' token files' dir
    aggregate: str | None = None  # (preset, preset_name, runs, out_dir) → its tables (the LM's: report.smk)
    outputs: Callable[[dict], list[str]] | None = None  # (its part) → the files `aggregate` writes in report/
    data: str | None = None  # (data: its part's data section, out_dir) → {split}.parquet (recall's: rule recall_data)
    # one data job per cell instead (recall: per (seq_len, kv)), into its results' data/<cell>/; a run's
    # spec names the cell it reads (`data_cell`)
    cells: str | None = None  # (its part) → {cell: its data section}
    # or a text corpus's three (the LM's, SNLI's: lm.smk, snli.smk), into its token_dir:
    download: str | None = None  # (data section, split, out path) → the split's checksum record
    train_tokenizer: str | None = None  # (train, vocab_size, out): the train split's, for tokenizer.name "trained"
    tokenize: str | None = None  # (tokenize section, raw split, out path, tokenizer file) → the token file's facts
    # (tokenize section, raw split, out path, tokenizer file) → the validation or test split as
    # lm-evaluation-harness's documents, into its token_dir's docs/; its evaluate job reads them
    # (--val-docs, --test-docs): the LM's word-level perplexity, the harness's (lm/rolling.py)
    documents: str | None = None
    check: str | None = None  # (key path, preset name, preset) → raises ConfigError naming the key
    # the JSON schema of its part: a dict, or a YAML file beside the declaration (snli/schema.yaml); its
    # `$defs` join the config schema's (the LM's part: workflow/schemas/config.schema.yaml)
    schema: dict | str | None = None
    model_key: str = "model"  # the spec key of the model's settings (SNLI: its head's)
    dirs: tuple[str, ...] = ()  # directories its jobs also get (`--<dir>-dir`; SNLI: its backbone)
    title: str = ""  # its category in Snakemake's report


def entry(ref: str) -> Callable:
    """The function a "module:function" string names."""
    module, fn = ref.split(":")
    return getattr(importlib.import_module(module), fn)


def declared(name: str) -> Task:
    """The declaration of task `name` (grassflow/<name>/task.py), read alone."""
    task = importlib.import_module(f"grassflow.{name}.task").TASK
    if task.name != name:
        raise ValueError(f"grassflow/{name}/task.py declares task {task.name!r}: a task is named after its package")
    return task
