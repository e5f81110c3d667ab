# Stage 5: the scaling benchmark on the device the training jobs use (train.device; under
# profiles/slurm a `gpu` node), then tables, figures, summary.


rule bench:
    input:
        preflight=preflight_file(P["train"]["device"]),
    output:
        f"{RES}/bench/bench.json",
    params:
        quick="--quick" if P["bench"]["quick"] else "",
        device=P["train"]["device"],
        code=fingerprint("bench", "model", "transformer", "grassmann"),
    resources:
        gpu=1,
    conda:
        "../../envs/train.yaml"
    log:
        f"{RES}/logs/bench.log",
    benchmark:
        f"{RES}/benchmarks/bench.tsv"
    shell:
        "{GF}.bench {params.quick} --device {params.device} --out {RES}/bench --name bench > {log} 2>&1"


rule aggregate:
    input:
        evals=run_outputs("eval.json"),
        records=run_outputs("run.json"),
        metrics=run_outputs("metrics.jsonl"),
        bench=f"{RES}/bench/bench.json",
    output:
        tables=[report(t, category="Tables", labels={"table": Path(t).name}) for t in table_outputs()],
        figures=[report(f, caption="../report/figure.rst", category="Figures",
                        labels={"figure": Path(f).stem}) for f in figure_outputs()],
        summary=report(f"{REPORT}/summary.md", caption="../report/summary.rst", category="Summary",
                       labels={"table": "summary"}),
    params:
        preset=quoted_json({k: v for k, v in P.items() if k != "snli"}),  # SNLI edits leave these alone
        runs=" ".join(f"{RES}/runs/{r}" for r in RUNS),
        code=fingerprint("report"),
    conda:
        "../../envs/report.yaml"
    log:
        f"{RES}/logs/aggregate.log",
    benchmark:
        f"{RES}/benchmarks/aggregate.tsv"
    shell:
        "{GF} aggregate --preset {params.preset} --preset-name {PRESET} "
        "--runs {params.runs} --bench {input.bench} --out-dir {REPORT} > {log} 2>&1"
