"""The recall part's planning: its (seq_len, kv) cells, its run grid, its checks and its jobs'
estimates (its row of grassflow.pipeline.tasks names these). Planning code: what it decides reaches
a job as its params (its spec, on its command line), so no job's code fingerprint holds this
file."""

from __future__ import annotations

from grassflow.errors import ConfigError
from grassflow.models.config import ModelConfig
from grassflow.planning import sections
from grassflow.planning.estimate import Estimate, lm_evaluate, lm_train
from grassflow.planning.sections import own_keys, run_train


def recall_cell(cell: dict) -> str:
    return f"L{cell['seq_len']}-kv{cell['kv']}"


def recall_cells(r: dict) -> dict[str, dict]:
    """{cell: the data section of its data job}: recall.data with the cell's seq_len and kv."""
    return {recall_cell(c): {**r["data"], **c} for c in r["cells"]}


def geometric_lags(L: int) -> list[int]:
    """1, 2, 4, … up to L/2: offsets whose sum of reaches covers the whole context."""
    lags = [1]
    while lags[-1] * 2 <= L // 2:
        lags.append(lags[-1] * 2)
    return lags


def recall_runs(name: str, p: dict) -> dict[str, dict]:
    """{run_id: spec}: (seq_len, kv) cell × d_model × named model × learning rate × seed."""
    r = p.get("recall")
    if not r:
        return {}
    out = {}
    for cell in r["cells"]:
        for d in r["d_models"]:
            for mname, m in r["models"].items():
                kind = m["kind"]
                lags = {"lags": geometric_lags(cell["seq_len"])} if m.get("geometric_lags") else {}
                model = own_keys(
                    kind,
                    {
                        **r["model"],
                        **(m.get("switches") or {}),
                        "d_model": d,
                        "d_ff": r["ffn_mult"] * d,
                        "n_layers": r["n_layers"],
                        "context_len": cell["seq_len"],
                        **lags,
                    },
                )
                for lr in r["lrs"]:
                    train = {
                        **run_train(r.get("train") or {}),
                        "lr": lr,
                        "epochs": r["epochs"],
                        "batch_size": r["batch_size"],
                    }
                    for seed in r["seeds"]:
                        run_id = sections.run_id(f"{recall_cell(cell)}-d{d}-{mname}-lr{lr:g}", seed)
                        out[run_id] = {
                            "run_id": run_id,
                            "preset": name,
                            "task": "recall",
                            "cell": dict(cell),
                            "data_cell": recall_cell(cell),
                            "model_name": mname,
                            "model_kind": kind,
                            "seed": seed,
                            "model": model,
                            "train": train,
                        }
    return out


def check_recall(where: str, name: str, p: dict) -> None:
    from grassflow.data import DataError
    from grassflow.recall.data import check_params

    r = p["recall"]
    for i, cell in enumerate(r["cells"]):
        try:
            check_params(r["data"]["vocab"], cell["seq_len"], cell["kv"], key=f"{where}.cells[{i}]")
        except DataError as e:
            raise ConfigError(str(e)) from None
    if len({recall_cell(c) for c in r["cells"]}) != len(r["cells"]):
        raise ConfigError(f"{where}.cells: a (seq_len, kv) cell is listed twice")


def check_model(spec: dict, p: dict) -> None:
    """A run's model as its dataclass takes it (raises ValueError)."""
    ModelConfig.from_dict({**spec["model"], "vocab_size": p["recall"]["data"]["vocab"]})


def estimate(stage, spec, preset, settings, files):
    """An LM's estimate over the cell's examples × seq_len tokens; trained on examples, evaluated
    once."""
    data, L = preset["recall"]["data"], spec["cell"]["seq_len"]
    lm, sizes = (
        {**spec, "model": {**spec["model"], "context_len": L}},
        {s: n * L for s, n in data["examples"].items()},
    )
    if stage != "train":
        return lm_evaluate(
            lm, sizes, data["vocab"], settings, passes=1
        ), "config (recall.data.examples)"
    est = lm_train(lm, sizes, data["vocab"], settings)
    return Estimate(
        est.seconds, est.items // L, est.mem_mb, est.basis
    ), "config (recall.data.examples)"
