"""lm-evaluation-harness runs our models (grassflow.harness), and the word-level perplexity the
pipeline reports (grassflow.lm.rolling, the LM's evaluation) is the number lm-eval itself reports:
lm-eval's own simple_evaluate, on its own wikitext task definition (its YAML and detokenizer, copied
from the installed package) reading local documents instead of the hub, to 1e-4 relative. Generated
articles in the default tier; the real Wikitext-2 test split (../shared) in the slow tier."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from grassflow.data.tokenizers import build_wordpiece
from grassflow.lm.rolling import (
    detokenize,
    encode,
    harness_words,
    pages,
    prefix_id,
    rolling_pairs,
    word_perplexity,
)
from grassflow.lm.synthetic import generate_split
from grassflow.models import ModelConfig, build_model
from grassflow.pretrained import save_pretrained
from helpers.lm_eval_task import wikitext_task
from helpers.procs import needs

L = 16  # short windows: most documents span several
SHARED_TEST = Path(__file__).resolve().parents[3] / "shared/data/wikitext-2-raw-v1/test.parquet"


def make_model_dir(
    d: Path,
    kind: str,
    rows: list[str],
    context_len: int = L,
    vocab_size: int = 400,
    map_unk: bool = False,
) -> Path:
    """An export-like directory: a randomly initialised model, config.json, tokenizer.json."""
    from tokenizers import Tokenizer

    build_wordpiece(rows, vocab_size, d / "tokenizer.json")
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=Tokenizer.from_file(str(d / "tokenizer.json")).get_vocab_size(),
        context_len=context_len,
        n_layers=2,
        d_model=32,
        d_ff=64,
        n_heads=2,
        r=4,
        lags=[1, 2],
        dropout=0.0,
    )
    save_pretrained(
        build_model(kind, cfg).eval(), kind, d, tokenizer={"name": "trained", "map_unk": map_unk}
    )
    return d


@pytest.fixture(scope="module", params=["transformer", "grassmann"])
def model_dir(request, tmp_path_factory):
    return make_model_dir(
        tmp_path_factory.mktemp(request.param), request.param, generate_split(6, seed=5)
    )


def lm_eval_word_perplexity(
    model_dir: Path, docs: list[str], tmp_path: Path, batch_size: int = 4
) -> float:
    import lm_eval

    import grassflow.harness  # noqa: F401  (registers --model grassflow)

    manager, task = wikitext_task(tmp_path, docs)
    out = lm_eval.simple_evaluate(
        model="grassflow",
        model_args=f"pretrained={model_dir}",
        tasks=[task],
        task_manager=manager,
        batch_size=batch_size,
        device="cpu",
    )
    return out["results"][task]["word_perplexity,none"]


def ours(model_dir: Path, docs: list[str]) -> dict:
    """The pipeline's number: each page's detokenized text encoded, its words counted on the
    page."""
    from grassflow.decode import open_model

    model, tok, _ = open_model(model_dir)
    return word_perplexity(
        model,
        [encode(tok, detokenize(p)) for p in docs],
        [harness_words(p) for p in docs],
        model.cfg.context_len,
        prefix_id(tok),
        batch_size=4,
    )


def test_our_windows_are_the_harnesss():
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    for n in (1, 5, L - 1, L, L + 1, 2 * L, 2 * L + 3, 5 * L - 1):
        theirs = [
            make_disjoint_window(w)
            for w in get_rolling_token_windows(list(range(1, n + 1)), 0, L, 1)
        ]
        # the harness's model reads (context + continuation)[-(L+1):][:-1] and scores the
        # continuation
        assert [((c + x)[-(L + 1) :][:-1], x) for c, x in theirs] == rolling_pairs(
            list(range(1, n + 1)), 0, L
        ), n


def test_our_detokenizer_and_pages_are_the_harnesss():
    from lm_eval.tasks.wikitext.preprocess_wikitext import wikitext_detokenizer

    rows = generate_split(5, seed=2) + [
        " ( a b ) [ c ] { d } \" e \" ' f ' 3 @,@ 000 @.@ 5 N 's s ' x ° y \n"
    ]
    docs = pages(rows)
    assert len(docs) == 5 and all(d.lstrip().startswith("= ") for d in docs)
    for page in docs:
        assert detokenize(page) == wikitext_detokenizer({"page": page})


def test_lm_eval_reports_our_word_perplexity(model_dir, tmp_path):
    docs = pages(generate_split(4, seed=9)) + [" a short one"]
    theirs = lm_eval_word_perplexity(model_dir, docs, tmp_path)
    mine = ours(model_dir, docs)
    assert mine["tokens"] > 2 * L * len(docs)  # most documents span several windows
    assert theirs == pytest.approx(mine["word_ppl"], rel=1e-4)


@pytest.mark.slow  # default tier under 5 min: real text from ../shared
def test_wikitext2_v1s_unk_is_one_token_in_the_documents_and_in_the_harness(tmp_path):
    """Wikitext-2 v1 (tokenizer.map_unk): the documents stage encodes each literal `<unk>` as the
    token file does, one unknown token, not `<`, `unk`, `>` (a model trained on [UNK] would find
    those improbable: ~13× the word perplexity on the laptop_v1 run), and the harness model of a run
    so trained encodes it the same way: lm-eval reports the documents' number."""
    from grassflow.lm.evaluate import harness_perplexity
    from grassflow.lm.rolling import documents_split, read_documents
    from grassflow.lm.tokenize import tokenize_split
    from grassflow.pretrained import load_model

    rows = [
        " ".join("<unk>" if i % 7 == 3 else w for i, w in enumerate(r.split(" ")))
        for r in generate_split(4, seed=11)
    ]
    n_unk = sum(r.count("<unk>") for r in rows)
    raw = tmp_path / "test.parquet"
    pq.write_table(pa.table({"text": rows}), raw)
    d = make_model_dir(tmp_path / "model", "transformer", rows, map_unk=True)
    section = {"name": "trained", "vocab_size": 400, "map_unk": True, "eval_max_tokens": None}
    tokens = tokenize_split(section, raw, tmp_path / "tokens.parquet", d / "tokenizer.json")
    meta = documents_split(section, raw, tmp_path / "docs.parquet", d / "tokenizer.json")
    ids, _, _ = read_documents(tmp_path / "docs.parquet")
    assert n_unk > 50 and tokens["unk_mapped"] == n_unk == sum(
        doc.count(meta["unk_id"]) for doc in ids
    )
    from tokenizers import Tokenizer

    assert Tokenizer.from_file(str(d / "tokenizer.json")).token_to_id("<") not in {
        i for doc in ids for i in doc
    }
    model = load_model(d)
    mine = harness_perplexity(
        model, tmp_path / "docs.parquet", tokens, model.cfg, 8, torch.device("cpu")
    )
    assert lm_eval_word_perplexity(d, pages(rows), tmp_path) == pytest.approx(
        mine["word_ppl"], rel=1e-4
    )


def test_an_export_without_tokenizer_map_unk_is_refused_not_guessed(tmp_path):
    """An export written before config.json carried tokenizer.map_unk: whether `<unk>` is one token
    is not known, so the harness model refuses it, naming the key and the fix."""
    from grassflow.harness import GrassflowLM

    d = make_model_dir(tmp_path / "model", "transformer", generate_split(2, seed=1))
    config = json.loads((d / "config.json").read_text())
    del config["tokenizer"]["map_unk"]
    (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError, match=r"config.json: no tokenizer.map_unk .* `grassflow export`"
    ):
        GrassflowLM(pretrained=str(d))


@pytest.mark.slow
@needs(SHARED_TEST.is_file(), "needs ../shared (the Wikitext-2 raw test split)")
def test_lm_eval_reports_our_word_perplexity_on_the_wikitext2_test_split(tmp_path):
    """The real test split (its 62 articles: the document-level test split's count), cut as a
    preset's eval_max_tokens cuts it, through the documents stage as the pipeline runs it: the same
    rows as its token file; lm-eval's wikitext task on those pages reports our number."""
    from grassflow.data.sources import read_rows
    from grassflow.lm.evaluate import harness_perplexity
    from grassflow.lm.rolling import documents_split
    from grassflow.lm.tokenize import tokenize_split
    from grassflow.pretrained import load_model

    rows = read_rows(SHARED_TEST)
    assert len(pages(rows)) == 62
    d = make_model_dir(tmp_path / "model", "transformer", rows, context_len=128, vocab_size=2000)
    section = {"name": "trained", "vocab_size": 2000, "eval_max_tokens": 40_000}
    tokens = tokenize_split(section, SHARED_TEST, tmp_path / "test.parquet", d / "tokenizer.json")
    meta = documents_split(section, SHARED_TEST, tmp_path / "docs.parquet", d / "tokenizer.json")
    assert meta["source_content_sha256"] == tokens["cut"]["content_sha256"]  # the token file's rows
    docs = pages(rows[: tokens["cut"]["rows"]])
    assert meta["documents"] == len(docs) > 5 and meta["n_words"] == sum(map(harness_words, docs))
    model = load_model(d)
    mine = harness_perplexity(
        model, tmp_path / "docs.parquet", tokens, model.cfg, 64, torch.device("cpu")
    )
    assert lm_eval_word_perplexity(d, docs, tmp_path, batch_size=64) == pytest.approx(
        mine["word_ppl"], rel=1e-4
    )


def test_loglikelihood_and_generation_through_the_harness(model_dir):
    """A continuation's log-likelihood is the rolling one of a short document (one window, the
    prefix token as its context); greedy generation is our decoder's, cut at the stop string."""
    from lm_eval.api.instance import Instance

    from grassflow.harness import GrassflowLM

    lm = GrassflowLM(str(model_dir), batch_size=2)
    text = " the history of the place"

    def req(args, kind):
        return Instance(request_type=kind, doc={}, arguments=args, idx=0)

    ((ll, _),) = lm.loglikelihood([req(("", text), "loglikelihood")])
    (rolling,) = lm.loglikelihood_rolling([req((text,), "loglikelihood_rolling")])
    assert ll == pytest.approx(rolling, rel=1e-6)
    ids = lm.tok_encode("the history")
    with torch.no_grad():  # greedy by hand: the whole prefix each step, its last position's argmax
        seq = list(ids)
        for _ in range(5):
            seq.append(int(lm.model(torch.tensor([seq]))[0, -1].argmax()))
    greedy = lm.tokenizer.decode(seq[len(ids) :])
    (out,) = lm.generate_until(
        [req(("the history", {"until": ["\n"], "max_gen_toks": 5}), "generate_until")]
    )
    assert out == greedy.split("\n")[0]
    with pytest.raises(TypeError, match="no_such_arg"):
        GrassflowLM(str(model_dir), no_such_arg=1)


def _by_hand(model, context: list[int], continuation: list[int], L: int) -> tuple[float, bool]:
    """What HFLM computes for (context, continuation), done here without grassflow's scorer: the
    model reads the last L+1 tokens of both, less the last; the continuation's tokens are scored at
    the last len(continuation) positions; greedy iff each is its position's argmax."""
    ids = (context + continuation)[-(L + 1) :]
    with torch.no_grad():
        logp = model(torch.tensor([ids[:-1]]))[0].double().log_softmax(-1)[-len(continuation) :]
    targets = torch.tensor(ids[-len(continuation) :])
    return float(logp.gather(1, targets[:, None]).sum()), bool((logp.argmax(-1) == targets).all())


def test_loglikelihood_splits_truncates_and_says_greedy_as_hflm(model_dir):
    """The context/continuation split (a context's trailing spaces move to the continuation), the
    truncation to the last L+1 tokens for a context longer than the model's, `is_greedy` (a
    continuation made of the model's own greedy tokens is greedy), each against the computation by
    hand; an empty or longer-than-the-context continuation is refused, naming why."""
    from lm_eval.api.instance import Instance

    from grassflow.harness import GrassflowLM

    lm = GrassflowLM(str(model_dir), batch_size=2)

    def req(c, x):
        return Instance(request_type="loglikelihood", doc={}, arguments=(c, x), idx=0)

    enc = lm.tok_encode
    short = lm.loglikelihood([req("the history ", "of the place")])[0]
    assert short == pytest.approx(
        _by_hand(lm.model, enc("the history"), enc(" of the place"), L), rel=1e-5
    )
    assert short == pytest.approx(
        lm.loglikelihood([req("the history", " of the place")])[0], rel=1e-6
    )
    long_ctx = "the history of the place and its people " * 6
    assert len(enc(long_ctx)) > L + 1
    got = lm.loglikelihood([req(long_ctx, "the end")])[0]
    assert got == pytest.approx(
        _by_hand(lm.model, enc(long_ctx.rstrip()), enc(" the end"), L), rel=1e-5
    )
    ctx = enc("the history")
    with torch.no_grad():
        seq = list(ctx)
        for _ in range(3):
            seq.append(int(lm.model(torch.tensor([seq]))[0, -1].argmax()))
    own = seq[len(ctx) :]  # the model's greedy tokens: greedy; one of them changed: not
    other = own[:-1] + [(own[-1] + 1) % lm.model.cfg.vocab_size]
    assert [g for _, g in lm._score([(ctx, own), (ctx, other)])] == [True, False]
    assert (
        _by_hand(lm.model, ctx, own, L)[1] is True and _by_hand(lm.model, ctx, other, L)[1] is False
    )
    with pytest.raises(ValueError, match="an empty continuation"):
        lm.loglikelihood([req("the history", "")])
    with pytest.raises(
        ValueError, match=rf"a continuation of \d+ tokens does not fit the model's context of {L}"
    ):
        lm.loglikelihood([req("the", " history of the place and its people" * 4)])


@pytest.mark.slow  # default tier under 5 min: lm-eval's command line in a process of its own
def test_grassflow_lm_eval_is_lm_evals_command_line(tmp_path):
    """`grassflow lm-eval`: lm-eval's own options, our model registered; its results file holds the
    word perplexity."""
    model_dir = make_model_dir(tmp_path, "transformer", generate_split(6, seed=5))
    _, task = wikitext_task(tmp_path, pages(generate_split(2, seed=1)))
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "grassflow",
            "lm-eval",
            "--model",
            "grassflow",
            "--model_args",
            f"pretrained={model_dir}",
            "--tasks",
            task,
            "--include_path",
            str(tmp_path / "wikitext_local"),
            "--device",
            "cpu",
            "--output_path",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    (results,) = (tmp_path / "out").rglob("results_*.json")
    assert json.loads(results.read_text())["results"][task]["word_perplexity,none"] > 1
