"""What a table's numbers can carry: where the data came from (said as what it is), and whether a
table is comparable with the paper's, against the paper's setup in
workflow/resources/published.yaml. A verdict on the paper's claim is given only when every condition
holds: the paper's data and tokenizer, its scale, at least two seeds per model, and runs that
learned (beat the unigram baseline); otherwise the table says why not. On the paper's articles in
another release (Wikitext-2 v1: `same_articles` in published.yaml) the verdict is on the gap between
the models only, and says so (verdict_scope)."""

from __future__ import annotations

import json
from dataclasses import MISSING, fields
from pathlib import Path

import yaml

from grassflow.models.config import ModelConfig
from grassflow.report.tables import MODELS

MIN_SEEDS = 2
# the model's defaults (its dataclass: their one source), for presets that leave a key unset
DEFAULTS = {
    f.name: list(f.default) if isinstance(f.default, tuple) else f.default
    for f in fields(ModelConfig)
    if f.default is not MISSING
}


def load_published(path) -> dict:
    return yaml.safe_load(Path(path).read_text())


def paper_ppl(published: dict, exp_name: str) -> dict:
    """{model: best validation PPL} the paper reports for our experiment `exp_name` (the `published`
    rows that name it: published.yaml is the only place they are written); {}."""
    row = next((r for r in published["published"] if r.get("experiment") == exp_name), None)
    return {m: row[m] for m in ("transformer", "grassmann")} if row else {}


def load_checksums(path) -> dict:
    """{split: content sha256} recorded by the download stage."""
    return {
        split: rec["content_sha256"] for split, rec in json.loads(Path(path).read_text()).items()
    }


def data_is_papers(checksums: dict, setup: dict) -> bool:
    pinned = setup["data"]["content_sha256"]
    return all(checksums.get(split) == digest for split, digest in pinned.items())


def same_articles(checksums: dict, setup: dict) -> dict | None:
    """The entry of setup["same_articles"] (another release of the paper's articles: v1) whose
    content hashes the data matches, every split; None if none."""
    for name, rel in (setup.get("same_articles") or {}).items():
        if all(checksums.get(split) == digest for split, digest in rel["content_sha256"].items()):
            return {"name": name, **rel}
    return None


def unk_note(unk: bool | None) -> str:
    """How the runs' token files read Wikitext-2 v1's `<unk>` (their records: unk_mapped; None: not
    recorded)."""
    return {True: "`<unk>` → `[UNK]`, one token", False: "`<unk>` split by the tokenizer"}.get(
        unk, "`<unk>`'s reading not in the runs' records"
    )


def data_label(preset: dict, checksums: dict, setup: dict, unk: bool | None = None) -> str:
    """The data a table's runs read; `unk`: whether their token files map `<unk>` (unk_note)."""
    data = preset["data"]
    if data["source"] == "synthetic":
        return "the SYNTHETIC demo corpus — not Wikitext-2; not comparable to the paper"
    release = same_articles(checksums, setup)
    if release:
        match = (
            f"{release['label']}; {unk_note(unk)}: its content hashes match that release's, every "
            "split — the paper's articles, NOT the paper's raw text"
        )
    else:
        match = (
            "its content hashes match the pinned hub ones"
            if data_is_papers(checksums, setup)
            else "its content hashes do NOT match the pinned hub ones: not the paper's data"
        )
    cut = f"; {eval_cut(data)}" if eval_cut(data) else ""
    if data["source"] == "hub":
        return (
            f"{data['dataset']}/{data['name']} (hub, revision {data.get('revision')}; {match}{cut})"
        )
    return f"local directory `{data.get('local_dir')}` ({match}{cut})"


def eval_cut(data: dict) -> str | None:
    n = data.get("eval_max_tokens")
    return f"validation and test cut to their leading rows of at most {n:,} tokens" if n else None


def verdict_scope(checksums: dict, setup: dict) -> str | None:
    """What a verdict on the paper's claim must say it is measured on, when the data is the paper's
    articles in another release (v1); None for the paper's own data."""
    release = same_articles(checksums, setup)
    return release["scope"] if release else None


class Varies(list):
    """A setting a model's runs ran at several values (ran_settings): said, never compared."""


def ran_settings(specs: list[dict], varied=()) -> dict[str, dict]:
    """{model kind: {key: value}}: the model and training settings (spec.model, spec.train) its
    runs' records hold; the `varied` keys (a table's own subject: the ablation switches, a sweep's
    key) left out. A key its runs hold at several values is a Varies of them (runs_differ says
    it)."""
    out = {}
    for kind in sorted({s["model_kind"] for s in specs}):
        settings = [{**s["model"], **s["train"]} for s in specs if s["model_kind"] == kind]
        out[kind] = {}
        for key in sorted(set().union(*settings) - set(varied)):
            values = list(
                {
                    json.dumps(x.get(key, "<absent>"), sort_keys=True): x.get(key, "<absent>")
                    for x in settings
                }.values()
            )
            out[kind][key] = values[0] if len(values) == 1 else Varies(values)
    return out


def runs_differ(ran: dict[str, dict]) -> list[str]:
    """Each model whose runs ran a setting at several values, in one line each."""
    return [
        f"the {kind} runs ran different settings: "
        + "; ".join(
            f"{k} {', '.join(map(str, v))}" for k, v in settings.items() if isinstance(v, Varies)
        )
        for kind, settings in ran.items()
        if any(isinstance(v, Varies) for v in settings.values())
    ]


def models_differ(ran: dict[str, dict]) -> str | None:
    """What the models ran differently of the settings both have (ran_settings), in one line;
    None."""
    kinds = sorted(ran, key=lambda k: (k not in MODELS, MODELS.index(k) if k in MODELS else 0, k))
    shared = sorted(set.intersection(*(set(ran[k]) for k in kinds))) if len(kinds) > 1 else []
    differ = [
        k
        for k in shared
        if not any(isinstance(ran[m][k], Varies) for m in kinds)
        and len({json.dumps(ran[m][k], sort_keys=True) for m in kinds}) > 1
    ]
    if not differ:
        return None
    return "the models ran different settings: " + "; ".join(
        f"{k} {', '.join(f'{ran[m][k]} ({m})' for m in kinds)}" for k in differ
    )


def setup_differences(ran: dict[str, dict], exp_name: str, setup: dict) -> list[str]:
    """The settings the runs ran (ran_settings: their records') that differ from the paper's (what
    it states) and from our `paper` preset's (what it leaves unstated and we assume:
    setup["assumed"]). A key is compared for the models that have it; one no record holds, at the
    model's default."""
    paper_exp = setup["experiments"].get(exp_name)
    if paper_exp is None:
        return [f"the paper has no experiment {exp_name!r}"]
    assumed = setup.get("assumed") or {}
    stated = {**setup["model"], **paper_exp}
    unstated = {
        **(assumed.get("model") or {}),
        **(assumed.get("experiments") or {}).get(exp_name, {}),
        **(assumed.get("train") or {}),
    }
    # a key of another kind's (r) is not this kind's
    held = set().union(*ran.values()) if ran else set()
    diffs = []
    for settings in ran.values():
        ours = {**{k: v for k, v in DEFAULTS.items() if k not in held}, **settings}
        for want, whose in ((stated, "paper"), (unstated, "paper preset")):
            for k, v in want.items():
                d = f"{k} {ours.get(k)} ({whose} {v})"
                if (
                    k in ours
                    and not isinstance(ours[k], Varies)
                    and ours[k] != v
                    and d not in diffs
                ):
                    diffs.append(d)
    return ["not the paper's setup: " + ", ".join(diffs)] if diffs else []


def not_comparable(
    preset: dict,
    exp_name: str,
    ran: dict,
    checksums: dict,
    setup: dict,
    models: dict,
    unk: bool | None = None,
) -> list[str]:
    """Why this table cannot carry a verdict on the paper's claim ([] if it can). `models`: {model:
    {"n_learned": int, "not_learned": [run ids]}}; `ran`: what each model's runs ran (ran_settings)
    and `unk` whether the token files map `<unk>`, as the runs' records hold them."""
    why = []
    release = same_articles(checksums, setup)
    if release:
        if unk is not True:  # `<unk>`'s 4 pieces, 3 free to predict, would flatter both models
            why.append(
                f"{release['name']} with `<unk>` split into pieces (tokenizer.map_unk: false)"
                if unk is False
                else f"{release['name']}, and the runs' records do not say how `<unk>` was read"
            )
    elif not data_is_papers(checksums, setup):
        why.append("not the paper's data (Wikitext-2 content hashes differ)")
    if preset["tokenizer"]["name"] != setup["tokenizer"]:
        why.append(f"tokenizer {preset['tokenizer']['name']} (paper {setup['tokenizer']})")
    if eval_cut(preset["data"]):
        why.append(eval_cut(preset["data"]))
    why += setup_differences(ran, exp_name, setup)
    if differ := models_differ(ran):
        why.append(differ)
    why += runs_differ(ran)
    not_learned = sum(len(m["not_learned"]) for m in models.values())
    if not_learned:
        why.append(f"{not_learned} run(s) did not beat the unigram baseline")
    if any(m["n_learned"] < MIN_SEEDS for m in models.values()):
        why.append(f"fewer than {MIN_SEEDS} seeds per model that learned")
    return why
