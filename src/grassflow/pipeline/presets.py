"""Pipeline configuration: pick the preset, check it, and expand it into one spec per run.

Shared by the Snakefile (through workflow/rules/common.smk) and the CLI, so the DAG and a
hand-run job resolve a run identically. The JSON schema (workflow/schemas/config.schema.yaml)
checks types, ranges and unknown keys; `check_preset` adds what a schema cannot say.
"""

from __future__ import annotations

import copy
import importlib
import json
import sys
from pathlib import Path

from grassflow.errors import ConfigError  # noqa: F401  (raised here; re-exported for callers)
from grassflow.io import spec_hash
from grassflow.lm.data import map_unk
from grassflow.models.config import ModelConfig
from grassflow.pipeline.schema import dataclass_schema


def load_schema(path) -> dict:
    """The config schema, each `{generated: module:Class}` section built from its dataclass."""
    import yaml

    from grassflow.pipeline.tasks import TASKS

    schema = yaml.safe_load(Path(path).read_text())
    preset = schema["$defs"]["preset"]
    for t in TASKS.values():  # each task's part: the schema its declaration names, with its own $defs
        part = t.part_schema()
        if part is not None:
            schema["$defs"].update(part.pop("$defs", {}))
            preset["properties"][t.part_key] = part
            preset["anyOf"].append({"required": [t.part_key]})
    for name, node in schema["$defs"].items():
        if isinstance(node, dict) and "generated" in node:
            module, cls = node["generated"].split(":")
            schema["$defs"][name] = dataclass_schema(getattr(importlib.import_module(module), cls),
                                                     exclude=node.get("exclude", ()))
    return schema


def fill_defaults(config: dict, schema: dict) -> None:
    """The schema's defaults into `config`, in place, wherever an object's key is absent (the
    recipe of jsonschema's FAQ, as Snakemake's `validate` does): before the semantic checks, so
    they and the run specs read every key."""
    import jsonschema

    base = jsonschema.Draft202012Validator

    def properties(validator, props, instance, node):
        if isinstance(instance, dict):
            for key, sub in props.items():
                if isinstance(sub, dict) and "default" in sub and key not in instance:
                    instance[key] = copy.deepcopy(sub["default"])
        yield from base.VALIDATORS["properties"](validator, props, instance, node)

    for _ in jsonschema.validators.extend(base, {"properties": properties})(schema).iter_errors(config):
        pass


def _key(path) -> str:
    return ".".join(str(p) for p in path) or "<top level>"


def schema_errors(config: dict, schema_path) -> list[str]:
    """Every schema violation as one line naming the key, the value and what is allowed."""
    import jsonschema

    schema = load_schema(schema_path)
    lines = []
    for err in sorted(jsonschema.Draft202012Validator(schema).iter_errors(config), key=lambda e: list(e.path)):
        msg = err.message
        if err.validator == "additionalProperties" and "properties" in err.schema:
            msg += f"; allowed keys: {sorted(err.schema['properties'])}"
        lines.append(f"config {_key(err.path)}: {msg}")
    return lines


def resolve_bases(config: dict) -> None:
    """Presets that name a `base` become that preset, deep-merged with their own keys (in
    place, before any check; a null removes a key): `paper_v1` is `paper` on other data, and
    stays so when `paper` changes. A missing base or a cycle is a ConfigError naming the key."""
    presets = config.get("presets") or {}

    def resolved(name, seen=()):
        p = presets[name]
        if not isinstance(p, dict) or "base" not in p:
            return p
        base = p["base"]
        if base not in presets:
            raise ConfigError(f"presets.{name}.base: {base!r} is not a preset; choose one of {sorted(presets)}")
        if base in seen or base == name:
            raise ConfigError(f"presets.{name}.base: presets {' → '.join((*seen, name, base))} form a cycle")
        own = {k: v for k, v in p.items() if k != "base"}
        return deep_merge(copy.deepcopy(resolved(base, (*seen, name))), own)

    for name in list(presets):
        presets[name] = resolved(name)


def deep_merge(into: dict, over: dict) -> dict:
    """`over` into `into`, recursively; a null in `over` removes the key (the schema's default
    applies: null for every nullable key, absent for optional parts such as `ablations`)."""
    for k, v in over.items():
        if v is None:
            into.pop(k, None)
        elif isinstance(v, dict) and isinstance(into.get(k), dict):
            into[k] = deep_merge(into[k], v)
        else:
            into[k] = copy.deepcopy(v)
    return into


def config_errors(config: dict, schema_path) -> list[str]:
    """Schema errors, then (the schema's defaults filled in) the semantic checks of the selected preset."""
    try:
        resolve_bases(config)
    except ConfigError as e:
        return [f"config {e}"]
    errors = schema_errors(config, schema_path)
    if errors:
        return errors
    fill_defaults(config, load_schema(schema_path))  # before the semantic checks: they read every key
    try:
        name, preset = select_preset(config)
        check_preset(name, preset)
    except ConfigError as e:
        return [f"config {e}"]
    return []


def validate_or_exit(config: dict, schema_path) -> None:
    """For the Snakefile: check everything before any job is planned; on failure print one
    `error:` line per problem (no traceback) and exit 1. Fills the schema's defaults (in place)."""
    errors = config_errors(config, schema_path)
    if errors:
        sys.exit("\n".join(f"error: {e}" for e in errors))


def select_preset(config: dict) -> tuple[str, dict]:
    name = config.get("preset")
    presets = config.get("presets") or {}
    if name not in presets:
        raise ConfigError(f"preset: {name!r} is not defined; choose one of {sorted(presets)}")
    return name, presets[name]


def check_preset(name: str, p: dict) -> None:
    from grassflow.pipeline.tasks import TASKS

    where = f"presets.{name}"
    parts = [t.part_key or "experiments" for t in TASKS.values()]
    if not any(t.part(p) for t in TASKS.values()):
        raise ConfigError(f"{where}: nothing to run (no {', '.join(parts[:-1])} or {parts[-1]} part)")
    if p.get("ablations") and not p.get("experiments"):
        raise ConfigError(f"{where}.ablations: needs the language-model experiments it varies")
    for t in TASKS.values():  # each task's own checks (its declaration's `check`)
        if t.part(p) and t.check:
            t.check(t.where(name), name, p)


def check_specs(where: str, specs: dict, build) -> None:
    """Each run's model (or head) as its dataclass checks it: `build(spec)`; a ValueError names the run."""
    for run_id, spec in specs.items():
        try:
            build(spec)
        except ValueError as e:
            raise ConfigError(f"{where} (run {run_id}): {e}") from None


def check_lm(where: str, name: str, p: dict) -> None:
    # the schema requires data, tokenizer, models, seeds and model with the experiments, seeds unique
    check_inputs(where, p, "data")
    if map_unk(p) and p["tokenizer"]["name"] == "gpt2":
        raise ConfigError(f"{where}.tokenizer.map_unk: gpt2 has no unknown token to map Wikitext-2 v1's "
                          "`<unk>` to; set tokenizer.map_unk: false to let it split `<unk>` into pieces")
    check_ablations(where, p)
    check_specs(where, runs(name, p), lambda spec: ModelConfig.from_dict({**spec["model"], "vocab_size": 1}))


def check_ablations(where: str, p: dict) -> None:
    a = p.get("ablations")
    if a and a["base"] not in p["experiments"]:
        raise ConfigError(f"{where}.ablations.base: {a['base']!r} is not an experiment of this preset "
                          f"({sorted(p['experiments'])})")


def check_inputs(where: str, part: dict, data_key: str) -> None:
    """Its data's source settings, and its tokenizer's vocab_size (given for, and only for, a trained one)."""
    tok = part["tokenizer"]
    if (tok["name"] == "trained") != bool(tok.get("vocab_size")):
        raise ConfigError(f"{where}.tokenizer.vocab_size: required for, and only for, tokenizer.name 'trained'")
    data = part["data"]
    if data["source"] == "local" and not data.get("local_dir"):
        raise ConfigError(f"{where}.data.local_dir: required when {data_key}.source is 'local'")
    if data["source"] == "synthetic" and not data.get("synthetic"):
        raise ConfigError(f"{where}.data.synthetic: required when {data_key}.source is 'synthetic'")


def tokenizer_spec(p: dict) -> dict:
    """The section the LM's tokenize stage runs: the tokenizer, map_unk resolved, and the cut of the
    evaluation splits."""
    return {**p["tokenizer"], "map_unk": map_unk(p), "eval_max_tokens": p["data"].get("eval_max_tokens")}


GRASSMANN_MODEL_KEYS = ("r", "lags", "lag_schedule", "empty_offsets", "eps", "plucker_backend")


def own_keys(kind: str, model: dict) -> dict:
    """The model section less the other model's keys, which cannot make a run stale."""
    other = GRASSMANN_MODEL_KEYS if kind == "transformer" else ("attention_window",)
    return {k: v for k, v in model.items() if k not in other}


def _run_spec(name: str, p: dict, exp: str, kind: str, seed: int, switches: dict) -> dict:
    """The spec of one language-model run: everything it depends on, and nothing else, so
    that editing one model's settings (or one ablation variant) changes only those specs."""
    e = p["experiments"][exp]
    model = own_keys(kind, {**p["model"], **(p.get("model_overrides") or {}).get(kind, {}), **switches,
                            "n_layers": e["n_layers"], "context_len": e["context_len"]})
    return {"run_id": f"{exp}-{kind}-s{seed}", "preset": name, "task": "lm", "experiment": exp, "model_kind": kind,
            "seed": seed, "model": model, "train": {**run_train(p["train"]), "epochs": e["epochs"], "batch_size": e["batch_size"]},
            "tokenizer": p["tokenizer"]["name"]}


def _content(spec: dict) -> str:
    return spec_hash({k: v for k, v in spec.items() if k != "run_id"})


def main_run_ids(p: dict) -> list[str]:
    """The main tables' runs: experiment × model × seed."""
    return [f"{exp}-{kind}-s{seed}" for exp in p.get("experiments") or {} for kind in p["models"] for seed in p["seeds"]]


# How a job runs, not what it computes: kept out of run specs, so changing it reruns nothing
# (the rules hand compile, compile_mode and trackers to the training jobs as resources: exec_resources).
EXECUTION_KEYS = ("threads", "compile", "compile_mode", "trackers", "runs_per_gpu", "fuse_seeds")

# train.device -> whether train.fuse_seeds `auto` fuses there, from `python -m grassflow.bench`
# (fused rows). CPU: no faster per member (reports/bench/bench-cpu.md); CUDA: not yet measured
# (a GPU default is only what ran on one); train.device auto: unknown where the jobs land.
FUSE_WINS = {"cpu": False, "cuda": False}


def fused_groups(p: dict, run_specs: dict[str, dict]) -> dict[str, list[str]]:
    """{group: its run ids} of the runs train.fuse_seeds trains as one ensemble each: for every
    group id g, the runs g-s<seed> for each of the preset's seeds, whose specs differ only in
    their seed and run id. Ablation runs of other seeds train one by one."""
    train = p["train"]
    if not (FUSE_WINS.get(train["device"], False) if train["fuse_seeds"] == "auto" else train["fuse_seeds"]):
        return {}
    if len(p["seeds"]) < 2:
        return {}
    groups = {}
    for g in dict.fromkeys(r.rsplit("-s", 1)[0] for r in run_specs):
        members = [f"{g}-s{seed}" for seed in p["seeds"]]
        if all(m in run_specs for m in members) and len({json.dumps(
                {k: v for k, v in run_specs[m].items() if k not in ("seed", "run_id")}, sort_keys=True)
                for m in members}) == 1:
            groups[g] = members
    return groups


def exec_resources(train: dict) -> dict:
    """A train section's execution keys as the training rules' resources (strings)."""
    return {"compile": str(train["compile"]).lower(), "compile_mode": train["compile_mode"],
            "trackers": ",".join(train["trackers"]) or "none"}


def run_train(train: dict) -> dict:
    """A preset's train section as a run spec holds it (without the execution keys)."""
    return {k: v for k, v in train.items() if k not in EXECUTION_KEYS}


def runs(name: str, p: dict) -> dict[str, dict]:
    """{run_id: spec}: experiment × model × seed, then the ablation grid's runs that are not
    already among them (see ablation_runs)."""
    out = {}
    for exp in p.get("experiments") or {}:
        for kind in p["models"]:
            for seed in p["seeds"]:
                spec = _run_spec(name, p, exp, kind, seed, {})
                out[spec["run_id"]] = spec
    for variant in ablation_runs(name, p, out).values():
        for specs in variant.values():
            for spec in specs:
                out.setdefault(spec["run_id"], spec)
    return out


def ablation_runs(name: str, p: dict, main: dict | None = None) -> dict[str, dict[str, list[dict]]]:
    """{variant: {model: [spec per seed]}} of the preset's `ablations` section: each variant's
    switches applied to the base experiment, for both models where a switch applies. A run
    whose spec equals another's is that run (the `paper` variant is the main table's runs; a
    Transformer is the same under a Grassmann-only switch): it is trained once."""
    a = p.get("ablations")
    if not a:
        return {}
    by_content = {_content(s): s["run_id"] for s in (main or {}).values()}
    out = {}
    for variant, switches in a["variants"].items():
        out[variant] = {}
        for kind in p["models"]:
            specs = []
            for seed in a["seeds"]:
                spec = _run_spec(name, p, a["base"], kind, seed, switches or {})
                key = _content(spec)
                spec["run_id"] = by_content.setdefault(key, f"{a['base']}_{variant}-{kind}-s{seed}")
                specs.append(spec)
            out[variant][kind] = specs
    return out
