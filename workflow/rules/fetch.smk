# What the jobs need from the hub, fetched where Snakemake runs (local rules: on clusters only the
# login node has the internet): the tokenizers named without a local `path` (FETCH_TOKENIZERS) and
# the pretrained backbone of SNLI's features (its runs get it as --backbone-dir). Their command
# line is their own (grassflow.fetch), not the CLI's: what they save feeds every LM and SNLI run.
FETCH = "python -m grassflow.fetch"

if FETCH_TOKENIZERS:

    localrules:
        fetch_tokenizer,

    rule fetch_tokenizer:
        input:
            tokenizer=specs("fetch_tokenizer", FETCH_TOKENIZERS, "tok_name"),
        output:
            fetched_tokenizer("{tok_name}"),
        log:
            f"{RES}/logs/fetch_tokenizer/{{tok_name}}.log",
        conda:
            "../../envs/data.yaml"
        params:
            gf=FETCH,
            code=code_of("fetch-tokenizer"),
        shell:
            "{params.gf} fetch-tokenizer --tokenizer {input.tokenizer} --out {output} > {log} 2>&1"


if TASKS["snli"].part(P):

    localrules:
        snli_fetch_backbone,

    rule snli_fetch_backbone:
        input:
            backbone=spec("snli/backbone", TASKS["snli"].part(P).get("backbone")),
        output:
            directory(f"{TASKS['snli'].results(RES)}/backbone/{{name}}"),
        log:
            f"{RES}/logs/snli/fetch_backbone/{{name}}.log",
        conda:
            "../../envs/train.yaml"
        params:
            gf=FETCH,
            code=code_of("snli-fetch-backbone"),
        shell:
            "{params.gf} snli-fetch-backbone --backbone {input.backbone} --out-dir {output} > {log} 2>&1"
