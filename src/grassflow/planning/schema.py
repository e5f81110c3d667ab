"""The typed configs are the one source of their keys' enums, ranges and defaults: the JSON schema's
`model` and `snli_head` sections are generated from the dataclasses (ModelConfig, HeadConfig), and
the dataclasses check themselves with the same tables (models.config.check_fields).

A dataclass declares `CHOICES` ({field: allowed values}) and `BOUNDS` ({field: JSON-schema bounds:
minimum, exclusiveMinimum, exclusiveMaximum; for a list, its items'}); the comment after a field is
its description. grassflow.pipeline.presets.load_schema reads workflow/schemas/config.schema.yaml
and puts each generated section where the YAML says `{generated: <module>:<class>}`.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
import typing
from dataclasses import MISSING, fields
from pathlib import Path


def read_yaml(path):
    """A schema file of ours, read with libyaml's parser where PyYAML has it (the same objects;
    every Snakemake process reads the schemas, and PyYAML's own parser takes ~10 times as long)."""
    import yaml

    return yaml.load(Path(path).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


_TYPES = {int: "integer", float: "number", bool: "boolean", str: "string"}


def _type_schema(hint) -> dict:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [_type_schema(a) for a in args if a is not type(None)]
        return {"type": [inner[0]["type"], "null"]} if type(None) in args else inner[0]
    if origin in (tuple, list):
        return {"type": "array", "items": {"type": _TYPES[args[0]]}}
    return {"type": _TYPES[hint]}


def _comments(cls) -> dict[str, str]:
    """{field: the comment after it}, with the comment lines that continue it (`#   ...`)."""
    lines = textwrap.dedent(inspect.getsource(cls)).splitlines()
    out, current = {}, None
    for node in ast.parse("\n".join(lines)).body[0].body:
        if isinstance(node, ast.AnnAssign):
            current = node.target.id
            line = lines[node.lineno - 1]
            if "#" in line:
                out[current] = line.split("#", 1)[1].strip()
                for more in lines[node.end_lineno :]:
                    if not more.strip().startswith("#") or more.strip().startswith("# ---"):
                        break
                    out[current] += " " + more.strip().lstrip("#").strip()
    return out


def dataclass_schema(cls, exclude=(), extra=None) -> dict:
    """The JSON schema of a preset section that `cls.from_dict` reads: a property per field (less
    `exclude`, set elsewhere in the preset), its type, enum, bounds and description; and `extra`'s
    properties (an ablation variant's `train`)."""
    hints, notes = typing.get_type_hints(cls), _comments(cls)
    props = {}
    for f in fields(cls):
        if f.name in exclude:
            continue
        node = _type_schema(hints[f.name])
        if f.name in cls.CHOICES:
            node = {"enum": list(cls.CHOICES[f.name])}
        bounds = cls.BOUNDS.get(f.name, {})
        if node.get("type") == "array":
            node["minItems"] = 1
            node["items"].update(bounds)
        else:
            node.update(bounds)
        if f.name in notes:
            node["description"] = notes[f.name]
        if f.default is not MISSING:
            node["x-default"] = list(f.default) if isinstance(f.default, tuple) else f.default
        props[f.name] = node
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {**props, **(extra or {})},
    }
