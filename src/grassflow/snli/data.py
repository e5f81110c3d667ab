"""SNLI data stages: raw pairs to parquet, then token ids to parquet.

download  stanfordnlp/snli through `datasets` (hub, pinned revision), a local mirror of the
          hub's parquet files, or grassflow.snli.synthetic; pairs labelled −1 (no gold
          label) are dropped. Columns premise, hypothesis, label; content sha256 recorded
          (and checked against `expected_sha256`).
tokenize  the backbone's tokenizer (or a trained WordPiece tokenizer for the offline demo),
          without special tokens, each sentence truncated to `max_tokens` − 2 word pieces so
          "[CLS] sentence [SEP]" fits in max_tokens. Columns premise, hypothesis (lists of
          ids), label; the ids of [CLS], [SEP] and [PAD] go into the metadata.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from grassflow.data import DataError, sources
from grassflow.data.sources import check_content, content_sha256, hub_split, local_file
from grassflow.data.tokenizers import build_wordpiece, load_tokenizer, tokenizer_sha256
from grassflow.io import atomic_path, sha256_file
from grassflow.snli.synthetic import generate_pairs

SPLITS = ("train", "validation", "test")
COLUMNS = ("premise", "hypothesis", "label")
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")


def pairs_sha256(cols: dict) -> str:
    return content_sha256(
        [f"{p}\t{h}\t{y}" for p, h, y in zip(cols["premise"], cols["hypothesis"], cols["label"])]
    )


def read_pairs(path) -> dict:
    return sources.read_columns(path, COLUMNS)


def load_pairs(cfg: dict, split: str) -> dict:
    source = cfg["source"]
    if source == "hub":
        ds = hub_split(cfg, split, key="snli.data")
        cols = {c: list(ds[c]) for c in COLUMNS}
    elif source == "local":
        cols = read_pairs(local_file(cfg, split, key="snli.data"))
    elif source == "synthetic":
        syn = cfg["synthetic"]
        cols = generate_pairs(syn["pairs"][split], seed=syn["seed"] * 1000 + SPLITS.index(split))
    else:
        raise DataError(f"snli.data.source: unknown source {source!r} (hub, local, synthetic)")
    keep = [i for i, y in enumerate(cols["label"]) if y in (0, 1, 2)]  # −1: no gold label
    return {c: [cols[c][i] for i in keep] for c in COLUMNS}


def download(cfg: dict, split: str, out_path) -> dict:
    cols = load_pairs(cfg, split)
    if not cols["label"]:
        raise DataError(
            f"snli.data: split {split!r} from source {cfg['source']!r} has no labelled pairs"
        )
    digest = pairs_sha256(cols)
    check_content(cfg, split, digest, key="snli.data")
    with atomic_path(out_path) as tmp:
        pq.write_table(
            pa.table(
                {
                    "premise": cols["premise"],
                    "hypothesis": cols["hypothesis"],
                    "label": pa.array(cols["label"], pa.int8()),
                }
            ),
            tmp,
        )
    return {
        "split": split,
        "pairs": len(cols["label"]),
        "content_sha256": digest,
        "file_sha256": sha256_file(out_path),
        "source": cfg["source"],
    }


def train_tokenizer(train, vocab_size: int, out) -> None:
    cols = read_pairs(train)
    build_wordpiece(cols["premise"] + cols["hypothesis"], vocab_size, out, SPECIALS, train)


def _special_ids(tok, name) -> dict:
    ids = {
        k: tok.token_to_id(t)
        for k, t in (("cls_id", "[CLS]"), ("sep_id", "[SEP]"), ("pad_id", "[PAD]"))
    }
    missing = [k for k, v in ids.items() if v is None]
    if missing:
        raise DataError(
            f"snli.tokenizer: {name!r} has no {missing} token; the heads need [CLS], [SEP] and "
            "[PAD]"
        )
    return ids


def tokenize_split(cfg: dict, raw_parquet, out_path, artifact=None) -> dict:
    """Encode one split's pairs (`cfg`: the tokenizer section, and snli.max_tokens as
    max_tokens)."""
    t0 = time.perf_counter()
    max_tokens = cfg["max_tokens"]
    tok = load_tokenizer(cfg, artifact)
    cols = read_pairs(raw_parquet)
    keep = max_tokens - 2
    out, truncated = {}, 0
    for c in ("premise", "hypothesis"):
        encs = tok.encode_batch(cols[c], add_special_tokens=False)
        truncated += sum(len(e.ids) > keep for e in encs)
        out[c] = [e.ids[:keep] for e in encs]
    if not out["premise"]:
        raise DataError(f"{raw_parquet}: no pairs (empty split)")
    meta = {
        "tokenizer": cfg["name"],
        "vocab_size": tok.get_vocab_size(),
        "tokenizer_sha256": tokenizer_sha256(tok),
        **_special_ids(tok, cfg["name"]),
        "max_tokens": max_tokens,
        "n_pairs": len(out["premise"]),
        "truncated_sentences": truncated,
        "source_content_sha256": pairs_sha256(cols),
        "label_counts": np.bincount(cols["label"], minlength=3).tolist(),
    }
    table = pa.table(
        {
            "premise": pa.array(out["premise"], pa.list_(pa.int32())),
            "hypothesis": pa.array(out["hypothesis"], pa.list_(pa.int32())),
            "label": pa.array(cols["label"], pa.int8()),
        }
    )
    with atomic_path(out_path) as tmp:
        pq.write_table(table.replace_schema_metadata({"grassflow": json.dumps(meta)}), tmp)
    meta["seconds"] = time.perf_counter() - t0
    return meta


def read_token_pairs(path, vocab_size: int | None = None) -> tuple[dict, dict]:
    """({"premise": [ids...], "hypothesis": [...], "label": np.ndarray}, metadata), checked."""
    data, meta = sources.read_token_file(
        path,
        "SNLI token file",
        lambda t: {
            "premise": t.column("premise").to_pylist(),
            "hypothesis": t.column("hypothesis").to_pylist(),
            "label": t.column("label").to_numpy().astype(np.int64),
        },
    )
    if len(data["label"]) != meta["n_pairs"]:
        raise DataError(
            f"{path}: holds {len(data['label'])} pairs, its metadata says {meta['n_pairs']}"
        )
    if vocab_size is not None:
        top = max((max(s) for col in ("premise", "hypothesis") for s in data[col] if s), default=-1)
        if top >= vocab_size:
            raise DataError(
                f"{path}: token id {top} ≥ vocab_size {vocab_size}; the token file does not "
                "belong to this tokenizer/model"
            )
    if len(data["label"]) and not set(np.unique(data["label"])) <= {0, 1, 2}:
        raise DataError(f"{path}: labels outside 0, 1, 2")
    return data, meta
