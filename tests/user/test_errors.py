"""Every user verb fails well: a bad input is one `error:` line naming the key, file or value (and
the fix where there is one), exit 1 (2 for a command line the parser refuses), no traceback, nothing
written; `load_model` from Python raises a ModelFileError naming the file and the key."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
import torch

from grassflow import cli
from grassflow.errors import ModelFileError
from grassflow.models import ModelConfig
from grassflow.pretrained import load_model
from helpers.specs import LM_SPEC


@pytest.fixture(scope="module")
def model_dirs(tokens, tmp_path_factory):
    """A finished Grassmann run (with its evaluation) and its export."""
    from grassflow.export import export_run
    from grassflow.lm.evaluate import evaluate_run
    from grassflow.lm.train import train

    root = tmp_path_factory.mktemp("verbs")
    run = root / "runs" / "t-grassmann-s0"
    spec = {**LM_SPEC, "train": {**LM_SPEC["train"], "epochs": 1, "max_steps_per_epoch": 3}}
    train(spec, tokens / "train.parquet", tokens / "validation.parquet", run)
    evaluate_run(
        run / "model.safetensors",
        run / "run.json",
        tokens / "validation.parquet",
        tokens / "test.parquet",
        run / "eval.json",
    )
    export = export_run(run, root / "export", tokenizer=tokens / "tok.json")
    return run, export


def _copy(src, dst, edit_config=None, write=None):
    shutil.copytree(src, dst)
    if edit_config is not None:
        config = json.loads((dst / "config.json").read_text())
        edit_config(config)
        (dst / "config.json").write_text(json.dumps(config))
    for name, content in (write or {}).items():
        (dst / name).write_bytes(content) if isinstance(content, bytes) else (
            dst / name
        ).write_text(content)
    return dst


def _cli(argv, capfd):
    """(exit code, stderr lines) of `grassflow <argv>` in this process."""
    message = ""
    try:
        code = cli.main(argv)
    except SystemExit as e:  # sys.exit("error: ...") prints its message and exits 1, as Python does
        code, message = (e.code, "") if isinstance(e.code, int) else (1, str(e.code))
    err = (capfd.readouterr().err + message).strip().splitlines()
    return code, err


def _foreign_safetensors() -> bytes:
    from safetensors.torch import save

    return save({"encoder.layer.0.weight": torch.zeros(2, 2)})


def _set(key, value):
    return lambda c: c.__setitem__(key, value)


def _drop(key):
    return lambda c: c.pop(key)


GENERATE_BAD_MODELS = [
    (
        "not safetensors",
        None,
        {"model.safetensors": b"PK\x03\x04 a zip, say"},
        r"model\.safetensors: not a readable safetensors file",
    ),
    (
        "foreign safetensors",
        None,
        {"model.safetensors": _foreign_safetensors()},
        r"model\.safetensors does not fit the grassmann of \S+config\.json: missing tensors "
        r"\['tok_emb\.weight'.*"
        r"unexpected \['encoder\.layer\.0\.weight'\]",
    ),
    (
        "format 2",
        _set("format", "grassflow-lm/2"),
        None,
        r"config\.json: format 'grassflow-lm/2'; this grassflow reads",
    ),
    (
        "d_model a string",
        _set("d_model", "32"),
        None,
        r"config\.json: d_model: '32' is not an integer",
    ),
    (
        "d_model not the weights'",
        _set("d_model", 48),
        None,
        r"model\.safetensors: tensor \S+ is \(.*\), but \S+config\.json makes it .*\(its .*d_model",
    ),
    (
        "kind mamba",
        _set("model_kind", "mamba"),
        None,
        r"config\.json: model_kind 'mamba' is not one of",
    ),
    ("no kind", _drop("model_kind"), None, r"config\.json: model_kind None is not one of"),
    ("not JSON", None, {"config.json": "{ not json"}, r"config\.json: not JSON"),
    (
        "wrong sha256",
        _set("weights_sha256", "0" * 64),
        None,
        r"its weights' sha256 is not \S+config\.json's",
    ),
    (
        "cupy on a CPU",
        _set("plucker_backend", "cupy"),
        None,
        r"config\.json: plucker_backend 'cupy' does not run on cpu: load it on cuda, or set "
        r"plucker_backend to \"auto\"",
    ),
    (
        "bad tokenizer.json",
        None,
        {"tokenizer.json": "{}"},
        r"tokenizer\.json: not a tokenizer\.json",
    ),
    ("missing field", _drop("norm"), None, r"config\.json: missing model field\(s\) \['norm'\]"),
    (
        "unknown key",
        _set("empty_offsetz", "bias"),
        None,
        r"config\.json: unknown key\(s\) \['empty_offsetz'\]",
    ),
]


@pytest.mark.parametrize(
    "edit, write, first",
    [c[1:] for c in GENERATE_BAD_MODELS],
    ids=[c[0] for c in GENERATE_BAD_MODELS],
)
def test_generate_refuses_a_bad_model_directory_in_one_line(
    edit, write, first, model_dirs, tmp_path, capfd
):
    bad = _copy(model_dirs[1], tmp_path / "bad", edit, write)
    before = sorted(p.name for p in bad.iterdir())
    code, err = _cli(["generate", str(bad), "--prompt", "the"], capfd)
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith("error: ") and __import__("re").search(first, err[0]), err[0]
    assert sorted(p.name for p in bad.iterdir()) == before  # nothing written


BAD_ARGS = [
    (["--prompt", ""], r"argument --prompt: '': must be a non-empty text"),
    (["--prompt", "x", "--top-k", "0"], r"argument --top-k: '0': must be ≥ 1"),
    (["--prompt", "x", "--top-p", "1.5"], r"argument --top-p: '1.5': must be in \(0, 1\]"),
    (["--prompt", "x", "--temperature", "-1"], r"argument --temperature: '-1': must be ≥ 0"),
    (["--prompt", "x", "--max-new-tokens", "-3"], r"argument --max-new-tokens: '-3': must be ≥ 1"),
    (["--prompt", "x", "--device", "tpu"], r"argument --device: invalid choice: 'tpu'"),
]


@pytest.mark.parametrize("args, first", BAD_ARGS, ids=[" ".join(a[-2:]) for a, _ in BAD_ARGS])
def test_generate_refuses_arguments_out_of_range_before_loading(
    args, first, model_dirs, capfd, monkeypatch
):
    monkeypatch.setattr(
        "grassflow.pretrained.load_model", lambda *a, **k: pytest.fail("loaded a model")
    )
    code, err = _cli(["generate", str(model_dirs[1]), *args], capfd)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: grassflow generate: "), err
    assert __import__("re").search(first, err[0]), err[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU build's refusal")
def test_generate_on_cuda_without_one_says_so(model_dirs, capfd):
    code, err = _cli(["generate", str(model_dirs[1]), "--prompt", "x", "--device", "cuda"], capfd)
    assert (
        code == 1
        and err == [err[0]]
        and err[0].startswith("error: --device cuda: no CUDA device here")
    )


def test_an_export_without_its_tokenizer_asks_for_the_option_that_exists(
    model_dirs, tmp_path, capfd, tokens
):
    bare = _copy(model_dirs[1], tmp_path / "bare")
    (bare / "tokenizer.json").unlink()
    code, err = _cli(["generate", str(bare), "--prompt", "the"], capfd)
    assert (
        code == 1
        and err == [err[0]]
        and "no tokenizer.json beside the model: give its tokenizer with --tokenizer" in err[0]
    )
    code, _ = _cli(
        [
            "generate",
            str(bare),
            "--prompt",
            "the",
            "--max-new-tokens",
            "2",
            "--tokenizer",
            str(tokens / "tok.json"),
        ],
        capfd,
    )
    assert code == 0


def test_preflight_refuses_an_unknown_device(capfd, tmp_path):
    code, err = _cli(["preflight", "--device", "tpu", "--out", str(tmp_path / "p.json")], capfd)
    assert code == 2 and len(err) == 1 and "argument --device: invalid choice: 'tpu'" in err[0]
    assert not (tmp_path / "p.json").exists()


def test_lm_eval_without_its_extra_is_one_line(capfd, monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # as where the extra is not installed
    monkeypatch.delitem(sys.modules, "grassflow.harness", raising=False)
    code, err = _cli(["lm-eval", "--model", "grassflow"], capfd)
    assert code == 1 and len(err) == 1
    assert (
        err[0].startswith("error: grassflow lm-eval needs lm-evaluation-harness")
        and "pip install 'grassflow[eval]'" in err[0]
    )


def test_export_refuses_an_evaluation_of_other_weights(model_dirs, tmp_path, capfd):
    run = _copy(model_dirs[0], tmp_path / "runs" / "t-grassmann-s0")
    ev = json.loads((run / "eval.json").read_text())
    (run / "eval.json").write_text(json.dumps({**ev, "weights_sha256": "f" * 64}))
    code, err = _cli(["export", str(run), str(tmp_path / "out")], capfd)
    assert code == 1 and len(err) == 1 and "eval.json: it evaluated weights ffffffffffff" in err[0]
    assert "rerun its evaluation" in err[0] and not (tmp_path / "out").exists()


# --- load_model from Python: strict, per field ----------------------------------------------------
@pytest.mark.parametrize("field", sorted(ModelConfig.__dataclass_fields__))
def test_a_config_missing_any_model_field_is_refused(field, model_dirs, tmp_path):
    bad = _copy(model_dirs[1], tmp_path / "bad", _drop(field))
    with pytest.raises(
        ModelFileError, match=rf"{bad / 'config.json'}: missing model field\(s\) \['{field}'\]"
    ):
        load_model(bad)


@pytest.mark.parametrize("field", sorted(ModelConfig.__dataclass_fields__))
def test_a_config_with_a_field_of_the_wrong_type_is_refused(field, model_dirs, tmp_path):
    bad = _copy(model_dirs[1], tmp_path / "bad", _set(field, {"a": 1}))
    with pytest.raises(ModelFileError, match=rf"config\.json: {field}: \{{'a': 1\}} is not "):
        load_model(bad)


def test_a_config_with_a_value_out_of_range_names_it(model_dirs, tmp_path):
    bad = _copy(model_dirs[1], tmp_path / "bad", _set("norm", "mid"))
    with pytest.raises(
        ModelFileError, match=r"config\.json: norm: 'mid' is not one of \('post', 'pre'\)"
    ):
        load_model(bad)
    bad = _copy(model_dirs[1], tmp_path / "bad2", _set("n_layers", 0))
    with pytest.raises(ModelFileError, match=r"config\.json: n_layers must be ≥ 1, got 0"):
        load_model(bad)


def test_the_prompt_is_encoded_as_the_model_was_trained(model_dirs, tmp_path, monkeypatch, capfd):
    """A model trained with tokenizer.map_unk reads a literal `<unk>` as the unknown token, one
    id."""
    import grassflow.decode as decode

    seen = {}

    def spy(model, idx, *a, **k):
        seen["ids"] = idx[0].tolist()
        return idx

    monkeypatch.setattr(decode, "generate", spy)
    for mapped in (True, False):
        d = _copy(
            model_dirs[1],
            tmp_path / f"m{mapped}",
            lambda c, m=mapped: c["tokenizer"].__setitem__("map_unk", m),
        )
        decode.generate_text(str(d), "the <unk> of", max_new_tokens=1)
        _, tok, unk = decode.open_model(d)
        assert (unk is not None) is mapped
        if mapped:
            assert seen["ids"].count(unk) == 1 and len(seen["ids"]) == 3
        else:
            assert seen["ids"] == tok.encode("the <unk> of", add_special_tokens=False).ids


def test_a_prompt_longer_than_the_context_is_cropped_and_said(model_dirs, capfd, monkeypatch):
    import grassflow.decode as decode

    seen = {}
    monkeypatch.setattr(
        decode, "generate", lambda model, idx, *a, **k: seen.setdefault("n", idx.shape[1]) and idx
    )
    decode.generate_text(str(model_dirs[1]), "the history of " * 20, max_new_tokens=1)
    err = capfd.readouterr().err
    assert (
        seen["n"] == LM_SPEC["model"]["context_len"]
        and "the model reads its last 16 (context_len)" in err
    )


def test_generate_continues_several_prompts_each_as_alone(model_dirs, capfd):
    """`grassflow generate --prompt A --prompt B ...`: a paragraph per prompt, in order, each the
    text that prompt gives alone under the same seed (prompts of one token length in one batch)."""
    prompts = ["the history of the", "in 1998 the band", "the", "a new album was"]
    args = ["--max-new-tokens", "6", "--seed", "3", "--temperature", "0.9", "--top-k", "20"]
    alone = []
    for p in prompts:
        assert cli.main(["generate", str(model_dirs[1]), "--prompt", p, *args]) in (0, None)
        alone.append(capfd.readouterr().out.strip())
    assert cli.main(
        ["generate", str(model_dirs[1]), *[a for p in prompts for a in ("--prompt", p)], *args]
    ) in (0, None)
    together = capfd.readouterr().out.strip().split("\n\n")
    assert together == alone and all(t.startswith(p) for t, p in zip(together, prompts))


OTHER_VERBS = [
    (
        ["plan", "--configfile", "/no/such.yaml"],
        1,
        "error: --configfile /no/such.yaml: no such file",
    ),
    (
        ["plan", "--why", "--configfile", "/no/such.yaml"],
        1,
        "error: --configfile /no/such.yaml: no such file",
    ),
    (
        ["plan", "--preset", "nosuch"],
        1,
        "error: config preset: 'nosuch' is not defined; choose one of",
    ),
    (
        ["plan", "nosuchtarget", "--preset", "demo"],
        1,  # Snakemake's own error, though its log is silenced
        "error: snakemake's dry run failed: MissingRuleException: No rule to produce nosuchtarget",
    ),
    (
        ["gpus", "--preset", "nosuch"],
        1,
        "error: config preset: 'nosuch' is not defined; choose one of",
    ),
    (
        ["gpus", "--runs-per-gpu", "0"],
        2,
        "error: grassflow gpus: argument --runs-per-gpu: '0': must be ≥ 1",
    ),
    (
        ["gpus", "--runs-per-gpu", "two"],
        2,
        "error: grassflow gpus: argument --runs-per-gpu: 'two' is not int",
    ),
    (
        ["bench", "--device", "tpu"],
        2,
        "error: python -m grassflow.bench: argument --device: invalid choice: 'tpu'",
    ),
    (
        ["bench", "--parts", "op,nope"],
        2,
        "error: python -m grassflow.bench: argument --parts: unknown part(s) ['nope']",
    ),
    (
        ["export", "/no/such/run", "{out}"],
        1,
        "error: /no/such/run/run.json: missing: not a finished language-model run",
    ),
    (
        ["preflight", "--backend", "triton", "--out", "{out}"],
        2,
        "error: grassflow preflight: argument --backend: invalid choice: 'triton'",
    ),
]


@pytest.mark.parametrize(
    "argv, code, first", OTHER_VERBS, ids=[" ".join(a[:2]) for a, *_ in OTHER_VERBS]
)
def test_every_other_verb_refuses_bad_input_in_one_line(
    argv, code, first, capfd, tmp_path, monkeypatch
):
    from helpers.dag import ROOT

    monkeypatch.chdir(ROOT)  # plan and gpus read the project's config.yaml
    out = tmp_path / "out"
    got, err = _cli([a.format(out=out) for a in argv], capfd)
    assert got == code and len(err) == 1 and err[0].startswith(first), err
    assert not out.exists()  # nothing written


@pytest.mark.parametrize("verb", ["generate", "export"])
def test_a_run_directory_with_a_damaged_record_is_one_line(verb, model_dirs, tmp_path, capfd):
    """A run directory (not an export) whose run.json is damaged: one line naming it, as every
    record reader's (finished_run reads records as report.records does; before, a traceback)."""
    run = tmp_path / "run"
    shutil.copytree(model_dirs[0], run)
    (run / "run.json").write_text("{ damaged")
    argv = (
        ["generate", str(run), "--prompt", "the"]
        if verb == "generate"
        else ["export", str(run), str(tmp_path / "out")]
    )
    code, err = _cli(argv, capfd)
    assert (
        code == 1 and len(err) == 1 and err[0].startswith(f"error: {run / 'run.json'}: not JSON")
    ), err
