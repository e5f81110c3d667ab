"""The rule files read as text: each rule's block, and the stage module its `code` param fingerprints
(`code_of("<module>", <kinds>)`, workflow/rules/common.smk) with what it passes as the kinds."""

from __future__ import annotations

import re

from helpers import ROOT

CODE = re.compile(r'code=(?:lambda wc: )?code_of\(\s*"([\w.]+)"(.*?)\),?\n', re.S)


def rule_blocks():
    """(rule name, its text) of every rule in the Snakefile and workflow/rules/*.smk."""
    for smk in [ROOT / "Snakefile", *sorted((ROOT / "workflow" / "rules").glob("*.smk"))]:
        for block in re.split(r"(?m)^(?=rule )", smk.read_text()):
            m = re.match(r"rule (\w+):", block)
            if m:
                yield m.group(1), block


def rule_codes() -> dict[str, tuple[str, str]]:
    """{rule: (the module its code param fingerprints, its kinds argument as written: "" for none)}."""
    return {rule: (m.group(1), m.group(2).strip()) for rule, block in rule_blocks() if (m := CODE.search(block))}
