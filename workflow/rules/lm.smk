# Language modelling (the paper's Tables 1-2 and the ablations), the preset itself where it has
# experiments:
#   download → (train_tokenizer, for tokenizer.name: trained) → tokenize → train → evaluate
#   → aggregate (a table per experiment), summary, ablation_aggregate
# and documents: the evaluation splits as lm-evaluation-harness's documents, which evaluate reads;
# unigram: the baseline a model must beat; bench: the scaling benchmark. `snakemake lm`: its tables;
# `snakemake table1`, `table2`, `ablations`: one table, its runs, their data. download is local (it
# runs where Snakemake runs): on clusters only the login node has the internet. A run's spec is its
# `spec` param: all it computes from; its `code` param the hash of the code it runs, of its own
# model kind only (common.smk): a Grassmann edit reruns Grassmann runs only.
from grassflow.lm.layout import experiment_figures, fused_dir, lm_layout, table_files

# its names (grassflow.lm.layout)
LM = lm_layout(PRESET, PRESET_CFG, config, TASK_RUNS["lm"], RESULTS)
# the paper's setup, its published numbers
PUBLISHED = own_file("workflow/resources/published.yaml")


wildcard_constraints:
    run=alternatives(LM.runs),
    exp=alternatives(LM.experiments),


rule download:
    output:
        raw=expand(f"{LM.raw}/{{split}}.parquet", split=SPLITS),
        checksums=f"{LM.raw}/checksums.json",
    log:
        f"{RESULTS}/logs/download.log",
    benchmark:
        f"{RESULTS}/benchmarks/download.tsv"
    localrule: True
    conda:
        "../../envs/data.yaml"
    params:
        stage="grassflow.lm.download",
        data=as_json(PRESET_CFG.get("data")),
        out_dir=lambda wc, output: Path(output.checksums).parent,
        code=code_of("grassflow.lm.download"),
    shell:
        "python -m {params.stage} --data {params.data:q} --out-dir {params.out_dir} > {log} 2>&1"


rule train_tokenizer:
    input:
        f"{LM.raw}/train.parquet",
    output:
        f"{RESULTS}/data/tokenizer/trained/tokenizer.json",
    log:
        f"{RESULTS}/logs/train_tokenizer.log",
    benchmark:
        f"{RESULTS}/benchmarks/train_tokenizer.tsv"
    conda:
        "../../envs/data.yaml"
    params:
        stage="grassflow.lm.train_tokenizer",
        vocab_size=lambda wc: PRESET_CFG["tokenizer"]["vocab_size"],
        code=code_of("grassflow.lm.train_tokenizer"),
    shell:
        "python -m {params.stage} --train {input} --vocab-size {params.vocab_size} --out {output} > {log} 2>&1"


rule tokenize:
    input:
        raw=expand(f"{LM.raw}/{{split}}.parquet", split=SPLITS),
        artifact=tokenizer_artifact(LM.part, RESULTS),
    output:
        expand(f"{LM.tokens}/{{split}}.parquet", split=SPLITS),
    log:
        f"{RESULTS}/logs/tokenize.log",
    benchmark:
        f"{RESULTS}/benchmarks/tokenize.tsv"
    conda:
        "../../envs/data.yaml"
    params:
        stage="grassflow.lm.tokenize",
        tokenizer=as_json(LM.tokenizer),
        out_dir=lambda wc, output: Path(output[0]).parent,
        artifact=artifact_args(LM.part, RESULTS),
        code=code_of("grassflow.lm.tokenize"),
    shell:
        "python -m {params.stage} --tokenizer {params.tokenizer:q} {params.artifact} "
        "--raw {input.raw} --out-dir {params.out_dir} > {log} 2>&1"


use rule tokenize as documents with:
    input:  # a reused rule's input is replaced whole (its params are merged)
        raw=[f"{LM.raw}/validation.parquet", f"{LM.raw}/test.parquet"],
        artifact=tokenizer_artifact(LM.part, RESULTS),
    output:
        [f"{LM.tokens}/docs/validation.parquet", f"{LM.tokens}/docs/test.parquet"],
    log:
        f"{RESULTS}/logs/documents.log",
    benchmark:
        f"{RESULTS}/benchmarks/documents.tsv"
    params:
        stage="grassflow.lm.documents",
        code=code_of("grassflow.lm.documents"),


rule train:  # every task's training job (snli_train, recall_train: this rule with their files)
    input:
        **LM.train_inputs,
        preflight=run_preflight(LM.runs, "run"),
    output:
        **run_outputs(f"{RESULTS}/runs/{{run}}"),
    log:
        f"{RESULTS}/logs/train/{{run}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/train/{{run}}.tsv"
    wildcard_constraints:
        # the runs of a fused group are trained by train_fused, those finished elsewhere adopted
        run=alternatives(r for r in LM.runs if r not in LM.fused_runs and r not in LM.finished),
    conda:
        "../../envs/train.yaml"
    threads: THREADS["lm"]
    resources:
        **run_resources("lm", "train", LM.runs, "run", LM.files),
    params:
        stage="grassflow.lm.train",
        spec=lambda wc: quoted_json([LM.runs[wc.run]]),
        code=lambda wc: code_of("grassflow.lm.train", LM.runs[wc.run]["model_kind"]),
        out_dir=f"{RESULTS}/runs/{{run}}",
        # a param made from the job's resources is no rerun trigger (Snakemake: a derived param), as
        # train.head_loss must not be: it says how the job runs, not what it computes
        extra=lambda wc, resources: f"--head-loss {resources.head_loss}",
    shell:
        "python -m {params.stage} --spec {params.spec} --train-tokens {input.train} "
        "--val-tokens {input.val} --out-dir {params.out_dir} --preflight {input.preflight} "
        "--compile {resources.compile} --compile-mode {resources.compile_mode} "
        "--trackers {resources.trackers} --code {params.code} {params.extra} > {log} 2>&1"


# train.fuse_seeds: a config's seeds (LM.fused) trained as one ensemble by one job, each run's
# outputs in its own directory as rule `train` writes them; evaluate reads them as any run's. The
# resume state is the group's (results/<preset>/fused/<group>/last.pt).
use rule train as train_fused with:
    input:
        **LM.train_inputs,
        preflight=run_preflight(LM.fused_first, "group"),
    output:
        **{
            f"{k}_s{seed}": f
            for seed in LM.fused_seeds
            for k, f in run_outputs(f"{RESULTS}/runs/{{group}}-s{seed}").items()
        },
    log:
        f"{RESULTS}/logs/train_fused/{{group}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/train_fused/{{group}}.tsv"
    wildcard_constraints:
        group=alternatives(LM.fused),
    resources:
        **run_resources("lm", "train", LM.runs, "group", LM.files, LM.fused),
    params:
        spec=lambda wc: quoted_json(LM.runs[r] for r in LM.fused[wc.group]),
        code=lambda wc: code_of("grassflow.lm.train", LM.fused_first[wc.group]["model_kind"]),
        out_dir=lambda wc: " ".join(f"{RESULTS}/runs/{r}" for r in LM.fused[wc.group]),
        extra=lambda wc, resources: f"--work-dir {fused_dir(RESULTS, wc.group)} --head-loss {resources.head_loss}",


rule evaluate:  # every task's evaluation job (snli_evaluate, recall_evaluate: this rule with their files)
    input:
        **LM.eval_inputs,
        weights=f"{RESULTS}/runs/{{run}}/model.safetensors",
        config=f"{RESULTS}/runs/{{run}}/config.json",
        record=f"{RESULTS}/runs/{{run}}/run.json",
        preflight=run_preflight(LM.runs, "run"),
    output:
        f"{RESULTS}/runs/{{run}}/eval.json",
    log:
        f"{RESULTS}/logs/evaluate/{{run}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/evaluate/{{run}}.tsv"
    wildcard_constraints:
        run=alternatives(r for r in LM.runs if r not in LM.finished),  # adopt_run's, those
    conda:
        "../../envs/train.yaml"
    threads: THREADS["lm"]
    resources:
        **run_resources("lm", "evaluate", LM.runs, "run", LM.files),
    params:
        stage="grassflow.lm.evaluate",
        code=lambda wc: code_of("grassflow.lm.evaluate", LM.runs[wc.run]["model_kind"]),
        extra=lambda wc, input: f"--val-docs {input.validation_docs} --test-docs {input.test_docs}",
    shell:
        "python -m {params.stage} --weights {input.weights} --run-json {input.record} "
        "--val-tokens {input.val} --test-tokens {input.test} --out {output} {params.extra} > {log} 2>&1"


# A run finished elsewhere (config finished_runs: a lease's committed records, another machine's):
# its records checked to be this run's (spec, data) and copied where the tables read every run's
rule adopt_run:
    input:
        **LM.eval_inputs,
        records=lambda wc: [
            f"{LM.finished[wc.run]}/{f}" for f in ("run.json", "eval.json", "metrics.jsonl")
        ],
        train=f"{LM.tokens}/train.parquet",
    output:
        record=f"{RESULTS}/runs/{{run}}/run.json",
        metrics=f"{RESULTS}/runs/{{run}}/metrics.jsonl",
        evals=f"{RESULTS}/runs/{{run}}/eval.json",
        adopted=f"{RESULTS}/runs/{{run}}/adopted.json",
    log:
        f"{RESULTS}/logs/adopt_run/{{run}}.log",
    wildcard_constraints:
        run=alternatives(LM.finished),
    localrule: True
    conda:
        "../../envs/report.yaml"
    params:
        spec=lambda wc: as_json(LM.runs[wc.run]),
        records=lambda wc: LM.finished[wc.run],
        out_dir=lambda wc, output: Path(output.record).parent,
        code=code_of("grassflow.lm.adopt"),
    shell:
        "python -m grassflow.lm.adopt --spec {params.spec:q} --records {params.records} --out-dir {params.out_dir} "
        "--train {input.train} --validation {input.val} --test {input.test} "
        "--validation-docs {input.validation_docs} --test-docs {input.test_docs} > {log} 2>&1"


# Its tables: the unigram baseline, the scaling benchmark on the device the training jobs use
# (train.device; under profiles/slurm a `gpu` node), then one table per experiment, the summary and
# the ablation table.


# The unigram baseline of the evaluation tokens (training-split counts): the perplexity a model must
# beat to have learned anything; the tables mark runs that do not.
rule unigram:
    input:
        **LM.train_inputs,
        test=LM.eval_inputs["test"],
    output:
        f"{LM.tokens}/unigram.json",
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
        preflight=preflight_file(LM.train.get("device", "cpu")),
    output:
        f"{RESULTS}/bench/bench.json",
    log:
        f"{RESULTS}/logs/bench.log",
    benchmark:
        f"{RESULTS}/benchmarks/bench.tsv"
    conda:
        "../../envs/train.yaml"
    threads: THREADS["lm"]
    resources:
        **GPU,
    params:
        out_dir=lambda wc, output: Path(output[0]).parent,
        quick="--quick" if LM.bench.get("quick") else "",
        lengths=",".join(map(str, LM.bench.get("lengths", []))),
        device=LM.train.get("device", "cpu"),
        code=code_of("grassflow.bench", *MODEL_KINDS),
    shell:
        "python -m grassflow.bench {params.quick} --device {params.device} --lengths {params.lengths} --out {params.out_dir} --name bench > {log} 2>&1"


rule aggregate:  # one experiment's table: a table's target plans only its own runs
    input:
        evals=lambda wc: run_files(RESULTS, LM.exp_runs[wc.exp], "eval.json"),
        records=lambda wc: run_files(RESULTS, LM.exp_runs[wc.exp], "run.json"),
        metrics=lambda wc: run_files(RESULTS, LM.exp_runs[wc.exp], "metrics.jsonl"),
        unigram=f"{LM.tokens}/unigram.json",
        checksums=f"{LM.raw}/checksums.json",
        published=PUBLISHED,
    output:
        shown(table_files(REPORT, "{exp}"), "Tables"),
        shown(experiment_figures(REPORT, "{exp}"), "Figures"),
    log:
        f"{RESULTS}/logs/aggregate/{{exp}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/aggregate/{{exp}}.tsv"
    conda:
        "../../envs/report.yaml"
    params:
        # what a table reads of the preset (what each run ran: its record), so that another table's,
        # the other tasks', ablation and execution edits leave this table alone
        preset=as_json(LM.table_preset),
        preset_name=PRESET,
        out_dir=lambda wc, output: Path(output[0]).parent,
        runs=lambda wc: " ".join(f"{RESULTS}/runs/{r}" for r in LM.exp_runs[wc.exp]),
        code=code_of("grassflow.lm.aggregate"),
    shell:
        "python -m grassflow.lm.aggregate --preset {params.preset:q} --preset-name {params.preset_name} --experiment {wildcards.exp} "
        "--runs {params.runs} --unigram {input.unigram} --checksums {input.checksums} "
        "--published {input.published} --out-dir {params.out_dir} > {log} 2>&1"


rule summary:
    input:
        tables=[f"{REPORT}/{exp}.md" for exp in LM.experiments],
        figures=[f for exp in LM.experiments for f in experiment_figures(REPORT, exp)],
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
        code=code_of("grassflow.lm.summary"),
    shell:
        "python -m grassflow.lm.summary --preset-name {params.preset_name} --tables {input.tables} --bench {input.bench} "
        "--out-dir {params.out_dir} > {log} 2>&1"


# `snakemake table1`, `snakemake table2`: that table, its runs and their data
rule table1:
    input:
        LM.exp_outputs.get("table1", []),


rule table2:
    input:
        LM.exp_outputs.get("table2", []),


rule ablation_aggregate:
    input:
        evals=run_files(RESULTS, LM.ablation_runs, "eval.json"),
        records=run_files(RESULTS, LM.ablation_runs, "run.json"),
        unigram=f"{LM.tokens}/unigram.json",
        checksums=f"{LM.raw}/checksums.json",
        published=PUBLISHED,
    output:
        shown(LM.ablation_files, "Ablations"),
    log:
        f"{RESULTS}/logs/ablation_aggregate.log",
    conda:
        "../../envs/report.yaml"
    params:
        # what the table reads of the preset: editing another experiment leaves it alone
        preset=as_json(LM.ablations_preset),
        grid=as_json(LM.ablations),
        preset_name=PRESET,
        out_dir=lambda wc, output: Path(output[0]).parent,
        runs_dir=lambda wc, input: Path(input.records[0]).parent.parent,
        code=code_of("grassflow.lm.ablations"),
    shell:
        "python -m grassflow.lm.ablations --preset {params.preset:q} --preset-name {params.preset_name} --grid {params.grid:q} "
        "--runs-dir {params.runs_dir} --unigram {input.unigram} --checksums {input.checksums} "
        "--published {input.published} --out-dir {params.out_dir} > {log} 2>&1"


rule ablations:  # `snakemake ablations`: just the grid, its runs and its table
    input:
        LM.ablation_outputs,


# The preset's sweep: one setting's values, both models; each model's value chosen on validation,
# the tuned gap on test (grassflow.lm.sweep)
rule sweep_aggregate:
    input:
        evals=run_files(RESULTS, LM.sweep_runs, "eval.json"),
        records=run_files(RESULTS, LM.sweep_runs, "run.json"),
        metrics=run_files(RESULTS, LM.sweep_runs, "metrics.jsonl"),
        unigram=f"{LM.tokens}/unigram.json",
        checksums=f"{LM.raw}/checksums.json",
        published=PUBLISHED,
    output:
        shown(LM.sweep_files, "Sweep"),
    log:
        f"{RESULTS}/logs/sweep_aggregate.log",
    conda:
        "../../envs/report.yaml"
    params:
        preset=as_json(LM.sweep_preset),
        grid=as_json(LM.sweep),
        preset_name=PRESET,
        out_dir=lambda wc, output: Path(output[0]).parent,
        runs_dir=lambda wc, input: Path(input.records[0]).parent.parent,
        code=code_of("grassflow.lm.sweep"),
    shell:
        "python -m grassflow.lm.sweep --preset {params.preset:q} --preset-name {params.preset_name} --grid {params.grid:q} "
        "--runs-dir {params.runs_dir} --unigram {input.unigram} --checksums {input.checksums} "
        "--published {input.published} --out-dir {params.out_dir} > {log} 2>&1"


rule sweep:  # `snakemake sweep`: just the sweep, its runs and its table
    input:
        LM.sweep_files,


rule lm:  # `snakemake lm`: every LM table and figure, every run's evaluation, their data
    input:
        LM.outputs,
        run_files(RESULTS, LM.runs, "eval.json"),
