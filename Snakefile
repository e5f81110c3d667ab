# grassflow: the reproduction DAG of arXiv 2512.19428.
#   download → tokenize → train (one job per run) → evaluate → tables, figures, report
#   (workflow/rules/lm.smk) and, for presets with an `snli` part, the same chain for
#   SNLI (paper Table 3: snli.smk); for presets with a `recall` part, multi-query associative
#   recall (MQAR: recall.smk)
# `snakemake --cores all` runs config.yaml's preset (paper); `--config preset=demo` the demo.
import sys
from pathlib import Path

from snakemake.utils import min_version

import grassflow
from grassflow.pipeline.presets import validate_or_exit

# This checkout: every file the workflow reads of its own (schema, resources, captions, the code its
# fingerprints hash) is found from here, never from the working directory, which holds the user's
# config and results (`--directory`, or a `module` deployment: the user's Snakefile there).
CHECKOUT = Path(str(workflow.current_basedir))
if not CHECKOUT.is_dir():
    sys.exit(
        f"error: this workflow is read from {workflow.current_basedir}, not a local checkout: its jobs run "
        "the grassflow package installed from a clone (`pip install -e <clone>`); point the module's "
        "`snakefile:` at the clone's Snakefile (docs/use/pipeline.md, deployment)"
    )

# The jobs run the installed package (`pip install -e .`, as make does), and their code fingerprints
# hash this checkout's src/ (common.smk): the two must be the same files.
PACKAGE = Path(grassflow.__file__).parent
if PACKAGE.resolve() != (CHECKOUT / "src" / "grassflow").resolve():
    sys.exit(
        f"error: python imports grassflow from {PACKAGE}, not from this "
        f"checkout's src/: run `pip install -e {CHECKOUT}` (make does), or set PYTHONPATH={CHECKOUT / 'src'}"
    )

min_version("9.0")


configfile: "config.yaml"


# JSON schema (types, ranges, unknown keys, defaults) + semantic checks; errors name the key.
validate_or_exit(config, CHECKOUT / "workflow/schemas/config.schema.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/preflight.smk"
include: "workflow/rules/fetch.smk"
include: "workflow/rules/lm.smk"
include: "workflow/rules/snli.smk"
include: "workflow/rules/recall.smk"


# Every task's tables and figures, and every run's evaluation too: Snakemake (>= 7.7, by design,
# snakemake#1978) does not redo a deleted intermediate file whose consumers look up to date, so
# without these a deleted or failed run would leave the old tables standing.
rule all:
    default_target: True
    input:
        rules.lm.input,
        rules.snli.input,
        rules.recall.input,
