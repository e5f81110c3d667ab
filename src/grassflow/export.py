"""`grassflow export RUN_DIR OUT_DIR`: a language-model run as a self-contained model directory.

    model.safetensors, config.json   grassflow.pretrained (load: grassflow.pretrained.load_model)
    tokenizer.json                   the run's tokenizer (its sha256 checked against the run's data)
    README.md                        a model card in the Hub's format: YAML front matter, then the
                                     run's numbers, its row of its table as printed with the paper's
                                     figure, the table's label and verdict, and the provenance

The export is made from the run's model.safetensors and config.json, and its run.json, eval.json and
table (results/<preset>/report/<experiment>.md/.csv); written to a temporary directory and renamed,
so an OUT_DIR that exists is complete. Upload: `huggingface_hub.upload_folder`
(docs/use/using-models.md).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from grassflow import markdown
from grassflow.errors import CommandError
from grassflow.finished_run import (
    find_tokenizer,
    model_from_run,
    read_json,
    results_root,
    unk_mapped,
)
from grassflow.io import write_json
from grassflow.pretrained import save_pretrained

LM_DATASET = "Salesforce/wikitext"


def table_of(run_dir: Path, record: dict) -> dict:
    """The run's table as the pipeline printed it: its label line, the model's row with the header,
    the verdict paragraph; and the run's own csv row. Empty where no table was made."""
    import csv

    exp, run = record["spec"]["experiment"], record["run_id"]
    md, csv_file = (
        results_root(run_dir) / "report" / f"{exp}.md",
        results_root(run_dir) / "report" / f"{exp}.csv",
    )
    if not md.is_file() or not csv_file.is_file():
        return {}
    with open(csv_file, newline="") as f:
        row = next((r for r in csv.DictReader(f) if r["run_id"] == run), None)
    lines = md.read_text().splitlines()
    table = [i for i, line in enumerate(lines) if line.startswith("|")]
    mine = [lines[i] for i in table if f"[{run}]" in lines[i]]
    return {
        "label": next((line for line in lines if line.startswith("### ")), ""),
        "rows": [lines[table[0]], lines[table[0] + 1], *mine] if table and mine else [],
        "verdict": next(
            (line for line in lines if line.startswith("Grassmann vs Transformer")), ""
        ),
        "run_row": row,
    }


def tokenizer_config(tokenizer_json: Path, context_len: int) -> dict:
    """tokenizer_config.json: the export's tokenizer.json as transformers' PreTrainedTokenizerFast
    (AutoTokenizer), with its special tokens; its end-of-text token is what a document's first token
    is conditioned on, the harness's prefix token (grassflow.lm.rolling.prefix_id)."""
    from tokenizers import Tokenizer

    from grassflow.lm.rolling import prefix_id

    tok = Tokenizer.from_file(str(tokenizer_json))
    special = {
        k: t
        for k, t in (
            ("unk_token", "[UNK]"),
            ("pad_token", "[PAD]"),
            ("sep_token", "[SEP]"),
            ("cls_token", "[CLS]"),
            ("mask_token", "[MASK]"),
        )
        if tok.token_to_id(t) is not None
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": context_len,
        "eos_token": tok.id_to_token(prefix_id(tok)),
        "clean_up_tokenization_spaces": False,
        **special,
    }


def model_card(record: dict, evaluation: dict, config: dict, table: dict) -> str:
    kind, spec = record["spec"]["model_kind"], record["spec"]
    test = evaluation.get("test") or {}
    val = evaluation.get("validation") or {}
    front = {
        "license": "mit",
        "library_name": "grassflow",
        "pipeline_tag": "text-generation",
        "tags": [
            "grassflow",
            "grassmann-flows" if kind == "grassmann" else "transformer",
            "causal-lm",
            "reproduction",
            "arxiv:2512.19428",
        ],
        "datasets": [LM_DATASET],
        "metrics": ["perplexity"],
    }
    import yaml

    out = [
        "---",
        yaml.safe_dump(front, sort_keys=False).strip(),
        "---",
        "",
        f"# {markdown.text(record['run_id'])}: {config['architectures'][0]} from grassflow",
        "",
        f"A {kind} language model trained by grassflow, the reproduction pipeline of *Attention Is "
        "Not What You Need: Grassmann Flows as an Attention-Free Alternative for Sequence "
        f"Modeling* (arXiv 2512.19428): preset {markdown.code(spec['preset'])}, experiment "
        f"{markdown.code(spec['experiment'])}, seed {spec['seed']}, {config['n_layers']} layers, "
        f"d_model {config['d_model']}, context {config['context_len']} tokens, "
        f"{record['n_params']:,} parameters; status {markdown.code(record['status']['state'])}, "
        f"best epoch {record['best_epoch']}.",
        "",
        "## Its numbers",
        "",
        "| split | perplexity (chunked, the paper's) | strided | word-level (lm-eval) |",
        "|---|---|---|---|",
    ]
    for name, e in (("validation", val), ("test", test)):
        if e:
            word = f"{e['harness']['word_ppl']:.2f}" if "harness" in e else "—"
            out.append(f"| {name} | {e['chunked_ppl']:.2f} | {e['strided_ppl']:.2f} | {word} |")
    out.append("")
    if table:
        out += [
            "## Its table, as the pipeline printed it",
            "",
            table["label"],
            "",
            *table["rows"],
            "",
            table["verdict"] or "(no verdict printed)",
            "",
        ]
    else:
        out += ["No table of this run's preset was found beside it (results/<preset>/report/).", ""]
    git = record.get("git") or {}
    out += [
        "## Provenance",
        "",
        (
            f"- commit {markdown.code(git['commit'])}"
            + (" (working tree dirty)" if git.get("dirty") else "")
            if git.get("commit")
            else "- commit: not recorded (the run was made outside a git checkout)"
        ),
        f"- spec sha256 `{record['spec_hash']}`; model settings in `config.json`",
        "- data: "
        + "; ".join(
            f"{s} `{d['file_sha256'][:16]}…` ({d['n_tokens']:,} tokens)"
            for s, d in record["data"].items()
        ),
        f"- tokenizer `{config['tokenizer']['name']}`, sha256 "
        f"`{config['tokenizer']['sha256'][:16]}…`",
        f"- weights sha256 `{config['weights_sha256']}` (as in the run's run.json)",
        f"- trained on {markdown.text(record['device'])} ({markdown.text(record['device_type'])}), "
        f"Plücker backend {markdown.text(record.get('plucker_backend'))}",
        "",
        "## Use",
        "",
        "```python",
        "from grassflow.pretrained import load_model",
        "from tokenizers import Tokenizer",
        'model = load_model("path/to/this/directory")',
        'tok = Tokenizer.from_file("path/to/this/directory/tokenizer.json")',
        "```",
        "",
        '`grassflow generate path/to/this/directory --prompt "..."` samples from it '
        "(docs/use/using-models.md).",
        "",
    ]
    return "\n".join(out)


def export_run(run_dir, out_dir, tokenizer=None) -> Path:
    """The export of one finished language-model run (see the module's docstring)."""
    run_dir, out = Path(run_dir), Path(out_dir)
    if out.exists():
        raise CommandError(f"{out}: exists; export into a new directory")
    model, record = model_from_run(run_dir)
    evaluation = read_json(run_dir / "eval.json")
    # the card's numbers must be these weights'
    if evaluation.get("weights_sha256") != record["weights_sha256"]:
        raise CommandError(
            f"{run_dir / 'eval.json'}: it evaluated weights "
            f"{str(evaluation.get('weights_sha256'))[:12]}…, "
            f"not the run's {record['weights_sha256'][:12]}…: rerun its evaluation (snakemake)"
        )
    tok = find_tokenizer(run_dir, record, tokenizer)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:  # a failure leaves no partial export behind
        kind = record["spec"]["model_kind"]
        # transformers' Auto classes (grassflow.hf)
        config = save_pretrained(
            model,
            kind,
            tmp,
            tokenizer={
                "name": record["data"]["train"]["tokenizer"],
                "sha256": record["data"]["train"]["tokenizer_sha256"],
                "map_unk": unk_mapped(record),
            },
            run={
                "run_id": record["run_id"],
                "spec_hash": record["spec_hash"],
                "commit": (record.get("git") or {}).get("commit"),
            },
            model_type=f"grassflow_{kind}",
        )
        shutil.copyfile(tok, tmp / "tokenizer.json")
        write_json(
            tmp / "tokenizer_config.json",
            tokenizer_config(tmp / "tokenizer.json", model.cfg.context_len),
        )
        (tmp / "README.md").write_text(
            model_card(record, evaluation, config, table_of(run_dir, record))
        )
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"exported {run_dir} → {out}")
    return out
