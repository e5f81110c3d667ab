# The SNLI experiment (paper Table 3), for presets with an `snli` part:
#   snli_download → (snli_train_tokenizer) → snli_tokenize → snli_train (one job per run)
#   → snli_evaluate (both in runs.smk) → snli_aggregate (tasks.smk)
if SNLI:

    localrules:
        snli_download,
        snli_fetch_backbone,

    rule snli_download:
        input:
            data=spec("snli/data", SNLI["data"]),
        output:
            raw=expand(f"{SNLI_RAW}/{{split}}.parquet", split=SPLITS),
            checksums=f"{SNLI_RAW}/checksums.json",
        params:
            gf=GF,
            out_dir=lambda wc, output: Path(output.checksums).parent,
            code=code_of("snli-download"),
        conda:
            "../../envs/data.yaml"
        log:
            f"{RES}/logs/snli/download.log",
        shell:
            "{params.gf} snli-download --data {input.data} --out-dir {params.out_dir} > {log} 2>&1"

    rule snli_fetch_backbone:
        input:
            backbone=spec("snli/backbone", SNLI.get("backbone")),
        output:
            directory(f"{SNLI_RES}/backbone/{{name}}"),
        params:
            gf=GF,
            code=code_of("snli-fetch-backbone"),
        conda:
            "../../envs/train.yaml"
        log:
            f"{RES}/logs/snli/fetch_backbone/{{name}}.log",
        shell:
            "{params.gf} snli-fetch-backbone --backbone {input.backbone} --out-dir {output} > {log} 2>&1"

    rule snli_train_tokenizer:
        input:
            f"{SNLI_RAW}/train.parquet",
        output:
            f"{SNLI_RES}/data/tokenizer/trained/tokenizer.json",
        params:
            gf=GF,
            vocab_size=SNLI["tokenizer"].get("vocab_size"),
            code=code_of("snli-train-tokenizer"),
        conda:
            "../../envs/data.yaml"
        log:
            f"{RES}/logs/snli/train_tokenizer.log",
        shell:
            "{params.gf} snli-train-tokenizer --train {input} --vocab-size {params.vocab_size} --out {output} > {log} 2>&1"

    rule snli_tokenize:
        input:
            raw=expand(f"{SNLI_RAW}/{{split}}.parquet", split=SPLITS),
            artifact=snli_tokenizer_artifact(),
            tokenizer=spec("snli/tokenize", SNLI["tokenizer"]),
        output:
            expand(f"{SNLI_TOKENS}/{{split}}.parquet", split=SPLITS),
        params:
            gf=GF,
            out_dir=lambda wc, output: Path(output[0]).parent,
            max_tokens=SNLI["max_tokens"],
            artifact=" ".join(f"--artifact {a}" for a in snli_tokenizer_artifact()),
            code=code_of("snli-tokenize"),
        conda:
            "../../envs/data.yaml"
        log:
            f"{RES}/logs/snli/tokenize.log",
        shell:
            "{params.gf} snli-tokenize --tokenizer {input.tokenizer} --max-tokens {params.max_tokens} "
            "{params.artifact} --raw {input.raw} --out-dir {params.out_dir} > {log} 2>&1"

    RUN_DIRS["snli"] = ("backbone", snli_backbone_input)  # its runs' --backbone-dir (runs.smk)
