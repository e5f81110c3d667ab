"""Every key a preset may set, as dotted paths, read from the JSON schema (for the docs test and
docs/use/configuration.md's key table)."""

from __future__ import annotations

import json
from pathlib import Path

from grassflow.pipeline.presets import load_schema

SCHEMA = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"


def _resolve(node: dict, schema: dict) -> dict:
    while isinstance(node, dict) and "$ref" in node:
        node = schema["$defs"][node["$ref"].split("/")[-1]] | {
            k: v for k, v in node.items() if k != "$ref"
        }
    return node


def keys(schema=None) -> dict[str, dict]:
    """{dotted key: its schema node}, under a preset; a map's keys read `<name>`
    (experiments.<name>)."""
    schema = schema or load_schema(SCHEMA)
    out, walked = {}, {}  # walked: $defs name -> the first path that spelled its keys out

    def walk(node, path):
        ref = node.get("$ref", "").split("/")[-1] if isinstance(node, dict) else ""
        if ref and "properties" not in schema["$defs"][ref]:
            ref = ""  # a leaf type (positive_int): nothing to share
        if ref and ref in walked and walked[ref] != path:  # the same keys as there: say so, once
            out[path] = {**_resolve(node, schema), "same_keys_as": walked[ref]}
            return
        if ref:
            walked[ref] = path
        node = _resolve(node, schema)
        for options in ("anyOf", "oneOf"):
            for alt in node.get(options, []):
                alt = _resolve(alt, schema)
                if alt.get("type") == "object" or "properties" in alt:
                    walk(alt, path)
        for k, v in (node.get("properties") or {}).items():
            p = f"{path}.{k}" if path else k
            out.setdefault(p, _resolve(v, schema))
            walk(v, p)
        extra = node.get("additionalProperties")
        if isinstance(extra, dict) and (extra.get("properties") or "$ref" in extra):
            walk(extra, f"{path}.<name>")

    walk(schema["$defs"]["preset"], "")
    top = {
        f"estimate.{k}": _resolve(v, schema)
        for k, v in schema["properties"]["estimate"].get("properties", {}).items()
    }
    return {
        **out,
        "(top level) preset": schema["properties"]["preset"],
        **{f"(top level) {k}": v for k, v in top.items()},
    }


def _allowed(node: dict) -> str:
    if "enum" in node:
        return " \\| ".join(
            f"`{json.dumps(v) if isinstance(v, bool) or v is None else v}`" for v in node["enum"]
        )
    t = node.get("type")
    t = (
        "/".join(t)
        if isinstance(t, list)
        else (t or ("one of several forms" if "anyOf" in node or "oneOf" in node else ""))
    )
    bounds = [
        f"{op} {node[k]}"
        for k, op in (
            ("minimum", "≥"),
            ("exclusiveMinimum", ">"),
            ("maximum", "≤"),
            ("exclusiveMaximum", "<"),
        )
        if k in node
    ]
    return ", ".join([t, *bounds]) if t else ", ".join(bounds)


def table() -> str:
    """The key table of docs/use/configuration.md (regenerate: python
    tests/helpers/schema_keys.py)."""
    rows = ["| key | allowed | default | meaning |", "|---|---|---|---|"]
    for key, node in keys().items():
        same = f"the keys of `{node['same_keys_as']}`" if node.get("same_keys_as") else ""
        desc = " ".join(str(node.get("description", "")).split()).replace("|", "\\|")
        # a schema default, or a dataclass's (x-default: what from_dict fills in for a section it
        # reads)
        value = node.get("default", node.get("x-default", ...))
        default = "" if value is ... else f"`{json.dumps(value, ensure_ascii=False)}`"
        rows.append(f"| `{key}` | {_allowed(node) if not same else same} | {default} | {desc} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    page = Path(__file__).resolve().parents[2] / "docs" / "use" / "configuration.md"
    text = page.read_text()
    marker = "## Every key\n"
    head = text.split(marker)[0] if marker in text else text.rstrip() + "\n\n"
    page.write_text(
        head + marker + "\nGenerated from the schema by `python tests/helpers/schema_keys.py`; "
        "`tests/user/test_docs.py` fails when it and the schema differ.\n\n" + table()
    )
