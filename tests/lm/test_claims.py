"""What the tables may say: the unigram baseline, 'did not learn', the verdict gate, the data label,
weights hashes, and the ablation grid's arithmetic."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from grassflow.checkpoint import state_sha256
from grassflow.lm.ablations import receptive_field
from grassflow.lm.comparable import data_label, load_published, not_comparable
from grassflow.lm.grid import ablation_runs, runs
from grassflow.lm.unigram import unigram_ppl
from helpers.specs import PUBLISHED, ran

SETUP = load_published(PUBLISHED)["paper_setup"]
PAPER_DATA = {"test": SETUP["data"]["content_sha256"]["test"]}
PAPER_PRESET = {
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
}
TABLE1 = {"n_layers": 6, "context_len": 128, "batch_size": 32, "epochs": 30}
LEARNED = {
    "transformer": {"n_learned": 3, "not_learned": []},
    "grassmann": {"n_learned": 3, "not_learned": []},
}


def _ran(preset, exp):
    return ran(preset["model"], preset["train"], exp)


def test_unigram_ppl():
    vocab = 10
    assert unigram_ppl(
        np.arange(vocab).repeat(50), np.arange(vocab).repeat(3), vocab
    ) == pytest.approx(vocab)
    # vocab 3, token 0 seen 9 times, 1 once, 2 never: add-one gives 10/13, 2/13, 1/13; the stream's
    # first token has no context and is not scored
    train = np.array([0] * 9 + [1])
    assert unigram_ppl(train, np.array([2, 0, 0]), 3) == pytest.approx(13 / 10)
    assert unigram_ppl(train, np.array([0, 2]), 3) == pytest.approx(13.0)


def test_verdict_only_where_the_table_can_carry_one():
    assert (
        not_comparable(
            PAPER_PRESET, "table1", _ran(PAPER_PRESET, TABLE1), PAPER_DATA, SETUP, LEARNED
        )
        == []
    )
    # the new user's 3-epoch real-text check: runs that did not learn on other data at another scale
    small = {
        **PAPER_PRESET,
        "data": {"source": "local", "local_dir": "/data/pseudo"},
        "model": {**PAPER_PRESET["model"], "d_model": 128},
    }
    why = not_comparable(
        small,
        "table1",
        _ran(small, {**TABLE1, "n_layers": 2, "epochs": 3}),
        {"test": "f" * 64},
        SETUP,
        {
            "transformer": {"n_learned": 0, "not_learned": ["a", "b"]},
            "grassmann": {"n_learned": 0, "not_learned": ["c", "d"]},
        },
    )
    assert any("not the paper's data" in w for w in why)
    assert any(
        "not the paper's setup" in w
        and "d_model 128 (paper 256)" in w
        and "n_layers 2 (paper 6)" in w
        and "epochs 3 (paper 30)" in w
        for w in why
    )
    assert "4 run(s) did not beat the unigram baseline" in why
    one_seed = {
        "transformer": {"n_learned": 1, "not_learned": []},
        "grassmann": {"n_learned": 3, "not_learned": []},
    }
    assert not_comparable(
        PAPER_PRESET, "table1", _ran(PAPER_PRESET, TABLE1), PAPER_DATA, SETUP, one_seed
    ) == ["fewer than 2 seeds per model that learned"]
    # the laptop preset's departures: what the paper states, and what only our paper preset assumes
    laptop = {
        **PAPER_PRESET,
        "data": {**PAPER_PRESET["data"], "eval_max_tokens": 50000},
        "model": {**PAPER_PRESET["model"], "norm": "pre", "tie_weights": False, "dropout": 0.0},
        "train": {"lr": 3e-3, "max_steps_per_epoch": 200},
    }
    why = not_comparable(
        laptop, "table1", _ran(laptop, {**TABLE1, "batch_size": 8}), PAPER_DATA, SETUP, LEARNED
    )
    assert why[0] == "validation and test cut to their leading rows of at most 50,000 tokens"
    assert why[1] == (
        "not the paper's setup: norm pre (paper post), dropout 0.0 (paper preset 0.1), "
        "tie_weights False (paper preset True), batch_size 8 (paper preset 32), "
        "lr 0.003 (paper preset 0.0003), max_steps_per_epoch 200 (paper preset None)"
    )
    assert "cut to their leading rows of at most 50,000 tokens" in data_label(
        laptop, PAPER_DATA, SETUP
    )
    gpt2 = {**PAPER_PRESET, "tokenizer": {"name": "gpt2"}}
    assert not_comparable(gpt2, "table1", _ran(gpt2, TABLE1), PAPER_DATA, SETUP, LEARNED) == [
        "tokenizer gpt2 (paper bert-base-uncased)"
    ]


def test_local_data_is_labelled_by_what_it_is():
    local = {
        **PAPER_PRESET,
        "data": {
            "source": "local",
            "local_dir": "/mirror/wikitext",
            "dataset": "Salesforce/wikitext",
            "name": "wikitext-2-raw-v1",
        },
    }
    assert (
        data_label(local, PAPER_DATA, SETUP)
        == "local directory `/mirror/wikitext` (its content hashes match the pinned hub ones)"
    )
    other = data_label(local, {"test": "0" * 64}, SETUP)
    assert "/mirror/wikitext" in other and "do NOT match" in other and "Salesforce" not in other


def test_weights_hash_identifies_weights_not_files(tmp_path):
    state = torch.nn.Linear(4, 3).state_dict()
    torch.save({"model": state}, tmp_path / "a.pt")
    torch.save({"model": state}, tmp_path / "b_other_name.pt")
    a, b = (
        torch.load(tmp_path / n, weights_only=True)["model"] for n in ("a.pt", "b_other_name.pt")
    )
    assert (tmp_path / "a.pt").read_bytes() != (
        tmp_path / "b_other_name.pt"
    ).read_bytes()  # torch.save names its archive
    assert state_sha256(a) == state_sha256(b) == state_sha256(state)
    changed = {**state, "bias": state["bias"] + 1e-7}
    assert state_sha256(changed) != state_sha256(state)
    assert state_sha256(None) is None


def _preset(variants, seeds=(0, 1, 2)):
    return {
        "models": ["transformer", "grassmann"],
        "seeds": [0, 1, 2],
        "tokenizer": {"name": "trained"},
        "model": {"d_model": 32, "d_ff": 64, "n_heads": 4, "r": 4, "lags": [1, 2, 4, 8, 12, 16]},
        "experiments": {"table1": {"n_layers": 6, "context_len": 32, "batch_size": 8, "epochs": 1}},
        "train": {"lr": 1e-3},
        "ablations": {"base": "table1", "seeds": list(seeds), "variants": variants},
    }


def test_ablation_grid_shares_equal_runs():
    p = _preset(
        {"paper": {}, "pre_norm": {"norm": "pre"}, "per_layer_lags": {"lag_schedule": "per_layer"}}
    )
    grid = ablation_runs("x", p, {k: v for k, v in runs("x", {**p, "ablations": None}).items()})
    ids = {v: {m: [s["run_id"] for s in specs] for m, specs in d.items()} for v, d in grid.items()}
    assert ids["paper"]["grassmann"] == [
        "table1-grassmann-s0",
        "table1-grassmann-s1",
        "table1-grassmann-s2",
    ]
    # a Grassmann-only switch
    assert ids["per_layer_lags"]["transformer"] == ids["paper"]["transformer"]
    assert ids["pre_norm"]["transformer"] == [
        "table1_pre_norm-transformer-s0",
        "table1_pre_norm-transformer-s1",
        "table1_pre_norm-transformer-s2",
    ]
    all_runs = runs("x", p)
    assert len(all_runs) == 6 + 6 + 3  # main; pre_norm both models; per_layer_lags Grassmann only


def test_receptive_field():
    model = {**PAPER_PRESET["model"], "n_layers": 6, "context_len": 128}  # a run's spec's model
    assert receptive_field(model) == 6 * 16
    assert receptive_field({**model, "lag_schedule": "per_layer"}) == 1 + 2 + 4 + 8 + 12 + 16
    assert receptive_field({**model, "n_layers": 3}) == 3 * 16


def _runs_frame(statuses: dict) -> pd.DataFrame:
    """A table's run rows: {run_id: status}, validation PPL 200 + 10·seed (Grassmann +20)."""
    rows = []
    for run_id, status in statuses.items():
        _, model, seed = run_id.split("-")
        ok = status == "completed"
        val = (
            200.0 + 10 * int(seed[1:]) + (20 if model == "grassmann" else 0) if ok else float("nan")
        )
        rows.append(
            {
                "run_id": run_id,
                "model": model,
                "seed": int(seed[1:]),
                "status": status,
                "val_ppl": val,
                "test_ppl": val,
                "test_strided_ppl": val,
                "test_word_ppl": val,
                "learned": ok,
                "n_params": 10,
                "record": f"runs/{run_id}/run.json",
            }
        )
    return pd.DataFrame(rows)


@pytest.mark.parametrize("dropped", [None, "table1-grassmann-s2"])
def test_a_diverged_seed_is_named_where_the_verdict_is(dropped):
    """The verdict line counts the seeds the gap rests on and names each run left out, with why; a
    verdict on fewer seeds than the preset asked for says so in the verdict itself."""
    from grassflow.lm.aggregate import judge, markdown_table, summarise

    statuses = {
        f"table1-{m}-s{s}": "completed" for m in ("transformer", "grassmann") for s in range(3)
    }
    if dropped:
        statuses[dropped] = "diverged"
    s = summarise(_runs_frame(statuses), {}, 3)
    judge(s, [], 15.0)
    line = markdown_table("table1", TABLE1, s, ".").splitlines()[-1]
    if dropped:
        basis = (
            "3 of 3 transformer seeds, 2 of 3 grassmann seeds; left out: table1-grassmann-s2 "
            "(diverged)"
        )
        assert f"over {basis}." in line
        assert s["gap"]["verdict"].endswith(f" — on fewer seeds than asked ({basis})")
    else:
        assert "over 3 of 3 transformer seeds, 3 of 3 grassmann seeds." in line
        assert "fewer seeds" not in s["gap"]["verdict"]


@pytest.mark.parametrize(
    "grassmann", ["completed", "diverged", None], ids=["one-model", "none-completed", "both"]
)
def test_a_table_without_a_gap_says_why_and_still_why_it_is_not_the_papers(grassmann):
    """A table of one model (a preset that asks only Grassmann, as the ablations' v1 preset does) or
    one whose other model completed no run: no gap, and the line says which; the reasons its numbers
    cannot be compared with the paper's, which a gap's verdict carries, are said there too, and in
    the LaTeX caption."""
    from grassflow.lm.aggregate import judge, latex_table, markdown_table, summarise

    statuses = {"table1-grassmann-s0": grassmann or "completed"}
    if grassmann != "completed":
        statuses["table1-transformer-s0"] = "diverged" if grassmann == "diverged" else "completed"
    why = ["2 layers, not 6"]
    s = summarise(_runs_frame(statuses), {}, 1)
    judge(s, why, 15.0)
    line = markdown_table("table1", TABLE1, s, ".").splitlines()[-1]
    if grassmann is None:  # both completed: the verdict carries the reasons
        assert "gap" in s and s["gap"]["verdict"] == "not comparable: 2 layers, not 6"
        return
    said = (
        "no transformer runs in this table"
        if grassmann == "completed"
        else "a model has no completed run"
    )
    assert line == (
        f"Gap not computed: {said}. **These numbers cannot be compared with the paper's:** 2 "
        "layers, not 6."
    )
    assert "Not comparable with the paper's numbers: 2 layers, not 6." in latex_table(
        "table1", TABLE1, s
    )
