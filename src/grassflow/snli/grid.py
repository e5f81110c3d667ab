"""The SNLI part's planning: its run grid, its checks, its tokenize section and its jobs' estimates
(its row of grassflow.pipeline.tasks names these). Planning code: what it decides reaches a job as
its params (its spec, on its command line), so no job's code fingerprint holds this file."""

from __future__ import annotations

import copy

from grassflow.errors import ConfigError
from grassflow.planning import sections
from grassflow.planning.estimate import (
    Estimate,
    device_kind,
    memory,
    rate,
    split_sizes,
    train_flops_per_token,
)
from grassflow.planning.sections import check_inputs, run_train
from grassflow.snli.config import HeadConfig

BACKBONE_FLOPS_PER_TOKEN = 2 * 42.5e6  # DistilBERT-base forward, non-embedding parameters
SNLI_TOKENS_PER_PAIR = 28  # joint pairs: ~27 tokens of SNLI's (reports/bench/snli_backbone.md)


GRASSMANN_HEAD_KEYS = (
    "d_proj",
    "mix_heads",
    "window",
    "stride",
    "pairs",
    "empty_offsets",
    "eps",
    "plucker_backend",
)


def snli_runs(name: str, p: dict) -> dict[str, dict]:
    """{run_id: spec} of the SNLI part: experiment × head × seed, each spec holding only what that
    run depends on (a scratch run does not depend on the backbone, a Transformer head not on the
    Plücker settings)."""
    s = p.get("snli")
    if not s:
        return {}
    out = {}
    for exp, e in s["experiments"].items():
        for kind in s["heads"]:
            head = {**s["head"], **s["head_overrides"].get(kind, {})}
            for k in GRASSMANN_HEAD_KEYS if kind == "transformer" else ("n_heads",):
                head.pop(k, None)
            features = {"kind": e["features"]}
            if e["features"] == "scratch":
                features["embed_dim"] = e["embed_dim"]
            train = {**run_train(s["train"]), "epochs": e["epochs"], "batch_size": e["batch_size"]}
            for seed in s["seeds"]:
                run_id = sections.run_id(f"{exp}-{kind}", seed)
                spec = {
                    "run_id": run_id,
                    "preset": name,
                    "task": "snli",
                    "experiment": exp,
                    "model_kind": kind,
                    "seed": seed,
                    "head": dict(head),
                    "features": features,
                    "train": train,
                    "tokenizer": s["tokenizer"]["name"],
                    "max_tokens": s["max_tokens"],
                }
                if e["features"] == "backbone":
                    spec["backbone"] = copy.deepcopy(s["backbone"])
                out[run_id] = spec
    return out


def check_snli(where: str, name: str, p: dict) -> None:
    s = p["snli"]
    check_inputs(where, s, "snli.data")
    tok = s["tokenizer"]
    uses_backbone = any(e["features"] == "backbone" for e in s["experiments"].values())
    if uses_backbone and not s.get("backbone"):
        raise ConfigError(f"{where}.backbone: required by an experiment with features: backbone")
    rand = (s.get("backbone") or {}).get("random")
    if uses_backbone and rand and rand["dim"] % rand["n_heads"]:
        raise ConfigError(
            f"{where}.backbone.random.n_heads ({rand['n_heads']}) must divide its dim "
            f"({rand['dim']})"
        )
    if uses_backbone and not rand and tok["name"] == "trained":
        raise ConfigError(
            f"{where}.tokenizer.name: a pretrained backbone needs its own tokenizer, not 'trained'"
        )
    if 2 * s["max_tokens"] - 1 > 512:
        raise ConfigError(
            f"{where}.max_tokens: {s['max_tokens']} makes joint pairs of up to "
            f"{2 * s['max_tokens'] - 1} tokens, more than DistilBERT's 512 positions"
        )
    for exp, e in s["experiments"].items():
        if e["features"] == "scratch" and not e.get("embed_dim"):
            raise ConfigError(
                f"{where}.experiments.{exp}.embed_dim: required when features is 'scratch'"
            )


def check_model(spec: dict, p: dict) -> None:
    """A run's head as its dataclass takes it (raises ValueError)."""
    from grassflow.snli.config import HeadConfig

    HeadConfig.from_dict(spec["head"])


def snli_tokenizer_spec(p: dict) -> dict:
    """The section SNLI's tokenize stage runs: the tokenizer, and the tokens kept per sentence."""
    return {**p["snli"]["tokenizer"], "max_tokens": p["snli"]["max_tokens"]}


def snli_train(spec: dict, pairs: dict, settings: dict, evaluate: bool = False) -> Estimate:
    """Pairs × tokens through the frozen backbone (forward) and the head (forward + backward)."""
    dev, threads = device_kind(spec, settings)
    h = HeadConfig.from_dict(spec["head"])
    head = train_flops_per_token("transformer", h.n_layers, h.d_model, h.d_ff, 48, 0)
    backbone = 0
    if spec["features"]["kind"] == "backbone":
        rand = spec["backbone"].get("random")
        backbone = (
            2 * rand["n_layers"] * 12 * rand["dim"] ** 2 if rand else BACKBONE_FLOPS_PER_TOKEN
        )
    fps, _, basis = rate(dev, "transformer", head + 3 * backbone, 64, 6, threads)
    t = spec["train"]
    if evaluate:
        tokens = (pairs["validation"] + pairs["test"]) * SNLI_TOKENS_PER_PAIR
        seconds = tokens * (head / 3 + backbone) / fps
        items = 0
    else:
        items = pairs["train"] // t["batch_size"] * t["batch_size"] * t["epochs"]
        tokens = items * SNLI_TOKENS_PER_PAIR
        seconds = (
            tokens * (head + backbone) / fps
            + t["epochs"] * pairs["validation"] * SNLI_TOKENS_PER_PAIR * (head / 3 + backbone) / fps
        )
    # its weights, embeddings included (~1.5×)
    backbone_mb = 4 * backbone / 2 * 1.5 if backbone else 0
    return Estimate(
        seconds,
        items,
        memory(settings, int(backbone_mb / 4) + 2_000_000, 100 * pairs["train"], 0),
        basis + " (SNLI: the LM Transformer's rate at equal FLOPs)",
    )


def snli_sizes(part: dict, files: dict | None) -> tuple[dict, str]:
    """({split: pairs}, where from) of an SNLI part."""
    name = "synthetic" if part["data"]["source"] == "synthetic" else part["data"].get("name", "")
    return split_sizes("snli", name, part["tokenizer"]["name"], files)


def estimate(stage, spec, preset, settings, files):
    pairs, source = snli_sizes(preset["snli"], files)
    return snli_train(spec, pairs, settings, evaluate=stage == "evaluate"), source


def run_dirs(part: dict, spec: dict) -> dict[str, str]:
    """The directories a run's jobs get: the backbone fetched from the hub
    (workflow/rules/fetch.smk), for a run on its frozen features; none for a backbone given by
    `path`, or a random one."""
    b = part.get("backbone") or {}
    fetched = b and not b.get("random") and not b.get("path")
    return (
        {"backbone": f"backbone/{b['name']}"}
        if fetched and spec["features"]["kind"] == "backbone"
        else {}
    )
