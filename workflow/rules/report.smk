# The language-modelling part's tables (Tables 1-2, the ablations): the unigram baseline, the scaling
# benchmark on the device the training jobs use (train.device; under profiles/slurm a `gpu` node),
# then one table per experiment, the summary and the ablation table.


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
    threads: THREADS["lm"]
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
        evals=lambda wc: run_outputs("eval.json", EXP_RUNS[wc.exp]),
        records=lambda wc: run_outputs("run.json", EXP_RUNS[wc.exp]),
        metrics=lambda wc: run_outputs("metrics.jsonl", EXP_RUNS[wc.exp]),
        # this experiment only: the other tables', the other tasks', ablation edits (and
        # train.threads) leave this table alone
        preset=spec("aggregate", "exp"),
        unigram=f"{TOKENS}/unigram.json",
        checksums=f"{RAW}/checksums.json",
        published=PUBLISHED,
    output:
        tables=[
            report(
                f"{REPORT}/{{exp}}.{ext}", category="Tables", labels={"table": f"{{exp}}.{ext}"}
            )
            for ext in ("md", "csv", "tex")
        ],
        figures=[
            report(
                f"{REPORT}/{kind}_{{exp}}.png",
                caption="../report/figure.rst",
                category="Figures",
                labels={"figure": f"{kind}_{{exp}}"},
            )
            for kind in ("curves", "best_ppl")
        ],
    log:
        f"{RESULTS}/logs/aggregate/{{exp}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/aggregate/{{exp}}.tsv"
    conda:
        "../../envs/report.yaml"
    params:
        preset_name=PRESET,
        out_dir=lambda wc, output: Path(output.tables[0]).parent,
        runs=lambda wc: " ".join(f"{RESULTS}/runs/{r}" for r in EXP_RUNS[wc.exp]),
        code=code_of("grassflow.report.aggregate"),
    shell:
        "python -m grassflow.report.aggregate --preset {input.preset} --preset-name {params.preset_name} --experiment {wildcards.exp} "
        "--runs {params.runs} --unigram {input.unigram} --checksums {input.checksums} "
        "--published {input.published} --out-dir {params.out_dir} > {log} 2>&1"


rule summary:
    input:
        tables=[f"{REPORT}/{exp}.md" for exp in EXPERIMENTS],
        figures=[f for e in EXPERIMENTS for f in experiment_outputs(e) if f.endswith(".png")],
        bench=f"{RESULTS}/bench/bench.json",
    output:
        summary=report(
            f"{REPORT}/summary.md",
            caption="../report/summary.rst",
            category="Summary",
            labels={"table": "summary"},
        ),
        scaling=report(
            f"{REPORT}/scaling.png",
            caption="../report/figure.rst",
            category="Figures",
            labels={"figure": "scaling"},
        ),
    log:
        f"{RESULTS}/logs/summary.log",
    conda:
        "../../envs/report.yaml"
    params:
        preset_name=PRESET,
        out_dir=lambda wc, output: Path(output.summary).parent,
        code=code_of("grassflow.report.summary"),
    shell:
        "python -m grassflow.report.summary --preset-name {params.preset_name} --tables {input.tables} --bench {input.bench} "
        "--out-dir {params.out_dir} > {log} 2>&1"


# `snakemake table1`, `snakemake table2`: that table, its runs and their data
rule table1:
    input:
        experiment_outputs("table1"),


rule table2:
    input:
        experiment_outputs("table2"),


rule ablation_aggregate:
    input:
        evals=run_outputs("eval.json", ABLATION_RUNS),
        records=run_outputs("run.json", ABLATION_RUNS),
        unigram=f"{TOKENS}/unigram.json",
        checksums=f"{RAW}/checksums.json",
        published=PUBLISHED,
        # what the table reads of the preset: editing another experiment leaves it alone
        preset=spec("ablations/preset"),
        grid=spec("ablations/grid"),
    output:
        tables=[
            report(
                f"{REPORT}/ablations.{ext}",
                category="Ablations",
                labels={"table": f"ablations.{ext}"},
            )
            for ext in ("md", "csv", "tex")
        ],
        figure=report(
            f"{REPORT}/ablations.png",
            caption="../report/ablations.rst",
            category="Ablations",
            labels={"figure": "ablations"},
        ),
    log:
        f"{RESULTS}/logs/ablation_aggregate.log",
    conda:
        "../../envs/report.yaml"
    params:
        preset_name=PRESET,
        out_dir=lambda wc, output: Path(output.figure).parent,
        runs_dir=lambda wc, input: Path(input.records[0]).parent.parent,
        code=code_of("grassflow.report.ablations"),
    shell:
        "python -m grassflow.report.ablations --preset {input.preset} --preset-name {params.preset_name} --grid {input.grid} "
        "--runs-dir {params.runs_dir} --unigram {input.unigram} --checksums {input.checksums} "
        "--published {input.published} --out-dir {params.out_dir} > {log} 2>&1"


rule ablations:  # `snakemake ablations`: just the grid, its runs and its table
    input:
        ablation_outputs(),
