"""Data stages: download (hub / local mirror / synthetic) and tokenization to parquet."""


class DataError(RuntimeError):
    """Bad or unavailable data; the message names the file or source and the fix."""
