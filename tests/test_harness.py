"""lm-evaluation-harness runs our models (grassflow.lm.harness), and our word-level perplexity
without lm-eval (grassflow.lm.rolling) is the number lm-eval itself reports: lm-eval's own
simple_evaluate on a local task (a task YAML through TaskManager's include_path, its documents a
local parquet file of generated text), to 1e-4 relative. The hub is never touched."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from grassflow.data.tokenizers import build_wordpiece
from grassflow.lm.rolling import harness_word_perplexity, prefix_id, windows
from grassflow.lm.synthetic import generate_split
from grassflow.models import ModelConfig, build_model
from grassflow.pretrained import save_pretrained

L = 16  # short windows: most documents span several


@pytest.fixture(scope="module", params=["transformer", "grassmann"])
def model_dir(request, tmp_path_factory):
    """An export-like directory: a randomly initialised model, config.json, tokenizer.json."""
    from tokenizers import Tokenizer

    d = tmp_path_factory.mktemp(request.param)
    rows = generate_split(6, seed=5)
    build_wordpiece(rows, 300, d / "tokenizer.json")
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=Tokenizer.from_file(str(d / "tokenizer.json")).get_vocab_size(), context_len=L,
                      n_layers=2, d_model=32, d_ff=64, n_heads=2, r=4, lags=[1, 2], dropout=0.0)
    save_pretrained(build_model(request.param, cfg).eval(), request.param, d, tokenizer={"name": "trained"})
    return d


def documents() -> list[str]:
    """Wikitext-like articles (one document each, as the harness's wikitext task has them), and a
    short one (fewer tokens than one window)."""
    rows = generate_split(4, seed=9)
    starts = [i for i, r in enumerate(rows) if r.startswith(" = ") and not r.startswith(" = = ")] + [len(rows)]
    return ["\n".join(rows[a:b]) for a, b in zip(starts, starts[1:])] + [" a short one \n"]


def local_task(tmp_path, docs) -> tuple:
    from lm_eval.tasks import TaskManager

    pq.write_table(pa.table({"page": docs}), tmp_path / "docs.parquet")
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "docs.yaml").write_text(
        "task: grassflow_docs\ndataset_path: parquet\n"
        f"dataset_kwargs:\n  data_files:\n    test: {tmp_path / 'docs.parquet'}\n"
        "test_split: test\noutput_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{page}}'\n"
        "metric_list:\n  - metric: word_perplexity\n")
    return TaskManager(include_path=str(tmp_path / "tasks")), "grassflow_docs"


def test_our_windows_are_the_harnesss():
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    for n in (1, 5, L - 1, L, L + 1, 2 * L, 2 * L + 3, 5 * L - 1):
        theirs = [make_disjoint_window(w) for w in get_rolling_token_windows(list(range(1, n + 1)), 0, L, 1)]
        seq = [0, *range(1, n + 1)]
        ours, done = [], 0
        for start, end in windows(n, L):
            ours.append((seq[start:end], seq[max(start, done) + 1 : end + 1]))
            done = end
        # the harness's model input is (context + continuation)[-(L+1):][:-1]
        assert [((c + x)[-(L + 1):][:-1], x) for c, x in theirs] == ours, n


def test_lm_eval_reports_our_word_perplexity(model_dir, tmp_path):
    import lm_eval

    import grassflow.lm.harness  # noqa: F401  (registers --model grassflow)
    from grassflow.decode import open_model

    docs = documents()
    manager, task = local_task(tmp_path, docs)
    out = lm_eval.simple_evaluate(model="grassflow", model_args=f"pretrained={model_dir}", tasks=[task],
                                  task_manager=manager, batch_size=4, device="cpu")
    theirs = out["results"][task]["word_perplexity,none"]
    model, tok = open_model(model_dir)
    ours = harness_word_perplexity(model, tok, docs, L, prefix_id(tok))
    assert ours["tokens"] > 3 * L * len(docs) // 2  # most documents span several windows
    assert theirs == pytest.approx(ours["word_perplexity"], rel=1e-4)


def test_loglikelihood_and_generation_through_the_harness(model_dir):
    """A continuation's log-likelihood is the rolling one of a short document (one window, the
    prefix token as its context); greedy generation is our decoder's, cut at the stop string."""
    from lm_eval.api.instance import Instance

    from grassflow.decode import generate
    from grassflow.lm.harness import GrassflowLM

    lm = GrassflowLM(str(model_dir), batch_size=2)
    text = " the history of the place"
    req = lambda args, kind: Instance(request_type=kind, doc={}, arguments=args, idx=0)  # noqa: E731
    (ll, _), = lm.loglikelihood([req(("", text), "loglikelihood")])
    (rolling,) = lm.loglikelihood_rolling([req((text,), "loglikelihood_rolling")])
    assert ll == pytest.approx(rolling, rel=1e-6)
    ids = lm.tok_encode("the history")
    greedy = lm.tokenizer.decode(generate(lm.model, torch.tensor([ids]), 5, temperature=0.0)[0, len(ids):].tolist())
    (out,) = lm.generate_until([req(("the history", {"until": ["\n"], "max_gen_toks": 5}), "generate_until")])
    assert out == greedy.split("\n")[0]


def test_grassflow_lm_eval_is_lm_evals_command_line(model_dir, tmp_path):
    """`grassflow lm-eval`: lm-eval's own options, our model registered; its results file holds
    the word perplexity."""
    manager_dir = tmp_path / "t"
    manager_dir.mkdir()
    local_task(manager_dir, documents())
    res = subprocess.run([sys.executable, "-m", "grassflow", "lm-eval", "--model", "grassflow", "--model_args",
                          f"pretrained={model_dir}", "--tasks", "grassflow_docs", "--include_path",
                          str(manager_dir / "tasks"), "--device", "cpu", "--output_path", str(tmp_path / "out")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    (results,) = (tmp_path / "out").rglob("results_*.json")
    assert json.loads(results.read_text())["results"]["grassflow_docs"]["word_perplexity,none"] > 1
