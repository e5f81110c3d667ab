"""Raw rows from where a dataset lives, shared by the tasks that read text from the hub: the Hugging
Face hub (pinned revision), a local mirror of its parquet files, and the content hash that
identifies a split independently of its file encoding."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pyarrow.parquet as pq

from grassflow.data import DataError


def content_sha256(rows: list[str]) -> str:
    """sha256 of the rows, independent of how a parquet file encodes them."""
    h = hashlib.sha256()
    for row in rows:
        b = row.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def hub_split(cfg: dict, split: str, key: str = "data"):
    """One split of a hub dataset (a `datasets.Dataset`); failures name the dataset and the fix."""
    try:
        import datasets

        return datasets.load_dataset(
            cfg["dataset"], cfg["name"], revision=cfg.get("revision"), split=split
        )
    except Exception as e:  # the hub raises many types; all mean the same to the user
        offline = " (HF_HUB_OFFLINE is set)" if os.environ.get("HF_HUB_OFFLINE") else ""
        raise DataError(
            f"could not load {cfg['dataset']}/{cfg['name']} split {split!r} from the Hugging Face "
            f"hub{offline}: {type(e).__name__}: {e}\n"
            f"Fix: run where the hub is reachable, or set {key}.source: local with {key}.local_dir "
            "pointing at the hub's parquet files, or use the offline demo (preset=demo)."
        ) from None


def local_file(cfg: dict, split: str, key: str = "data") -> Path:
    root = Path(cfg["local_dir"]).expanduser()
    for d in (root, root / cfg["name"]):
        for name in (f"{split}.parquet", f"{split}-00000-of-00001.parquet"):
            if (d / name).is_file():
                return d / name
    raise DataError(
        f"{key}.local_dir: no parquet file for split {split!r} in {root} (looked for "
        f"{split}.parquet and {split}-00000-of-00001.parquet, also under {cfg['name']}/)"
    )


def read_columns(path, columns) -> dict[str, list]:
    """{column: values} of a raw split's parquet file; a DataError naming the file if it has not got
    them."""
    try:
        table = pq.read_table(path)
    except Exception as e:
        raise DataError(
            f"{path}: not a readable parquet file ({type(e).__name__}: {e}); where the pipeline "
            "wrote it, remove it and run snakemake again: the job that wrote it runs again"
        ) from None
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise DataError(f"{path}: missing column(s) {missing}; found {table.column_names}")
    return {c: table.column(c).to_pylist() for c in columns}


def read_rows(path) -> list[str]:
    return read_columns(path, ["text"])["text"]


def token_meta(path) -> dict:
    """The metadata grassflow wrote into a token file (counts, vocabulary, tokenizer)."""
    return json.loads(pq.ParquetFile(path).schema_arrow.metadata[b"grassflow"])


def read_token_file(path, what: str, columns):
    """(columns(its table), its metadata) of a token file grassflow wrote (`what`: its kind, for the
    error); a DataError naming the file if it is not one or cannot be read."""
    try:
        meta = token_meta(path)
        return columns(pq.read_table(path)), meta
    except (KeyError, TypeError):
        raise DataError(
            f"{path}: not a grassflow {what} (no 'grassflow' metadata or columns)"
        ) from None
    except Exception as e:
        raise DataError(
            f"{path}: unreadable {what} ({type(e).__name__}: {e}); remove it and run snakemake "
            "again: the job that wrote it runs again"
        ) from None


def check_content(cfg: dict, split: str, digest: str, key: str = "data") -> None:
    """The split's content hash against `<key>.expected_sha256.<split>`, when one is given."""
    expected = (cfg.get("expected_sha256") or {}).get(split)
    if expected and expected != digest:
        raise DataError(
            f"{key}: split {split!r} content sha256 {digest} does not match the expected "
            f"{expected} ({key}.expected_sha256.{split}); the source changed or is corrupt"
        )


def download_main(download, module: str, doc: str, argv=None) -> int:
    """A text corpus's download stage (the LM's, SNLI's: `python -m grassflow.<task>.download`): its
    data section's train, validation and test splits by `download(data, split, path)`, their records
    in checksums.json."""
    from grassflow import job
    from grassflow.io import write_json

    p = job.parser(module, doc)
    p.add_argument("--data", required=True, type=job.json_arg, help="its data section: " + job.JSON)
    p.add_argument("--out-dir", required=True)
    a = p.parse_args(argv)
    out = Path(a.out_dir)
    return job.run(
        lambda: write_json(
            out / "checksums.json",
            {
                split: download(a.data, split, out / f"{split}.parquet")
                for split in ("train", "validation", "test")
            },
        )
    )
