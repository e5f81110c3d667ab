# The spec files the rules read (common.smk `spec`): written where Snakemake runs, when missing
# or when their content (the param) changed; included last, once every spec is registered.
localrules:
    spec,


rule spec:
    output:
        f"{RES}/specs/{{name}}.json",
    wildcard_constraints:
        name="|".join(map(re.escape, SPECS)) or "(?!)",
    params:
        content=lambda wc: SPECS[wc.name],
    log:
        f"{RES}/logs/spec/{{name}}.log",
    run:
        from grassflow.io import write_text

        write_text(output[0], params.content + "\n")
        write_text(log[0], f"wrote {output[0]}\n")
