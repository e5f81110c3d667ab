"""Stage 2, tokenize: raw rows → one flat token-id column in results/.../tokens/{tok}/{split}.parquet.

Tokenizers (config `tokenizer.name`):
  bert-base-uncased  the paper's; from the hub, or `tokenizer.path`: a directory with
                     tokenizer.json or vocab.txt
  gpt2               from the hub, or a directory with tokenizer.json or vocab.json + merges.txt
  trained            a WordPiece tokenizer (BERT normalisation: lower-case, strip accents)
                     built from the train split with `tokenizer.vocab_size` (characters + the
                     most frequent words; deterministic, see train_tokenizer): the offline choice
Rows are encoded in batches without special tokens and concatenated in order, as the paper
treats Wikitext-2 as one stream. The parquet schema metadata records the tokenizer, its
vocabulary size and hash, the source's content hash and the whitespace word count (for
word-level perplexity).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from grassflow.data import DataError
from grassflow.data.download import content_sha256, read_rows
from grassflow.io import atomic_path

HUB_NAMES = {"bert-base-uncased": "bert-base-uncased", "gpt2": "gpt2",
             "distilbert-base-uncased": "distilbert-base-uncased"}  # SNLI's backbone; BERT's vocabulary
BATCH_ROWS = 2048


def train_tokenizer(train_parquet, vocab_size: int, out_path) -> None:
    """The LM's trained tokenizer: build_wordpiece over the rows of the train split."""
    build_wordpiece(read_rows(train_parquet), vocab_size, out_path, source=train_parquet)


def build_wordpiece(rows, vocab_size: int, out_path, specials=("[PAD]", "[UNK]"), source="") -> None:
    """A WordPiece tokenizer with BERT's normalisation and pre-tokenisation, whose vocabulary
    is: the special tokens, every character seen (alone and as a ##continuation), then the most
    frequent words, ties broken alphabetically, up to vocab_size. Deterministic: the
    tokenizers library's WordPieceTrainer breaks frequency ties in hash order, which gave a
    different vocabulary (49 of 400 tokens) in every process on the demo corpus."""
    from collections import Counter

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    normalizer = normalizers.BertNormalizer(lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()
    words = Counter()
    for row in rows:
        if row.strip():
            words.update(w for w, _ in pre.pre_tokenize_str(normalizer.normalize_str(row)))
    chars = sorted({c for w in words for c in w})
    vocab = list(specials) + chars + [f"##{c}" for c in chars]
    if len(vocab) > vocab_size:
        raise DataError(f"tokenizer.vocab_size: {vocab_size} is smaller than the {len(vocab)} "
                        f"characters and special tokens of {source}")
    seen = set(vocab)
    for w, _ in sorted(words.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(vocab) == vocab_size:
            break
        if w not in seen:
            vocab.append(w)
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.WordPiece()
    with atomic_path(out_path) as tmp:
        tok.save(str(tmp))


def load_tokenizer(cfg: dict, artifact=None):
    """A `tokenizers.Tokenizer` for the config; errors name the key and the fix."""
    from tokenizers import Tokenizer

    name, path = cfg["name"], cfg.get("path")
    if artifact is not None or name == "trained":  # trained here, or fetched by fetch_tokenizer
        if artifact is None or not Path(artifact).is_file():
            raise DataError(f"tokenizer: {name} tokenizer file {artifact} is missing")
        return Tokenizer.from_file(str(artifact))
    if name not in HUB_NAMES:
        raise DataError(f"tokenizer.name: {name!r} is not one of {sorted(HUB_NAMES)} or trained")
    if path:
        p = Path(path).expanduser()
        if (p / "tokenizer.json").is_file():
            return Tokenizer.from_file(str(p / "tokenizer.json"))
        needed = ["vocab.json", "merges.txt"] if name == "gpt2" else ["vocab.txt"]
        missing = [f for f in needed if not (p / f).is_file()]
        if missing:
            raise DataError(f"tokenizer.path: {p} has no tokenizer.json and lacks {missing}")
    try:
        from transformers import BertTokenizerFast, GPT2TokenizerFast

        cls = GPT2TokenizerFast if name == "gpt2" else BertTokenizerFast
        return cls.from_pretrained(str(Path(path).expanduser()) if path else HUB_NAMES[name]).backend_tokenizer
    except Exception as e:
        raise DataError(f"tokenizer: could not load {name!r} from {path or 'the Hugging Face hub'}: "
                        f"{type(e).__name__}: {e}\nFix: set tokenizer.path to a local directory with "
                        "its files, or use tokenizer.name: trained (offline).") from None


def fetch_tokenizer(cfg: dict, out_path) -> None:
    """Save a hub (or local-path) tokenizer as one tokenizer.json, so the jobs that use it need
    no internet: the pipeline runs this where Snakemake runs (a cluster's login node)."""
    tok = load_tokenizer(cfg)
    with atomic_path(out_path) as tmp:
        tok.save(str(tmp))


def tokenizer_sha256(tok) -> str:
    return hashlib.sha256(tok.to_str().encode()).hexdigest()


def encode_rows(tok, rows: list[str], desc="tokenize") -> np.ndarray:
    texts = [r for r in rows if r.strip()]
    parts = []
    for i in tqdm(range(0, len(texts), BATCH_ROWS), desc=desc, unit="batch", mininterval=2):
        for enc in tok.encode_batch(texts[i : i + BATCH_ROWS], add_special_tokens=False):
            parts.append(np.asarray(enc.ids, dtype=np.int64))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def tokenize_split(cfg: dict, raw_parquet, out_path, artifact=None) -> dict:
    t0 = time.perf_counter()
    tok = load_tokenizer(cfg, artifact)
    rows = read_rows(raw_parquet)
    ids = encode_rows(tok, rows, desc=f"tokenize {Path(raw_parquet).stem}")
    if ids.size == 0:
        raise DataError(f"{raw_parquet}: no tokens (empty split)")
    vocab = tok.get_vocab_size()
    dtype = np.uint16 if vocab <= 65535 else np.int32
    meta = {"tokenizer": cfg["name"], "vocab_size": vocab, "tokenizer_sha256": tokenizer_sha256(tok),
            "source_content_sha256": content_sha256(rows), "n_tokens": int(ids.size),
            "n_words": sum(len(r.split()) for r in rows)}
    table = pa.table({"ids": ids.astype(dtype)})
    table = table.replace_schema_metadata({"grassflow": json.dumps(meta)})
    with atomic_path(out_path) as tmp:
        pq.write_table(table, tmp)
    meta["seconds"] = time.perf_counter() - t0
    return meta


def read_tokens(path, vocab_size: int | None = None) -> tuple[np.ndarray, dict]:
    """Token ids and their metadata; checks that they fit the model's vocabulary."""
    try:
        pf = pq.ParquetFile(path)
        meta = json.loads(pf.schema_arrow.metadata[b"grassflow"])
        ids = pf.read().column("ids").to_numpy().astype(np.int64)
    except (KeyError, TypeError):
        raise DataError(f"{path}: not a grassflow token file (no 'grassflow' metadata)") from None
    except Exception as e:
        raise DataError(f"{path}: unreadable token file ({type(e).__name__}: {e})") from None
    if ids.size != meta["n_tokens"]:
        raise DataError(f"{path}: holds {ids.size} tokens, its metadata says {meta['n_tokens']}")
    if vocab_size is not None and ids.size and int(ids.max()) >= vocab_size:
        raise DataError(f"{path}: token id {int(ids.max())} ≥ vocab_size {vocab_size}; the token file "
                        "does not belong to this tokenizer/model")
    return ids, meta
