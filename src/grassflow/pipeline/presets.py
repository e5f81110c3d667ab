"""Pipeline configuration: pick the preset, check it, and expand it into one spec per run.

Shared by the Snakefile (through workflow/rules/common.smk) and the CLI, so the DAG and a hand-run
job resolve a run identically. The JSON schema (workflow/schemas/config.schema.yaml) checks types,
ranges and unknown keys; `check_preset` adds what a schema cannot say.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import MISSING, fields

from grassflow.errors import ConfigError
from grassflow.models.config import ModelConfig
from grassflow.pipeline.tasks import TASKS
from grassflow.planning.schema import dataclass_schema, read_yaml
from grassflow.planning.sections import check_specs
from grassflow.snli.config import HeadConfig
from grassflow.train_config import TrainConfig

# the dataclasses a schema section is generated from (`{generated: module:Class}`)
GENERATED = {f"{c.__module__}:{c.__name__}": c for c in (ModelConfig, HeadConfig)}


def load_schema(path) -> dict:
    """The config schema, each `{generated: module:Class}` section built from its dataclass, the
    train section's defaults TrainConfig's."""
    schema = read_yaml(path)
    preset = schema["$defs"]["preset"]
    # each task's part: the schema its declaration names, with its own $defs
    for t in TASKS.values():
        part = t.part_schema()
        if part is not None:
            schema["$defs"].update(part.pop("$defs", {}))
            preset["properties"][t.part_key] = part
            preset["anyOf"].append({"required": [t.part_key]})
    for f in fields(TrainConfig):  # the train section's defaults, each stated once: by TrainConfig
        if f.default is not MISSING:
            schema["$defs"]["train"]["properties"][f.name]["default"] = (
                list(f.default) if isinstance(f.default, tuple) else f.default
            )
    # an ablation variant's training keys: the train section's, none defaulted (a variant sets what
    # it switches)
    train = schema["$defs"]["train"]
    schema["$defs"]["variant_train"] = {
        **{k: v for k, v in train.items() if k != "default"},
        "properties": {
            k: {kk: vv for kk, vv in v.items() if kk != "default"}
            for k, v in train["properties"].items()
        },
    }
    for name, node in schema["$defs"].items():
        if isinstance(node, dict) and "generated" in node:
            schema["$defs"][name] = dataclass_schema(
                GENERATED[node["generated"]],
                exclude=node.get("exclude", ()),
                extra=node.get("extra"),
            )
    # a sweep's keys: the numbers a variant may set, each with a list of at least 3 of its values
    variant = schema["$defs"]["variant"]["properties"]
    for section, props in (
        ("train", schema["$defs"]["variant_train"]["properties"]),
        ("model", {k: v for k, v in variant.items() if k != "train"}),
    ):
        schema["$defs"][f"sweep_{section}"] = {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                k: {
                    "type": "array",
                    "minItems": 3,
                    "uniqueItems": True,
                    "items": {**node, "type": numeric},
                }
                for k, v in props.items()
                if (numeric := _numeric(node := _resolved(v, schema)))
            },
        }
    return schema


def _resolved(node: dict, schema: dict) -> dict:
    """A schema node with its local `$ref` (#/$defs/...) replaced by what it names, its own keys
    kept."""
    ref = node.get("$ref", "")
    if not ref.startswith("#/$defs/"):
        return node
    return {
        **schema["$defs"][ref.rsplit("/", 1)[1]],
        **{k: v for k, v in node.items() if k != "$ref"},
    }


def _numeric(node: dict) -> list[str]:
    """The number types a schema node takes (a sweep's values; a null or a choice is not one)."""
    types = node.get("type") if isinstance(node.get("type"), list) else [node.get("type")]
    return [t for t in types if t in ("integer", "number")]


def fill_defaults(config: dict, schema: dict) -> None:
    """The schema's defaults into `config`, in place, wherever an object's key is absent (the recipe
    of jsonschema's FAQ, as Snakemake's `validate` does): before the semantic checks, so they and
    the run specs read every key."""
    import jsonschema

    base = jsonschema.Draft202012Validator

    def properties(validator, props, instance, node):
        if isinstance(instance, dict):
            for key, sub in props.items():
                if isinstance(sub, dict) and "default" in sub and key not in instance:
                    instance[key] = copy.deepcopy(sub["default"])
        yield from base.VALIDATORS["properties"](validator, props, instance, node)

    for _ in jsonschema.validators.extend(base, {"properties": properties})(schema).iter_errors(
        config
    ):
        pass


def schema_errors(config: dict, schema: dict) -> list[str]:
    """Every schema violation as one line naming the key, the value and what is allowed."""
    import jsonschema

    lines = []
    for err in sorted(
        jsonschema.Draft202012Validator(schema).iter_errors(config), key=lambda e: list(e.path)
    ):
        msg = err.message
        if err.validator == "additionalProperties" and "properties" in err.schema:
            msg += f"; allowed keys: {sorted(err.schema['properties'])}"
        lines.append(f"config {'.'.join(map(str, err.path)) or '<top level>'}: {msg}")
    return lines


def resolve_bases(config: dict) -> None:
    """Presets that name a `base` become that preset, deep-merged with their own keys (in place,
    before any check; a null removes a key): `paper_v1` is `paper` on other data, and stays so when
    `paper` changes. A missing base or a cycle is a ConfigError naming the key."""
    presets = config.get("presets") or {}

    def resolved(name, seen=()):
        p = presets[name]
        if not isinstance(p, dict) or "base" not in p:
            return p
        base = p["base"]
        if base not in presets:
            raise ConfigError(
                f"presets.{name}.base: {base!r} is not a preset; choose one of {sorted(presets)}"
            )
        if base in seen or base == name:
            raise ConfigError(
                f"presets.{name}.base: presets {' → '.join((*seen, name, base))} form a cycle"
            )
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
    """Schema errors, then (the schema's defaults filled in) the semantic checks of the selected
    preset."""
    try:
        resolve_bases(config)
    except ConfigError as e:
        return [f"config {e}"]
    schema = load_schema(schema_path)
    errors = schema_errors(config, schema)
    if errors:
        return errors
    fill_defaults(config, schema)  # before the semantic checks: they read every key
    try:
        name, preset = select_preset(config)
        check_preset(name, preset)
    except ConfigError as e:
        return [f"config {e}"]
    return []


def validate_or_exit(config: dict, schema_path) -> None:
    """For the Snakefile: check everything before any job is planned; on failure print one `error:`
    line per problem (no traceback) and exit 1. Fills the schema's defaults (in place)."""
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
    where = f"presets.{name}"
    parts = [t.part_key or "experiments" for t in TASKS.values()]
    if not any(t.part(p) for t in TASKS.values()):
        raise ConfigError(
            f"{where}: nothing to run (no {', '.join(parts[:-1])} or {parts[-1]} part)"
        )
    for grid in ("ablations", "sweep"):
        if p.get(grid) and not p.get("experiments"):
            raise ConfigError(f"{where}.{grid}: needs the language-model experiments it varies")
    # each task's own checks (its declaration's `check`), then its runs' models
    for t in TASKS.values():
        at = where + (f".{t.part_key}" if t.part_key else "")  # its part's key path, for its errors
        if t.part(p) and t.check:
            t.check(at, name, p)
        if t.part(p) and t.check_model:
            check_specs(at, t.specs(name, p), lambda spec, t=t: t.check_model(spec, p))
