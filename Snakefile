# grassflow: the reproduction DAG of arXiv 2512.19428.
#   download → tokenize → train (one job per run) → evaluate → tables, figures, report
# `snakemake --cores all` runs config.yaml's preset (paper); `--config preset=demo` the demo.
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "config.yaml"


validate(config, "workflow/schemas/config.schema.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        final_outputs(),
    default_target: True
