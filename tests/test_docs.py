"""What the repository promises a newcomer holds: a license, a citation file valid against the
Citation File Format's schema, citing the paper it reproduces."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_citation_cff_is_valid_and_cites_the_paper():
    schema = json.loads((ROOT / "tests" / "data" / "cff-1.2.0.schema.json").read_text())
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    jsonschema.Draft7Validator(schema, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER).validate(cff)
    (paper,) = cff["references"]
    assert "arXiv:2512.19428" in [i["value"] for i in paper["identifiers"]]
    assert cff["license"] == "MIT"


def test_a_broken_citation_is_caught():
    schema = json.loads((ROOT / "tests" / "data" / "cff-1.2.0.schema.json").read_text())
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    cff["references"][0]["repository"] = "arXiv"  # not a URL
    assert list(jsonschema.Draft7Validator(schema).iter_errors(cff))
    del cff["references"][0]["repository"], cff["authors"]
    assert any("authors" in e.message for e in jsonschema.Draft7Validator(schema).iter_errors(cff))


def test_license_is_mit_as_pyproject_says():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "WITHOUT WARRANTY" in text
    assert 'license = { text = "MIT" }' in (ROOT / "pyproject.toml").read_text()
