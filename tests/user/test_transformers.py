"""Our models as transformers models (grassflow.hf): an export loads with AutoModelForCausalLM and
AutoTokenizer in a fresh process and gives the evaluation's logits; transformers' generate() decodes
incrementally through our cache and gives `grassflow generate`'s greedy text; lm-eval's own `hf`
model gives the `grassflow` model's word perplexity; the classes live outside every job's code."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from helpers.dag import BIN, edited, planned

FRESH = r"""
import sys, json, numpy as np, torch
import grassflow.hf  # registers the Auto classes
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
tok = AutoTokenizer.from_pretrained(sys.argv[1])
ids = torch.as_tensor(np.load(sys.argv[2])[: model.config.context_len][None])
with torch.no_grad():
    torch.save(model(ids).logits, sys.argv[3])
enc = tok("the history of", add_special_tokens=False)["input_ids"]
print(json.dumps({"class": type(model).__name__, "tokens": enc, "unk": tok.unk_token,
                  "eos": tok.eos_token, "max": tok.model_max_length}))
"""


@pytest.mark.parametrize("kind", ["grassmann", "transformer"])
def test_an_export_loads_with_the_auto_classes_alone_and_gives_the_evaluations_logits(
    demo, tmp_path, kind
):
    from tokenizers import Tokenizer

    from grassflow.pretrained import load_model

    run = demo / f"results/demo/runs/table1-{kind}-s0"
    export = tmp_path / "export"
    res = subprocess.run(
        [str(BIN / "grassflow"), "export", str(run), str(export)], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    config = json.loads((export / "config.json").read_text())
    assert (
        config["model_type"] == f"grassflow_{kind}" and (export / "tokenizer_config.json").is_file()
    )
    ids = (
        pq.read_table(demo / "results/demo/data/tokens/trained/validation.parquet")["ids"]
        .to_numpy()
        .astype(np.int64)
    )
    np.save(tmp_path / "ids.npy", ids)
    fresh = subprocess.run(
        [
            sys.executable,
            "-c",
            FRESH,
            str(export),
            str(tmp_path / "ids.npy"),
            str(tmp_path / "l.pt"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    facts = json.loads(fresh.stdout.strip().splitlines()[-1])
    # the run's weights, as the evaluation reads them (tests/user/test_export.py)
    model = load_model(run)
    with torch.no_grad():
        want = model(torch.as_tensor(ids[: model.cfg.context_len][None]))
    assert torch.equal(torch.load(tmp_path / "l.pt"), want)
    assert facts["class"] == f"{kind.capitalize()}ForCausalLM"
    tok = Tokenizer.from_file(str(export / "tokenizer.json"))
    assert facts["tokens"] == tok.encode("the history of", add_special_tokens=False).ids
    assert (facts["unk"], facts["eos"], facts["max"]) == ("[UNK]", "[PAD]", model.cfg.context_len)


@pytest.fixture(scope="module")
def exports(tokens, tmp_path_factory):
    """A finished run of each kind, exported."""
    from grassflow.export import export_run
    from grassflow.lm.evaluate import evaluate_run
    from grassflow.lm.train import train
    from helpers.specs import LM_SPEC

    root = tmp_path_factory.mktemp("hf")
    out = {}
    for kind in ("grassmann", "transformer"):
        run = root / "runs" / kind
        spec = {
            **LM_SPEC,
            "model_kind": kind,
            "run_id": f"t-{kind}-s0",
            "train": {**LM_SPEC["train"], "epochs": 1, "max_steps_per_epoch": 5},
        }
        train(spec, tokens / "train.parquet", tokens / "validation.parquet", run)
        evaluate_run(
            run / "model.safetensors",
            run / "run.json",
            tokens / "validation.parquet",
            tokens / "test.parquet",
            run / "eval.json",
        )
        out[kind] = export_run(run, root / "export" / kind, tokenizer=tokens / "tok.json")
    return out


@pytest.mark.parametrize("kind", ["grassmann", "transformer"])
def test_generate_is_grassflow_generates_greedy_text_and_decodes_incrementally(
    kind, exports, capfd, monkeypatch
):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import grassflow.hf  # noqa: F401
    from grassflow.decode import generate_text
    from grassflow.hf import GrassflowCache

    model = AutoModelForCausalLM.from_pretrained(exports[kind])
    tok = AutoTokenizer.from_pretrained(exports[kind])
    enc = tok("the history of", return_tensors="pt", add_special_tokens=False)
    fed, feed = [], GrassflowCache.feed
    monkeypatch.setattr(
        GrassflowCache,
        "feed",
        lambda self, idx, *mask: fed.append(idx.shape[1]) or feed(self, idx, *mask),
    )
    n = 10
    cached = model.generate(**enc, max_new_tokens=n, do_sample=False)
    prompt = enc["input_ids"].shape[1]
    # the prompt once, then each new token alone: incremental
    assert fed == [prompt] + [1] * (n - 1)
    fed.clear()
    recomputed = model.generate(**enc, max_new_tokens=n, do_sample=False, use_cache=False)
    # without the cache: the whole text each step, same tokens
    assert fed == [] and torch.equal(cached, recomputed)
    sampled = {}
    for use_cache in (True, False):  # sampled, under one seed: the same draws either way
        torch.manual_seed(7)
        sampled[use_cache] = model.generate(
            **enc, max_new_tokens=n, do_sample=True, top_k=20, temperature=0.9, use_cache=use_cache
        )
    assert torch.equal(sampled[True], sampled[False])
    (text,) = generate_text(str(exports[kind]), "the history of", max_new_tokens=n, temperature=0)
    capfd.readouterr()
    ours = tok(
        "the history of" + (" " if not text.startswith(" ") else "") + text,
        add_special_tokens=False,
    )["input_ids"]
    assert cached[0].tolist() == ours
    with pytest.raises(
        ValueError, match=r"longer than the model's context \(16 learned positions\)"
    ):
        model.generate(**enc, max_new_tokens=20, do_sample=False)


@pytest.mark.parametrize("kind", ["grassmann", "transformer"])
def test_save_pretrained_writes_a_directory_both_loaders_read_with_the_same_logits(
    kind, exports, tmp_path
):
    """What a transformers user does after fine-tuning: model.save_pretrained(dir). The tied head is
    stored once; the directory loads by AutoModelForCausalLM and by load_model with equal logits.
    The run's record stays while the weights are the run's, and goes once they are not."""
    from transformers import AutoModelForCausalLM

    import grassflow.hf  # noqa: F401
    from grassflow.pretrained import load_model

    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    model = AutoModelForCausalLM.from_pretrained(exports[kind])
    for name, edit in (("same", None), ("tuned", lambda m: m.model.tok_emb.weight.data.mul_(1.01))):
        if edit:
            edit(model)
        with torch.no_grad():
            want = model(ids).logits
        model.save_pretrained(tmp_path / name)
        again = AutoModelForCausalLM.from_pretrained(tmp_path / name)
        with torch.no_grad():
            assert torch.equal(again(ids).logits, want)
            assert torch.equal(load_model(tmp_path / name)(ids), want)
        config = json.loads((tmp_path / name / "config.json").read_text())
        assert (
            config["model_type"] == f"grassflow_{kind}"
            and config["tokenizer"] == model.config.tokenizer
        )
        assert ("run" in config) is (name == "same")  # the run's record: its weights only
    half = AutoModelForCausalLM.from_pretrained(exports[kind], torch_dtype=torch.bfloat16)
    # saved in float32, as load_model rebuilds it: its checksum holds
    half.save_pretrained(tmp_path / "bf16")
    with torch.no_grad():
        assert torch.equal(load_model(tmp_path / "bf16")(ids), half.float()(ids).logits)


def test_push_to_hub_uploads_the_save_pretrained_folder(exports, tmp_path, monkeypatch):
    """push_to_hub's folder, as transformers writes it before the upload (the hub itself is out of
    reach here: its repo creation, model card and upload are stand-ins that keep the folder)."""
    import shutil
    from types import SimpleNamespace

    import transformers.utils.hub as hub
    from transformers import AutoModelForCausalLM

    import grassflow.hf  # noqa: F401
    from grassflow.checkpoint import load_weights
    from grassflow.pretrained import load_model

    monkeypatch.setattr(
        hub,
        "hf_api",
        lambda: SimpleNamespace(create_repo=lambda repo_id, **kw: SimpleNamespace(repo_id=repo_id)),
    )
    monkeypatch.setattr(
        hub,
        "create_and_tag_model_card",
        lambda *a, **kw: SimpleNamespace(save=lambda path: open(path, "w").close()),
    )
    model = AutoModelForCausalLM.from_pretrained(exports["grassmann"])
    pushed = tmp_path / "pushed"
    monkeypatch.setattr(
        model, "_upload_modified_files", lambda folder, *a, **kw: shutil.copytree(folder, pushed)
    )
    model.push_to_hub("someone/grassmann")
    model.save_pretrained(tmp_path / "saved")
    assert {p.name for p in pushed.iterdir()} == {
        p.name for p in (tmp_path / "saved").iterdir()
    } | {"README.md"}
    assert (pushed / "config.json").read_bytes() == (
        tmp_path / "saved" / "config.json"
    ).read_bytes()
    # the same tensors (safetensors writes its metadata's keys in no fixed order: the bytes may
    # differ)
    a, b = (load_weights(d / "model.safetensors") for d in (pushed, tmp_path / "saved"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        assert torch.equal(load_model(pushed)(ids), model(ids).logits)


PROMPTS = [[5, 6, 7, 8, 9], [11, 12], [13, 14, 15]]


def _padded(side: str, pad: int = 0):
    T = max(map(len, PROMPTS))
    rows = [
        [pad] * (T - len(p)) + p if side == "left" else p + [pad] * (T - len(p)) for p in PROMPTS
    ]
    mask = [
        [0] * (T - len(p)) + [1] * len(p) if side == "left" else [1] * len(p) + [0] * (T - len(p))
        for p in PROMPTS
    ]
    return torch.tensor(rows), torch.tensor(mask)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("kind", ["grassmann", "transformer"])
def test_a_padded_batch_gives_each_prompt_its_own_logits(kind, side, exports):
    """Prompts of different lengths in one batch with an attention_mask: each row's logits are its
    prompt's alone, cached or not; a Grassmann pair whose earlier token is padding is one with t − Δ
    < 0, left out, and each row's positions start at its first real token."""
    from transformers import AutoModelForCausalLM

    import grassflow.hf  # noqa: F401

    model = AutoModelForCausalLM.from_pretrained(exports[kind])
    ids, mask = _padded(side)
    with torch.no_grad():
        alone = [model(torch.tensor([p])).logits[0] for p in PROMPTS]
        for use_cache in (False, True):
            got = model(ids, attention_mask=mask, use_cache=use_cache).logits
            for b, want in enumerate(alone):
                assert torch.equal(got[b][mask[b].bool()], want), (b, use_cache)


@pytest.mark.parametrize("kind", ["grassmann", "transformer"])
def test_batched_greedy_generate_with_left_padding_is_each_prompt_alone(kind, exports):
    from transformers import AutoModelForCausalLM

    import grassflow.hf  # noqa: F401

    model = AutoModelForCausalLM.from_pretrained(exports[kind])
    ids, mask = _padded("left")
    n = 6
    alone = [
        model.generate(torch.tensor([p]), max_new_tokens=n, do_sample=False, pad_token_id=0)[0, -n:]
        for p in PROMPTS
    ]
    for use_cache in (True, False):
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
            use_cache=use_cache,
        )
        for b, want in enumerate(alone):
            assert torch.equal(out[b, -n:], want), (b, use_cache)
    with pytest.raises(NotImplementedError, match="beam search over a padded batch"):
        model.generate(
            ids, attention_mask=mask, max_new_tokens=2, num_beams=2, do_sample=False, pad_token_id=0
        )


def test_the_cache_holds_a_constant_state_for_grassmann_and_keys_and_values_for_the_transformer(
    exports,
):
    from transformers import AutoModelForCausalLM

    import grassflow.hf  # noqa: F401
    from grassflow.hf import GrassflowCache

    for kind, grows in (("grassmann", False), ("transformer", True)):
        model = AutoModelForCausalLM.from_pretrained(exports[kind])
        out = model(torch.tensor([[5, 6, 7, 8, 9]]), use_cache=True)
        cache = out.cache
        assert isinstance(cache, GrassflowCache) and cache.get_seq_length() == 5
        before = cache.decoder.state_numel()
        for t in range(6):
            out = model(torch.tensor([[10 + t]]), cache=cache, use_cache=True)
        assert cache.get_seq_length() == 11 and (cache.decoder.state_numel() > before) is grows
        with torch.no_grad():
            full = model.model(torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]]))
        torch.testing.assert_close(out.logits[:, -1], full[:, -1], rtol=1e-5, atol=1e-5)


def test_lm_evals_own_hf_model_reports_the_grassflow_models_word_perplexity(exports, tmp_path):
    import lm_eval
    import lm_eval.models  # noqa: F401  (lm-eval's own models: hf)

    import grassflow.harness  # noqa: F401
    import grassflow.hf  # noqa: F401
    from grassflow.lm.rolling import pages
    from grassflow.lm.synthetic import generate_split
    from helpers.lm_eval_task import wikitext_task

    manager, task = wikitext_task(tmp_path, pages(generate_split(2, seed=1)))
    for kind in ("grassmann", "transformer"):
        got = {
            (m, b): lm_eval.simple_evaluate(
                model=m,
                model_args=f"pretrained={exports[kind]},backend=causal"
                if m == "hf"
                else f"pretrained={exports[kind]}",
                tasks=[task],
                task_manager=manager,
                device="cpu",
                batch_size=b,
            )["results"][task]["word_perplexity,none"]
            for m, b in (("grassflow", 4), ("hf", 4), ("hf", 1))
        }
        assert got["hf", 4] == pytest.approx(got["grassflow", 4], rel=1e-4), (kind, got)
        # its padded batches: exact
        assert got["hf", 4] == pytest.approx(got["hf", 1], rel=1e-6), (
            kind,
            got,
        )


def test_an_edit_to_the_transformers_classes_reruns_no_job(demo):
    """grassflow.hf is outside every job's code: on the finished demo, a code edit to it plans
    nothing."""
    from collections import Counter

    with edited(demo / "src/grassflow/hf.py"):
        assert planned(demo) == Counter()


@pytest.mark.parametrize("kind", ["grassmann", "transformer"])
def test_the_labels_loss_is_the_shifted_cross_entropy_over_the_unpadded_labels(kind, exports):
    """`model(ids, labels=labels).loss`, what Trainer and most fine-tuning scripts call: each
    position's logits score the next label, positions labelled -100 (padding) left out, the mean
    over the rest; computed here by hand from the model's own logits."""
    from transformers import AutoModelForCausalLM

    import grassflow.hf  # noqa: F401

    model = AutoModelForCausalLM.from_pretrained(exports[kind])
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (3, 12), generator=gen)
    labels = ids.clone()
    labels[0, 8:] = -100  # a padded row
    labels[2, :3] = -100  # and one whose prompt is not scored
    with torch.no_grad():
        out = model(ids, labels=labels)
    logp = torch.log_softmax(out.logits.double(), -1)
    terms = [
        -logp[b, t, labels[b, t + 1]]
        for b in range(3)
        for t in range(11)
        if labels[b, t + 1] != -100
    ]
    assert len(terms) == 3 * 11 - 4 - 2
    assert out.loss.item() == pytest.approx(torch.stack(terms).mean().item(), rel=1e-5)
