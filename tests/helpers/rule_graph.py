"""The README's DAG picture (docs/dag.svg): the `paper` preset's rule graph, drawn by graphviz.

Regenerate it (needs graphviz's `dot`): `python tests/helpers/rule_graph.py`.
tests/user/test_docs.py reads the picture's rules and edges back and compares them with today's
`snakemake --rulegraph`.
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SVG = ROOT / "docs" / "dag.svg"


def rule_graph_dot(cwd: Path = ROOT) -> str:
    """`snakemake --rulegraph` (graphviz's dot language) of the paper preset."""
    # a copy: its own package
    res = subprocess.run(
        [str(Path(sys.executable).parent / "snakemake"), "--rulegraph", "--config", "preset=paper"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(Path(cwd) / "src")},
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def dot_graph(dot: str) -> tuple[frozenset, frozenset]:
    """(rule names, edges by name) of a dot rule graph."""
    names = dict(re.findall(r'(?m)^\s*(\d+)\[label = "(\w+)"', dot))
    edges = {(names[a], names[b]) for a, b in re.findall(r"(?m)^\s*(\d+) -> (\d+)", dot)}
    return frozenset(names.values()), frozenset(edges)


def svg_graph(svg: str) -> tuple[frozenset, frozenset]:
    """(rule names, edges by name) of graphviz's SVG of a rule graph: each node's group holds its id
    as its title and its rule as its text, each edge's its two ids as `a->b`."""
    groups = re.findall(
        r'<g id="\w+" class="(node|edge)">\s*<title>(.*?)</title>(.*?)</g>', svg, re.S
    )
    names = {
        html.unescape(t): html.unescape(re.search(r"<text[^>]*>(.*?)</text>", body).group(1))
        for kind, t, body in groups
        if kind == "node"
    }
    edges = {
        tuple(names[n] for n in html.unescape(t).split("->"))
        for kind, t, _ in groups
        if kind == "edge"
    }
    return frozenset(names.values()), frozenset(edges)


if __name__ == "__main__":
    dot = rule_graph_dot()
    svg = subprocess.run(
        ["dot", "-Tsvg"], input=dot, capture_output=True, text=True, check=True
    ).stdout
    SVG.write_text(svg)
    print(f"wrote {SVG.relative_to(ROOT)}: {len(dot_graph(dot)[0])} rules")
