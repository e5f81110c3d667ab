# The tokenizers named without a local `path` (common.smk: tokenizer_artifact), fetched from the hub
# where Snakemake runs (a local rule: on clusters only the login node has the internet), for every
# LM and SNLI run. Its job is grassflow.data.fetch_tokenizer, as snli_fetch_backbone's is
# grassflow.snli.fetch_backbone (snli.smk).


rule fetch_tokenizer:
    output:
        fetched_tokenizer("{tok_name}"),
    log:
        f"{RESULTS}/logs/fetch_tokenizer/{{tok_name}}.log",
    localrule: True
    conda:
        "../../envs/data.yaml"
    params:
        tokenizer=lambda wc: as_json({"name": wc.tok_name}),
        code=code_of("grassflow.data.fetch_tokenizer"),
    shell:
        "python -m grassflow.data.fetch_tokenizer --tokenizer {params.tokenizer:q} --out {output} > {log} 2>&1"
