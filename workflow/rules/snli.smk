# The SNLI experiment (paper Table 3), for presets with an `snli` part:
#   snli_download → (snli_train_tokenizer) → snli_tokenize → snli_train (one job per run)
#   → snli_evaluate → snli_aggregate
# A run's spec param holds all it depends on; its code param the hash of the code it runs.
if SNLI:

    localrules:
        snli_download,
        snli_fetch_backbone,

    rule snli_download:
        output:
            raw=expand(f"{SNLI_RAW}/{{split}}.parquet", split=SPLITS),
            checksums=f"{SNLI_RAW}/checksums.json",
        params:
            gf=GF,
            out_dir=lambda wc, output: Path(output.checksums).parent,
            data=quoted_json(SNLI["data"]),
            code=code_of("snli-download"),
        conda:
            "../../envs/data.yaml"
        log:
            f"{RES}/logs/snli/download.log",
        shell:
            "{params.gf} snli-download --data {params.data} --out-dir {params.out_dir} > {log} 2>&1"

    rule snli_fetch_backbone:
        output:
            directory(f"{SNLI_RES}/backbone/{{name}}"),
        params:
            gf=GF,
            backbone=quoted_json(SNLI.get("backbone")),
            code=code_of("snli-fetch-backbone"),
        conda:
            "../../envs/train.yaml"
        log:
            f"{RES}/logs/snli/fetch_backbone/{{name}}.log",
        shell:
            "{params.gf} snli-fetch-backbone --backbone {params.backbone} --out-dir {output} > {log} 2>&1"

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
        output:
            expand(f"{SNLI_TOKENS}/{{split}}.parquet", split=SPLITS),
        params:
            gf=GF,
            out_dir=lambda wc, output: Path(output[0]).parent,
            tokenizer=quoted_json(SNLI["tokenizer"]),
            max_tokens=SNLI["max_tokens"],
            artifact=" ".join(f"--artifact {a}" for a in snli_tokenizer_artifact()),
            code=code_of("snli-tokenize"),
        conda:
            "../../envs/data.yaml"
        log:
            f"{RES}/logs/snli/tokenize.log",
        shell:
            "{params.gf} snli-tokenize --tokenizer {params.tokenizer} --max-tokens {params.max_tokens} "
            "{params.artifact} --raw {input.raw} --out-dir {params.out_dir} > {log} 2>&1"

    rule snli_train:
        input:
            train=f"{SNLI_TOKENS}/train.parquet",
            val=f"{SNLI_TOKENS}/validation.parquet",
            backbone=snli_backbone_input,
            preflight=snli_preflight,
        output:
            best=f"{SNLI_RUN_DIR}/best.pt",
            metrics=f"{SNLI_RUN_DIR}/metrics.jsonl",
            record=f"{SNLI_RUN_DIR}/run.json",
        threads: SNLI["train"]["threads"]
        params:
            gf=GF,
            spec=lambda wc: quoted_json(SNLI_RUNS[wc.snli_run]),
            code=lambda wc: code_of("snli-train", SNLI_RUNS[wc.snli_run]["head_kind"]),
            out_dir=SNLI_RUN_DIR,
            backbone=snli_backbone_arg,
        resources:
            gpu=1,
            runs_per_gpu=RUNS_PER_GPU,
            **SNLI_EXEC,
            **estimated("snli_train", lambda wc: SNLI_RUNS[wc.snli_run], SNLI_FILES),
        conda:
            "../../envs/train.yaml"
        log:
            f"{RES}/logs/snli/train/{{snli_run}}.log",
        benchmark:
            f"{RES}/benchmarks/snli/train/{{snli_run}}.tsv"
        shell:
            "OMP_NUM_THREADS={threads} GRASSFLOW_RUNS_PER_GPU={resources.runs_per_gpu} {params.gf} snli-train --spec {params.spec} --train-tokens {input.train} "
            "--val-tokens {input.val} --out-dir {params.out_dir} {params.backbone} "
            "--preflight {input.preflight} --compile {resources.compile} --compile-mode {resources.compile_mode} > {log} 2>&1"

    rule snli_evaluate:
        input:
            best=f"{SNLI_RUN_DIR}/best.pt",
            record=f"{SNLI_RUN_DIR}/run.json",
            val=f"{SNLI_TOKENS}/validation.parquet",
            test=f"{SNLI_TOKENS}/test.parquet",
            backbone=snli_backbone_input,
            preflight=snli_preflight,
        output:
            f"{SNLI_RUN_DIR}/eval.json",
        threads: SNLI["train"]["threads"]
        params:
            gf=GF,
            code=lambda wc: code_of("snli-evaluate", SNLI_RUNS[wc.snli_run]["head_kind"]),
            backbone=snli_backbone_arg,
        resources:
            gpu=1,
            runs_per_gpu=RUNS_PER_GPU,
            **estimated("snli_evaluate", lambda wc: SNLI_RUNS[wc.snli_run], SNLI_FILES),
        conda:
            "../../envs/train.yaml"
        log:
            f"{RES}/logs/snli/evaluate/{{snli_run}}.log",
        benchmark:
            f"{RES}/benchmarks/snli/evaluate/{{snli_run}}.tsv"
        shell:
            "OMP_NUM_THREADS={threads} GRASSFLOW_RUNS_PER_GPU={resources.runs_per_gpu} {params.gf} snli-evaluate --checkpoint {input.best} --run-json {input.record} "
            "--val-tokens {input.val} --test-tokens {input.test} --out {output} {params.backbone} > {log} 2>&1"

    rule snli:  # `snakemake snli`: the SNLI tables, their runs and their data only
        input:
            snli_table_outputs(),
            f"{REPORT}/snli_summary.md",

    rule snli_aggregate:
        input:
            evals=snli_run_outputs("eval.json"),
            records=snli_run_outputs("run.json"),
            metrics=snli_run_outputs("metrics.jsonl"),
        output:
            tables=[report(t, category="SNLI", labels={"table": Path(t).name}) for t in snli_table_outputs()],
            summary=report(f"{REPORT}/snli_summary.md", caption="../report/snli.rst", category="SNLI",
                           labels={"table": "snli_summary"}),
        params:
            gf=GF,
            preset_name=PRESET,
            out_dir=lambda wc, output: Path(output.summary).parent,
            preset=quoted_json({"snli": SNLI}),  # only the SNLI part: LM edits leave these tables alone
            runs=" ".join(f"{SNLI_RES}/runs/{r}" for r in SNLI_RUNS),
            code=code_of("snli-aggregate"),
        conda:
            "../../envs/report.yaml"
        log:
            f"{RES}/logs/snli/aggregate.log",
        shell:
            "{params.gf} snli-aggregate --preset {params.preset} --preset-name {params.preset_name} "
            "--runs {params.runs} --out-dir {params.out_dir} > {log} 2>&1"
