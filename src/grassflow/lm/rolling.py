"""Word-level perplexity as lm-evaluation-harness's wikitext task computes it, without lm-eval:
word_perplexity = exp(-Σ loglikelihood / Σ words) over its documents, where

  documents   one per article: a page runs from one top-level heading row (" = Title = ") to the
              next (`pages`), its rows joined by newlines, as the harness's document-level
              Wikitext has them; of a split cut to eval_max_tokens, the same leading rows as its
              token file;
  scored text the page detokenized as the task's doc_to_target does (`detokenize`, its
              wikitext_detokenizer) and encoded without special tokens;
  words       counted on the page before detokenization: `len(re.split(r"\\s+", page))`;
  loglikelihood  the rolling one: lm_eval.utils.get_rolling_token_windows with context_len=1,
              made disjoint, after a prefix token. Written out (`windows`), for n tokens t and a
              context of L: the first window reads the prefix and t[0:L-1] and scores t[0:L];
              each later one scores the next ≤ L tokens t[p:e] reading the L tokens before e. So
              full windows are disjoint blocks of L whose first token sees one token of context;
              the last, shorter one sees a full window.
The prefix token (the harness uses the tokenizer's end-of-text token, which BERT's lacks): the first
of PREFIX_TOKENS the tokenizer has; our models never saw it in training.

The `documents` stage writes a split's documents ({split}.parquet under its token directory's docs/:
each page's token ids and word count); the evaluation scores them (grassflow.lm.evaluate).
grassflow.harness is our model in lm-eval; tests/lm/test_harness.py checks lm-eval itself reports
this number, and that `detokenize` and `windows` are the harness's.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F

from grassflow.runtime import autocast

# bert-base-uncased: [SEP]; the pipeline's trained tokenizers: [PAD]
PREFIX_TOKENS = (
    "[SEP]",
    "[PAD]",
)


def prefix_id(tokenizer, name: str | None = None) -> int:
    """The prefix token's id: `name`'s, else the first of PREFIX_TOKENS the tokenizer has."""
    for candidate in [name] if name else PREFIX_TOKENS:
        if tokenizer.token_to_id(candidate) is not None:
            return tokenizer.token_to_id(candidate)
    raise ValueError(
        f"prefix_token: none of {[name] if name else list(PREFIX_TOKENS)} is in the model's "
        "tokenizer"
    )


def encode(tokenizer, text: str, unk_id: int | None = None) -> list[int]:
    """A text's token ids as the pipeline encodes its corpus: no special tokens; with unk_id
    (tokenizer.map_unk), each literal `<unk>` that one id, as in the token files."""
    from grassflow.lm.tokenize import UNK_LITERAL

    if unk_id is None:
        return tokenizer.encode(text, add_special_tokens=False).ids
    out = []
    for j, part in enumerate(text.split(UNK_LITERAL)):
        out += ([unk_id] if j else []) + (
            tokenizer.encode(part, add_special_tokens=False).ids if part.strip() else []
        )
    return out


def harness_words(page: str) -> int:
    return len(re.split(r"\s+", page))


def _is_title(row: str) -> bool:
    text = row.replace("= = =", "===").replace("= =", "==").strip()
    return text.startswith("= ") and text.endswith(" =")


def pages(rows: list[str]) -> list[str]:
    """A split's rows (Hugging Face Wikitext rows) as articles: a page starts at each top-level
    heading row; rows keep their text, without their trailing newline, joined by newlines."""
    out, page = [], []
    for row in rows:
        if _is_title(row) and "\n".join(page).strip():
            out.append("\n".join(page))
            page = []
        page.append(row.removesuffix("\n"))
    if "\n".join(page).strip():
        out.append("\n".join(page))
    return out


def detokenize(page: str) -> str:
    """The harness's wikitext_detokenizer (lm_eval/tasks/wikitext/preprocess_wikitext.py), the text
    its wikitext task scores."""
    s = page.replace("s '", "s'")
    s = re.sub(r"/' [0-9]/", r"/'[0-9]/", s)
    for a, b in (
        (" @-@ ", "-"),
        (" @,@ ", ","),
        (" @.@ ", "."),
        (" : ", ": "),
        (" ; ", "; "),
        (" . ", ". "),
        (" ! ", "! "),
        (" ? ", "? "),
        (" , ", ", "),
    ):
        s = s.replace(a, b)
    # brackets and quotes: no spaces inside
    s = re.sub(r"\(\s*([^\)]*?)\s*\)", r"(\1)", s)
    s = re.sub(r"\[\s*([^\]]*?)\s*\]", r"[\1]", s)
    s = re.sub(r"{\s*([^}]*?)\s*}", r"{\1}", s)
    s = re.sub(r"\"\s*([^\"]*?)\s*\"", r'"\1"', s)
    s = re.sub(r"'\s*([^']*?)\s*'", r"'\1'", s)
    for a, b in (
        ("= = = =", "===="),
        ("= = =", "==="),
        ("= =", "=="),
        (" \u00b0 ", "\u00b0"),
        (" \n", "\n"),
        ("\n ", "\n"),
        (" N ", " 1 "),
        (" 's", "'s"),
    ):
        s = s.replace(a, b)
    return s


def windows(n: int, L: int) -> list[tuple[int, int]]:
    """(start, end) of each window over [prefix] + t (n tokens t): the model reads seq[start:end]
    and scores the targets seq[start+1:end+1] that no earlier window scored."""
    return [(0, min(L, n))] + [(min(p + L, n) - L, min(p + L, n)) for p in range(L, n, L)]


def rolling_pairs(ids: list[int], prefix: int, L: int) -> list[tuple[list[int], list[int]]]:
    """(what the model reads, the targets of its last positions) of each window of a document."""
    seq, done, out = [prefix, *ids], 0, []
    for start, end in windows(len(ids), L):
        out.append((seq[start:end], seq[max(start, done) + 1 : end + 1]))
        done = end
    return out


@torch.no_grad()
def score(model, pairs, batch_size: int, device) -> list[tuple[float, bool]]:
    """(Σ log p of the targets, whether greedy decoding gives them) of each (inputs, targets): the
    targets are the next tokens of the inputs' last len(targets) positions."""
    device = torch.device(device)
    out = [None] * len(pairs)
    # similar lengths batch together
    order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]))
    for b in range(0, len(order), batch_size):
        part = order[b : b + batch_size]
        width = max(len(pairs[i][0]) for i in part)
        batch = torch.tensor(
            [pairs[i][0] + [0] * (width - len(pairs[i][0])) for i in part], device=device
        )
        with autocast(device):
            logits = model(batch)  # causal: the right padding changes no earlier position
        for row, i in zip(F.log_softmax(logits.float(), dim=-1), part):
            inputs, targets = pairs[i]
            scored, y = (
                row[len(inputs) - len(targets) : len(inputs)],
                torch.tensor(targets, device=device),
            )
            out[i] = (
                scored.gather(1, y[:, None]).sum().item(),
                bool((scored.argmax(-1) == y).all()),
            )
    return out


def word_perplexity(
    model, docs: list[list[int]], words: list[int], L: int, prefix: int, batch_size=16, device="cpu"
) -> dict:
    """{word_ppl, loglikelihood, words, documents, tokens} of documents given as token ids."""
    model.eval()
    pairs = [(d, p) for d, ids in enumerate(docs) if ids for p in rolling_pairs(ids, prefix, L)]
    ll = sum(s for s, _ in score(model, [p for _, p in pairs], batch_size, device))
    return {
        "word_ppl": math.exp(-ll / sum(words)),
        "loglikelihood": ll,
        "words": sum(words),
        "documents": len(docs),
        "tokens": sum(map(len, docs)),
        "prefix_token_id": prefix,
    }


def documents_split(cfg: dict, raw_parquet, out_path, artifact=None) -> dict:
    """The `documents` stage: a validation or test split's pages, as token ids of their detokenized
    text (`<unk>` mapped as the token file maps it) and word counts, into `out_path` (parquet), of
    the rows its token file keeps."""
    from grassflow.data.sources import content_sha256, read_rows
    from grassflow.data.tokenizers import load_tokenizer, tokenizer_sha256
    from grassflow.io import atomic_path
    from grassflow.lm.tokenize import kept_rows, unk_id_of

    tok = load_tokenizer(cfg, artifact)
    rows = read_rows(raw_parquet)
    rows = rows[: kept_rows(cfg, tok, rows, raw_parquet)]
    docs = pages(rows)
    unk_id = unk_id_of(tok, cfg["name"]) if cfg.get("map_unk") else None
    ids = [encode(tok, detokenize(p), unk_id) for p in docs]
    meta = {
        "tokenizer": cfg["name"],
        "tokenizer_sha256": tokenizer_sha256(tok),
        "prefix_token_id": prefix_id(tok),
        "unk_id": unk_id,
        "source_content_sha256": content_sha256(rows),
        "documents": len(docs),
        "n_words": sum(map(harness_words, docs)),
        "n_tokens": sum(map(len, ids)),
    }
    table = pa.table(
        {"ids": pa.array(ids, type=pa.list_(pa.int32())), "words": [harness_words(p) for p in docs]}
    )
    with atomic_path(out_path) as tmp:
        pq.write_table(table.replace_schema_metadata({"grassflow": json.dumps(meta)}), tmp)
    return meta


def read_documents(path) -> tuple[list[list[int]], list[int], dict]:
    """(token ids, word counts, metadata) of a documents file (data: parquet, never run); a
    DataError naming the file if it is not one or cannot be read."""
    from grassflow.errors import DataError

    try:
        table = pq.read_table(Path(path))
        meta = json.loads((table.schema.metadata or {}).get(b"grassflow", b"{}"))
        return table.column("ids").to_pylist(), table.column("words").to_pylist(), meta
    except Exception as e:  # pyarrow's errors, a missing column, metadata that is not JSON
        raise DataError(
            f"{path}: unreadable documents file ({type(e).__name__}: {e}); remove it and run "
            "snakemake again: the job that wrote it runs again"
        ) from None
