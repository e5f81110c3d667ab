"""Data stages: download (hub / local mirror / synthetic) and tokenization to parquet."""

from grassflow.errors import DataError

__all__ = ["DataError"]
