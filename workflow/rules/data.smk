# Stage 1 (download) and 2 (tokenize). download and fetch_tokenizer are local: on clusters
# only the login node has internet.
localrules:
    download,
    fetch_tokenizer,


rule download:
    output:
        raw=expand(f"{RAW}/{{split}}.parquet", split=SPLITS),
        checksums=f"{RAW}/checksums.json",
    params:
        data=quoted_json(P["data"]),
        code=fingerprint("download"),
    conda:
        "../../envs/data.yaml"
    log:
        f"{RES}/logs/download.log",
    benchmark:
        f"{RES}/benchmarks/download.tsv"
    shell:
        "{GF} download --data {params.data} --out-dir {RAW} > {log} 2>&1"


rule fetch_tokenizer:
    output:
        fetched_tokenizer("{tok_name}"),
    params:
        tokenizer=lambda wc: quoted_json(FETCH_TOKENIZERS[wc.tok_name]),
        code=fingerprint("tokenize"),
    conda:
        "../../envs/data.yaml"
    log:
        f"{RES}/logs/fetch_tokenizer/{{tok_name}}.log",
    shell:
        "{GF} fetch-tokenizer --tokenizer {params.tokenizer} --out {output} > {log} 2>&1"


rule train_tokenizer:
    input:
        f"{RAW}/train.parquet",
    output:
        f"{RES}/data/tokenizer/trained/tokenizer.json",
    params:
        vocab_size=P["tokenizer"].get("vocab_size"),
        code=fingerprint("tokenize"),
    conda:
        "../../envs/data.yaml"
    log:
        f"{RES}/logs/train_tokenizer.log",
    benchmark:
        f"{RES}/benchmarks/train_tokenizer.tsv"
    shell:
        "{GF} train-tokenizer --train {input} --vocab-size {params.vocab_size} "
        "--out {output} > {log} 2>&1"


rule tokenize:
    input:
        raw=expand(f"{RAW}/{{split}}.parquet", split=SPLITS),
        artifact=tokenizer_artifact(),
    output:
        expand(f"{TOKENS}/{{split}}.parquet", split=SPLITS),
    params:
        tokenizer=quoted_json(P["tokenizer"]),
        artifact=" ".join(f"--artifact {a}" for a in tokenizer_artifact()),
        code=fingerprint("tokenize"),
    conda:
        "../../envs/data.yaml"
    log:
        f"{RES}/logs/tokenize.log",
    benchmark:
        f"{RES}/benchmarks/tokenize.tsv"
    shell:
        "{GF} tokenize --tokenizer {params.tokenizer} {params.artifact} "
        "--raw {input.raw} --out-dir {TOKENS} > {log} 2>&1"
