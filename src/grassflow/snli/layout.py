"""What snli.smk's rules read, planned from the preset's `snli` part: its runs' files, the backbone
each run reads, its outputs. Planning: no job imports it."""

from __future__ import annotations

from types import SimpleNamespace

from grassflow.planning.sections import SPLITS
from grassflow.snli.grid import run_dirs, snli_tokenizer_spec


def snli_layout(p: dict, runs: dict, results: str) -> SimpleNamespace:
    """The names of snli.smk (`runs`: its task's specs; `results`: results/<preset>)."""
    s = p.get("snli") or {}
    res, report = f"{results}/snli", f"{results}/report"
    tokens = f"{res}/data/tokens/{s['tokenizer']['name'] if s else None}"
    exps = list(s.get("experiments") or {})
    # {run: the fetched backbone it reads (snli_fetch_backbone), or none (a `path`, random,
    # scratch)}
    backbones = {
        r: [f"{res}/{d['backbone']}"] if "backbone" in (d := run_dirs(s, spec)) else []
        for r, spec in runs.items()
    }
    return SimpleNamespace(
        part=s or None,
        runs=runs,
        res=res,
        tokens=tokens,
        files={x: f"{tokens}/{x}.parquet" for x in SPLITS} if s else None,
        tokenizer=snli_tokenizer_spec(p) if s else None,
        backbones=backbones,
        backbone_args={
            r: " ".join(f"--backbone-dir {d}" for d in ds) for r, ds in backbones.items()
        },
        outputs=[f"{report}/snli_{e}.{x}" for e in exps for x in ("md", "csv", "tex")]
        + [f"{report}/snli_curves_{e}.png" for e in exps]
        + ([f"{report}/snli_summary.md"] if s else []),
    )
