"""A trained model leaves the pipeline (grassflow export, grassflow.pretrained, grassflow generate),
from the finished demo: the export alone, in a fresh Python process, gives the evaluation's logits
and its perplexity; its weights are tensors only; generation is deterministic under a seed."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from grassflow.loop import load_trained
from grassflow.models import build_model, config_from_json
from grassflow.runs import open_for_evaluation

# run in a fresh process that is given the export directory and the token ids, nothing of the run
FRESH = """
import json, sys
import numpy as np, torch
from grassflow.lm.evaluate import chunked_nll
from grassflow.pretrained import load_model
export, ids_file, out, batch = sys.argv[1:]
model = load_model(export)
ids = np.load(ids_file)
L = model.cfg.context_len
torch.save(model(torch.as_tensor(ids[: 2 * L].reshape(2, L), dtype=torch.long)), out)
nll, n = chunked_nll(model, ids, L, int(batch), torch.device("cpu"))
print(json.dumps({"ppl": float(np.exp(nll / n)), "type": type(model).__name__}))
"""


def gf(*args, **kw):
    return subprocess.run(
        [sys.executable, "-m", "grassflow", *map(str, args)], capture_output=True, text=True, **kw
    )


@pytest.mark.parametrize("kind", ["grassmann", "transformer"])
def test_an_export_alone_gives_the_evaluations_logits_and_perplexity(demo, tmp_path, kind):
    run = demo / f"results/demo/runs/table1-{kind}-s0"
    res = gf("export", run, tmp_path / "export")
    assert res.returncode == 0, res.stderr
    export = tmp_path / "export"
    assert sorted(p.name for p in export.iterdir()) == [
        "README.md",
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]

    # the evaluation's model, as the evaluate job loads it
    ckpt, _, _, _ = open_for_evaluation(
        run / "model.safetensors", run / "run.json", tmp_path / "unused.json"
    )
    model = build_model(kind, config_from_json({k: v for k, v in ckpt.items() if k != "model"}))
    load_trained(model, ckpt["model"])
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
            str(tmp_path / "logits.pt"),
            str(ckpt["spec"]["train"]["eval_batch_size"]),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert fresh.returncode == 0, fresh.stderr
    L = model.cfg.context_len
    with torch.no_grad():
        expected = model.eval()(torch.as_tensor(ids[: 2 * L].reshape(2, L)))
    assert torch.equal(torch.load(tmp_path / "logits.pt"), expected)
    got = json.loads(fresh.stdout)
    assert got["type"] == type(model).__name__
    evaluation = json.loads((run / "eval.json").read_text())
    # the same sums in the same batches; the evaluation job's thread count may round differently
    assert got["ppl"] == pytest.approx(evaluation["validation"]["chunked_ppl"], rel=1e-6)

    # tensors only, read by safetensors alone; the tied head stored once; the weights are the run's
    from safetensors import safe_open

    raw = (export / "model.safetensors").read_bytes()
    header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
    assert all(
        set(v) == {"dtype", "shape", "data_offsets"}
        for k, v in header.items()
        if k != "__metadata__"
    )
    with safe_open(str(export / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert all(isinstance(f.get_tensor(k), torch.Tensor) for k in keys)
    assert "head.weight" not in keys and "tok_emb.weight" in keys  # the demo ties the head
    config = json.loads((export / "config.json").read_text())
    record = json.loads((run / "run.json").read_text())
    assert config["weights_sha256"] == record["weights_sha256"] and config["model_kind"] == kind
    assert config["tokenizer"]["sha256"] == record["data"]["train"]["tokenizer_sha256"]

    card = (export / "README.md").read_text()
    assert card.startswith("---\nlicense: mit\n") and "perplexity" in card.split("---")[1]
    assert f"[table1-{kind}-s0]" in card and "Grassmann vs Transformer, best validation PPL" in card
    assert f"| validation | {evaluation['validation']['chunked_ppl']:.2f} |" in card

    # an export is never overwritten
    again = gf("export", run, export)
    assert again.returncode == 1 and "exists" in again.stderr


def test_generate_is_deterministic_under_a_seed_from_an_export_and_from_its_run(demo, tmp_path):
    run = demo / "results/demo/runs/table1-grassmann-s0"
    assert gf("export", run, tmp_path / "g").returncode == 0

    def text(model, seed):
        res = gf(
            "generate",
            model,
            "--prompt",
            "the history of the",
            "--max-new-tokens",
            24,
            "--seed",
            seed,
            "--temperature",
            1.0,
            "--top-k",
            40,
        )
        assert res.returncode == 0, res.stderr
        return res.stdout

    first = text(tmp_path / "g", 1)
    assert first.startswith("the history of the") and len(first.split()) > 8
    assert text(tmp_path / "g", 1) == first
    assert text(tmp_path / "g", 2) != first
    assert text(run, 1) == first  # a run directory: the same model, the same text
