# SNLI (the paper's Table 3), the preset's `snli` part:
#   snli_download → (snli_train_tokenizer) → snli_tokenize → snli_train → snli_evaluate → snli_aggregate
# its data chain the LM's rules (lm.smk) with its own stages and files; and snli_fetch_backbone: the
# pretrained backbone a run on its frozen features reads (--backbone-dir), fetched where Snakemake
# runs (on clusters only the login node has the internet), as download is. `snakemake snli`: its
# tables, their runs and data only.
from grassflow.snli.layout import snli_layout

SNLI = snli_layout(PRESET_CFG, TASK_RUNS["snli"], RESULTS)  # its names (grassflow.snli.layout)


wildcard_constraints:
    snli_run=alternatives(SNLI.runs),


rule snli_fetch_backbone:
    output:
        directory(f"{SNLI.res}/backbone/{{name}}"),
    log:
        f"{RESULTS}/logs/snli/fetch_backbone/{{name}}.log",
    localrule: True
    conda:
        "../../envs/train.yaml"
    params:
        backbone=as_json((SNLI.part or {}).get("backbone")),
        code=code_of("grassflow.snli.fetch_backbone"),
    shell:
        "python -m grassflow.snli.fetch_backbone --backbone {params.backbone:q} --out-dir {output} > {log} 2>&1"


use rule download as snli_download with:  # local, as download (`use rule` does not carry it over)
    output:
        raw=expand(f"{SNLI.res}/data/raw/{{split}}.parquet", split=SPLITS),
        checksums=f"{SNLI.res}/data/raw/checksums.json",
    log:
        f"{RESULTS}/logs/snli/download.log",
    benchmark:
        f"{RESULTS}/benchmarks/snli/download.tsv"
    localrule: True
    params:
        stage="grassflow.snli.download",
        data=as_json((SNLI.part or {}).get("data")),
        code=code_of("grassflow.snli.download"),


use rule train_tokenizer as snli_train_tokenizer with:
    input:
        f"{SNLI.res}/data/raw/train.parquet",
    output:
        f"{SNLI.res}/data/tokenizer/trained/tokenizer.json",
    log:
        f"{RESULTS}/logs/snli/train_tokenizer.log",
    benchmark:
        f"{RESULTS}/benchmarks/snli/train_tokenizer.tsv"
    params:
        stage="grassflow.snli.train_tokenizer",
        vocab_size=lambda wc: SNLI.part["tokenizer"]["vocab_size"],
        code=code_of("grassflow.snli.train_tokenizer"),


use rule tokenize as snli_tokenize with:
    input:
        raw=expand(f"{SNLI.res}/data/raw/{{split}}.parquet", split=SPLITS),
        artifact=tokenizer_artifact(SNLI.part, SNLI.res),
    output:
        expand(f"{SNLI.tokens}/{{split}}.parquet", split=SPLITS),
    log:
        f"{RESULTS}/logs/snli/tokenize.log",
    benchmark:
        f"{RESULTS}/benchmarks/snli/tokenize.tsv"
    params:
        stage="grassflow.snli.tokenize",
        tokenizer=as_json(SNLI.tokenizer),
        artifact=artifact_args(SNLI.part, SNLI.res),
        code=code_of("grassflow.snli.tokenize"),


use rule train as snli_train with:
    input:
        train=f"{SNLI.tokens}/train.parquet",
        val=f"{SNLI.tokens}/validation.parquet",
        preflight=run_preflight(SNLI.runs, "snli_run", "head"),
        backbone=lambda wc: SNLI.backbones[wc.snli_run],
    output:
        **run_outputs(f"{SNLI.res}/runs/{{snli_run}}"),
    log:
        f"{RESULTS}/logs/snli/train/{{snli_run}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/snli/train/{{snli_run}}.tsv"
    threads: THREADS["snli"]
    resources:
        **run_resources("snli", "train", SNLI.runs, "snli_run", SNLI.files),
    params:
        stage="grassflow.snli.train",
        spec=lambda wc: quoted_json([SNLI.runs[wc.snli_run]]),
        code=lambda wc: code_of("grassflow.snli.train", SNLI.runs[wc.snli_run]["model_kind"]),
        out_dir=f"{SNLI.res}/runs/{{snli_run}}",
        extra=lambda wc: SNLI.backbone_args[wc.snli_run],


use rule evaluate as snli_evaluate with:
    input:
        weights=f"{SNLI.res}/runs/{{snli_run}}/model.safetensors",
        config=f"{SNLI.res}/runs/{{snli_run}}/config.json",
        record=f"{SNLI.res}/runs/{{snli_run}}/run.json",
        val=f"{SNLI.tokens}/validation.parquet",
        test=f"{SNLI.tokens}/test.parquet",
        preflight=run_preflight(SNLI.runs, "snli_run", "head"),
        backbone=lambda wc: SNLI.backbones[wc.snli_run],
    output:
        f"{SNLI.res}/runs/{{snli_run}}/eval.json",
    log:
        f"{RESULTS}/logs/snli/evaluate/{{snli_run}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/snli/evaluate/{{snli_run}}.tsv"
    threads: THREADS["snli"]
    resources:
        **run_resources("snli", "evaluate", SNLI.runs, "snli_run", SNLI.files),
    params:
        stage="grassflow.snli.evaluate",
        code=lambda wc: code_of("grassflow.snli.evaluate", SNLI.runs[wc.snli_run]["model_kind"]),
        extra=lambda wc: SNLI.backbone_args[wc.snli_run],


# a task's table job (recall_aggregate is this rule with recall's files): its own part only, without
# execution keys, so other tasks' edits leave its tables alone
rule snli_aggregate:
    input:
        evals=run_files(SNLI.res, SNLI.runs, "eval.json"),
        records=run_files(SNLI.res, SNLI.runs, "run.json"),
        metrics=run_files(SNLI.res, SNLI.runs, "metrics.jsonl"),
    output:
        shown(SNLI.outputs, "SNLI"),
    log:
        f"{RESULTS}/logs/snli/aggregate.log",
    conda:
        "../../envs/report.yaml"
    params:
        stage="grassflow.snli.aggregate",
        preset=as_json(table_part(SNLI.part, "snli")),
        preset_name=PRESET,
        out_dir=lambda wc, output: Path(output[0]).parent,
        runs=" ".join(f"{SNLI.res}/runs/{run}" for run in SNLI.runs),
        code=code_of("grassflow.snli.aggregate"),
    shell:
        "python -m {params.stage} --preset {params.preset:q} --preset-name {params.preset_name} "
        "--runs {params.runs} --out-dir {params.out_dir} > {log} 2>&1"


rule snli:  # `snakemake snli`: its tables, every run's evaluation, their data
    input:
        SNLI.outputs,
        run_files(SNLI.res, SNLI.runs, "eval.json"),
