# Stage 1 (download) and 2 (tokenize). download and fetch_tokenizer are local: on clusters
# only the login node has internet.
localrules:
    download,
    fetch_tokenizer,


rule download:
    input:
        data=spec("data", P["data"]),
    output:
        raw=expand(f"{RAW}/{{split}}.parquet", split=SPLITS),
        checksums=f"{RAW}/checksums.json",
    params:
        gf=GF,
        out_dir=lambda wc, output: Path(output.checksums).parent,
        code=code_of("download"),
    conda:
        "../../envs/data.yaml"
    log:
        f"{RES}/logs/download.log",
    benchmark:
        f"{RES}/benchmarks/download.tsv"
    shell:
        "{params.gf} download --data {input.data} --out-dir {params.out_dir} > {log} 2>&1"


rule fetch_tokenizer:
    input:
        tokenizer=specs("fetch_tokenizer", FETCH_TOKENIZERS, "tok_name"),
    output:
        fetched_tokenizer("{tok_name}"),
    params:
        gf=GF,
        code=code_of("fetch-tokenizer"),
    conda:
        "../../envs/data.yaml"
    log:
        f"{RES}/logs/fetch_tokenizer/{{tok_name}}.log",
    shell:
        "{params.gf} fetch-tokenizer --tokenizer {input.tokenizer} --out {output} > {log} 2>&1"


rule train_tokenizer:
    input:
        f"{RAW}/train.parquet",
    output:
        f"{RES}/data/tokenizer/trained/tokenizer.json",
    params:
        gf=GF,
        vocab_size=P["tokenizer"].get("vocab_size"),
        code=code_of("train-tokenizer"),
    conda:
        "../../envs/data.yaml"
    log:
        f"{RES}/logs/train_tokenizer.log",
    benchmark:
        f"{RES}/benchmarks/train_tokenizer.tsv"
    shell:
        "{params.gf} train-tokenizer --train {input} --vocab-size {params.vocab_size} "
        "--out {output} > {log} 2>&1"


rule tokenize:
    input:
        raw=expand(f"{RAW}/{{split}}.parquet", split=SPLITS),
        artifact=tokenizer_artifact(),
        tokenizer=spec("tokenize", tokenizer_spec(P)),
    output:
        expand(f"{TOKENS}/{{split}}.parquet", split=SPLITS),
    params:
        gf=GF,
        out_dir=lambda wc, output: Path(output[0]).parent,
        artifact=" ".join(f"--artifact {a}" for a in tokenizer_artifact()),
        cut=f"--eval-max-tokens {P['data']['eval_max_tokens']}" if P["data"].get("eval_max_tokens") else "",
        code=code_of("tokenize"),
    conda:
        "../../envs/data.yaml"
    log:
        f"{RES}/logs/tokenize.log",
    benchmark:
        f"{RES}/benchmarks/tokenize.tsv"
    shell:
        "{params.gf} tokenize --tokenizer {input.tokenizer} {params.artifact} {params.cut} "
        "--raw {input.raw} --out-dir {params.out_dir} > {log} 2>&1"


# The unigram baseline of the evaluation tokens (training-split counts): the perplexity a model
# must beat to have learned anything; the tables mark runs that do not.
rule unigram:
    input:
        train=f"{TOKENS}/train.parquet",
        val=f"{TOKENS}/validation.parquet",
        test=f"{TOKENS}/test.parquet",
    output:
        f"{TOKENS}/unigram.json",
    params:
        gf=GF,
        code=code_of("unigram"),
    conda:
        "../../envs/data.yaml"
    log:
        f"{RES}/logs/unigram.log",
    shell:
        "{params.gf} unigram --train-tokens {input.train} --val-tokens {input.val} --test-tokens {input.test} "
        "--out {output} > {log} 2>&1"
