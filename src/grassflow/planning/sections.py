"""A preset's sections as a task's grid reads them: its checks of data and model, the model keys a
kind owns, the train keys a run's spec holds and those it does not (how a job runs).

A leaf of planning: it imports no task and no module that reads the tasks, so each task's grid
(grassflow/<task>/grid.py) imports it, and the planning that reads the tasks (presets,
pipeline.tasks) calls into the grids without being imported back (a test holds the graph to it).
"""

from __future__ import annotations

from grassflow.errors import ConfigError

SPLITS = ("train", "validation", "test")  # every task's data splits, as its files name them


def run_id(group: str, seed: int) -> str:
    """A run's id: its group (the runs that differ in their seed only: `<experiment>-<model>`, an
    ablation cell's `<base>_<variant>-<model>`, ...) and its seed, which group_seed reads back."""
    return f"{group}-s{seed}"


def group_seed(run: str) -> tuple[str, int]:
    group, seed = run.rsplit("-s", 1)
    return group, int(seed)


def check_specs(where: str, specs: dict, build) -> None:
    """Each run's model (or head) as its dataclass checks it: `build(spec)`; a ValueError names the
    run."""
    for run_id, spec in specs.items():
        try:
            build(spec)
        except ValueError as e:
            raise ConfigError(f"{where} (run {run_id}): {e}") from None


def check_inputs(where: str, part: dict, data_key: str) -> None:
    """Its data's source settings, and its tokenizer's vocab_size (given for, and only for, a
    trained one)."""
    tok = part["tokenizer"]
    if (tok["name"] == "trained") != bool(tok.get("vocab_size")):
        raise ConfigError(
            f"{where}.tokenizer.vocab_size: required for, and only for, tokenizer.name 'trained'"
        )
    data = part["data"]
    if data["source"] == "local" and not data.get("local_dir"):
        raise ConfigError(f"{where}.data.local_dir: required when {data_key}.source is 'local'")
    if data["source"] == "synthetic" and not data.get("synthetic"):
        raise ConfigError(f"{where}.data.synthetic: required when {data_key}.source is 'synthetic'")


# The model section's keys each kind owns (the others are shared): a new kind declares its own here
# (grassflow.models.KIND_CODE has every kind: tested).
KIND_KEYS = {
    "transformer": ("attention_window",),
    "grassmann": ("r", "lags", "lag_schedule", "empty_offsets", "eps", "plucker_backend"),
}


def own_keys(kind: str, model: dict) -> dict:
    """The model section less the other kinds' keys, which cannot make a run stale."""
    other = {k for owner, keys in KIND_KEYS.items() if owner != kind for k in keys}
    return {k: v for k, v in model.items() if k not in other}


# How a job runs, not what it computes: kept out of run specs, so changing it reruns nothing (the
# rules hand compile, compile_mode, trackers and head_loss to the training jobs as resources:
# exec_resources).
EXECUTION_KEYS = (
    "threads",
    "compile",
    "compile_mode",
    "trackers",
    "runs_per_gpu",
    "fuse_seeds",
    "head_loss",
)


def exec_resources(train: dict) -> dict:
    """A train section's execution keys as the training rules' resources (strings)."""
    return {
        "compile": str(train["compile"]).lower(),
        "compile_mode": train["compile_mode"],
        "trackers": ",".join(train["trackers"]) or "none",
        "head_loss": train["head_loss"],
    }


def run_train(train: dict) -> dict:
    """A preset's train section as a run spec holds it (without the execution keys)."""
    return {k: v for k, v in train.items() if k not in EXECUTION_KEYS}
