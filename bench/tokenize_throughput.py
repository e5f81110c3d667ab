"""Tokenization throughput on a real split: `python bench/tokenize_throughput.py PARQUET
[--tokenizer NAME
--path DIR]` (target: Wikitext-2 test in ≤ 3 s on 2 cores). Writes reports/bench/tokenize.md."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from grassflow.data.sources import read_rows
from grassflow.data.tokenizers import load_tokenizer
from grassflow.lm.tokenize import encode_rows
from grassflow.runtime import device_name


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("parquet")
    ap.add_argument("--tokenizer", action="append", default=[], help="NAME=DIR, repeatable")
    ap.add_argument("--out", default="reports/bench/tokenize.md")
    args = ap.parse_args()
    rows = read_rows(args.parquet)
    lines = [
        f"# Tokenization throughput — {device_name(__import__('torch').device('cpu'))}",
        "",
        f"Split: `{Path(args.parquet).name}` ({len(rows)} rows, "
        f"{sum(len(r.split()) for r in rows)} words), "
        f"RAYON threads: {os.environ.get('RAYON_NUM_THREADS', 'default')}. Median of 3.",
        "",
        "| tokenizer | files from | vocab | tokens | seconds | tokens/s |",
        "|---|---|---|---|---|---|",
    ]
    for spec in args.tokenizer:
        name, path = spec.split("=", 1)
        tok = load_tokenizer({"name": name, "path": path})
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            ids = np.concatenate(encode_rows(tok, rows))
            times.append(time.perf_counter() - t0)
        t = sorted(times)[1]
        lines.append(
            f"| {name} | `{path}` | {tok.get_vocab_size()} | {len(ids)} | {t:.2f} | "
            f"{len(ids) / t:,.0f} |"
        )
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
