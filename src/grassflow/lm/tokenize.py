"""The LM's tokenize stage: raw rows to one flat token-id column in
results/.../tokens/{tok}/{split}.parquet (see grassflow.lm.data for the sources and the token files'
metadata)."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from grassflow import job
from grassflow.data import DataError
from grassflow.data.sources import content_sha256, read_rows
from grassflow.data.stages import tokenize_args, tokenize_splits
from grassflow.data.tokenizers import load_tokenizer, tokenizer_sha256
from grassflow.io import atomic_path

BATCH_ROWS = 2048


UNK_LITERAL = "<unk>"  # Wikitext-2 v1's rare words


def encode_rows(
    tok, rows: list[str], desc="tokenize", unk_id: int | None = None
) -> list[np.ndarray]:
    """The token ids of each row (an empty array for a blank row). With unk_id, every literal
    `<unk>` becomes that one id: the text between them is encoded as usual (in v1 `<unk>` is a
    whitespace-separated word, so nothing else changes)."""
    out = [np.zeros(0, dtype=np.int64)] * len(rows)
    parts = [
        (i, r.split(UNK_LITERAL) if unk_id is not None else [r])
        for i, r in enumerate(rows)
        if r.strip()
    ]
    pieces = [(i, j, p) for i, ps in parts for j, p in enumerate(ps) if p.strip()]
    ids = {}
    for b in tqdm(range(0, len(pieces), BATCH_ROWS), desc=desc, unit="batch", mininterval=2):
        batch = pieces[b : b + BATCH_ROWS]
        for (i, j, _), enc in zip(
            batch, tok.encode_batch([p for *_, p in batch], add_special_tokens=False)
        ):
            ids[i, j] = enc.ids
    unk = [unk_id] if unk_id is not None else []
    for i, ps in parts:
        row = []
        for j in range(len(ps)):
            row += (unk if j else []) + ids.get((i, j), [])
        out[i] = np.asarray(row, dtype=np.int64)
    return out


def harness_word_count(rows: list[str]) -> int:
    """Words as lm-evaluation-harness counts them for word perplexity (its wikitext task:
    `len(re.split(r"\\s+", page))` on the text before detokenization), the split's rows taken as one
    document: whitespace-separated words, plus one empty field for leading and one for trailing
    whitespace (Wikitext rows start with a space and end in a newline)."""
    return len(re.split(r"\s+", "\n".join(rows)))


def unk_id_of(tok, name: str) -> int:
    """The tokenizer's unknown token's id, for tokenizer.map_unk."""
    unk = getattr(tok.model, "unk_token", None)
    uid = tok.token_to_id(unk) if unk else None
    if uid is None:
        raise DataError(
            f"tokenizer.map_unk: {name} has no unknown token to map `<unk>` to; set "
            "tokenizer.map_unk: false to let it split `<unk>` into pieces"
        )
    return uid


def leading_rows(row_ids: list[np.ndarray], max_tokens: int) -> int:
    """How many leading rows hold at most max_tokens tokens (at least one non-blank row)."""
    total, k = 0, 0
    for k, ids in enumerate(row_ids, start=1):
        if total + ids.size > max_tokens and total > 0:
            return k - 1
        total += ids.size
    return k


def kept_rows(cfg: dict, tok, rows: list[str], raw_parquet, row_ids=None) -> int:
    """How many leading rows of a split its token file keeps: all, or of the validation and test
    splits (by file name) under eval_max_tokens those holding at most that many tokens (as
    tokenize_split encodes them: `row_ids`, or encoded here)."""
    max_tokens = (
        cfg.get("eval_max_tokens") if Path(raw_parquet).stem in ("validation", "test") else None
    )
    if max_tokens is None:
        return len(rows)
    if row_ids is None:
        row_ids = encode_rows(
            tok, rows, unk_id=unk_id_of(tok, cfg["name"]) if cfg.get("map_unk") else None
        )
    return (
        leading_rows(row_ids, max_tokens)
        if sum(ids.size for ids in row_ids) > max_tokens
        else len(rows)
    )


def tokenize_split(cfg: dict, raw_parquet, out_path, artifact=None) -> dict:
    """Encode one split (`cfg`: the tokenizer section, and data.eval_max_tokens as eval_max_tokens).
    With eval_max_tokens, keep of the validation and test splits (by file name) only the leading
    rows holding at most that many tokens, and say so in the metadata."""
    t0 = time.perf_counter()
    tok = load_tokenizer(cfg, artifact)
    rows = read_rows(raw_parquet)
    unk_id = unk_id_of(tok, cfg["name"]) if cfg.get("map_unk") else None
    row_ids = encode_rows(tok, rows, desc=f"tokenize {Path(raw_parquet).stem}", unk_id=unk_id)
    n_all = sum(ids.size for ids in row_ids)
    if n_all == 0:
        raise DataError(f"{raw_parquet}: no tokens (empty split)")
    meta = {"source_content_sha256": content_sha256(rows)}
    k = kept_rows(cfg, tok, rows, raw_parquet, row_ids)
    if k < len(rows):
        meta["cut"] = {
            "max_tokens": cfg["eval_max_tokens"],
            "rows": k,
            "of_rows": len(rows),
            "of_tokens": int(n_all),
            "content_sha256": content_sha256(rows[:k]),
        }
        rows, row_ids = rows[:k], row_ids[:k]
    ids = np.concatenate(row_ids)
    vocab = tok.get_vocab_size()
    dtype = np.uint16 if vocab <= 65535 else np.int32
    meta = {
        "tokenizer": cfg["name"],
        "vocab_size": vocab,
        "tokenizer_sha256": tokenizer_sha256(tok),
        **meta,
        "n_tokens": int(ids.size),
        "n_words": harness_word_count(rows),
        "unk_mapped": sum(r.count(UNK_LITERAL) for r in rows) if unk_id is not None else None,
    }
    table = pa.table({"ids": ids.astype(dtype)})
    table = table.replace_schema_metadata({"grassflow": json.dumps(meta)})
    with atomic_path(out_path) as tmp:
        pq.write_table(table, tmp)
    meta["seconds"] = time.perf_counter() - t0
    return meta


def main(argv=None) -> int:
    p = job.parser(__spec__.name, __doc__)
    tokenize_args(p)
    return job.run(tokenize_splits, tokenize_split, p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
