# SNLI (the paper's Table 3), the preset's `snli` part:
#   snli_download → (snli_train_tokenizer) → snli_tokenize → snli_train → snli_evaluate → snli_aggregate
# and snli_fetch_backbone: the pretrained backbone a run on its frozen features reads (--backbone-dir),
# fetched where Snakemake runs (on clusters only the login node has the internet), as download is.
# `snakemake snli`: its tables, their runs and data only.


from grassflow.snli.grid import run_dirs, snli_tokenizer_spec

# SNLI (snli.smk), the preset's `snli` part
SNLI = PRESET_CFG.get("snli") or {}
SNLI_RUNS = TASK_RUNS["snli"]
SNLI_RES = f"{RESULTS}/snli"
SNLI_TOKENS = f"{SNLI_RES}/data/tokens/{SNLI['tokenizer']['name'] if SNLI else None}"
SNLI_FILES = token_files(SNLI_TOKENS, SNLI)
SNLI_THREADS = part_threads(SNLI)
SNLI_EXPERIMENTS = list(SNLI.get("experiments") or {})
SNLI_OUTPUTS = (
    [f"{REPORT}/snli_{exp}.{ext}" for exp in SNLI_EXPERIMENTS for ext in ("md", "csv", "tex")]
    + [f"{REPORT}/snli_curves_{exp}.png" for exp in SNLI_EXPERIMENTS]
    + ([f"{REPORT}/snli_summary.md"] if SNLI else [])
)


wildcard_constraints:
    snli_run=alternatives(SNLI_RUNS),


SPECS.update(
    {
        "snli/backbone": SNLI.get("backbone"),
        "snli/tokenize": snli_tokenizer_spec(PRESET_CFG) if SNLI else None,
        "snli/data": SNLI.get("data"),
        "snli/aggregate": aggregate_part(SNLI, "snli"),
        **run_specs("snli/", SNLI_RUNS),
    }
)


# {run: the fetched backbone it reads (snli_fetch_backbone), or none (a `path`, random, scratch)}
SNLI_BACKBONES = {
    run: [f"{SNLI_RES}/{dirs['backbone']}"] if "backbone" in dirs else []
    for run, dirs in ((run, run_dirs(SNLI, spec)) for run, spec in SNLI_RUNS.items())
}
SNLI_BACKBONE_ARGS = {
    run: " ".join(f"--backbone-dir {d}" for d in dirs) for run, dirs in SNLI_BACKBONES.items()
}


rule snli_fetch_backbone:
    input:
        backbone=spec("snli/backbone"),
    output:
        directory(f"{SNLI_RES}/backbone/{{name}}"),
    log:
        f"{RESULTS}/logs/snli/fetch_backbone/{{name}}.log",
    localrule: True
    conda:
        "../../envs/train.yaml"
    params:
        code=code_of("grassflow.snli.fetch_backbone"),
    shell:
        "python -m grassflow.snli.fetch_backbone --backbone {input.backbone} --out-dir {output} > {log} 2>&1"


rule snli_download:
    input:
        data=spec("snli/data"),
    output:
        raw=expand(f"{SNLI_RES}/data/raw/{{split}}.parquet", split=SPLITS),
        checksums=f"{SNLI_RES}/data/raw/checksums.json",
    log:
        f"{RESULTS}/logs/snli/download.log",
    benchmark:
        f"{RESULTS}/benchmarks/snli/download.tsv"
    localrule: True
    conda:
        "../../envs/data.yaml"
    params:
        out_dir=lambda wc, output: Path(output.checksums).parent,
        code=code_of("grassflow.snli.download"),
    shell:
        "python -m grassflow.snli.download --data {input.data} --out-dir {params.out_dir} > {log} 2>&1"


rule snli_train_tokenizer:
    input:
        f"{SNLI_RES}/data/raw/train.parquet",
    output:
        f"{SNLI_RES}/data/tokenizer/trained/tokenizer.json",
    log:
        f"{RESULTS}/logs/snli/train_tokenizer.log",
    benchmark:
        f"{RESULTS}/benchmarks/snli/train_tokenizer.tsv"
    conda:
        "../../envs/data.yaml"
    params:
        vocab_size=lambda wc: SNLI["tokenizer"]["vocab_size"],
        code=code_of("grassflow.snli.train_tokenizer"),
    shell:
        "python -m grassflow.snli.train_tokenizer --train {input} --vocab-size {params.vocab_size} "
        "--out {output} > {log} 2>&1"


rule snli_tokenize:
    input:
        raw=expand(f"{SNLI_RES}/data/raw/{{split}}.parquet", split=SPLITS),
        artifact=tokenizer_artifact(SNLI, SNLI_RES),
        tokenizer=spec("snli/tokenize"),
    output:
        expand(f"{SNLI_TOKENS}/{{split}}.parquet", split=SPLITS),
    log:
        f"{RESULTS}/logs/snli/tokenize.log",
    benchmark:
        f"{RESULTS}/benchmarks/snli/tokenize.tsv"
    conda:
        "../../envs/data.yaml"
    params:
        out_dir=lambda wc, output: Path(output[0]).parent,
        artifact=artifact_args(SNLI, SNLI_RES),
        code=code_of("grassflow.snli.tokenize"),
    shell:
        "python -m grassflow.snli.tokenize --tokenizer {input.tokenizer} {params.artifact} "
        "--raw {input.raw} --out-dir {params.out_dir} > {log} 2>&1"


rule snli_train:
    input:
        spec=spec("snli/run", "snli_run"),
        train=f"{SNLI_TOKENS}/train.parquet",
        val=f"{SNLI_TOKENS}/validation.parquet",
        preflight=run_preflight(SNLI_RUNS, "snli_run", "head"),
        backbone=lambda wc: SNLI_BACKBONES[wc.snli_run],
    output:
        weights=f"{SNLI_RES}/runs/{{snli_run}}/model.safetensors",
        config=f"{SNLI_RES}/runs/{{snli_run}}/config.json",
        metrics=f"{SNLI_RES}/runs/{{snli_run}}/metrics.jsonl",
        record=f"{SNLI_RES}/runs/{{snli_run}}/run.json",
    log:
        f"{RESULTS}/logs/snli/train/{{snli_run}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/snli/train/{{snli_run}}.tsv"
    conda:
        "../../envs/train.yaml"
    threads: SNLI_THREADS
    resources:
        **execution(SNLI),
        **estimated("snli_train", SNLI_RUNS, "snli_run", SNLI_FILES),
        gpu=1,
        runs_per_gpu=RUNS_PER_GPU,
    params:
        code=lambda wc: code_of("grassflow.snli.train", SNLI_RUNS[wc.snli_run]["model_kind"]),
        out_dir=f"{SNLI_RES}/runs/{{snli_run}}",
        extra=lambda wc: SNLI_BACKBONE_ARGS[wc.snli_run],
    shell:
        "OMP_NUM_THREADS={threads} GRASSFLOW_RUNS_PER_GPU={resources.runs_per_gpu} "
        "python -m grassflow.snli.train --spec {input.spec} --train-tokens {input.train} "
        "--val-tokens {input.val} --out-dir {params.out_dir} {params.extra} --preflight {input.preflight} "
        "--compile {resources.compile} --compile-mode {resources.compile_mode} "
        "--trackers {resources.trackers} > {log} 2>&1"


rule snli_evaluate:
    input:
        weights=f"{SNLI_RES}/runs/{{snli_run}}/model.safetensors",
        config=f"{SNLI_RES}/runs/{{snli_run}}/config.json",
        record=f"{SNLI_RES}/runs/{{snli_run}}/run.json",
        val=f"{SNLI_TOKENS}/validation.parquet",
        test=f"{SNLI_TOKENS}/test.parquet",
        preflight=run_preflight(SNLI_RUNS, "snli_run", "head"),
        backbone=lambda wc: SNLI_BACKBONES[wc.snli_run],
    output:
        f"{SNLI_RES}/runs/{{snli_run}}/eval.json",
    log:
        f"{RESULTS}/logs/snli/evaluate/{{snli_run}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/snli/evaluate/{{snli_run}}.tsv"
    conda:
        "../../envs/train.yaml"
    threads: SNLI_THREADS
    resources:
        **estimated("snli_evaluate", SNLI_RUNS, "snli_run", SNLI_FILES),
        gpu=1,
        runs_per_gpu=RUNS_PER_GPU,
    params:
        code=lambda wc: code_of("grassflow.snli.evaluate", SNLI_RUNS[wc.snli_run]["model_kind"]),
        extra=lambda wc: SNLI_BACKBONE_ARGS[wc.snli_run],
    shell:
        "OMP_NUM_THREADS={threads} GRASSFLOW_RUNS_PER_GPU={resources.runs_per_gpu} "
        "python -m grassflow.snli.evaluate --weights {input.weights} --run-json {input.record} "
        "--val-tokens {input.val} --test-tokens {input.test} --out {output} {params.extra} > {log} 2>&1"


rule snli_aggregate:
    input:
        evals=run_files(SNLI_RES, SNLI_RUNS, "eval.json"),
        records=run_files(SNLI_RES, SNLI_RUNS, "run.json"),
        metrics=run_files(SNLI_RES, SNLI_RUNS, "metrics.jsonl"),
        # its own part only, without execution keys: other tasks' edits leave its tables alone
        preset=spec("snli/aggregate"),
    output:
        shown(SNLI_OUTPUTS, "SNLI"),
    log:
        f"{RESULTS}/logs/snli/aggregate.log",
    conda:
        "../../envs/report.yaml"
    params:
        preset_name=PRESET,
        out_dir=lambda wc, output: Path(output[0]).parent,
        runs=" ".join(f"{SNLI_RES}/runs/{run}" for run in SNLI_RUNS),
        code=code_of("grassflow.snli.aggregate"),
    shell:
        "python -m grassflow.snli.aggregate --preset {input.preset} --preset-name {params.preset_name} "
        "--runs {params.runs} --out-dir {params.out_dir} > {log} 2>&1"


rule snli:  # `snakemake snli`: its tables, every run's evaluation, their data
    input:
        SNLI_OUTPUTS,
        run_files(SNLI_RES, SNLI_RUNS, "eval.json"),
