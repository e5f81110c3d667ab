"""Bad configurations fail before any job starts, with one line naming the key and what is allowed:
through the package check (many cases) and through real Snakemake (a few)."""

import copy
import os
import sys
from pathlib import Path

import pytest
import yaml

from grassflow.lm.grid import runs
from grassflow.pipeline.presets import config_errors, load_schema, select_preset

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "workflow/schemas/config.schema.yaml"
SRC = ROOT / "src/grassflow"
BASE = yaml.safe_load((ROOT / "config.yaml").read_text())


def demo(mutate):
    cfg = copy.deepcopy(BASE)
    cfg["preset"] = "demo"
    mutate(cfg, cfg["presets"]["demo"])
    return cfg


def setp(path, value):
    def f(cfg, d):
        keys = path.split(".")
        target = cfg if keys[0] in ("preset", "foo") else d
        for k in keys[:-1]:
            target = target.setdefault(k, {})
        target[keys[-1]] = value

    return f


CASES = [
    (
        "foo",
        1,
        (
            "config <top level>: Additional properties are not allowed ('foo' was unexpected); "
            "allowed keys: ['estimate', 'finished_runs', 'preset', 'presets']"
        ),
    ),
    ("epochz", 3, "config presets.demo: Additional properties are not allowed ('epochz'"),
    ("model.heads", 4, "config presets.demo.model: Additional properties are not allowed ('heads'"),
    ("model.d_model", "256", "config presets.demo.model.d_model: '256' is not of type 'integer'"),
    (
        "train.lr",
        -1.0,
        "config presets.demo.train.lr: -1.0 is less than or equal to the minimum of 0",
    ),
    ("model.r", 1, "config presets.demo.model.r: 1 is less than the minimum of 2"),
    ("model.lags", [0, 1], "config presets.demo.model.lags.0: 0 is less than the minimum of 1"),
    ("model.lags", [1, 40], "model.lags: offset 40 must be in 1..context_len-1 (31)"),
    ("model.n_heads", 3, "model.n_heads (3) must divide model.d_model (64)"),
    (
        "models",
        ["transformer", "mamba"],
        "config presets.demo.models.1: 'mamba' is not one of ['transformer', 'grassmann']",
    ),
    (
        "preset",
        "nope",
        (
            "config preset: 'nope' is not defined; choose one of ['demo', 'laptop', 'laptop_v1', "
            "'laptop_v1_ablations', 'laptop_v1_paper_settings', 'paper', 'paper_v1', 'recall']"
        ),
    ),
    ("experiments", {}, "config presets.demo.experiments: {} should be non-empty"),
    ("seeds", [], "config presets.demo.seeds: [] should be non-empty"),
    ("seeds", [0, 0], "config presets.demo.seeds: [0, 0] has non-unique elements"),
    (
        "model.dropout",
        1.5,
        "config presets.demo.model.dropout: 1.5 is greater than or equal to the maximum of 1",
    ),
    ("model.norm", "mid", "config presets.demo.model.norm: 'mid' is not one of ['post', 'pre']"),
    (
        "data.source",
        "ftp",
        "config presets.demo.data.source: 'ftp' is not one of ['hub', 'local', 'synthetic']",
    ),
    (
        "data",
        {"source": "local"},
        "presets.demo.data.local_dir: required when data.source is 'local'",
    ),
    (
        "tokenizer",
        {"name": "trained"},
        "presets.demo.tokenizer.vocab_size: required for, and only for",
    ),
    (
        "tokenizer",
        {"name": "bert-base-uncased", "vocab_size": 100},
        "presets.demo.tokenizer.vocab_size: required for, and only for",
    ),
    (
        "tokenizer.name",
        "sentencepiece",
        "config presets.demo.tokenizer.name: 'sentencepiece' is not one of",
    ),
    (
        "experiments.table1",
        {"n_layers": 2, "context_len": 32, "batch_size": 4},
        "config presets.demo.experiments.table1: 'epochs' is a required property",
    ),
    (
        "experiments.table1.batch_size",
        0,
        "config presets.demo.experiments.table1.batch_size: 0 is less than the minimum of 1",
    ),
    (
        "data.expected_sha256",
        {"test": "abc"},
        "config presets.demo.data.expected_sha256.test: 'abc' does not match",
    ),
    (
        "train.device",
        "tpu",
        "config presets.demo.train.device: 'tpu' is not one of ['auto', 'cpu', 'cuda']",
    ),
    (
        "model.lag_schedule",
        "per_token",
        "config presets.demo.model.lag_schedule: 'per_token' is not one of ['all', 'per_layer']",
    ),
    (
        "train.betas",
        [0.9, 0.95, 0.99],
        "config presets.demo.train.betas: [0.9, 0.95, 0.99] is too long",
    ),
    (
        "model_overrides.grassmann",
        {"r": "eight"},
        "config presets.demo.model_overrides.grassmann.r: 'eight' is not of type 'integer'",
    ),
    # the SNLI part
    (
        "snli.head.window",
        1,
        "config presets.demo.snli.head.window: 1 is less than the minimum of 2",
    ),
    ("snli.head.stride", 9, "head.stride must be ≤ head.window; got window 8, stride 9"),
    ("snli.head.d_proj", 15, "head.d_proj (15) must be a multiple of head.mix_heads (2)"),
    (
        "snli.head.pairs",
        "all",
        "config presets.demo.snli.head.pairs: 'all' is not one of ['bidirectional', 'causal']",
    ),
    (
        "snli.heads",
        ["lstm"],
        "config presets.demo.snli.heads.0: 'lstm' is not one of ['transformer', 'grassmann']",
    ),
    ("snli.seeds", [1, 1], "config presets.demo.snli.seeds: [1, 1] has non-unique elements"),
    (
        "ablations.seeds",
        [0, 0],
        "config presets.demo.ablations.seeds: [0, 0] has non-unique elements",
    ),
    ("recall.seeds", [2, 2], "config presets.demo.recall.seeds: [2, 2] has non-unique elements"),
    (
        "snli.experiments.table3_scratch",
        {"features": "scratch", "epochs": 1, "batch_size": 8},
        (
            "presets.demo.snli.experiments.table3_scratch.embed_dim: required when features is "
            "'scratch'"
        ),
    ),
    (
        "snli.experiments.table3.features",
        "glove",
        "config presets.demo.snli.experiments.table3.features: 'glove' is not one of",
    ),
    ("snli.backbone", None, "config presets.demo.snli.backbone: None is not of type 'object'"),
    (
        "snli.backbone.random.n_heads",
        3,
        "presets.demo.snli.backbone.random.n_heads (3) must divide its dim (32)",
    ),
    (
        "snli.max_tokens",
        300,
        "presets.demo.snli.max_tokens: 300 makes joint pairs of up to 599 tokens",
    ),
    (
        "snli.tokenizer",
        {"name": "trained"},
        "presets.demo.snli.tokenizer.vocab_size: required for, and only for",
    ),
    (
        "snli.experiments.table3.paper_acc",
        {"grassmann": {"test": 185.0}},
        "paper_acc.grassmann.test: 185.0 is greater than the maximum of 100",
    ),
]


@pytest.mark.parametrize(
    "path, value, expected", CASES, ids=[f"{c[0]}={c[1]!r}"[:40] for c in CASES]
)
def test_bad_config_is_named(path, value, expected):
    errors = config_errors(demo(setp(path, value)), SCHEMA)
    assert errors, "accepted a bad config"
    assert any(expected in e for e in errors), errors


def test_shipped_config_is_valid_for_every_preset():
    for name in BASE["presets"]:
        assert config_errors({**BASE, "preset": name}, SCHEMA) == []
    grid = runs(*select_preset({**BASE, "preset": "paper"}))
    main = [r for r in grid if "_" not in r.split("-")[0]]
    assert len(main) == 2 * 2 * 3  # tables × models × seeds
    # ablations: 10 variants × 2 models × 3 seeds, less the `paper` variant (the main runs) and the
    # Transformer under the five Grassmann-only switches (the paper variant's Transformer); lr_1e-3
    # switches both models. The sweep's lr 1e-4, both models (its 3e-4 is the main runs, its 1e-3
    # lr_1e-3's)
    assert len(grid) - len(main) == 10 * 2 * 3 - 2 * 3 - 5 * 3 + 2 * 3


def test_transformer_specs_carry_no_grassmann_keys():
    spec = runs(*select_preset({**BASE, "preset": "demo"}))["table1-transformer-s0"]
    assert not {"r", "lags", "lag_schedule", "empty_offsets"} & set(spec["model"])


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--config", "preset=nope"], "error: config preset: 'nope' is not defined"),
        (
            ["--config", "preset=demo", "presets={'demo': {'seeds': []}}"],
            "error: config presets.demo",
        ),
    ],
)
def test_snakemake_rejects_before_any_job(args, expected, tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    from helpers.dag import run_snakemake

    res = run_snakemake(["-n", "--cores", "1", *args], ROOT, env, timeout=600)
    assert res.returncode != 0
    out = res.stdout + res.stderr
    assert expected in out and "Traceback" not in out and 'File "' not in out


def test_a_checkout_whose_package_is_not_the_one_python_imports_is_refused(tmp_path):
    """The Snakefile injects nothing into sys.path or PYTHONPATH: the jobs run the package python
    imports (installed with `pip install -e .`), and the code fingerprints hash the checkout's src/.
    A copy of the project planned with the venv's package (this checkout's) is refused before any
    job, naming both places and the fix; with its own src/ on PYTHONPATH it plans."""
    from helpers.dag import copy_repo, pipeline_env, run_snakemake

    work = copy_repo(tmp_path)
    env = {**pipeline_env(work), "PYTHONPATH": ""}
    cmd = ["-n", "--cores", "1", "--config", "preset=demo"]
    res = run_snakemake(cmd, work, env, timeout=600)
    out = res.stdout + res.stderr
    assert (
        res.returncode != 0
        and f"python imports grassflow from {SRC}, not from this checkout's src/" in out
    ), out
    assert f"pip install -e {work}" in out and "Traceback" not in out
    assert not (work / "results").exists()
    res = run_snakemake(cmd, work, pipeline_env(work), timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]


def test_paper_preset_holds_the_full_snli_grid():
    from grassflow.snli.config import HeadConfig
    from grassflow.snli.grid import snli_runs

    cfg = copy.deepcopy(BASE)
    name, p = select_preset({**cfg, "preset": "paper"})
    specs = snli_runs(name, p)
    assert set(specs) == {
        f"{e}-{h}-s{s}"
        for e in ("table3", "table3_scratch")
        for h in ("transformer", "grassmann")
        for s in (0, 1, 2)
    }
    g = HeadConfig.from_dict(specs["table3-grassmann-s0"]["head"])
    assert (
        g.d_proj,
        g.window,
        g.stride,
        g.d_model,
        g.n_layers,
        g.mix_heads,
        g.d_ff,
        g.dropout,
    ) == (64, 8, 8, 256, 2, 4, 512, 0.1)
    assert all(s["train"]["epochs"] == 20 for s in specs.values())
    assert specs["table3-grassmann-s0"]["backbone"]["name"] == "distilbert-base-uncased"
    assert "backbone" not in specs["table3_scratch-grassmann-s0"]
    assert p["snli"]["experiments"]["table3"]["paper_acc"]["grassmann"] == {
        "validation": 85.50,
        "test": 85.38,
    }


def test_plucker_backends_are_one_list():
    """models.config.PLUCKER_BACKENDS is the list; the op's own, the SNLI head's and the schema's
    enums (model, an ablation variant's, snli.head) must equal it, and ModelConfig refuses the
    rest."""
    from grassflow.models.config import PLUCKER_BACKENDS, ModelConfig
    from grassflow.ops.plucker.backends import BACKENDS
    from grassflow.snli.config import CHOICES

    schema = load_schema(SCHEMA)
    enums = [
        node["plucker_backend"]["enum"]
        for node in _walk(schema)
        if isinstance(node, dict) and isinstance(node.get("plucker_backend"), dict)
    ]
    assert len(enums) == 3 and all(tuple(e) == PLUCKER_BACKENDS for e in enums)
    assert BACKENDS == CHOICES["plucker_backend"] == PLUCKER_BACKENDS
    with pytest.raises(ValueError, match="model.plucker_backend: 'cuda' is not one of"):
        ModelConfig(plucker_backend="cuda")


def test_model_and_head_schemas_are_generated_from_their_dataclasses():
    """One direction: the YAML names the dataclass, never its keys; the generated section holds
    every field a preset may set, with the dataclass's enums, ranges and descriptions, and the
    schema refuses what the dataclass refuses, naming the key."""
    from dataclasses import fields

    from grassflow.models.config import ModelConfig
    from grassflow.snli.config import HeadConfig

    raw = {
        **yaml.safe_load(SCHEMA.read_text())["$defs"],
        **yaml.safe_load((SRC / "snli/schema.yaml").read_text())["$defs"],
    }
    schema = load_schema(SCHEMA)
    for name, cls, exclude in (
        ("model", ModelConfig, {"vocab_size", "context_len", "n_layers"}),
        ("snli_head", HeadConfig, set()),
    ):
        assert set(raw[name]) <= {"generated", "exclude"}
        props = schema["$defs"][name]["properties"]
        assert set(props) == {f.name for f in fields(cls)} - exclude
        for key, allowed in cls.CHOICES.items():
            assert props[key]["enum"] == list(allowed)
        for f in fields(cls):
            if f.name in props:
                assert props[f.name]["x-default"] == (
                    list(f.default) if isinstance(f.default, tuple) else f.default
                )
    assert "4·d_model" in schema["$defs"]["model"]["properties"]["d_ff"]["description"]
    assert (
        "[u, v, |u−v|, u⊙v]"
        in schema["$defs"]["snli_head"]["properties"]["pair_input"]["description"]
    )
    for path, value, message in (
        ("model.r", 1, "model.r: 1 is less than the minimum of 2"),
        ("model.lags", [0], "model.lags.0: 0 is less than the minimum of 1"),
        ("snli.head.window", 1, "snli.head.window: 1 is less than the minimum of 2"),
        ("snli.head.dropout", 1.0, "snli.head.dropout: 1.0 is greater than or equal to"),
    ):
        errors = config_errors(demo(setp(path, value)), SCHEMA)
        assert any(message in e for e in errors), errors
    with pytest.raises(ValueError, match=r"head.window must be ≥ 2, got 1"):
        HeadConfig(window=1, stride=1)


def test_each_train_default_is_stated_once_by_train_config():
    """The train section's defaults are TrainConfig's, the one place they are written: the YAML
    schema states none, the loaded schema has each (so the presets and run specs hold them), and the
    loop reads a spec's section through TrainConfig (a key it lacks: the same default)."""
    from dataclasses import MISSING, fields

    from grassflow.train_config import TrainConfig

    raw = yaml.safe_load(SCHEMA.read_text())["$defs"]["train"]["properties"]
    assert not [k for k, v in raw.items() if "default" in v]
    loaded = load_schema(SCHEMA)["$defs"]["train"]["properties"]
    stated = {f.name: f.default for f in fields(TrainConfig) if f.default is not MISSING}
    # every key of the section, and no other, has its default there
    assert set(stated) == set(loaded)
    assert {k: v["default"] for k, v in loaded.items()} == {
        k: list(v) if isinstance(v, tuple) else v for k, v in stated.items()
    }
    assert TrainConfig.from_dict({"epochs": 1, "batch_size": 2}).log_every == stated["log_every"]
    with pytest.raises(ValueError, match=r"train: unknown key\(s\) \['lr_max'\]"):
        TrainConfig.from_dict({"epochs": 1, "batch_size": 2, "lr_max": 1.0})


def test_defaults_are_filled_before_the_semantic_checks():
    """The semantic checks and the run specs read every key: a preset that leaves the recall model's
    sizes to the schema gets the schema's defaults in its specs."""
    from grassflow.recall.grid import recall_runs

    cfg = copy.deepcopy(BASE)
    cfg["preset"] = "demo"
    for key in ("n_layers", "ffn_mult"):
        cfg["presets"]["demo"]["recall"].pop(key, None)
    assert config_errors(cfg, SCHEMA) == []
    specs = recall_runs(*select_preset(cfg))
    assert specs and all(
        s["model"]["n_layers"] == 2 and s["model"]["d_ff"] == 4 * s["model"]["d_model"]
        for s in specs.values()
    )


def _walk(node):
    yield node
    for v in node.values() if isinstance(node, dict) else node if isinstance(node, list) else ():
        yield from _walk(v)


def test_snli_head_ffn_is_settable_and_reaches_the_runs():
    from grassflow.snli.grid import snli_runs

    cfg = demo(lambda c, d: d["snli"].setdefault("head", {}).update(ffn=False))
    assert config_errors(cfg, SCHEMA) == []
    specs = snli_runs(*select_preset(cfg))
    assert specs and all(s["head"]["ffn"] is False for s in specs.values())


def test_every_run_spec_of_every_preset_reads_as_a_run_spec():
    """What the jobs read of a spec file: every run of every task of every preset, as a RunSpec
    whose train section is a TrainConfig and whose record is the file's dict, unchanged."""
    from grassflow.pipeline.preview import load_config
    from grassflow.pipeline.tasks import TASKS
    from grassflow.run_spec import RunSpec
    from grassflow.train_config import TrainConfig

    seen = set()
    for name in BASE["presets"]:
        _, preset = select_preset(load_config(ROOT, preset=name))
        for task in TASKS.values():
            for run_id, spec in task.specs(name, preset).items():
                rs = RunSpec.from_dict(spec)
                assert isinstance(rs.train, TrainConfig) and rs.source is spec
                assert (rs.run_id, rs.task, rs.seed, rs.train.epochs) == (
                    run_id,
                    task.name,
                    spec["seed"],
                    spec["train"]["epochs"],
                )
                seen.add(task.name)
    assert seen == set(TASKS)


@pytest.mark.parametrize(
    "edit, first",
    [
        ({"bogus": 1}, "run spec t-grassmann-s0: unknown key(s) ['bogus']"),
        ({"seed": None}, "run spec t-grassmann-s0: missing key(s) ['seed']"),
        (
            {"train": {"epochs": 1, "batch_size": 2, "lrr": 3}},
            "run spec t-grassmann-s0: train: unknown key(s) ['lrr']",
        ),
        ({"train": {"epochs": 1}}, "run spec t-grassmann-s0: train: missing key(s) ['batch_size']"),
        (None, "a run spec is a JSON object, not list"),
    ],
)
def test_a_training_job_refuses_a_spec_with_a_bad_key_in_one_line(edit, first, capfd):
    import json

    from grassflow.lm.train import main
    from helpers.specs import LM_SPEC

    spec = (
        [LM_SPEC]
        if edit is None
        else {k: v for k, v in {**LM_SPEC, **edit}.items() if v is not None}
    )
    with pytest.raises(SystemExit) as e:
        main(
            [
                "--spec",
                json.dumps(spec),
                "--train-tokens",
                "t",
                "--val-tokens",
                "v",
                "--out-dir",
                "o",
            ]
        )
    err = capfd.readouterr().err
    assert e.value.code == 2 and first in err and len(err.strip().splitlines()) == 1, err


def test_the_model_kinds_are_named_once_in_the_schemas_and_alike_in_the_registry():
    """The kind enum is one $def that every task's schema refers to, naming the kinds of the models'
    registry (KIND_CODE), each of which declares the model keys it owns (KIND_KEYS); a kind's run
    spec drops the keys every other kind owns, a kind not yet declared too."""
    from grassflow.models import KIND_CODE
    from grassflow.planning.sections import KIND_KEYS, own_keys

    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    assert schema["$defs"]["model_kind"]["enum"] == list(KIND_CODE) and set(KIND_KEYS) == set(
        KIND_CODE
    )
    for f in [
        ROOT / "workflow/schemas/config.schema.yaml",
        *(ROOT / "src/grassflow").glob("*/schema.yaml"),
    ]:
        text = f.read_text()
        assert text.count("[transformer, grassmann]") == (f.name == "config.schema.yaml"), f
    model = {"d_model": 8, "attention_window": 4, "r": 2, "lags": [1], "eps": 1e-6}
    assert own_keys("transformer", model) == {"d_model": 8, "attention_window": 4}
    assert own_keys("grassmann", model) == {"d_model": 8, "r": 2, "lags": [1], "eps": 1e-6}
    assert own_keys("a_third_kind", model) == {"d_model": 8}


def test_a_finished_runs_path_a_shell_would_read_is_refused_by_name():
    """finished_runs' directories reach the adoption's command line: one with a character a shell
    reads (a space, `;`, `$`, `|`, `<`) is refused before any job, naming the key."""
    # ~: a shell's home
    for path in (
        "their runs",
        "runs;rm -rf ~",
        "$(id)",
        "a|b",
        "<x>",
        "~/runs",
        "a=~/runs",
    ):
        errors = config_errors({**BASE, "preset": "demo", "finished_runs": [path]}, SCHEMA)
        assert any(
            e.startswith(f"config finished_runs.0: {path!r} does not match") for e in errors
        ), errors
    # a ~ inside a name: no shell expands it
    assert (
        config_errors(
            {
                **BASE,
                "preset": "demo",
                "finished_runs": ["reports/wikitext2-v1-gpu/runs", "/home/u/x_1+2@h,3~4"],
            },
            SCHEMA,
        )
        == []
    )


def test_a_variant_switches_training_keys_of_its_runs_not_the_experiments_or_executions():
    """paper's and paper_v1's `lr_1e-3` variant: both models' runs at lr 1e-3, the others at the
    preset's; a variant's train.epochs (the experiment's) or train.compile (how a job runs)
    refused."""
    from grassflow.lm.grid import ablation_grid, runs
    from grassflow.pipeline.preview import load_config

    for preset, files in (
        ("paper", ["config.yaml"]),
        ("paper_v1", ["config.yaml", "workflow/overlays/wikitext2-v1-local.yaml"]),
    ):
        name, p = select_preset(load_config(ROOT, [str(ROOT / f) for f in files], preset))
        specs, grid = runs(name, p), ablation_grid(name, p)
        assert {k: len(v) for k, v in grid["lr_1e-3"].items()} == {"transformer": 3, "grassmann": 3}
        assert all(specs[r]["train"]["lr"] == 1e-3 for ids in grid["lr_1e-3"].values() for r in ids)
        assert specs["table1-grassmann-s0"]["train"]["lr"] == 3e-4
    for key, value, says in (
        ("lr", 0.01, None),
        ("compile", True, "train.compile: not a variant's to set"),
        ("checkpoint_every", 0, None),
    ):
        cfg = demo(
            lambda c, d, switch={key: value}: d["ablations"]["variants"].update(v={"train": switch})
        )
        errors = config_errors(cfg, SCHEMA)
        assert (
            (errors == [])
            if says is None
            else any(f"ablations.variants.v.{says}" in e for e in errors)
        ), errors
