# grassflow: the reproduction DAG of arXiv 2512.19428.
#   download → tokenize → train (one job per run) → evaluate → tables, figures, report
#   (workflow/rules/lm.smk, report.smk) and, for presets with an `snli` part, the same chain for
#   SNLI (paper Table 3: snli.smk); for presets with a `recall` part, multi-query associative
#   recall (MQAR: recall.smk)
# `snakemake --cores all` runs config.yaml's preset (paper); `--config preset=demo` the demo.
import os
import sys

from snakemake.utils import min_version

# This checkout's package, for this file and (through the environment, which cluster jobs
# inherit and re-derive) every job, whatever else is installed. An environment variable, not a
# rule param: a param holding this absolute path made every job look changed after the project
# directory moved.
_SRC = os.path.join(workflow.basedir, "src")
sys.path.insert(0, _SRC)
_PATH = os.environ.get("PYTHONPATH")
if not _PATH or _PATH.split(os.pathsep)[0] != _SRC:  # set, not required: no envvars directive
    os.environ.update(PYTHONPATH=os.pathsep.join(p for p in (_SRC, _PATH) if p))

from grassflow.pipeline.presets import validate_or_exit  # noqa: E402

min_version("9.0")


configfile: "config.yaml"


# JSON schema (types, ranges, unknown keys, defaults) + semantic checks; errors name the key.
validate_or_exit(config, "workflow/schemas/config.schema.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/preflight.smk"
include: "workflow/rules/fetch.smk"
include: "workflow/rules/lm.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/snli.smk"
include: "workflow/rules/recall.smk"
include: "workflow/rules/estimates.smk"
include: "workflow/rules/specs.smk"


rule all:
    default_target: True
    input:
        final_outputs(),
