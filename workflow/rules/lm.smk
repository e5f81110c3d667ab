# Language modelling (the paper's Tables 1-2 and the ablations; its tables: report.smk):
#   download → (train_tokenizer, for tokenizer.name: trained) → tokenize → train → evaluate
# and documents: the evaluation splits as lm-evaluation-harness's documents, which evaluate reads.
# download is local (it runs where Snakemake runs): on clusters only the login node has the internet.
# A run's spec file holds all it computes from; its `code` param the hash of the code it runs, of its
# own model kind only (common.smk): a Grassmann edit reruns Grassmann runs only.


rule download:
    input:
        data=spec("data"),
    output:
        raw=expand(f"{RAW}/{{split}}.parquet", split=SPLITS),
        checksums=f"{RAW}/checksums.json",
    log:
        f"{RESULTS}/logs/download.log",
    benchmark:
        f"{RESULTS}/benchmarks/download.tsv"
    localrule: True
    conda:
        "../../envs/data.yaml"
    params:
        out_dir=lambda wc, output: Path(output.checksums).parent,
        code=code_of("grassflow.lm.download"),
    shell:
        "python -m grassflow.lm.download --data {input.data} --out-dir {params.out_dir} > {log} 2>&1"


rule train_tokenizer:
    input:
        f"{RAW}/train.parquet",
    output:
        f"{RESULTS}/data/tokenizer/trained/tokenizer.json",
    log:
        f"{RESULTS}/logs/train_tokenizer.log",
    benchmark:
        f"{RESULTS}/benchmarks/train_tokenizer.tsv"
    conda:
        "../../envs/data.yaml"
    params:
        vocab_size=lambda wc: PRESET_CFG["tokenizer"]["vocab_size"],
        code=code_of("grassflow.lm.train_tokenizer"),
    shell:
        "python -m grassflow.lm.train_tokenizer --train {input} --vocab-size {params.vocab_size} "
        "--out {output} > {log} 2>&1"


rule tokenize:
    input:
        raw=expand(f"{RAW}/{{split}}.parquet", split=SPLITS),
        artifact=tokenizer_artifact(PRESET_CFG if LM else None, RESULTS),
        tokenizer=spec("tokenize"),
    output:
        expand(f"{TOKENS}/{{split}}.parquet", split=SPLITS),
    log:
        f"{RESULTS}/logs/tokenize.log",
    benchmark:
        f"{RESULTS}/benchmarks/tokenize.tsv"
    conda:
        "../../envs/data.yaml"
    params:
        out_dir=lambda wc, output: Path(output[0]).parent,
        artifact=artifact_args(PRESET_CFG if LM else None, RESULTS),
        code=code_of("grassflow.lm.tokenize"),
    shell:
        "python -m grassflow.lm.tokenize --tokenizer {input.tokenizer} {params.artifact} "
        "--raw {input.raw} --out-dir {params.out_dir} > {log} 2>&1"


rule documents:
    input:
        raw=[f"{RAW}/validation.parquet", f"{RAW}/test.parquet"],
        artifact=tokenizer_artifact(PRESET_CFG if LM else None, RESULTS),
        tokenizer=spec("tokenize"),
    output:
        [f"{TOKENS}/docs/validation.parquet", f"{TOKENS}/docs/test.parquet"],
    log:
        f"{RESULTS}/logs/documents.log",
    benchmark:
        f"{RESULTS}/benchmarks/documents.tsv"
    conda:
        "../../envs/data.yaml"
    params:
        out_dir=lambda wc, output: Path(output[0]).parent,
        artifact=artifact_args(PRESET_CFG if LM else None, RESULTS),
        code=code_of("grassflow.lm.documents"),
    shell:
        "python -m grassflow.lm.documents --tokenizer {input.tokenizer} {params.artifact} "
        "--raw {input.raw} --out-dir {params.out_dir} > {log} 2>&1"


rule train:
    input:
        spec=spec("run", "run"),
        train=f"{TOKENS}/train.parquet",
        val=f"{TOKENS}/validation.parquet",
        preflight=run_preflight("lm"),
    output:
        weights=f"{RESULTS}/runs/{{run}}/model.safetensors",
        config=f"{RESULTS}/runs/{{run}}/config.json",
        metrics=f"{RESULTS}/runs/{{run}}/metrics.jsonl",
        record=f"{RESULTS}/runs/{{run}}/run.json",
    log:
        f"{RESULTS}/logs/train/{{run}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/train/{{run}}.tsv"
    wildcard_constraints:
        run=UNFUSED_RUNS,  # the runs of a fused group are trained by train_fused
    conda:
        "../../envs/train.yaml"
    threads: THREADS["lm"]
    resources:
        **EXECUTION["lm"],
        **estimated("train"),
        gpu=1,
        runs_per_gpu=RUNS_PER_GPU,
    params:
        code=lambda wc: code_of("grassflow.lm.train", RUNS[wc.run]["model_kind"]),
        out_dir=f"{RESULTS}/runs/{{run}}",
    shell:
        "OMP_NUM_THREADS={threads} GRASSFLOW_RUNS_PER_GPU={resources.runs_per_gpu} "
        "python -m grassflow.lm.train --spec {input.spec} --train-tokens {input.train} "
        "--val-tokens {input.val} --out-dir {params.out_dir} --preflight {input.preflight} "
        "--compile {resources.compile} --compile-mode {resources.compile_mode} "
        "--trackers {resources.trackers} --head-loss {resources.head_loss} > {log} 2>&1"


# train.fuse_seeds: a config's seeds (FUSED, common.smk) trained as one ensemble by one job, each
# run's outputs in its own directory as rule `train` writes them; evaluate reads them as any
# run's. The resume state is the group's (results/<preset>/fused/<group>/last.pt).
rule train_fused:
    input:
        specs=lambda wc: [f"{RESULTS}/specs/run/{r}.json" for r in FUSED[wc.group]],
        train=f"{TOKENS}/train.parquet",
        val=f"{TOKENS}/validation.parquet",
        preflight=run_preflight("lm"),
    output:
        **{
            f"{f}_s{seed}": f"{RESULTS}/runs/{{group}}-s{seed}/{name}"
            for seed in FUSED_SEEDS
            for f, name in (
                ("weights", "model.safetensors"),
                ("config", "config.json"),
                ("metrics", "metrics.jsonl"),
                ("record", "run.json"),
            )
        },
    log:
        f"{RESULTS}/logs/train_fused/{{group}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/train_fused/{{group}}.tsv"
    wildcard_constraints:
        group=alternatives(FUSED),
    conda:
        "../../envs/train.yaml"
    threads: THREADS["lm"]
    resources:
        **EXECUTION["lm"],
        **estimated("train_fused"),
        gpu=1,
        runs_per_gpu=RUNS_PER_GPU,
    params:
        code=lambda wc: code_of("grassflow.lm.train", RUNS[FUSED[wc.group][0]]["model_kind"]),
        out_dirs=lambda wc: " ".join(f"{RESULTS}/runs/{r}" for r in FUSED[wc.group]),
        work_dir=lambda wc: f"{RESULTS}/fused/{wc.group}",
    shell:
        "OMP_NUM_THREADS={threads} GRASSFLOW_RUNS_PER_GPU={resources.runs_per_gpu} "
        "python -m grassflow.lm.train --spec {input.specs} --train-tokens {input.train} "
        "--val-tokens {input.val} --out-dir {params.out_dirs} --work-dir {params.work_dir} "
        "--preflight {input.preflight} --compile {resources.compile} --compile-mode {resources.compile_mode} "
        "--trackers {resources.trackers} --head-loss {resources.head_loss} > {log} 2>&1"


rule evaluate:
    input:
        weights=f"{RESULTS}/runs/{{run}}/model.safetensors",
        config=f"{RESULTS}/runs/{{run}}/config.json",
        record=f"{RESULTS}/runs/{{run}}/run.json",
        val=f"{TOKENS}/validation.parquet",
        test=f"{TOKENS}/test.parquet",
        validation_docs=f"{TOKENS}/docs/validation.parquet",
        test_docs=f"{TOKENS}/docs/test.parquet",
        preflight=run_preflight("lm"),
    output:
        f"{RESULTS}/runs/{{run}}/eval.json",
    log:
        f"{RESULTS}/logs/evaluate/{{run}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/evaluate/{{run}}.tsv"
    conda:
        "../../envs/train.yaml"
    threads: THREADS["lm"]
    resources:
        **estimated("evaluate"),
        gpu=1,
        runs_per_gpu=RUNS_PER_GPU,
    params:
        code=lambda wc: code_of("grassflow.lm.evaluate", RUNS[wc.run]["model_kind"]),
    shell:
        "OMP_NUM_THREADS={threads} GRASSFLOW_RUNS_PER_GPU={resources.runs_per_gpu} "
        "python -m grassflow.lm.evaluate --weights {input.weights} --run-json {input.record} "
        "--val-tokens {input.val} --test-tokens {input.test} --out {output} "
        "--val-docs {input.validation_docs} --test-docs {input.test_docs} > {log} 2>&1"
