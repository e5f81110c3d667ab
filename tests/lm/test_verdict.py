"""Every branch of the LM tables' verdict, reached through the real aggregate on crafted run records
(its statistics: tests/report/test_stats.py)."""

from __future__ import annotations

import json

import pytest

from grassflow.lm.aggregate import aggregate
from grassflow.lm.comparable import load_published
from grassflow.report.stats import gap_ci
from helpers.specs import PUBLISHED

SETUP = load_published(PUBLISHED)["paper_setup"]


# --- every verdict through the real aggregate -----------------------------------------------------
PRESET = {
    "data": {
        "source": "hub",
        "dataset": "Salesforce/wikitext",
        "name": "wikitext-2-raw-v1",
        "revision": "b08601e",
    },
    "tokenizer": {"name": "bert-base-uncased"},
    "models": ["transformer", "grassmann"],
    "model": {"d_model": 256, "d_ff": 1024, "n_heads": 4, "r": 32, "lags": [1, 2, 4, 8, 12, 16]},
    "train": {"lr": 3.0e-4, "max_steps_per_epoch": None},
    "experiments": {"table1": {"n_layers": 6, "context_len": 128, "batch_size": 32, "epochs": 30}},
    "seeds": [0, 1, 2],
}
UNIGRAM = {"validation": {"unigram_ppl": 800.0}, "test": {"unigram_ppl": 820.0}}


def _run(root, model: str, seed: int, val_ppl: float):
    d = root / "runs" / f"table1-{model}-s{seed}"
    d.mkdir(parents=True)
    rec = {
        "run_id": d.name,
        "spec": {
            "experiment": "table1",
            "model_kind": model,
            "seed": seed,
            "model": {"n_layers": 6, "context_len": 128},
            "train": {"batch_size": 32, "epochs": 30},
        },
        "status": {"state": "completed"},
        "best_epoch": 30,
        "n_params": 1000,
        "epochs_completed": 30,
        "wall_seconds": 1.0,
        "device": "crafted",
        "device_type": "cpu",
        "plucker_backend": None,
        "git": {"commit": "0" * 40, "dirty": False},
        "data": {"train": {"file_sha256": "a" * 64}},
    }
    ppl = {
        "chunked_ppl": val_ppl,
        "strided_ppl": val_ppl,
        "strided_word_ppl": 2 * val_ppl,
        "chunked_tokens": 10,
    }
    (d / "run.json").write_text(json.dumps(rec))
    (d / "eval.json").write_text(
        json.dumps({"validation": ppl, "test": ppl, "weights_sha256": "b" * 64})
    )
    (d / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "val_ppl": val_ppl}) + "\n")
    return d


def _table(root, grassmann: list[float], transformer: list[float], test_hash=None) -> str:
    runs = [_run(root, "grassmann", i, v) for i, v in enumerate(grassmann)]
    runs += [_run(root, "transformer", i, v) for i, v in enumerate(transformer)]
    files = {
        "unigram": UNIGRAM,
        "bench": {"step_rows": [], "tokens": 0, "device": "crafted"},
        "checksums": {
            "test": {"content_sha256": test_hash or SETUP["data"]["content_sha256"]["test"]}
        },
    }
    for name, obj in files.items():
        (root / f"{name}.json").write_text(json.dumps(obj))
    aggregate(
        PRESET,
        "paper",
        "table1",
        runs,
        root / "report",
        root / "unigram.json",
        root / "checksums.json",
        PUBLISHED,
    )
    csv = (root / "report" / "table1.csv").read_text()
    assert all(str(d / "run.json") in csv for d in runs)  # every number traces to its record
    return (root / "report" / "table1.md").read_text()


@pytest.mark.parametrize(
    "grassmann, transformer, verdict",
    [
        (
            [275.0, 281.0, 270.0],
            [249.0, 247.5, 251.0],
            "inconclusive (CI straddles 15 %)",
        ),  # the example
        ([260.0, 261.0, 259.0], [250.0, 250.5, 249.5], "supported (gap ≤ 15 % at 95 %)"),
        ([330.0, 331.0, 329.0], [250.0, 250.5, 249.5], "refuted (gap > 15 % at 95 %)"),
        ([230.0, 231.0, 229.0], [250.0, 250.5, 249.5], "exceeded (Grassmann better at 95 %)"),
        (
            [260.0],
            [250.0],
            "not comparable: fewer than 2 seeds per model that learned — on fewer seeds than asked "
            "(1 of 3 transformer seeds, 1 of 3 grassmann seeds)",
        ),
    ],
    ids=["inconclusive", "supported", "refuted", "exceeded", "one-seed"],
)
def test_every_verdict_through_the_aggregate(grassmann, transformer, verdict, tmp_path):
    md = _table(tmp_path, grassmann, transformer)
    assert f'Paper\'s claim "within 10–15 %": **{verdict}**.' in md
    if len(grassmann) > 1:
        g = gap_ci(grassmann, transformer)
        assert f"(95 % CI {g['ci_low']:+.1f} … {g['ci_high']:+.1f} %)" in md


def test_the_verdict_limit_is_the_papers_claim_from_published_yaml():
    assert SETUP["claim_limit_pct"] == 15


def test_no_verdict_on_data_that_is_not_the_papers(tmp_path):
    md = _table(tmp_path, [260.0, 261.0, 259.0], [250.0, 250.5, 249.5], test_hash="f" * 64)
    assert "**not comparable: not the paper's data (Wikitext-2 content hashes differ)**" in md


def test_a_preset_that_leaves_model_keys_unset_is_read_at_the_models_defaults():
    # what the model runs with where a preset is silent (ModelConfig's defaults, their one source),
    # not "None": the paper's own sizes and switches are no difference
    from grassflow.lm.comparable import setup_differences
    from helpers.specs import ran

    exp = {"n_layers": 6, "context_len": 128, "epochs": 30, "batch_size": 32}
    train = {"lr": 3e-4, "max_steps_per_epoch": None}
    assert setup_differences(ran({}, train, exp), "table1", SETUP) == []
    assert setup_differences(ran({"norm": "pre", "lags": [1, 2]}, train, exp), "table1", SETUP) == [
        "not the paper's setup: lags [1, 2] (paper [1, 2, 4, 8, 12, 16]), norm pre (paper post)"
    ]
