"""Tokenizers shared by the tasks: the hub's (bert-base-uncased, gpt2, distilbert's), from the hub
or a local directory, and deterministic WordPiece tokenizers built from rows (the offline choice).
`fetch_tokenizer` saves a hub tokenizer as one file on the login node."""

from __future__ import annotations

import hashlib
from pathlib import Path

from grassflow.data import DataError
from grassflow.io import atomic_path

# SNLI's backbone; BERT's vocabulary
HUB_NAMES = {
    "bert-base-uncased": "bert-base-uncased",
    "gpt2": "gpt2",
    "distilbert-base-uncased": "distilbert-base-uncased",
}


def build_wordpiece(
    rows, vocab_size: int, out_path, specials=("[PAD]", "[UNK]"), source=""
) -> None:
    """A WordPiece tokenizer with BERT's normalisation and pre-tokenisation, whose vocabulary is:
    the special tokens, every character seen (alone and as a ##continuation), then the most frequent
    words, ties broken alphabetically, up to vocab_size. Deterministic: the tokenizers library's
    WordPieceTrainer breaks frequency ties in hash order, which gave a different vocabulary (49 of
    400 tokens) in every process on the demo corpus."""
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
        raise DataError(
            f"tokenizer.vocab_size: {vocab_size} is smaller than the {len(vocab)} "
            f"characters and special tokens of {source}"
        )
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
        return cls.from_pretrained(
            str(Path(path).expanduser()) if path else HUB_NAMES[name]
        ).backend_tokenizer
    except Exception as e:
        raise DataError(
            f"tokenizer: could not load {name!r} from {path or 'the Hugging Face hub'}: "
            f"{type(e).__name__}: {e}\nFix: set tokenizer.path to a local directory with "
            "its files, or use tokenizer.name: trained (offline)."
        ) from None


def fetch_tokenizer(tokenizer: dict, out) -> None:
    """Save a hub (or local-path) tokenizer as one tokenizer.json, so the jobs that use it need no
    internet: the pipeline runs this where Snakemake runs (a cluster's login node)."""
    tok = load_tokenizer(tokenizer)
    with atomic_path(out) as tmp:
        tok.save(str(tmp))


def tokenizer_sha256(tok) -> str:
    return hashlib.sha256(tok.to_str().encode()).hexdigest()
