# Stage 5: the scaling benchmark on the device the training jobs use (train.device; under
# profiles/slurm a `gpu` node), then tables, figures, summary.


rule bench:
    input:
        preflight=preflight_file(P["train"]["device"]),
    output:
        f"{RES}/bench/bench.json",
    threads: P["train"]["threads"]
    params:
        gf=GF,
        out_dir=lambda wc, output: Path(output[0]).parent,
        quick="--quick" if P["bench"]["quick"] else "",
        lengths=",".join(map(str, P["bench"]["lengths"])),
        device=P["train"]["device"],
        code=code_of("bench", *MODEL_KINDS),
    resources:
        gpu=1,
    conda:
        "../../envs/train.yaml"
    log:
        f"{RES}/logs/bench.log",
    benchmark:
        f"{RES}/benchmarks/bench.tsv"
    shell:
        "OMP_NUM_THREADS={threads} {params.gf} bench {params.quick} --device {params.device} --lengths {params.lengths} --out {params.out_dir} --name bench > {log} 2>&1"


rule aggregate:
    input:
        evals=run_outputs("eval.json"),
        records=run_outputs("run.json"),
        metrics=run_outputs("metrics.jsonl"),
        bench=f"{RES}/bench/bench.json",
        unigram=f"{TOKENS}/unigram.json",
        checksums=f"{RAW}/checksums.json",
        published=PUBLISHED,
    output:
        tables=[report(t, category="Tables", labels={"table": Path(t).name}) for t in table_outputs()],
        figures=[report(f, caption="../report/figure.rst", category="Figures",
                        labels={"figure": Path(f).stem}) for f in figure_outputs()],
        summary=report(f"{REPORT}/summary.md", caption="../report/summary.rst", category="Summary",
                       labels={"table": "summary"}),
    params:
        gf=GF,
        preset_name=PRESET,
        out_dir=lambda wc, output: Path(output.summary).parent,
        # SNLI, ablation and recall edits (and train.threads) leave these tables alone
        preset=quoted_json({k: run_train(v) if k == "train" else v for k, v in P.items()
                            if k not in ("snli", "ablations", "recall")}),
        runs=" ".join(f"{RES}/runs/{r}" for r in MAIN_RUNS),
        code=code_of("aggregate"),
    conda:
        "../../envs/report.yaml"
    log:
        f"{RES}/logs/aggregate.log",
    benchmark:
        f"{RES}/benchmarks/aggregate.tsv"
    shell:
        "{params.gf} aggregate --preset {params.preset} --preset-name {params.preset_name} "
        "--runs {params.runs} --bench {input.bench} --unigram {input.unigram} --checksums {input.checksums} "
        "--published {input.published} --out-dir {params.out_dir} > {log} 2>&1"


if ABLATIONS:

    rule ablation_aggregate:
        input:
            evals=run_outputs("eval.json", ABLATION_RUNS),
            records=run_outputs("run.json", ABLATION_RUNS),
            unigram=f"{TOKENS}/unigram.json",
            checksums=f"{RAW}/checksums.json",
            published=PUBLISHED,
        output:
            tables=[report(t, category="Ablations", labels={"table": Path(t).name})
                    for t in ablation_outputs() if not t.endswith(".png")],
            figure=report(f"{REPORT}/ablations.png", caption="../report/ablations.rst", category="Ablations",
                          labels={"figure": "ablations"}),
        params:
            gf=GF,
            preset_name=PRESET,
            out_dir=lambda wc, output: Path(output.figure).parent,
            runs_dir=lambda wc, input: Path(input.records[0]).parent.parent,
            # what the table reads of the preset: editing another experiment leaves it alone
            preset=quoted_json({**{k: P[k] for k in ("data", "tokenizer", "models", "model", "ablations")},
                                "model_overrides": P.get("model_overrides") or {}, "train": run_train(P["train"]),
                                "experiments": {P["ablations"]["base"]: P["experiments"][P["ablations"]["base"]]}}),
            grid=quoted_json(ABLATIONS),
            code=code_of("ablations"),
        conda:
            "../../envs/report.yaml"
        log:
            f"{RES}/logs/ablation_aggregate.log",
        shell:
            "{params.gf} ablations --preset {params.preset} --preset-name {params.preset_name} --grid {params.grid} "
            "--runs-dir {params.runs_dir} --unigram {input.unigram} --checksums {input.checksums} "
            "--published {input.published} --out-dir {params.out_dir} > {log} 2>&1"

    rule ablations:  # `snakemake ablations`: just the grid, its runs and its table
        input:
            ablation_outputs(),
