"""Run records to table, crafted from the committed records of a finished run, and records a tracker
wrote, read back."""

from __future__ import annotations

import json
import math
import shutil

from helpers import ROOT

TEMPLATE = ROOT / "reports/wikitext2-v1-laptop"  # real records of a finished run: their shape
# a distinct value per (split, metric): validation's and test's chunked, strided, strided word-level
# (strided NLL per harness word) and lm-eval's word-level ("harness": eval.json's harness.word_ppl)
OFFSETS = {
    ("validation", "chunked_ppl"): 1,
    ("validation", "strided_ppl"): 2,
    ("validation", "strided_word_ppl"): 3,
    ("test", "chunked_ppl"): 4,
    ("test", "strided_ppl"): 5,
    ("test", "strided_word_ppl"): 6,
    ("validation", "harness"): 7,
    ("test", "harness"): 8,
}


def distinct_runs(tmp_path) -> dict[str, dict]:
    """Two seeds per model, each run's values 100·(its index + 1) + the (split, metric) offset."""
    out = {}
    for i, (model, seed) in enumerate((m, s) for m in ("transformer", "grassmann") for s in (0, 1)):
        run_id, d = f"table1-{model}-s{seed}", tmp_path / "runs" / f"table1-{model}-s{seed}"
        d.mkdir(parents=True)
        src = TEMPLATE / "runs" / f"table1-{model}-s0"
        rec, ev = (json.loads((src / f).read_text()) for f in ("run.json", "eval.json"))
        rec["run_id"], rec["spec"]["seed"], rec["spec"]["run_id"] = run_id, seed, run_id
        rec["n_params"] = 1000 + i
        values = {}
        for (split, metric), off in OFFSETS.items():
            values[split, metric] = 100.0 * (i + 1) + off
            if metric == "harness":
                ev[split]["harness"] = {"word_ppl": values[split, metric]}
            else:
                ev[split][metric] = values[split, metric]
        (d / "run.json").write_text(json.dumps(rec))
        (d / "eval.json").write_text(json.dumps(ev))
        shutil.copy(src / "metrics.jsonl", d / "metrics.jsonl")
        out[run_id] = {"dir": d, "model": model, "values": values, "n_params": 1000 + i}
    return out


def tensorboard_scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def crafted_run(
    runs_dir,
    run_id: str,
    model: str,
    seed: int,
    val: float,
    test: float,
    train=None,
    model_keys=None,
    state: str = "completed",
    epochs: int = 1,
):
    """A finished run's records (the template's shape) with these figures: eval.json's validation
    and test chunked PPL, and metrics.jsonl's epochs, the last of which is the best (its validation
    PPL eval.json's, as run.json's best_val_ppl); `train`, `model_keys`: its spec's, over the
    template's. A diverged run records no evaluation."""
    d = runs_dir / run_id
    d.mkdir(parents=True)
    src = TEMPLATE / "runs" / f"table1-{model}-s0"
    rec, ev = (json.loads((src / f).read_text()) for f in ("run.json", "eval.json"))
    spec = rec["spec"]
    spec.update(run_id=run_id, seed=seed)
    spec["train"].update(train or {}, epochs=max(epochs, spec["train"]["epochs"]))
    spec["model"].update(model_keys or {})
    line = json.loads((src / "metrics.jsonl").read_text().splitlines()[0])
    metrics = [
        {
            **line,
            "epoch": e,
            "val_ppl": val * (1 + 0.1 * (epochs - e)),
            "val_loss": math.log(val * (1 + 0.1 * (epochs - e))),
        }
        for e in range(1, epochs + 1)
    ]
    rec.update(
        run_id=run_id,
        seed=seed,
        status={"state": state},
        epochs_completed=epochs,
        best_epoch=epochs,
        best_val_ppl=val,
    )
    ev.update(run_id=run_id, best_epoch=epochs)
    ev["validation"]["chunked_ppl"], ev["test"]["chunked_ppl"] = val, test
    if state != "completed":
        ev.update(status={"state": state}, validation=None, test=None)
    (d / "run.json").write_text(json.dumps(rec))
    (d / "eval.json").write_text(json.dumps(ev))
    (d / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return d
