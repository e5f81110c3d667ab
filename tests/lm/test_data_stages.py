"""Data stages through their real interfaces: parquet files in, parquet files out."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grassflow.data import DataError
from grassflow.data.sources import content_sha256, read_rows
from grassflow.data.tokenizers import load_tokenizer
from grassflow.lm.data import download, read_tokens
from grassflow.lm.synthetic import generate_split
from grassflow.lm.tokenize import leading_rows, tokenize_split
from grassflow.lm.train_tokenizer import train_tokenizer
from helpers.procs import needs

SHARED_TEST = Path(__file__).resolve().parents[3] / "shared/data/wikitext-2-raw-v1/test.parquet"
SYN = {
    "source": "synthetic",
    "synthetic": {"seed": 3, "articles": {"train": 20, "validation": 3, "test": 3}},
}


def test_synthetic_is_deterministic_and_wikitext_shaped():
    a, b = generate_split(5, seed=1), generate_split(5, seed=1)
    assert a == b and a != generate_split(5, seed=2)
    assert any(r.startswith(" = ") and r.endswith(" = \n") for r in a)
    assert "" in a and all(r == "" or r.endswith("\n") for r in a)


def test_download_synthetic_and_checksum(tmp_path):
    rec = download(SYN, "train", tmp_path / "train.parquet")
    rows = read_rows(tmp_path / "train.parquet")
    assert rec["rows"] == len(rows) and rec["content_sha256"] == content_sha256(rows)
    bad = {**SYN, "expected_sha256": {"train": "0" * 64}}
    with pytest.raises(DataError, match=r"expected_sha256\.train"):
        download(bad, "train", tmp_path / "again.parquet")
    assert not (tmp_path / "again.parquet").exists()  # nothing written from bad data


def test_local_mirror_layout(tmp_path):
    mirror = tmp_path / "mirror" / "wikitext-2-raw-v1"
    mirror.mkdir(parents=True)
    pq.write_table(
        pa.table({"text": ["", " = A = \n", " hello world \n"]}),
        mirror / "test-00000-of-00001.parquet",
    )
    cfg = {"source": "local", "local_dir": str(tmp_path / "mirror"), "name": "wikitext-2-raw-v1"}
    assert download(cfg, "test", tmp_path / "test.parquet")["rows"] == 3
    with pytest.raises(DataError, match="data.local_dir: no parquet file for split 'train'"):
        download(cfg, "train", tmp_path / "train.parquet")


def test_hub_offline_fails_at_once_with_the_fix(tmp_path):
    code = (
        "from grassflow.lm.data import download\n"
        "download({'source': 'hub', 'dataset': 'Salesforce/wikitext', 'name': 'wikitext-2-raw-v1',"
        " 'revision': None}, 'test', 'x.parquet')"
    )
    # a hang guard, not a bound
    res = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=600,
    )
    assert res.returncode != 0
    assert "HF_HUB_OFFLINE" in res.stderr and "data.source: local" in res.stderr


def test_trained_tokenizer_to_parquet(tmp_path):
    for split in ("train", "test"):
        download(SYN, split, tmp_path / f"{split}.parquet")
    train_tokenizer(tmp_path / "train.parquet", 200, tmp_path / "tok.json")
    cfg = {"name": "trained"}
    meta = tokenize_split(
        cfg, tmp_path / "test.parquet", tmp_path / "tok_test.parquet", tmp_path / "tok.json"
    )
    ids, meta2 = read_tokens(tmp_path / "tok_test.parquet", vocab_size=meta["vocab_size"])
    assert pq.read_table(tmp_path / "tok_test.parquet").schema.field("ids").type == pa.uint16()
    assert meta2["n_tokens"] == len(ids) > 100 and meta2["tokenizer"] == "trained"
    assert meta2["source_content_sha256"] == content_sha256(read_rows(tmp_path / "test.parquet"))
    with pytest.raises(DataError, match="does not belong to this tokenizer"):
        read_tokens(tmp_path / "tok_test.parquet", vocab_size=5)


def test_bert_and_gpt2_from_local_directories(tmp_path):
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "vocab.txt").write_text(
        "\n".join(
            ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "grass", "##mann", "flow", ","]
        )
        + "\n"
    )
    tok = load_tokenizer({"name": "bert-base-uncased", "path": str(bert)})
    assert tok.encode("The Grassmann flow,", add_special_tokens=False).tokens == [
        "the",
        "grass",
        "##mann",
        "flow",
        ",",
    ]
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    vocab = {c: i for i, c in enumerate(["a", "b", "Ġ", "ab", "Ġab", "<|endoftext|>"])}
    (gpt2 / "vocab.json").write_text(json.dumps(vocab))
    (gpt2 / "merges.txt").write_text("#version: 0.2\na b\nĠ ab\n")
    tok = load_tokenizer({"name": "gpt2", "path": str(gpt2)})
    assert tok.encode("ab ab", add_special_tokens=False).tokens == ["ab", "Ġab"]
    with pytest.raises(DataError, match=r"lacks \['merges.txt'\]"):
        (gpt2 / "merges.txt").unlink()
        load_tokenizer({"name": "gpt2", "path": str(gpt2)})


def test_corrupt_token_file_names_the_file(tmp_path):
    f = tmp_path / "bad.parquet"
    f.write_bytes(b"PAR1 not really")
    with pytest.raises(DataError, match="bad.parquet"):
        read_tokens(f)
    with pytest.raises(DataError, match="bad.parquet"):
        read_rows(f)


def test_eval_max_tokens_cuts_validation_and_test_to_leading_rows(tmp_path):
    for split in ("train", "validation", "test"):
        download(SYN, split, tmp_path / f"{split}.parquet")
    train_tokenizer(tmp_path / "train.parquet", 200, tmp_path / "tok.json")
    full = {
        s: tokenize_split(
            {"name": "trained"},
            tmp_path / f"{s}.parquet",
            tmp_path / f"full_{s}.parquet",
            tmp_path / "tok.json",
        )
        for s in ("train", "validation")
    }
    cap = full["validation"]["n_tokens"] // 3
    out = tmp_path / "tokens"
    r = _cli(
        "tokenize",
        "--tokenizer",
        json.dumps({"name": "trained", "eval_max_tokens": cap}),
        "--artifact",
        str(tmp_path / "tok.json"),
        "--raw",
        *(str(tmp_path / f"{s}.parquet") for s in ("train", "validation")),
        "--out-dir",
        str(out),
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    train_ids, train_meta = read_tokens(out / "train.parquet")
    # train is never cut
    assert "cut" not in train_meta and len(train_ids) == full["train"]["n_tokens"]
    ids, meta = read_tokens(out / "validation.parquet")
    full_ids, _ = read_tokens(tmp_path / "full_validation.parquet")
    rows = read_rows(tmp_path / "validation.parquet")
    k = meta["cut"]["rows"]
    # a prefix of whole rows
    assert 0 < len(ids) <= cap and np.array_equal(ids, full_ids[: len(ids)])
    assert meta["cut"] == {
        "max_tokens": cap,
        "rows": k,
        "of_rows": len(rows),
        "of_tokens": len(full_ids),
        "content_sha256": content_sha256(rows[:k]),
    }
    assert meta["n_words"] == len(re.split(r"\s+", "\n".join(rows[:k])))
    # still names the split it came from
    assert meta["source_content_sha256"] == content_sha256(rows)
    rows_of = lambda *n: [np.zeros(k, dtype=np.int64) for k in n]  # noqa: E731
    assert [leading_rows(rows_of(3, 0, 4, 2), cap) for cap in (9, 8, 6, 2)] == [4, 3, 2, 1]
    assert leading_rows(rows_of(0, 5, 1), 2) == 2  # at least one non-blank row, even over the cap


@needs(SHARED_TEST.exists(), "../shared/data not present")
def test_real_wikitext_test_split(tmp_path):
    rows = read_rows(SHARED_TEST)
    assert len(rows) == 4358 and sum(1 for r in rows if r) == 2891
    pq.write_table(pa.table({"text": rows}), tmp_path / "train.parquet")
    train_tokenizer(tmp_path / "train.parquet", 2000, tmp_path / "tok.json")
    meta = tokenize_split(
        {"name": "trained"},
        tmp_path / "train.parquet",
        tmp_path / "ids.parquet",
        tmp_path / "tok.json",
    )
    ids, _ = read_tokens(tmp_path / "ids.parquet")
    assert meta["n_words"] == len(re.split(r"\s+", "\n".join(rows))) and np.all(
        ids < meta["vocab_size"]
    )


def _cli(stage, *args, cwd):
    """The LM's stage `stage` as its rule runs it: `python -m grassflow.lm.<stage>`."""
    return subprocess.run(
        [sys.executable, "-m", f"grassflow.lm.{stage}", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=600,
    )


def test_empty_split_fails_clearly_and_writes_nothing(tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for split in ("train", "validation", "test"):
        rows = ["", " = A = \n", " some words here \n"] if split != "test" else ["", "", ""]
        pq.write_table(pa.table({"text": rows}), mirror / f"{split}.parquet")
    data = json.dumps({"source": "local", "local_dir": str(mirror), "name": "wikitext-2-raw-v1"})
    res = _cli("download", "--data", data, "--out-dir", "raw", cwd=tmp_path)
    assert res.returncode == 1 and res.stderr.startswith("error:") and "Traceback" not in res.stderr
    assert "split 'test'" in res.stderr and "is empty" in res.stderr
    assert not (tmp_path / "raw" / "test.parquet").exists()
    assert not (tmp_path / "raw" / "checksums.json").exists()
    # the tokenize stage refuses an empty raw file too, naming it
    train_tokenizer(mirror / "train.parquet", 40, tmp_path / "tok.json")
    res = _cli(
        "tokenize",
        "--tokenizer",
        json.dumps({"name": "trained"}),
        "--artifact",
        "tok.json",
        "--raw",
        str(mirror / "test.parquet"),
        "--out-dir",
        "tok",
        cwd=tmp_path,
    )
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "test.parquet: no tokens (empty split)" in res.stderr
    assert not (tmp_path / "tok" / "test.parquet").exists()


def test_truncated_raw_parquet_is_named_by_the_stage(tmp_path):
    good = tmp_path / "train.parquet"
    pq.write_table(pa.table({"text": [" hello world \n"] * 50}), good)
    bad = tmp_path / "validation.parquet"
    bad.write_bytes(good.read_bytes()[:-40])
    res = _cli(
        "train_tokenizer",
        "--train",
        str(bad),
        "--vocab-size",
        "50",
        "--out",
        "tok.json",
        cwd=tmp_path,
    )
    assert res.returncode == 1 and "validation.parquet: not a readable parquet file" in res.stderr
    assert not (tmp_path / "tok.json").exists()


def test_trained_tokenizer_is_identical_across_processes(tmp_path):
    download(SYN, "train", tmp_path / "train.parquet")
    code = (
        "import sys; from grassflow.lm.train_tokenizer import train_tokenizer; "
        "train_tokenizer(sys.argv[1], 300, sys.argv[2])"
    )
    for name in ("a.json", "b.json"):
        subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / "train.parquet"), str(tmp_path / name)],
            check=True,
        )
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()


def test_a_spec_file_reads_as_its_json_and_a_bad_one_is_named(tmp_path):
    """The rules pass sections as JSON (`--data '{...}'`); a user may pass a file of it: the stage
    reads the file as it reads the JSON itself; a missing or malformed file is named before any
    work, with the option it was given to."""
    (tmp_path / "data.json").write_text(json.dumps(SYN))
    from_file = _cli("download", "--data", "data.json", "--out-dir", "a", cwd=tmp_path)
    inline = _cli("download", "--data", json.dumps(SYN), "--out-dir", "b", cwd=tmp_path)
    assert from_file.returncode == inline.returncode == 0, from_file.stderr + inline.stderr
    assert (tmp_path / "a/checksums.json").read_text() == (
        tmp_path / "b/checksums.json"
    ).read_text()
    missing = _cli("download", "--data", "nowhere.json", "--out-dir", "c", cwd=tmp_path)
    assert (
        missing.returncode == 2
        and "argument --data: nowhere.json: no such JSON file" in missing.stderr
    )
    (tmp_path / "broken.json").write_text('{"source": ')
    broken = _cli("download", "--data", "broken.json", "--out-dir", "c", cwd=tmp_path)
    assert (
        broken.returncode == 2 and "argument --data: broken.json is not valid JSON" in broken.stderr
    )
    assert not (tmp_path / "c").exists()
