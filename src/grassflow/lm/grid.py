"""The language-modelling runs (Tables 1-2 and the ablation grid), their checks and their estimate:
planning code (its row of grassflow.pipeline.tasks names these). What it decides reaches a job as
its params (its spec, on its command line), so no job's code fingerprint holds this file."""

from __future__ import annotations

from pathlib import Path

from grassflow.errors import ConfigError
from grassflow.io import spec_hash
from grassflow.lm.data import map_unk
from grassflow.models.config import ModelConfig
from grassflow.planning import sections
from grassflow.planning.estimate import lm_evaluate, lm_train, split_sizes
from grassflow.planning.sections import EXECUTION_KEYS, check_inputs, own_keys, run_train


def check_lm(where: str, name: str, p: dict) -> None:
    # the schema requires data, tokenizer, models, seeds and model with the experiments, seeds
    # unique
    check_inputs(where, p, "data")
    if map_unk(p) and p["tokenizer"]["name"] == "gpt2":
        raise ConfigError(
            f"{where}.tokenizer.map_unk: gpt2 has no unknown token to map Wikitext-2 v1's "
            "`<unk>` to; set tokenizer.map_unk: false to let it split `<unk>` into pieces"
        )
    check_ablations(where, p)
    check_sweep(where, p)


def check_model(spec: dict, p: dict) -> None:
    """A run's model as its dataclass takes it (raises ValueError)."""
    ModelConfig.from_dict({**spec["model"], "vocab_size": 1})


# a variant's training keys that are not its runs': the experiment's (its scale) and how a job runs
NOT_VARIANT_TRAIN = ("epochs", "batch_size", "device", *EXECUTION_KEYS)


def check_ablations(where: str, p: dict) -> None:
    a = p.get("ablations")
    if a and a["base"] not in p["experiments"]:
        raise ConfigError(
            f"{where}.ablations.base: {a['base']!r} is not an experiment of this preset "
            f"({sorted(p['experiments'])})"
        )
    for variant, switches in ((a or {}).get("variants") or {}).items():
        for key in sorted(set((switches or {}).get("train") or {}) & set(NOT_VARIANT_TRAIN)):
            raise ConfigError(
                f"{where}.ablations.variants.{variant}.train.{key}: not a variant's to set (the "
                "base experiment's scale, or how a job runs, which changes no run)"
            )


def check_sweep(where: str, p: dict) -> None:
    """One key (under train or model), its values (numbers: the schema) in increasing order: the
    first and the last are a sweep's edges, which a model's best must lie between (bracketed)."""
    s = p.get("sweep")
    if not s:
        return
    if s["base"] not in p["experiments"]:
        raise ConfigError(
            f"{where}.sweep.base: {s['base']!r} is not an experiment of this preset "
            f"({sorted(p['experiments'])})"
        )
    keys = [f"{section}.{k}" for section in ("train", "model") for k in s.get(section) or {}]
    if len(keys) != 1:
        raise ConfigError(
            f"{where}.sweep: one key to sweep, under train or model (e.g. train: {{lr: [1.0e-3, "
            f"3.0e-3, 1.0e-2]}}); got {keys or 'none'}"
        )
    section, key = keys[0].split(".")
    if section == "train" and key in NOT_VARIANT_TRAIN:
        raise ConfigError(
            f"{where}.sweep.train.{key}: not a sweep's to set (the base experiment's scale, or how "
            "a job runs, which changes no run)"
        )
    # numbers (the schema): a choice between settings is an ablation variant
    values = s[section][key]
    if values != sorted(values):
        raise ConfigError(
            f"{where}.sweep.{section}.{key}: {values} are not in increasing order (the first and "
            "the last are the edges a best must lie between)"
        )


def sweep_key(p: dict) -> tuple[str, str]:
    """(section, key) of the preset's sweep: ("train", "lr")."""
    s = p["sweep"]
    return next((section, k) for section in ("train", "model") for k in s.get(section) or {})


def value_label(v) -> str:
    """A swept value as its runs' ids and the tables name it: 0.001 → 1e-3, 64 → 64."""
    if isinstance(v, int):
        return str(v)
    mantissa, exponent = f"{v:.6e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def tokenizer_spec(p: dict) -> dict:
    """The section the LM's tokenize stage runs: the tokenizer, map_unk resolved, and the cut of the
    evaluation splits."""
    return {
        **p["tokenizer"],
        "map_unk": map_unk(p),
        "eval_max_tokens": p["data"].get("eval_max_tokens"),
    }


def run_group(exp: str, kind: str) -> str:
    """The group of a table's runs of one model (its seeds differ only): `<experiment>-<model>`."""
    return f"{exp}-{kind}"


def _run_spec(name: str, p: dict, exp: str, kind: str, seed: int, switches: dict) -> dict:
    """The spec of one language-model run: everything it depends on, and nothing else, so that
    editing one model's settings (or one ablation variant) changes only those specs."""
    e = p["experiments"][exp]
    switches = dict(switches)
    train = switches.pop("train", None) or {}  # an ablation variant's training keys
    model = own_keys(
        kind,
        {
            **p["model"],
            **(p.get("model_overrides") or {}).get(kind, {}),
            **switches,
            "n_layers": e["n_layers"],
            "context_len": e["context_len"],
        },
    )
    return {
        "run_id": sections.run_id(run_group(exp, kind), seed),
        "preset": name,
        "task": "lm",
        "experiment": exp,
        "model_kind": kind,
        "seed": seed,
        "model": model,
        "train": {
            **run_train(p["train"]),
            **train,
            "epochs": e["epochs"],
            "batch_size": e["batch_size"],
            **{k: e[k] for k in ("checkpoint_every",) if k in e},
        },
        "tokenizer": p["tokenizer"]["name"],
    }


def _content(spec: dict) -> str:
    return spec_hash({k: v for k, v in spec.items() if k != "run_id"})


def main_run_ids(p: dict) -> list[str]:
    """The main tables' runs: experiment × model × seed."""
    return [
        sections.run_id(run_group(exp, kind), seed)
        for exp in p.get("experiments") or {}
        for kind in p["models"]
        for seed in p["seeds"]
    ]


def finished_runs(dirs, run_ids) -> dict[str, str]:
    """{run id: its records' directory} of the runs whose records (run.json) are in one of `dirs`
    (config finished_runs: <dir>/<run id>/), the first dir that has it: they are adopted
    (grassflow.lm.adopt), neither trained nor evaluated here."""
    found = {}
    for run in run_ids:
        for d in dirs or ():
            if (Path(d) / run / "run.json").is_file():
                found[run] = str(Path(d) / run)
                break
    return found


def fused_groups(p: dict, run_specs: dict[str, dict], finished=()) -> dict[str, list[str]]:
    """{group: its run ids} of the runs train.fuse_seeds trains as one ensemble each: for every
    group id g, the runs g-s<seed> whose specs differ only in their seed and run id, one for each
    seed of the preset that no run of a group with a run left to train has finished elsewhere
    (`finished`: run ids; a table finished in full constrains nothing), when two or more. Ablation
    runs of other seeds, and those finished seeds' runs, train one by one. Every group fuses the
    same seeds: rule train_fused's outputs are one pattern per seed."""
    if p["train"]["fuse_seeds"] is not True:  # auto: not fused until a device measures it faster
        return {}
    names = dict.fromkeys(sections.group_seed(r)[0] for r in run_specs)
    left = [r for r in run_specs if r not in finished]  # a group with a run left to train
    open_ = {sections.group_seed(r)[0] for r in left if sections.group_seed(r)[1] in p["seeds"]}
    done = {seed for g, seed in map(sections.group_seed, finished) if g in open_}
    seeds = [s for s in p["seeds"] if s not in done]
    if len(seeds) < 2:
        return {}
    groups = {}
    for g in names:
        members = [sections.run_id(g, seed) for seed in seeds]
        if all(m in run_specs and m not in finished for m in members):
            if len({_content({**run_specs[m], "seed": 0}) for m in members}) == 1:
                groups[g] = members
    return groups


def _cells(name: str, p: dict, base: str, seeds, cells: dict, known: dict) -> dict:
    """{cell: {model: [spec per seed]}}: each cell's switches applied to the base experiment, for
    every model. A run whose spec equals one of `known` ({run_id: spec}, which gains the new runs)
    is that run, trained once; a new one is `<base>_<cell>-<model>-s<seed>`."""
    by_content = {_content(spec): run for run, spec in known.items()}
    out = {}
    for cell, switches in cells.items():
        out[cell] = {kind: [] for kind in p["models"]}
        for kind in p["models"]:
            for seed in seeds:
                spec = _run_spec(name, p, base, kind, seed, switches or {})
                spec["run_id"] = by_content.setdefault(
                    _content(spec), sections.run_id(f"{base}_{cell}-{kind}", seed)
                )
                known.setdefault(spec["run_id"], spec)
                out[cell][kind].append(spec)
    return out


def _main_runs(name: str, p: dict) -> dict[str, dict]:
    """{run_id: spec} of the main tables: experiment × model × seed."""
    specs = (
        _run_spec(name, p, exp, kind, seed, {})
        for exp in p.get("experiments") or {}
        for kind in p["models"]
        for seed in p["seeds"]
    )
    return {s["run_id"]: s for s in specs}


def ablation_runs(name: str, p: dict, known: dict) -> dict[str, dict[str, list[dict]]]:
    """{variant: {model: [spec per seed]}} of the preset's `ablations` section (`_cells`; `known`:
    the main tables' runs): the `paper` variant is the main table's runs; a Transformer is the same
    under a Grassmann-only switch."""
    a = p.get("ablations")
    return _cells(name, p, a["base"], a["seeds"], a["variants"], known) if a else {}


def sweep_runs(name: str, p: dict, known: dict) -> dict[str, dict[str, list[dict]]]:
    """{`<key>_<label>`: {model: [spec per seed]}} of the preset's `sweep`, a cell per value
    (`_cells`; `known`: the main tables' and the ablation grid's runs): the base's own value is the
    table's runs."""
    s = p.get("sweep")
    if not s:
        return {}
    section, key = sweep_key(p)
    cells = {
        f"{key}_{value_label(v)}": {"train": {key: v}} if section == "train" else {key: v}
        for v in s[section][key]
    }
    return _cells(name, p, s["base"], s["seeds"], cells, known)


def _grids(name: str, p: dict) -> tuple[dict, dict, dict]:
    """(every run {run_id: spec}, the ablation grid's cells, the sweep's cells)."""
    known = _main_runs(name, p)
    return known, ablation_runs(name, p, known), sweep_runs(name, p, known)


def _ids(cells: dict) -> dict[str, dict[str, list[str]]]:
    return {
        c: {m: [s["run_id"] for s in specs] for m, specs in ms.items()} for c, ms in cells.items()
    }


def runs(name: str, p: dict) -> dict[str, dict]:
    """{run_id: spec}: the main tables' runs, then the ablation grid's and the sweep's runs that are
    not already among them."""
    return _grids(name, p)[0]


def ablation_grid(name: str, p: dict) -> dict[str, dict[str, list[str]]]:
    """{variant: {model: [run ids]}} of the preset's ablation grid."""
    return _ids(_grids(name, p)[1])


def sweep_grid(name: str, p: dict) -> dict | None:
    """What the sweep's table is handed: its base experiment, its key (dotted), its values with
    their labels, and each value's run ids by model; None without a sweep."""
    if not p.get("sweep"):
        return None
    section, key = sweep_key(p)
    values = p["sweep"][section][key]
    return {
        "base": p["sweep"]["base"],
        "key": f"{section}.{key}",
        "values": values,
        "labels": [value_label(v) for v in values],
        "runs": list(_ids(_grids(name, p)[2]).values()),
    }


TOKENIZER_VOCAB = {"bert-base-uncased": 30522, "gpt2": 50257}


def lm_sizes(preset: dict, files: dict | None) -> tuple[dict, int, str]:
    """({split: tokens} as training and evaluation read them, vocabulary, where from)."""
    data, tok = preset["data"], preset["tokenizer"]
    dataset = "synthetic" if data["source"] == "synthetic" else data.get("name", "")
    sizes, source = split_sizes("lm", dataset, tok["name"], files)
    cut = data.get("eval_max_tokens")
    if cut:
        sizes = {s: (min(n, cut) if s != "train" else n) for s, n in sizes.items()}
    vocab = tok.get("vocab_size") or TOKENIZER_VOCAB.get(tok["name"], 30522)
    if files and Path(files["train"]).is_file():
        from grassflow.data.sources import token_meta

        vocab = token_meta(files["train"])["vocab_size"]
    return sizes, vocab, source


def estimate(stage, spec, preset, settings, files):
    """The LM's estimate hook: (Estimate, where the data sizes came from) of one train or evaluate
    job."""
    sizes, vocab, source = lm_sizes(preset, files)
    return (lm_train if stage == "train" else lm_evaluate)(spec, sizes, vocab, settings), source
