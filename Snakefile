# grassflow: the reproduction DAG of arXiv 2512.19428.
#   download → tokenize → train (one job per run) → evaluate → tables, figures, report
#   and, for presets with an `snli` part, the same chain for SNLI (paper Table 3); for
#   presets with a `recall` part, multi-query associative recall (MQAR)
# `snakemake --cores all` runs config.yaml's preset (paper); `--config preset=demo` the demo.
from snakemake.utils import min_version

from grassflow.config import validate_or_exit

min_version("9.0")


configfile: "config.yaml"


# JSON schema (types, ranges, unknown keys, defaults) + semantic checks; errors name the key.
validate_or_exit(config, "workflow/schemas/config.schema.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/preflight.smk"


if LM:

    include: "workflow/rules/data.smk"
    include: "workflow/rules/train.smk"
    include: "workflow/rules/evaluate.smk"
    include: "workflow/rules/report.smk"


include: "workflow/rules/snli.smk"
include: "workflow/rules/recall.smk"


rule all:
    input:
        final_outputs(),
    default_target: True
