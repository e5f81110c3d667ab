"""Markdown tables, as every report of the project writes them, and a report's two files."""

import json
from pathlib import Path

# CommonMark's punctuation that can start markup (a table cell's end, emphasis, a link, code, a
# heading, an image, a strike-through), backslash-escaped; HTML's three as entities
_ESCAPED = set("\\`*_[]{}#|!~")
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def text(value) -> str:
    """A string from a record or a config (a path, a name, a status, a device) as Markdown that
    renders as exactly that text: no markup, no HTML, no cell or line it could end (control
    characters become spaces). Everything a report prints from a record goes through it."""
    return "".join(
        _ENTITIES.get(c)
        or ("\\" + c if c in _ESCAPED else " " if ord(c) < 32 or ord(c) == 127 else c)
        for c in str(value)
    )


def code(value) -> str:
    """A string as a Markdown code span: shown as it is, but for a backtick (which would end the
    span) and line breaks."""
    return "`" + "".join("'" if c == "`" else " " if ord(c) < 32 else c for c in str(value)) + "`"


def table(header: list[str], rows) -> list[str]:
    """The lines of a Markdown table: `header` and each row's cells (formatted by the caller)."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(map(str, r)) + " |" for r in rows
    ]


def save_report(out, stem: str, res: dict, md: str) -> None:
    """<out>/<stem>.json (the measurements) and .md (their tables), each written atomically; the
    Markdown printed too."""
    from grassflow.io import write_text

    write_text(Path(out) / f"{stem}.json", json.dumps(res, indent=2))
    write_text(Path(out) / f"{stem}.md", md)
    print(md)
