import json

from grassflow.lm.grid import tokenizer_spec
from grassflow.snli.grid import snli_tokenizer_spec


# What a job computes from (a run's spec, a data or tokenizer section, the slice of the preset a
# table reads), as a small JSON file that the local rule `spec` (below) writes from
# spec_objects() when its content changes: a job's command line stays short and can be pasted to
# rerun the job by hand, and the job reruns when its spec file is rewritten.
@functools.cache
def spec_objects():
    """Every spec file the rules read, by name (results/<preset>/specs/<name>.json): each task's
    runs, data and table's part (<task>/run/<run id>, <task>/data[/<cell>], <task>/aggregate; a
    new task's rules read theirs so), the LM's and the other inputs the rules compute from."""
    out = {
        "data": PRESET_CFG.get("data"),
        "tokenize": tokenizer_spec(PRESET_CFG) if LM else None,
        "ablations/preset": ABLATIONS_PRESET,
        "ablations/grid": ABLATIONS,
        "estimates/preset": {k: run_train(v) if k == "train" else v for k, v in PRESET_CFG.items()},
        "estimates/estimate": ESTIMATE,
        "snli/backbone": SNLI.get("backbone"),
        "snli/tokenize": snli_tokenizer_spec(PRESET_CFG) if SNLI else None,
        **{f"aggregate/{exp}": part for exp, part in AGGREGATE_PRESETS.items()},
        **{f"fetch_tokenizer/{name}": tok for name, tok in FETCH_TOKENIZERS.items()},
    }
    for t in TASKS.values():
        out |= {f"{t.subdir}run/{run}": s for run, s in TASK_RUNS[t.name].items()}
        part = t.part(PRESET_CFG) or {}
        if t.part_key:  # the LM's data and tables: above
            out[f"{t.subdir}data"] = part.get("data")
            out[f"{t.subdir}aggregate"] = aggregate_part(part, t.part_key)
        if t.cells and part:
            out |= {f"{t.subdir}data/{c}": d for c, d in t.cells(part).items()}
    return out


def aggregate_part(part, key):
    """Another task's tables read its own part only, without execution keys."""
    return {key: {**part, "train": run_train(part["train"])}} if part else None


def spec_json(name):
    """Spec `name`'s file content: canonical JSON."""
    return json.dumps(spec_objects()[name], sort_keys=True, indent=1)


# The spec files the rules read (`spec`, their content spec_objects): written where
# Snakemake runs, when missing or when their content (the param) changed.
# Snakemake compares this rule's run block as code (its comments aside) when it plans: an edit
# there, even to the log line, reruns every spec and so every job of the DAG. Keep it as it is.
localrules:
    spec,


rule spec:
    output:
        f"{RESULTS}/specs/{{name}}.json",
    log:
        f"{RESULTS}/logs/spec/{{name}}.log",
    params:
        content=lambda wc: spec_json(wc.name),
    run:
        from grassflow.io import write_text

        write_text(output[0], params.content + "\n")
        write_text(log[0], f"wrote {output[0]}\n")
