"""Multi-query associative recall (MQAR; Arora et al. 2023, "Zoology", `multiquery_ar`).

An example of length L holds `kv` key-value pairs first (keys from the first half of the vocabulary,
1 … V/2−1; values from the second half, V/2 … V−1; each without repetition), then, in the rest of
the sequence, every key once more as a query, placed at an even offset from the end of the pairs
drawn without replacement with probability ∝ g^(a−1) for g = 1, 2, … (zoology's power law, a = 0.01:
short gaps most likely). The model reads the sequence causally and is scored only where it has just
read a query key: its next token must be that key's value. Every other target is ignored (label
IGNORE), and the positions that are neither pairs nor queries hold random tokens.

Each answer also records its key–query distance (query position − key position), so accuracy can be
bucketed by how far back the model must reach. Splits are written as parquet files (one row per
example: `inputs`, `labels`, `distance`, each a list of L values) whose schema metadata holds the
generator's parameters and a content hash, like the LM token files.
"""

from __future__ import annotations

import hashlib
import json
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from grassflow import job
from grassflow.data import DataError
from grassflow.data.sources import read_token_file
from grassflow.io import atomic_path

IGNORE = -100
POWER_A = 0.01  # zoology's default


def check_params(vocab: int, L: int, kv: int, key: str = "recall") -> None:
    """Zoology's constraints, with the offending key named."""
    if L % 2:
        raise DataError(f"{key}: seq_len must be even, got {L}")
    if 4 * kv > L:
        raise DataError(
            f"{key}: needs 4·kv ≤ seq_len (pairs, then room for every query), got kv={kv}, "
            f"seq_len={L}"
        )
    if vocab <= L:
        raise DataError(f"{key}: needs vocab > seq_len, got vocab={vocab}, seq_len={L}")
    if kv < 1 or kv > vocab // 2 - 1:
        raise DataError(f"{key}: kv={kv} keys and values do not fit a vocabulary of {vocab}")


def generate(
    vocab: int, L: int, kv: int, n: int, seed: int, power_a: float = POWER_A
) -> dict[str, np.ndarray]:
    """n examples: {"inputs", "labels", "distance"}, each (n, L) int64; deterministic in seed."""
    check_params(vocab, L, kv)
    rng = np.random.default_rng(seed)
    half, ctx = vocab // 2, 2 * kv
    space = (L - ctx) // 2  # query slots: even offsets 0, 2, …, 2·(space−1) after the pairs
    p = np.arange(1, space + 1, dtype=np.float64) ** (power_a - 1)
    p /= p.sum()
    keys = np.stack([rng.choice(np.arange(1, half), size=kv, replace=False) for _ in range(n)])
    values = np.stack(
        [rng.choice(np.arange(half, vocab), size=kv, replace=False) for _ in range(n)]
    )
    gaps = np.stack([rng.choice(space, size=kv, replace=False, p=p) for _ in range(n)])

    seq = np.zeros((n, L + 1), dtype=np.int64)  # one extra: the target of the last input
    seq[:, 0:ctx:2], seq[:, 1:ctx:2] = keys, values
    rows = np.arange(n)[:, None]
    q_pos = ctx + 2 * gaps  # where each query key sits
    seq[rows, q_pos] = keys
    filler = rng.integers(0, vocab, size=seq.shape)
    free = np.ones(seq.shape, dtype=bool)
    free[:, :ctx] = False
    free[rows, q_pos] = False
    seq[free] = filler[free]

    labels = np.full((n, L), IGNORE, dtype=np.int64)
    distance = np.zeros((n, L), dtype=np.int64)
    labels[rows, q_pos] = values  # input position q_pos predicts the token after it
    distance[rows, q_pos] = q_pos - 2 * np.arange(kv)[None, :]
    return {"inputs": seq[:, :L], "labels": labels, "distance": distance}


def content_sha256(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in ("inputs", "labels", "distance"):
        a = np.ascontiguousarray(arrays[name], dtype=np.int64)
        h.update(name.encode() + str(a.shape).encode() + a.tobytes())
    return h.hexdigest()


def write_split(arrays: dict[str, np.ndarray], params: dict, out_path) -> dict:
    """One split as parquet; its metadata: the generator's params and the content hash."""
    n, L = arrays["inputs"].shape
    dtype = pa.int16() if params["vocab"] <= 32767 else pa.int32()
    cols = {
        name: pa.FixedSizeListArray.from_arrays(pa.array(arrays[name].reshape(-1), type=t), L)
        for name, t in (("inputs", dtype), ("labels", dtype), ("distance", pa.int32()))
    }
    meta = {
        **params,
        "n_examples": n,
        "seq_len": L,
        "content_sha256": content_sha256(arrays),
        "answers": int((arrays["labels"] != IGNORE).sum()),
    }
    table = pa.table(cols).replace_schema_metadata({"grassflow": json.dumps(meta)})
    with atomic_path(out_path) as tmp:
        pq.write_table(table, tmp)
    return meta


def read_split(path) -> tuple[dict[str, np.ndarray], dict]:
    table, meta = read_token_file(path, "recall file", lambda t: t)
    n, L = meta["n_examples"], meta["seq_len"]
    arrays = {
        name: table.column(name)
        .combine_chunks()
        .flatten()
        .to_numpy()
        .astype(np.int64)
        .reshape(n, L)
        for name in ("inputs", "labels", "distance")
    }
    if content_sha256(arrays) != meta["content_sha256"]:
        raise DataError(
            f"{path}: content does not match its recorded sha256 (a corrupt or edited file)"
        )
    return arrays, meta


def make_cell(data: dict, out_dir) -> dict[str, dict]:
    """The data job of one cell: `data` is recall.data (vocab, seed, examples) with the cell's
    seq_len and kv."""
    return make_splits(
        data["vocab"], data["seq_len"], data["kv"], data["examples"], data["seed"], out_dir
    )


def make_splits(
    vocab: int, L: int, kv: int, sizes: dict[str, int], seed: int, out_dir
) -> dict[str, dict]:
    """Train/validation/test of one (L, kv) cell, each from its own seed (seed, split index)."""
    from pathlib import Path

    out = {}
    for i, (split, n) in enumerate(sizes.items()):
        split_seed = int(np.random.SeedSequence([seed, L, kv, i]).generate_state(1)[0])
        params = {
            "task": "mqar",
            "vocab": vocab,
            "kv": kv,
            "power_a": POWER_A,
            "seed": seed,
            "split": split,
            "split_seed": split_seed,
        }
        out[split] = write_split(
            generate(vocab, L, kv, n, split_seed), params, Path(out_dir) / f"{split}.parquet"
        )
    return out


def main(argv=None) -> int:
    p = job.parser(__spec__.name, __doc__)
    p.add_argument(
        "--data", required=True, type=job.json_arg, help="the cell's data section: " + job.JSON
    )
    p.add_argument("--out-dir", required=True)
    a = p.parse_args(argv)
    return job.run(make_cell, a.data, a.out_dir)


if __name__ == "__main__":
    sys.exit(main())
