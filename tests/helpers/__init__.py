"""What the tests share: specs and data, the DAG in a scratch copy, stand-ins for CUDA's and CuPy's
rules, margins, subprocess helpers. Scripts among them regenerate committed files
(`python tests/helpers/rule_graph.py`, `python tests/helpers/schema_keys.py`)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
