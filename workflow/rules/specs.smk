# The spec files the rules read (common.smk: `spec`; their content SPECS, each rule file's): written where
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
