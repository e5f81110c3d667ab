"""Wikitext-2 v1 (the tokenized release: rare words read `<unk>`) as a dataset of its own: the
`<unk>` mapping, the content hashes of ../shared's files, the presets built on `paper` and `laptop`,
and what the tables may say about it. The DAG on the full splits is in
tests/pipeline/test_demo_outputs.py (slow)."""

from __future__ import annotations

import copy
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from grassflow.data import DataError
from grassflow.data.sources import content_sha256, read_rows
from grassflow.data.tokenizers import build_wordpiece
from grassflow.lm.comparable import data_label, load_published, not_comparable, verdict_scope
from grassflow.lm.data import download, map_unk, read_tokens
from grassflow.lm.tokenize import tokenize_split, unk_id_of
from grassflow.pipeline.presets import ConfigError, config_errors, resolve_bases
from helpers.procs import needs
from helpers.specs import PUBLISHED

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "workflow/schemas/config.schema.yaml"
SHARED = ROOT.parent / "shared" / "data"
V1 = SHARED / "wikitext-2-v1"
V1_SHA256 = {
    "train": "1597fdfbb98f53f7f0160eba53a689e083ca30e1ef65e7cd1cc1825fe52f5964",
    "validation": "e8abb8b938b85bf3ab7af158da0ade544a5c9e78ee8c64debf3f9a1ec16023c2",
    "test": "51c71cb57b659849b25f21f8369391bbea803fe483ac1d5aa4307ddd5ccee90d",
}
ROWS = [
    " = Valkyria <unk> = \n",
    "",
    " the <unk> of the <unk> , a <unk> . \n",
    " <unk> <unk> \n",
    " plain text \n",
]


def _config() -> dict:
    """config.yaml as the pipeline reads it: bases resolved, the schema's defaults filled."""
    cfg = yaml.safe_load((ROOT / "config.yaml").read_text())
    assert config_errors(cfg, SCHEMA) == []
    return cfg


@pytest.fixture
def trained(tmp_path):
    build_wordpiece([r.replace("<unk>", "") for r in ROWS] * 3, 80, tmp_path / "tok.json")
    raw = tmp_path / "raw.parquet"
    pq.write_table(pa.table({"text": ROWS}), raw)
    return tmp_path / "tok.json", raw


def test_unk_becomes_the_tokenizers_unknown_token_once(trained, tmp_path):
    tok_json, raw = trained
    mapped = tokenize_split(
        {"name": "trained", "map_unk": True}, raw, tmp_path / "m.parquet", tok_json
    )
    plain = tokenize_split(
        {"name": "trained", "map_unk": False}, raw, tmp_path / "p.parquet", tok_json
    )
    ids, meta = read_tokens(tmp_path / "m.parquet")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_json))
    unk = tok.token_to_id("[UNK]")
    assert meta["unk_mapped"] == 6 == int((ids == unk).sum())
    # everything else is the text without `<unk>`, encoded as before
    words = " ".join(r.replace("<unk>", "") for r in ROWS if r.strip())
    assert list(ids[ids != unk]) == tok.encode(words, add_special_tokens=False).ids
    # not mapped: the tokenizer's own pieces of `<unk>`, as a raw-data preset always had them
    raw_ids, raw_meta = read_tokens(tmp_path / "p.parquet")
    assert raw_meta["unk_mapped"] is None and plain["n_tokens"] > mapped["n_tokens"]
    assert list(raw_ids) == [
        i for r in ROWS if r.strip() for i in tok.encode(r, add_special_tokens=False).ids
    ]


def test_a_tokenizer_without_an_unknown_token_is_named(tmp_path):
    from tokenizers import Tokenizer, models

    bpe = Tokenizer(models.BPE())
    with pytest.raises(
        DataError, match="tokenizer.map_unk: gpt2 has no unknown token.*map_unk: false"
    ):
        unk_id_of(bpe, "gpt2")
    cfg = _config()
    cfg["preset"] = "paper_v1"
    cfg["presets"]["paper_v1"]["tokenizer"] = {"name": "gpt2"}  # map_unk auto: on for v1
    errors = config_errors(cfg, SCHEMA)
    assert (
        len(errors) == 1
        and "presets.paper_v1.tokenizer.map_unk: gpt2 has no unknown token" in errors[0]
    )


def test_v1_presets_are_paper_and_laptop_on_v1():
    cfg = _config()
    resolve_bases(cfg)
    paper, v1, lap, lap_v1 = (
        cfg["presets"][k] for k in ("paper", "paper_v1", "laptop", "laptop_v1")
    )
    assert "base" not in v1
    assert v1["data"]["name"] == "wikitext-2-v1" and v1["data"]["expected_sha256"] == V1_SHA256
    assert v1["data"]["revision"] == paper["data"]["revision"]  # the same pinned hub commit
    for key in ("experiments", "ablations", "model", "train", "snli", "recall", "seeds", "models"):
        assert v1[key] == paper[key], key
    assert map_unk(v1) and not map_unk(paper)
    assert (
        lap_v1["model"] == lap["model"]
        and lap_v1["seeds"] == [0, 1, 2]
        and "ablations" not in lap_v1
    )
    assert (
        lap_v1["experiments"]["table1"]["epochs"] == 1
        and lap_v1["train"]["max_steps_per_epoch"] is None
    )
    # the paper's model settings at laptop_v1's size: it differs from laptop_v1 in those four keys
    # only
    pap = cfg["presets"]["laptop_v1_paper_settings"]
    assert {k: v for k, v in pap.items() if k != "description"} == {
        **{k: v for k, v in lap_v1.items() if k != "description"},
        "model": {
            **lap_v1["model"],
            "norm": "post",
            "init": "default",
            "tie_weights": True,
            "dropout": 0.1,
        },
    }
    assert not config_errors({**copy.deepcopy(cfg), "preset": "paper_v1"}, SCHEMA)


def test_preset_bases_name_what_is_wrong():
    for presets, match in [
        ({"a": {"base": "nope"}}, r"presets\.a\.base: 'nope' is not a preset"),
        ({"a": {"base": "b"}, "b": {"base": "a"}}, "form a cycle"),
    ]:
        with pytest.raises(ConfigError, match=match):
            resolve_bases({"preset": "a", "presets": presets})


def _v1_preset(map_unk_setting="auto"):
    cfg = _config()
    resolve_bases(cfg)
    p = cfg["presets"]["paper_v1"]
    p["data"] = {**p["data"], "source": "local", "local_dir": "/data/wikitext-2-v1"}
    p["tokenizer"] = {**p["tokenizer"], "map_unk": map_unk_setting}
    return p


def _ran(p):
    from helpers.specs import ran

    e = p["experiments"]["table1"]
    return ran(p["model"], p["train"], e)


def test_a_v1_table_says_what_its_data_is_and_scopes_its_verdict():
    setup = load_published(PUBLISHED)["paper_setup"]
    p = _v1_preset()
    learned = {m: {"n_learned": 3, "not_learned": []} for m in ("transformer", "grassmann")}
    # `<unk>` read as one token: what the runs' token files record (data.train.unk_mapped), the
    # table says
    label = data_label(p, V1_SHA256, setup, unk=True)
    assert (
        "Wikitext-2 v1" in label
        and "`<unk>` → `[UNK]`" in label
        and "NOT the paper's raw text" in label
    )
    assert not_comparable(p, "table1", _ran(p), V1_SHA256, setup, learned, unk=True) == []
    assert "not in the runs' records" in data_label(p, V1_SHA256, setup) and not_comparable(
        p, "table1", _ran(p), V1_SHA256, setup, learned
    ) == ["wikitext-2-v1, and the runs' records do not say how `<unk>` was read"]
    assert "not its raw text" in verdict_scope(
        V1_SHA256, setup
    ) and "absolute perplexities are not" in verdict_scope(V1_SHA256, setup)
    # <unk> left in pieces: 3 of 4 free to predict flatter both models; no verdict then
    p = _v1_preset(False)
    why = not_comparable(p, "table1", _ran(p), V1_SHA256, setup, learned, unk=False)
    assert why == ["wikitext-2-v1 with `<unk>` split into pieces (tokenizer.map_unk: false)"]
    assert "split by the tokenizer" in data_label(p, V1_SHA256, setup, unk=False)
    # one split off: not v1, not the paper's data
    other = {**V1_SHA256, "test": "0" * 64}
    assert verdict_scope(other, setup) is None
    assert "not the paper's data" in not_comparable(p, "table1", _ran(p), other, setup, learned)[0]


@needs(V1.is_dir(), "needs ../shared/data/wikitext-2-v1")
def test_shared_v1_files_are_v1_by_content(tmp_path):
    """The download stage over ../shared's files (data.source: local): every split's content hash is
    the one the presets expect, and v1's `<unk>` counts are there."""
    cfg = {
        "source": "local",
        "name": "wikitext-2-v1",
        "local_dir": str(V1),
        "expected_sha256": V1_SHA256,
    }
    for split, words in (("train", 54_625), ("validation", 11_718), ("test", 15_218)):
        rec = download(cfg, split, tmp_path / f"{split}.parquet")
        assert rec["content_sha256"] == V1_SHA256[split]
        rows = read_rows(tmp_path / f"{split}.parquet")
        assert content_sha256(rows) == V1_SHA256[split]
        assert sum(r.count("<unk>") for r in rows) == words
    with pytest.raises(DataError, match="does not match the expected"):
        download(
            {**cfg, "expected_sha256": {"train": V1_SHA256["test"]}},
            "train",
            tmp_path / "x.parquet",
        )


def test_a_raw_preset_tokenizes_as_before(tokens):
    """map_unk resolves off for raw data, and the token files say nothing was mapped."""
    cfg = _config()
    resolve_bases(cfg)
    for name in ("paper", "laptop", "demo"):
        assert not map_unk(cfg["presets"][name])
    _, meta = read_tokens(tokens / "train.parquet")
    assert meta["unk_mapped"] is None and meta["n_tokens"] > 0
