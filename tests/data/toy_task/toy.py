"""The toy task's part schema, runs, checks, estimate and table (its data: recall's make_cell): its
row
of grassflow.pipeline.tasks names these."""

import json
import sys
from pathlib import Path

from grassflow import job
from grassflow.report.tables import aggregate_args

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["data", "models", "seeds", "epochs", "batch_size"],
    "properties": {
        "data": {
            "type": "object",
            "additionalProperties": False,
            "required": ["seq_len", "kv", "examples"],
            "properties": {
                "vocab": {"type": "integer", "minimum": 8, "default": 64},
                "seq_len": {"type": "integer", "minimum": 4},
                "kv": {"type": "integer", "minimum": 1},
                "examples": {
                    "type": "object",
                    "required": ["train", "validation", "test"],
                    "additionalProperties": {"type": "integer", "minimum": 1},
                },
                "seed": {"type": "integer", "minimum": 0, "default": 0},
            },
        },
        "models": {"type": "array", "minItems": 1, "items": {"enum": ["transformer", "grassmann"]}},
        "d_model": {"type": "integer", "minimum": 4, "default": 16},
        "seeds": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
        "epochs": {"type": "integer", "minimum": 1},
        "batch_size": {"type": "integer", "minimum": 1},
        "train": {"$ref": "#/$defs/train", "default": {}},
    },
}


def runs(name, p):
    from grassflow.planning.sections import run_train

    t = p["toy"]
    out = {}
    for kind in t["models"]:
        model = {
            "d_model": t["d_model"],
            "d_ff": 2 * t["d_model"],
            "n_layers": 1,
            "dropout": 0.0,
            "context_len": t["data"]["seq_len"],
        }
        model.update({"r": 4, "lags": [1, 2]} if kind == "grassmann" else {"n_heads": 1})
        for seed in t["seeds"]:
            run_id = f"{kind}-s{seed}"
            out[run_id] = {
                "run_id": run_id,
                "preset": name,
                "task": "toy",
                "model_kind": kind,
                "seed": seed,
                "model": model,
                "train": {
                    **run_train(t["train"]),
                    "epochs": t["epochs"],
                    "batch_size": t["batch_size"],
                },
            }
    return out


def check(where, name, p):
    from grassflow.data import DataError
    from grassflow.errors import ConfigError
    from grassflow.recall.data import check_params

    d = p["toy"]["data"]
    try:
        check_params(d["vocab"], d["seq_len"], d["kv"], key=f"{where}.data")
    except DataError as e:
        raise ConfigError(str(e)) from None


def estimate(stage, spec, preset, settings, files):
    from grassflow.recall.grid import estimate as recall_job

    d = preset["toy"]["data"]
    as_recall = {"recall": {"data": {"vocab": d["vocab"], "examples": d["examples"]}}}
    est, _ = recall_job(
        stage, {**spec, "cell": {"seq_len": d["seq_len"]}}, as_recall, settings, files
    )
    return est, "config (toy.data.examples)"


def aggregate(preset, preset_name, runs, out_dir):
    rows = []
    for d in map(Path, runs):
        spec = json.loads((d / "run.json").read_text())["spec"]
        test = json.loads((d / "eval.json").read_text()).get("test")  # none: the run did not learn
        acc = f"{test['accuracy']:.4f}" if test else ""
        rows.append(f"{spec['model_kind']},{spec['seed']},{acc}")
    out = Path(out_dir)
    (out / "toy.csv").write_text("model,seed,test_accuracy\n" + "\n".join(sorted(rows)) + "\n")
    (out / "toy.md").write_text(
        f"# Toy ({preset_name})\n\n" + "\n".join(f"- {r}" for r in sorted(rows)) + "\n"
    )


def main(argv=None) -> int:
    p = job.parser(__spec__.name, __doc__)
    aggregate_args(p)
    a = p.parse_args(argv)
    return job.run(aggregate, a.preset, a.preset_name, a.runs, a.out_dir)


if __name__ == "__main__":
    sys.exit(main())
