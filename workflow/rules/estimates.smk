# Estimated against measured: every training and evaluation job's estimate (the time limit and
# memory it asked for, grassflow.pipeline.estimate) beside its wall time from Snakemake's benchmark files,
# per job and per rule, so workflow/resources/throughput.csv can be corrected with real numbers.


rule estimates:
    input:
        benchmarks=lambda wc: estimate_benchmarks(),
        preset=spec("estimates/preset"),
        estimate=spec("estimates/estimate"),
    output:
        md=report(f"{REPORT}/estimates.md", category="Summary", labels={"table": "estimates"}),
        csv=f"{REPORT}/estimates.csv",
    log:
        f"{RESULTS}/logs/estimates.log",
    conda:
        "../../envs/report.yaml"
    params:
        preset_name=PRESET,
        results=lambda wc, output: Path(output.md).parent.parent,
        code=code_of("grassflow.pipeline.estimates_report"),
    shell:
        "python -m grassflow.pipeline.estimates_report --preset {input.preset} --preset-name {params.preset_name} "
        "--estimate {input.estimate} --results {params.results} --out {output.md} > {log} 2>&1"
