"""The rule files read as text: each rule's block, and the stage module its `code` param fingerprints
(`code_of("<module>", <kinds>)`, workflow/rules/common.smk) with what it passes as the kinds. A rule
made with `use rule <parent> as <rule> with:` reads as its own settings, then its parent's block,
its shell's `{params.stage}` as its stage param says."""

from __future__ import annotations

import re

from helpers import ROOT

CODE = re.compile(r'code=(?:lambda wc: )?code_of\(\s*"([\w.]+)"(.*?)\),?\n', re.S)
USE = re.compile(r"use rule (\w+) as (\w+) with:")


def rule_blocks():
    """(rule name, its text) of every rule in the Snakefile and workflow/rules/*.smk."""
    raw, uses = {}, {}
    for smk in [ROOT / "Snakefile", *sorted((ROOT / "workflow" / "rules").glob("*.smk"))]:
        for block in re.split(r"(?m)^(?=rule |use rule )", smk.read_text()):
            if m := re.match(r"rule (\w+):", block):
                raw[m.group(1)] = block
            elif m := USE.match(block):
                uses[m.group(2)] = (m.group(1), block)
    for rule, (parent, block) in uses.items():
        raw[rule] = block + "\n" + raw[parent]  # its own settings first: a search finds them before its parent's
    for rule, block in raw.items():
        stage = re.search(r'stage="([\w.]+)"', block)
        yield rule, block.replace("{params.stage}", stage.group(1)) if stage else block


def rule_codes() -> dict[str, tuple[str, str]]:
    """{rule: (the module its code param fingerprints, its kinds argument as written: "" for none)}."""
    return {rule: (m.group(1), m.group(2).strip()) for rule, block in rule_blocks() if (m := CODE.search(block))}
