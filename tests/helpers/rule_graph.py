"""The README's DAG picture (docs/dag.svg): the `paper` preset's rule graph, less the `spec` rule
(which writes every job's spec file and would point at every rule), drawn by graphviz.

Regenerate it (needs graphviz's `dot`): `python tests/helpers/rule_graph.py`. tests/user/test_docs.py reads the
picture's rules and edges back and compares them with today's `snakemake --rulegraph`.
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
HIDDEN = {"spec"}


def rule_graph_dot(cwd: Path = ROOT) -> str:
    """`snakemake --rulegraph` (graphviz's dot language) of the paper preset."""
    res = subprocess.run([str(Path(sys.executable).parent / "snakemake"), "--rulegraph", "--config", "preset=paper"],
                         cwd=cwd, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(Path(cwd) / "src")})  # a copy: its own package
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def dot_graph(dot: str, hidden=HIDDEN) -> tuple[frozenset, frozenset]:
    """(rule names, edges by name) of a dot rule graph, less the `hidden` rules and their edges."""
    names = dict(re.findall(r'(?m)^\s*(\d+)\[label = "(\w+)"', dot))
    edges = {(names[a], names[b]) for a, b in re.findall(r"(?m)^\s*(\d+) -> (\d+)", dot)}
    return _less(names.values(), edges, hidden)


def svg_graph(svg: str) -> tuple[frozenset, frozenset]:
    """(rule names, edges by name) of graphviz's SVG of a rule graph: each node's group holds its
    id as its title and its rule as its text, each edge's its two ids as `a->b`."""
    groups = re.findall(r'<g id="\w+" class="(node|edge)">\s*<title>(.*?)</title>(.*?)</g>', svg, re.S)
    names = {html.unescape(t): html.unescape(re.search(r"<text[^>]*>(.*?)</text>", body).group(1))
             for kind, t, body in groups if kind == "node"}
    edges = {tuple(names[n] for n in html.unescape(t).split("->")) for kind, t, _ in groups if kind == "edge"}
    return _less(names.values(), edges, ())


def _less(names, edges, hidden) -> tuple[frozenset, frozenset]:
    return (frozenset(set(names) - set(hidden)), frozenset((a, b) for a, b in edges if not {a, b} & set(hidden)))


def without_hidden(dot: str, hidden=HIDDEN) -> str:
    """The dot text less the `hidden` rules' nodes and edges."""
    rules = "|".join(map(re.escape, hidden))
    ids = set(re.findall(rf'(?m)^\s*(\d+)\[label = "(?:{rules})"', dot))
    keep = [line for line in dot.splitlines()
            if not (m := re.match(r"^\s*(\d+)(?:\[| -> (\d+))", line)) or not {m.group(1), m.group(2)} & ids]
    return "\n".join(keep) + "\n"


if __name__ == "__main__":
    dot = without_hidden(rule_graph_dot())
    svg = subprocess.run(["dot", "-Tsvg"], input=dot, capture_output=True, text=True, check=True).stdout
    SVG.write_text(svg)
    print(f"wrote {SVG.relative_to(ROOT)}: {len(dot_graph(dot)[0])} rules")
