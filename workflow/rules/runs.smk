# Stages 3 and 4 of every task (grassflow.tasks): one training job per run, after the preflight
# of its device and op backend (whose record it keeps in run.json; see common.smk), then the
# evaluation of its best weights (model.safetensors with its config.json). The run's spec file holds all it depends on; the code param
# the hash of the code it runs, of its own model kind only: changing a Grassmann setting or file
# reruns Grassmann runs only. Rules: train, evaluate (LM), snli_train, ..., recall_evaluate.


def _run_rules(task, data):
    """The train and evaluate rules of `task`: `data(split)` is a run's token file of a split (a
    path, or a function of the wildcards); the directories its runs need (task_dirs) are inputs
    of both jobs, passed as `--<name>-dir`."""
    run_dir = f"{task.results(RES)}/runs/{{{task.wildcard}}}"
    logs = f"{RES}/logs/{task.subdir}"
    runs_of = TASK_RUNS[task.name]
    kind = lambda wc: runs_of[getattr(wc, task.wildcard)]["model_kind"]  # noqa: E731
    extra_input = task_dirs(task)
    extra_arg = lambda wc: " ".join(
        f"--{n}-dir {d}" for n, of in extra_input.items() for d in of(wc)
    )  # noqa: E731

    rule:
        name:
            task.rule("train")
        input:
            **extra_input,
            spec=specs(f"{task.subdir}run", runs_of, task.wildcard),
            train=data("train"),
            val=data("validation"),
            preflight=run_preflight(task.name),
        output:
            weights=f"{run_dir}/model.safetensors",
            config=f"{run_dir}/config.json",
            metrics=f"{run_dir}/metrics.jsonl",
            record=f"{run_dir}/run.json",
        log:
            f"{logs}train/{{{task.wildcard}}}.log",
        benchmark:
            str(task.bench_file(RES, "train", f"{{{task.wildcard}}}"))
        wildcard_constraints:
            # the LM's runs of a fused group are made by rule train_fused instead
            **{
                task.wildcard: "|".join(re.escape(r) for r in runs_of if r not in FUSED_RUNS)
                or "(?!)"
            },
        conda:
            "../../envs/train.yaml"
        threads: task.part(P)["train"]["threads"]
        resources:
            **EXEC[task.name],
            **estimated(task.rule("train")),
            gpu=1,
            runs_per_gpu=RUNS_PER_GPU,
        params:
            code=lambda wc: code_of(task.command("train"), kind(wc)),
            out_dir=run_dir,
            extra=extra_arg,
        shell:
            "OMP_NUM_THREADS={threads} GRASSFLOW_RUNS_PER_GPU={resources.runs_per_gpu} "
            + task.job("train")
            + " --spec {input.spec} --train-tokens {input.train} --val-tokens {input.val} --out-dir {params.out_dir} "
            "{params.extra} --preflight {input.preflight} --compile {resources.compile} "
            "--compile-mode {resources.compile_mode} --trackers {resources.trackers} > {log} 2>&1"

    docs = task.docs_files(RES, P) or {}  # lm-eval's documents (data.smk), the LM's

    rule:
        name:
            task.rule("evaluate")
        input:
            **{f"{split}_docs": str(f) for split, f in docs.items()},
            **extra_input,
            weights=f"{run_dir}/model.safetensors",
            config=f"{run_dir}/config.json",
            record=f"{run_dir}/run.json",
            val=data("validation"),
            test=data("test"),
            preflight=run_preflight(task.name),
        output:
            f"{run_dir}/eval.json",
        log:
            f"{logs}evaluate/{{{task.wildcard}}}.log",
        benchmark:
            str(task.bench_file(RES, "evaluate", f"{{{task.wildcard}}}"))
        conda:
            "../../envs/train.yaml"
        threads: task.part(P)["train"]["threads"]
        resources:
            **estimated(task.rule("evaluate")),
            gpu=1,
            runs_per_gpu=RUNS_PER_GPU,
        params:
            code=lambda wc: code_of(task.command("evaluate"), kind(wc)),
            extra=extra_arg,
        shell:
            "OMP_NUM_THREADS={threads} GRASSFLOW_RUNS_PER_GPU={resources.runs_per_gpu} "
            + task.job("evaluate")
            + " --weights {input.weights} --run-json {input.record} --val-tokens {input.val} "
            "--test-tokens {input.test} --out {output} "
            + ("--val-docs {input.validation_docs} --test-docs {input.test_docs} " if docs else "")
            + "{params.extra} > {log} 2>&1"


# Every task's runs, reading its token files (task_tokens) and the directories it declares (task_dirs).
for _task in ACTIVE:
    _run_rules(_task, task_tokens(_task))
