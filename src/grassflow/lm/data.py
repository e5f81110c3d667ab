"""Language-modelling data: Wikitext-2 rows (hub, local mirror, or the synthetic stand-in) to
results/.../raw/{split}.parquet (stage 1), and reading the token files (stage 2 writes them:
grassflow.lm.tokenize).

Sources:
  hub        datasets.load_dataset(dataset, name, revision=<pinned>) — needs the Hugging Face hub
  local      a directory of the hub's parquet files (an HPC mirror): {split}.parquet or
             {split}-00000-of-00001.parquet, directly or under <name>/
  synthetic  grassflow.lm.synthetic, deterministic, offline

Each split's content hash (sha256 over its rows) is recorded beside the file hash; when the config
gives an expected content hash, a mismatch is an error.

Tokenizers (config `tokenizer.name`; grassflow.data.tokenizers):
  bert-base-uncased  the paper's; from the hub, or `tokenizer.path`: a directory with
                     tokenizer.json or vocab.txt
  gpt2               from the hub, or a directory with tokenizer.json or vocab.json + merges.txt
  trained            a WordPiece tokenizer (BERT normalisation: lower-case, strip accents)
                     built from the train split with `tokenizer.vocab_size` (characters + the
                     most frequent words; deterministic, see train_tokenizer): the offline choice
Rows are encoded in batches without special tokens and concatenated in order, as the paper treats
Wikitext-2 as one stream. The parquet schema metadata records the tokenizer, its vocabulary size and
hash, the source's content hash and the whitespace word count (for word-level perplexity), and how
many literal `<unk>` (Wikitext-2 v1's rare words) became the tokenizer's unknown token
(`tokenizer.map_unk`; None: not mapped). `data.eval_max_tokens` cuts validation and test to their
leading rows (whole rows, at most that many tokens), for CPU-sized presets; the metadata's `cut`
says so.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from grassflow.data import DataError, sources
from grassflow.data.sources import check_content, content_sha256, hub_split, local_file, read_rows
from grassflow.io import atomic_path, sha256_file
from grassflow.lm.synthetic import generate_split

SPLITS = ("train", "validation", "test")


def load_rows(cfg: dict, split: str) -> list[str]:
    source = cfg["source"]
    if source == "hub":
        return list(hub_split(cfg, split)["text"])
    if source == "local":
        return read_rows(local_file(cfg, split))
    if source == "synthetic":
        syn = cfg["synthetic"]
        return generate_split(syn["articles"][split], seed=syn["seed"] * 1000 + SPLITS.index(split))
    raise DataError(f"data.source: unknown source {source!r} (hub, local, synthetic)")


def download(cfg: dict, split: str, out_path) -> dict:
    """Write one split's rows to parquet; return its checksum record."""
    rows = load_rows(cfg, split)
    if not any(r.strip() for r in rows):
        raise DataError(f"data: split {split!r} from source {cfg['source']!r} is empty")
    digest = content_sha256(rows)
    check_content(cfg, split, digest)
    with atomic_path(out_path) as tmp:
        pq.write_table(pa.table({"text": rows}), tmp)
    return {
        "split": split,
        "rows": len(rows),
        "content_sha256": digest,
        "file_sha256": sha256_file(out_path),
        "source": cfg["source"],
    }


def read_tokens(path, vocab_size: int | None = None) -> tuple[np.ndarray, dict]:
    """Token ids and their metadata; checks that they fit the model's vocabulary."""
    ids, meta = sources.read_token_file(
        path, "token file", lambda t: t.column("ids").to_numpy().astype(np.int64)
    )
    if ids.size != meta["n_tokens"]:
        raise DataError(f"{path}: holds {ids.size} tokens, its metadata says {meta['n_tokens']}")
    if vocab_size is not None and ids.size and int(ids.max()) >= vocab_size:
        raise DataError(
            f"{path}: token id {int(ids.max())} ≥ vocab_size {vocab_size}; the token file "
            "does not belong to this tokenizer/model"
        )
    return ids, meta


V1_NAMES = ("wikitext-2-v1",)  # releases whose rare words read `<unk>` (the tokenized ones)


def map_unk(p: dict) -> bool:
    """A preset's tokenizer.map_unk resolved: auto maps `<unk>` for the tokenized releases
    (data.name)."""
    setting = p["tokenizer"]["map_unk"]
    return p["data"].get("name") in V1_NAMES if setting == "auto" else bool(setting)
