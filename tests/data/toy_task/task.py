"""The toy task's declaration: associative recall at one cell, trained and evaluated by recall's
stages, with its own preset part (and schema), data job, runs, checks, estimate and table."""

from grassflow.toy.toy import check, estimate, runs

from grassflow.pipeline.tasks import Task

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["data", "models", "seeds", "epochs", "batch_size"],
    "properties": {
        "data": {
            "type": "object", "additionalProperties": False, "required": ["seq_len", "kv", "examples"],
            "properties": {"vocab": {"type": "integer", "minimum": 8, "default": 64},
                           "seq_len": {"type": "integer", "minimum": 4}, "kv": {"type": "integer", "minimum": 1},
                           "examples": {"type": "object", "required": ["train", "validation", "test"],
                                        "additionalProperties": {"type": "integer", "minimum": 1}},
                           "seed": {"type": "integer", "minimum": 0, "default": 0}}},
        "models": {"type": "array", "minItems": 1, "items": {"enum": ["transformer", "grassmann"]}},
        "d_model": {"type": "integer", "minimum": 4, "default": 16},
        "seeds": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
        "epochs": {"type": "integer", "minimum": 1},
        "batch_size": {"type": "integer", "minimum": 1},
        "train": {"$ref": "#/$defs/train", "default": {}},
    },
}

TASK = Task(
    name="toy",
    part_key="toy",
    runs=runs,
    estimate=estimate,
    check=check,
    schema=SCHEMA,
)
