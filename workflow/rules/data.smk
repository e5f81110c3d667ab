# Stages 1 (download) and 2 (tokenize) of every task whose declaration names them (grassflow.tasks:
# the LM's, SNLI's): download → (train_tokenizer, for tokenizer.name: trained) → tokenize, into
# the token files its runs read; and documents (the LM's), the evaluation splits as
# lm-evaluation-harness's documents, which only its evaluate jobs read. Rules download, tokenize, ..., snli_download, snli_tokenize.
# download is local (it runs where Snakemake runs): on clusters only the login node has the
# internet; so are the hub fetches (fetch.smk).


def _text_data_rules(task):
    part, sub = task.part(P), task.subdir
    raw = expand(f"{task.results(RES)}/data/raw/{{split}}.parquet", split=SPLITS)
    artifact = tokenizer_artifact(task)

    rule:
        name:
            task.rule("download")
        input:
            data=spec(f"{sub}data", part["data"]),
        output:
            raw=raw,
            checksums=f"{task.results(RES)}/data/raw/checksums.json",
        log:
            f"{RES}/logs/{sub}download.log",
        benchmark:
            f"{RES}/benchmarks/{sub}download.tsv"
        localrule: True
        conda:
            "../../envs/data.yaml"
        params:
            out_dir=lambda wc, output: Path(output.checksums).parent,
            code=code_of(task.command("download")),
        shell:
            f"{task.job('download')} --data {{input.data}} --out-dir {{params.out_dir}} > {{log}} 2>&1"

    if part["tokenizer"]["name"] == "trained":

        rule:
            name:
                task.rule("train_tokenizer")
            input:
                raw[0],
            output:
                artifact,
            log:
                f"{RES}/logs/{sub}train_tokenizer.log",
            benchmark:
                f"{RES}/benchmarks/{sub}train_tokenizer.tsv"
            conda:
                "../../envs/data.yaml"
            params:
                vocab_size=part["tokenizer"]["vocab_size"],
                code=code_of(task.command("train_tokenizer")),
            shell:
                f"{task.job('train_tokenizer')} --train {{input}} --vocab-size {{params.vocab_size}} "
                "--out {output} > {log} 2>&1"

    rule:
        name:
            task.rule("tokenize")
        input:
            raw=raw,
            artifact=artifact,
            tokenizer=spec(f"{sub}tokenize", entry(task.tokenize_section)(P)),
        output:
            [str(f) for f in task.files(RES, P).values()],
        log:
            f"{RES}/logs/{sub}tokenize.log",
        benchmark:
            f"{RES}/benchmarks/{sub}tokenize.tsv"
        conda:
            "../../envs/data.yaml"
        params:
            out_dir=lambda wc, output: Path(output[0]).parent,
            artifact=" ".join(f"--artifact {a}" for a in artifact),
            code=code_of(task.command("tokenize")),
        shell:
            f"{task.job('tokenize')} --tokenizer {{input.tokenizer}} {{params.artifact}} "
            "--raw {input.raw} --out-dir {params.out_dir} > {log} 2>&1"

    if task.documents:  # the evaluation splits as lm-eval's documents: its evaluate jobs' input

        rule:
            name:
                task.rule("documents")
            input:
                raw=[r for r in raw if Path(r).stem != "train"],
                artifact=artifact,
                tokenizer=spec(f"{sub}tokenize", entry(task.tokenize_section)(P)),
            output:
                [str(f) for f in task.docs_files(RES, P).values()],
            log:
                f"{RES}/logs/{sub}documents.log",
            benchmark:
                f"{RES}/benchmarks/{sub}documents.tsv"
            conda:
                "../../envs/data.yaml"
            params:
                out_dir=lambda wc, output: Path(output[0]).parent,
                artifact=" ".join(f"--artifact {a}" for a in artifact),
                code=code_of(task.command("documents")),
            shell:
                f"{task.job('documents')} --tokenizer {{input.tokenizer}} {{params.artifact}} "
                "--raw {input.raw} --out-dir {params.out_dir} > {log} 2>&1"


for _task in ACTIVE:
    if _task.tokenize:
        _text_data_rules(_task)
