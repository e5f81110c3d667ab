"""A finished language-model run read back, as `grassflow export` and `grassflow generate` read it:
its best weights checked against its record, the tokenizer its tokens were made with, and how its
tokens read Wikitext-2 v1's `<unk>`."""

from __future__ import annotations

from pathlib import Path

from grassflow.checkpoint import state_sha256
from grassflow.errors import CommandError
from grassflow.pretrained import load_model
from grassflow.report.records import read_record


def read_json(path: Path) -> dict:
    """A record of the run (run.json, eval.json) as report.records reads every record: a damaged one
    is one line naming it, not a traceback."""
    if not path.is_file():
        raise CommandError(f"{path}: missing: not a finished language-model run directory")
    return read_record(path)


def results_root(run_dir: Path) -> Path:
    """results/<preset> of a run directory results/<preset>/runs/<run>."""
    return run_dir.resolve().parents[1]


def find_tokenizer(run_dir: Path, record: dict, given=None) -> Path:
    """The tokenizer.json the run's tokens were made with: `given`, or where the pipeline keeps it
    (trained: data/tokenizer/trained/, fetched: tokenizers/<name>/; a tokenizer.path of the preset
    is not in the run's record: give it); the one whose sha256 is the run's data's."""
    from tokenizers import Tokenizer

    from grassflow.data.tokenizers import tokenizer_sha256

    want, name = record["data"]["train"]["tokenizer_sha256"], record["data"]["train"]["tokenizer"]
    root = results_root(run_dir)
    candidates = (
        [Path(given)]
        if given
        else [
            root / "data/tokenizer/trained/tokenizer.json",
            root / "tokenizers" / name / "tokenizer.json",
        ]
    )
    for c in candidates:
        if c.is_file() and tokenizer_sha256(Tokenizer.from_file(str(c))) == want:
            return c
    raise CommandError(
        f"{run_dir}: no tokenizer.json with the run's tokenizer sha256 {want[:12]}… among "
        f"{[str(c) for c in candidates]}; give it with --tokenizer"
    )


def unk_mapped(record: dict) -> bool:
    """Whether the run's token files read Wikitext-2 v1's literal `<unk>` as the tokenizer's unknown
    token (tokenizer.map_unk): how a text given to the model must be encoded."""
    return record["data"]["train"].get("unk_mapped") is not None


def model_from_run(run_dir: Path):
    """(model, record) of a finished run: its best weights (model.safetensors and config.json, as
    the run wrote them), checked to be the ones its run.json records."""
    record = read_json(run_dir / "run.json")
    if record["spec"].get("task", "lm") != "lm":
        raise CommandError(
            f"{run_dir}: a {record['spec']['task']} run; only language-model runs are exported"
        )
    if not record.get("weights_sha256"):
        raise CommandError(
            f"{run_dir}: the run has no weights to export (status {record['status']})"
        )
    model = load_model(run_dir)
    if state_sha256(model.state_dict()) != record["weights_sha256"]:
        raise CommandError(
            f"{run_dir}/model.safetensors: its weights' sha256 is not run.json's weights_sha256"
        )
    return model, record
