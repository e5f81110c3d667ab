"""Markdown tables, as every report of the project writes them, and a report's two files."""

import json
from pathlib import Path


def table(header: list[str], rows) -> list[str]:
    """The lines of a Markdown table: `header` and each row's cells (formatted by the caller)."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(map(str, r)) + " |"
                                                                             for r in rows]


def save_report(out, stem: str, res: dict, md: str) -> None:
    """<out>/<stem>.json (the measurements) and .md (their tables), each written atomically; the
    Markdown printed too."""
    from grassflow.io import write_text

    write_text(Path(out) / f"{stem}.json", json.dumps(res, indent=2))
    write_text(Path(out) / f"{stem}.md", md)
    print(md)
