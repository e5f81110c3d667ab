"""The Snakemake workflow catalog's usage file (.snakemake-workflow-catalog.yml): it parses into the
catalog's keys and says only what is true of this workflow: every flag it names is one of
Snakemake's, every target a rule, every file one of the repository's; every rule that runs a job has
a conda env (its `conda: true`); no rule a container (its `singularity: false`)."""

from __future__ import annotations

import re
import subprocess

import yaml

from helpers.dag import BIN, ROOT, pipeline_env, run_snakemake
from helpers.rule_code import rules


def test_the_catalogs_usage_file_names_only_what_exists():
    usage = yaml.safe_load((ROOT / ".snakemake-workflow-catalog.yml").read_text())["usage"]
    assert set(usage) == {"mandatory-flags", "software-stack-deployment", "report"}
    flags = usage["mandatory-flags"]
    assert set(flags) == {"desc", "flags"}
    assert usage["software-stack-deployment"] == {
        "conda": True,
        "singularity": False,
        "singularity+conda": False,
    }
    assert usage["report"] is True
    text = flags["desc"] + " " + flags["flags"]
    helps = subprocess.run(
        [str(BIN / "snakemake"), "--help"], capture_output=True, text=True, env=pipeline_env(ROOT)
    ).stdout
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", text))
    assert named and all(re.search(rf"(?<![\w-]){re.escape(f)}\b", helps) for f in named), named
    rules = set(run_snakemake(["--list-rules"], ROOT, pipeline_env(ROOT)).stdout.split())
    targets = set(
        re.search(r"Targets: ([^.]*)", flags["desc"])
        .group(1)
        .replace(" (or all)", "")
        .replace(" or ", ", ")
        .split(", ")
    ) | {"all"}
    assert targets <= rules, targets - rules
    for path in re.findall(r"(?:workflow|profiles)/[\w./-]+\w", text):
        assert (ROOT / path).exists(), path


def test_its_conda_and_container_claims_are_the_rules():
    jobs = {name: r for name, r in rules().items() if r.runs}  # as Snakemake parsed them
    assert len(jobs) > 20
    assert [name for name, r in jobs.items() if not r.conda] == []
    assert not any(r.container for r in rules().values())
