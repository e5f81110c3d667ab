# Language modelling (the paper's Tables 1-2 and the ablations), the preset itself where it has
# experiments:
#   download → (train_tokenizer, for tokenizer.name: trained) → tokenize → train → evaluate
#   → aggregate (a table per experiment), summary, ablation_aggregate
# and documents: the evaluation splits as lm-evaluation-harness's documents, which evaluate reads;
# unigram: the baseline a model must beat; bench: the scaling benchmark.
# `snakemake lm`: its tables; `snakemake table1`, `table2`, `ablations`: one table, its runs, their data.
# download is local (it runs where Snakemake runs): on clusters only the login node has the internet.
# A run's spec file holds all it computes from; its `code` param the hash of the code it runs, of its
# own model kind only (common.smk): a Grassmann edit reruns Grassmann runs only.


from grassflow.lm.grid import (
    ablation_runs,
    finished_runs,
    fused_groups,
    main_run_ids,
    tokenizer_spec,
)

# Its part: the preset itself, when it has experiments (a preset may hold only SNLI or only recall).
LM = bool(PRESET_CFG.get("experiments"))
LM_PART = PRESET_CFG if LM else None
LM_TRAIN = PRESET_CFG["train"] if LM else {}
LM_THREADS = part_threads(LM_PART)
BENCH = PRESET_CFG.get("bench") or {}
LM_RUNS = TASK_RUNS["lm"]  # the main tables' runs, then the ablation grid's (each trained once)
EXPERIMENTS = list(PRESET_CFG.get("experiments") or {})
MAIN_RUNS = main_run_ids(PRESET_CFG)
EXP_RUNS = {exp: [r for r in MAIN_RUNS if LM_RUNS[r]["experiment"] == exp] for exp in EXPERIMENTS}
# {variant: {model: [run ids]}} of the ablation grid; its runs are in LM_RUNS
ABLATIONS = {
    v: {m: [s["run_id"] for s in specs] for m, specs in models.items()}
    for v, models in ablation_runs(PRESET, PRESET_CFG, LM_RUNS).items()
}
ABLATION_RUNS = sorted({r for models in ABLATIONS.values() for rs in models.values() for r in rs})
# {run: its records} of the runs finished elsewhere (config finished_runs; rule adopt_run)
FINISHED = finished_runs(config.get("finished_runs"), LM_RUNS) if LM else {}
# {group: its runs} of the LM runs trained as one ensemble each (train.fuse_seeds; rule train_fused)
FUSED = fused_groups(PRESET_CFG, LM_RUNS, FINISHED) if LM else {}
FUSED_RUNS = {r for runs in FUSED.values() for r in runs}
FUSED_SEEDS = [int(r.rsplit("-s", 1)[1]) for r in next(iter(FUSED.values()), [])]  # every group's
FUSED_FIRST = {group: LM_RUNS[runs[0]] for group, runs in FUSED.items()}  # its preflight's run
PUBLISHED = "workflow/resources/published.yaml"  # the paper's setup, its published numbers
RAW = f"{RESULTS}/data/raw"
TOKENS = f"{RESULTS}/data/tokens/{PRESET_CFG['tokenizer']['name'] if LM else None}"
LM_FILES = token_files(TOKENS, LM_PART)
UNFUSED_RUNS = alternatives(r for r in LM_RUNS if r not in FUSED_RUNS and r not in FINISHED)


wildcard_constraints:
    run=alternatives(LM_RUNS),
    exp=alternatives(EXPERIMENTS),


# each experiment's table and figures (rule aggregate), the ablation table's, and all of them (`lm`)
EXPERIMENT_OUTPUTS = {exp: experiment_tables(exp) + experiment_figures(exp) for exp in EXPERIMENTS}
ABLATION_FILES = [f"{REPORT}/ablations_gap.png"] + [
    f"{REPORT}/ablations.{ext}" for ext in ("md", "csv", "tex", "png")
]
ABLATION_OUTPUTS = ABLATION_FILES if ABLATIONS else []
LM_OUTPUTS = (
    [f for outputs in EXPERIMENT_OUTPUTS.values() for f in outputs]
    + [f"{REPORT}/scaling.png", f"{REPORT}/summary.md"]
    + ABLATION_OUTPUTS
    if LM
    else []
)


TASK_PARTS = {t.part_key for t in TASKS.values() if t.part_key}  # the other tasks' preset keys
# each LM experiment's table: this experiment only, so that the other tables', the other tasks' and
# the ablations' edits (and train.threads) leave it alone
AGGREGATE_PRESETS = {
    exp: {
        **{
            k: run_train(v) if k == "train" else v
            for k, v in PRESET_CFG.items()
            if k not in ("ablations", "experiments", *TASK_PARTS)
        },
        "experiments": {exp: PRESET_CFG["experiments"][exp]},
    }
    for exp in EXPERIMENTS
}
# the ablation table: the grid's base experiment, not the others
ABLATIONS_PRESET = (
    {
        **{k: PRESET_CFG[k] for k in ("data", "tokenizer", "models", "model", "ablations")},
        "model_overrides": PRESET_CFG.get("model_overrides") or {},
        "train": run_train(PRESET_CFG["train"]),
        "experiments": {
            PRESET_CFG["ablations"]["base"]: PRESET_CFG["experiments"][
                PRESET_CFG["ablations"]["base"]
            ]
        },
    }
    if ABLATIONS
    else None
)

SPECS.update(
    {
        "data": PRESET_CFG.get("data"),
        "tokenize": tokenizer_spec(PRESET_CFG) if LM else None,
        "ablations/preset": ABLATIONS_PRESET,
        "ablations/grid": ABLATIONS,
        **{f"aggregate/{exp}": part for exp, part in AGGREGATE_PRESETS.items()},
        **run_specs("", LM_RUNS),
    }
)


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
        artifact=tokenizer_artifact(LM_PART, RESULTS),
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
        artifact=artifact_args(LM_PART, RESULTS),
        code=code_of("grassflow.lm.tokenize"),
    shell:
        "python -m grassflow.lm.tokenize --tokenizer {input.tokenizer} {params.artifact} "
        "--raw {input.raw} --out-dir {params.out_dir} > {log} 2>&1"


rule documents:
    input:
        raw=[f"{RAW}/validation.parquet", f"{RAW}/test.parquet"],
        artifact=tokenizer_artifact(LM_PART, RESULTS),
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
        artifact=artifact_args(LM_PART, RESULTS),
        code=code_of("grassflow.lm.documents"),
    shell:
        "python -m grassflow.lm.documents --tokenizer {input.tokenizer} {params.artifact} "
        "--raw {input.raw} --out-dir {params.out_dir} > {log} 2>&1"


rule train:
    input:
        spec=spec("run", "run"),
        train=f"{TOKENS}/train.parquet",
        val=f"{TOKENS}/validation.parquet",
        preflight=run_preflight(LM_RUNS, "run"),
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
    threads: LM_THREADS
    resources:
        **execution(LM_PART),
        **estimated("train", LM_RUNS, "run", LM_FILES),
        gpu=1,
        runs_per_gpu=RUNS_PER_GPU,
    params:
        code=lambda wc: code_of("grassflow.lm.train", LM_RUNS[wc.run]["model_kind"]),
        out_dir=f"{RESULTS}/runs/{{run}}",
    shell:
        "OMP_NUM_THREADS={threads} GRASSFLOW_RUNS_PER_GPU={resources.runs_per_gpu} "
        "python -m grassflow.lm.train --spec {input.spec} --train-tokens {input.train} "
        "--val-tokens {input.val} --out-dir {params.out_dir} --preflight {input.preflight} "
        "--compile {resources.compile} --compile-mode {resources.compile_mode} "
        "--trackers {resources.trackers} --head-loss {resources.head_loss} > {log} 2>&1"


# train.fuse_seeds: a config's seeds (FUSED, above) trained as one ensemble by one job, each
# run's outputs in its own directory as rule `train` writes them; evaluate reads them as any
# run's. The resume state is the group's (results/<preset>/fused/<group>/last.pt).
rule train_fused:
    input:
        specs=lambda wc: [f"{RESULTS}/specs/run/{r}.json" for r in FUSED[wc.group]],
        train=f"{TOKENS}/train.parquet",
        val=f"{TOKENS}/validation.parquet",
        preflight=run_preflight(FUSED_FIRST, "group"),
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
    threads: LM_THREADS
    resources:
        **execution(LM_PART),
        **estimated("train", LM_RUNS, "group", LM_FILES, FUSED),
        gpu=1,
        runs_per_gpu=RUNS_PER_GPU,
    params:
        code=lambda wc: code_of("grassflow.lm.train", LM_RUNS[FUSED[wc.group][0]]["model_kind"]),
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
        preflight=run_preflight(LM_RUNS, "run"),
    output:
        f"{RESULTS}/runs/{{run}}/eval.json",
    log:
        f"{RESULTS}/logs/evaluate/{{run}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/evaluate/{{run}}.tsv"
    wildcard_constraints:
        run=alternatives(r for r in LM_RUNS if r not in FINISHED),  # adopt_run's, those
    conda:
        "../../envs/train.yaml"
    threads: LM_THREADS
    resources:
        **estimated("evaluate", LM_RUNS, "run", LM_FILES),
        gpu=1,
        runs_per_gpu=RUNS_PER_GPU,
    params:
        code=lambda wc: code_of("grassflow.lm.evaluate", LM_RUNS[wc.run]["model_kind"]),
    shell:
        "OMP_NUM_THREADS={threads} GRASSFLOW_RUNS_PER_GPU={resources.runs_per_gpu} "
        "python -m grassflow.lm.evaluate --weights {input.weights} --run-json {input.record} "
        "--val-tokens {input.val} --test-tokens {input.test} --out {output} "
        "--val-docs {input.validation_docs} --test-docs {input.test_docs} > {log} 2>&1"


# A run finished elsewhere (config finished_runs: a lease's committed records, another machine's):
# its records checked to be this run's (spec, data) and copied where the tables read every run's
rule adopt_run:
    input:
        spec=spec("run", "run"),
        records=lambda wc: [
            f"{FINISHED[wc.run]}/{f}" for f in ("run.json", "eval.json", "metrics.jsonl")
        ],
        train=f"{TOKENS}/train.parquet",
        val=f"{TOKENS}/validation.parquet",
        test=f"{TOKENS}/test.parquet",
        validation_docs=f"{TOKENS}/docs/validation.parquet",
        test_docs=f"{TOKENS}/docs/test.parquet",
    output:
        record=f"{RESULTS}/runs/{{run}}/run.json",
        metrics=f"{RESULTS}/runs/{{run}}/metrics.jsonl",
        evals=f"{RESULTS}/runs/{{run}}/eval.json",
        adopted=f"{RESULTS}/runs/{{run}}/adopted.json",
    log:
        f"{RESULTS}/logs/adopt_run/{{run}}.log",
    wildcard_constraints:
        run=alternatives(FINISHED),
    localrule: True
    conda:
        "../../envs/report.yaml"
    params:
        records=lambda wc: FINISHED[wc.run],
        out_dir=lambda wc, output: Path(output.record).parent,
        code=code_of("grassflow.lm.adopt"),
    shell:
        "python -m grassflow.lm.adopt --spec {input.spec} --records {params.records} --out-dir {params.out_dir} "
        "--train {input.train} --validation {input.val} --test {input.test} "
        "--validation-docs {input.validation_docs} --test-docs {input.test_docs} > {log} 2>&1"


# Its tables: the unigram baseline, the scaling benchmark on the device the training jobs use
# (train.device; under profiles/slurm a `gpu` node), then one table per experiment, the summary and
# the ablation table.


# The unigram baseline of the evaluation tokens (training-split counts): the perplexity a model
# must beat to have learned anything; the tables mark runs that do not.
rule unigram:
    input:
        train=f"{TOKENS}/train.parquet",
        val=f"{TOKENS}/validation.parquet",
        test=f"{TOKENS}/test.parquet",
    output:
        f"{TOKENS}/unigram.json",
    log:
        f"{RESULTS}/logs/unigram.log",
    conda:
        "../../envs/data.yaml"
    params:
        code=code_of("grassflow.lm.unigram"),
    shell:
        "python -m grassflow.lm.unigram --train-tokens {input.train} --val-tokens {input.val} --test-tokens {input.test} "
        "--out {output} > {log} 2>&1"


rule bench:
    input:
        preflight=preflight_file(LM_TRAIN.get("device", "cpu")),
    output:
        f"{RESULTS}/bench/bench.json",
    log:
        f"{RESULTS}/logs/bench.log",
    benchmark:
        f"{RESULTS}/benchmarks/bench.tsv"
    conda:
        "../../envs/train.yaml"
    threads: LM_THREADS
    resources:
        gpu=1,
        runs_per_gpu=RUNS_PER_GPU,
    params:
        out_dir=lambda wc, output: Path(output[0]).parent,
        quick="--quick" if BENCH.get("quick") else "",
        lengths=",".join(map(str, BENCH.get("lengths", []))),
        device=LM_TRAIN.get("device", "cpu"),
        code=code_of("grassflow.bench", *MODEL_KINDS),
    shell:
        "OMP_NUM_THREADS={threads} GRASSFLOW_RUNS_PER_GPU={resources.runs_per_gpu} python -m grassflow.bench {params.quick} --device {params.device} --lengths {params.lengths} --out {params.out_dir} --name bench > {log} 2>&1"


rule aggregate:  # one experiment's table: a table's target plans only its own runs
    input:
        evals=lambda wc: run_files(RESULTS, EXP_RUNS[wc.exp], "eval.json"),
        records=lambda wc: run_files(RESULTS, EXP_RUNS[wc.exp], "run.json"),
        metrics=lambda wc: run_files(RESULTS, EXP_RUNS[wc.exp], "metrics.jsonl"),
        # this experiment only: the other tables', the other tasks', ablation edits (and
        # train.threads) leave this table alone
        preset=spec("aggregate", "exp"),
        unigram=f"{TOKENS}/unigram.json",
        checksums=f"{RAW}/checksums.json",
        published=PUBLISHED,
    output:
        shown(experiment_tables("{exp}"), "Tables"),
        shown(experiment_figures("{exp}"), "Figures"),
    log:
        f"{RESULTS}/logs/aggregate/{{exp}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/aggregate/{{exp}}.tsv"
    conda:
        "../../envs/report.yaml"
    params:
        preset_name=PRESET,
        out_dir=lambda wc, output: Path(output[0]).parent,
        runs=lambda wc: " ".join(f"{RESULTS}/runs/{r}" for r in EXP_RUNS[wc.exp]),
        code=code_of("grassflow.report.aggregate"),
    shell:
        "python -m grassflow.report.aggregate --preset {input.preset} --preset-name {params.preset_name} --experiment {wildcards.exp} "
        "--runs {params.runs} --unigram {input.unigram} --checksums {input.checksums} "
        "--published {input.published} --out-dir {params.out_dir} > {log} 2>&1"


rule summary:
    input:
        tables=[f"{REPORT}/{exp}.md" for exp in EXPERIMENTS],
        figures=[f for exp in EXPERIMENTS for f in experiment_figures(exp)],
        bench=f"{RESULTS}/bench/bench.json",
    output:
        shown([f"{REPORT}/summary.md"], "Summary"),
        shown([f"{REPORT}/scaling.png"], "Figures"),
    log:
        f"{RESULTS}/logs/summary.log",
    conda:
        "../../envs/report.yaml"
    params:
        preset_name=PRESET,
        out_dir=lambda wc, output: Path(output[0]).parent,
        code=code_of("grassflow.report.summary"),
    shell:
        "python -m grassflow.report.summary --preset-name {params.preset_name} --tables {input.tables} --bench {input.bench} "
        "--out-dir {params.out_dir} > {log} 2>&1"


# `snakemake table1`, `snakemake table2`: that table, its runs and their data
rule table1:
    input:
        EXPERIMENT_OUTPUTS.get("table1", []),


rule table2:
    input:
        EXPERIMENT_OUTPUTS.get("table2", []),


rule ablation_aggregate:
    input:
        evals=run_files(RESULTS, ABLATION_RUNS, "eval.json"),
        records=run_files(RESULTS, ABLATION_RUNS, "run.json"),
        unigram=f"{TOKENS}/unigram.json",
        checksums=f"{RAW}/checksums.json",
        published=PUBLISHED,
        # what the table reads of the preset: editing another experiment leaves it alone
        preset=spec("ablations/preset"),
        grid=spec("ablations/grid"),
    output:
        shown(ABLATION_FILES, "Ablations"),
    log:
        f"{RESULTS}/logs/ablation_aggregate.log",
    conda:
        "../../envs/report.yaml"
    params:
        preset_name=PRESET,
        out_dir=lambda wc, output: Path(output[0]).parent,
        runs_dir=lambda wc, input: Path(input.records[0]).parent.parent,
        code=code_of("grassflow.report.ablations"),
    shell:
        "python -m grassflow.report.ablations --preset {input.preset} --preset-name {params.preset_name} --grid {input.grid} "
        "--runs-dir {params.runs_dir} --unigram {input.unigram} --checksums {input.checksums} "
        "--published {input.published} --out-dir {params.out_dir} > {log} 2>&1"


rule ablations:  # `snakemake ablations`: just the grid, its runs and its table
    input:
        ABLATION_OUTPUTS,


rule lm:  # `snakemake lm`: every LM table and figure, every run's evaluation, their data
    input:
        LM_OUTPUTS,
        run_files(RESULTS, LM_RUNS, "eval.json"),
