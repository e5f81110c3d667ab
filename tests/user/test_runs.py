"""`grassflow runs` and `grassflow diff` on the finished demo, through the CLI: a row per run with a
record, equal to the records (status, epochs, parts, figures, commit); the settings that differ
across the runs listed, as dotted spec keys; --preset and --where filter, --csv writes CSV; `diff`
says a spec edit as its dotted key with both values, the hashes and the curves; a damaged record is
refused in one line naming it."""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
import sys

import pytest

from helpers.dag import pipeline_env

pytestmark = pytest.mark.slow  # reads the finished demo


def _grassflow(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "grassflow", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=pipeline_env(cwd),
    )


def test_runs_lists_every_run_as_its_records_say(demo):
    res = _grassflow("runs", "results", "--preset", "demo", "--csv", cwd=demo)
    assert res.returncode == 0, res.stderr
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    records = sorted(demo.glob("results/demo/**/run.json"))
    assert len(rows) == len(records) > 10  # every task's runs: LM, SNLI, recall
    by_run = {r["run"]: r for r in rows}
    for f in records:
        rec = json.loads(f.read_text())
        row = by_run[str(f.parent.relative_to(demo))]
        assert (
            row["status"] == rec["status"]["state"]
            and int(row["epochs"]) == rec["epochs_completed"]
        )
        assert int(row["parts"]) == len(rec["parts"]) and row["seed"] == str(rec["spec"]["seed"])
        if rec["spec"]["task"] == "lm" and row["status"] == "completed":
            ev = json.loads((f.parent / "eval.json").read_text())
            assert float(row["best_val"]) == ev["validation"]["chunked_ppl"]
            assert float(row["test"]) == ev["test"]["chunked_ppl"]
    # the settings that differ: columns of their own, dotted (the ablation's pre-norm runs, the
    # tables' depths)
    assert {"model.norm", "model.n_layers"} <= set(rows[0]), sorted(rows[0])
    # by columns: Table 1's Grassmann runs, the demo's two seeds, the ablation's pre-norm run and
    # the sweep's two other learning rates (their base is table1); and by a dotted spec key: Table
    # 1's pre-norm runs, the variant's, both models
    md = _grassflow("runs", "--where", "table=table1", "--where", "model=grassmann", cwd=demo)
    assert md.returncode == 0, md.stderr
    lines = [
        line for line in md.stdout.splitlines() if line.startswith("| demo | table1 | grassmann |")
    ]
    assert (
        len(lines) == 7
        and md.stdout.startswith("7 run(s).")
        and "table1\\_pre\\_norm-grassmann-s0" in md.stdout
    ), md.stdout
    pre = _grassflow(
        "runs", "--where", "table=table1", "--where", "model.norm=pre", "--csv", cwd=demo
    )
    assert sorted(r["run"].rsplit("/", 1)[1] for r in csv.DictReader(io.StringIO(pre.stdout))) == [
        "table1_pre_norm-grassmann-s0",
        "table1_pre_norm-transformer-s0",
    ], pre.stdout


def test_diff_says_a_spec_edit_as_its_key_and_a_damaged_record_by_name(demo, tmp_path):
    a = demo / "results/demo/runs/table1-grassmann-s0"
    b = tmp_path / "edited"
    shutil.copytree(a, b, ignore=shutil.ignore_patterns("*.safetensors", "*.pt"))
    rec = json.loads((b / "run.json").read_text())
    rec["spec"]["train"]["lr"] = 1e-3
    (b / "run.json").write_text(json.dumps(rec))
    res = _grassflow("diff", str(a), str(b), cwd=demo)
    assert res.returncode == 0, res.stderr
    assert "| train.lr | 0.003 | 0.001 |" in res.stdout, res.stdout
    assert "The same spec." not in res.stdout and "| weights\\_sha256 |" in res.stdout
    assert "## Validation curves (val_ppl)" in res.stdout and "| 3 |" in res.stdout
    (b / "run.json").write_text("{not json")
    res = _grassflow("diff", str(a), str(b), cwd=demo)
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert res.stderr.startswith(f"error: {b / 'run.json'}: not JSON"), res.stderr
    res = _grassflow("runs", str(tmp_path), cwd=demo)
    assert res.returncode == 1 and res.stderr.startswith(f"error: {b / 'run.json'}: not JSON"), (
        res.stderr
    )


def test_runs_in_a_real_terminal_fits_it_and_prints_plain_rounded_text(demo, tmp_path):
    """`grassflow runs` in tmux at 100 columns (capture-pane): every run once, no line wider than
    the terminal, no Markdown escape or HTML entity, figures rounded as the tables round them; --md
    is the piped default's Markdown (mutation: the Markdown printed on a terminal too)."""
    import re
    import time

    if shutil.which("tmux") is None:
        from helpers.procs import skip_or_fail_in_ci

        skip_or_fail_in_ci("no tmux (apt-get install tmux)")
    env = pipeline_env(demo)
    done = tmp_path / "done"
    session = f"grassflow-runs-{tmp_path.name}"
    cmd = (
        f"cd {demo} && PATH={env['PATH']} PYTHONPATH={env['PYTHONPATH']} {sys.executable} -m "
        f"grassflow runs results; touch {done}; sleep 60"
    )
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "100", "-y", "200", cmd],
        check=True,
        env=env,
    )
    try:
        for _ in range(600):
            if done.exists():
                break
            time.sleep(0.1)
        screen = subprocess.run(
            ["tmux", "capture-pane", "-p", "-t", session, "-S", "-", "-E", "-"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)
    lines = [line.rstrip() for line in screen.splitlines()]
    assert max(map(len, lines)) <= 100, max(lines, key=len)
    assert (
        "\\_" not in screen
        and "\\[" not in screen
        and "&lt;" not in screen
        and "&gt;" not in screen
    ), screen
    records = sorted(demo.glob("results/demo/**/run.json"))
    for f in records:  # every run once, its figures as its table prints them
        (row,) = [line for line in lines if line.split(" ", 1)[0] == f.parent.name]
        ev = json.loads((f.parent / "eval.json").read_text())
        task = json.loads(f.read_text())["spec"]["task"]
        val = (ev.get("validation") or {}).get("chunked_ppl" if task == "lm" else "accuracy")
        if val is not None:
            assert (f"{val:.1f}" if task == "lm" else f"{val:.2f}") in row.split(), (row, val)
    assert re.search(rf"^{len(records)} run\(s\)\.", screen, re.M), screen
    piped, md = (
        _grassflow("runs", "results", cwd=demo),
        _grassflow("runs", "results", "--md", cwd=demo),
    )
    assert (
        piped.stdout == md.stdout
        and md.stdout.startswith(f"{len(records)} run(s).")
        and "| preset |" in md.stdout
    )


def test_runs_json_round_trips_every_record_field_and_group_pools_the_seeds(demo):
    res = _grassflow("runs", "results", "--json", cwd=demo)
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    for row in rows:
        d = demo / row["run"]
        for name in ("run.json", "eval.json"):
            # every field, full precision
            assert row["records"][name] == json.loads((d / name).read_text()), (
                d,
                name,
            )
    # --group: each group's mean ± std from eval.json by hand
    groups = json.loads(
        _grassflow(
            "runs", "results", "--group", "--json", "--where", "table=table1", cwd=demo
        ).stdout
    )
    by = {g["group"]: g for g in groups}
    vals = [
        json.loads((demo / f"results/demo/runs/table1-transformer-s{s}/eval.json").read_text())[
            "validation"
        ]["chunked_ppl"]
        for s in (0, 1)
    ]
    g = by["table1-transformer"]
    assert (g["n"], g["ok"], g["seeds"]) == (2, 2, [0, 1])
    assert g["best_val_mean"] == pytest.approx(sum(vals) / 2, rel=1e-12)
    assert g["best_val_std"] == pytest.approx(abs(vals[0] - vals[1]) / 2**0.5, rel=1e-12)
    # --sort: by a column
    rows = list(
        csv.DictReader(
            io.StringIO(
                _grassflow(
                    "runs",
                    "results",
                    "--csv",
                    "--where",
                    "table=table1",
                    "--sort",
                    "best_val",
                    cwd=demo,
                ).stdout
            )
        )
    )
    figures = [float(r["best_val"]) for r in rows if r["best_val"]]
    assert figures == sorted(figures) and len(figures) > 4


def test_diff_of_three_runs_gives_the_deltas_and_the_environment(demo):
    runs = [
        demo / f"results/demo/runs/{r}"
        for r in ("table1-grassmann-s0", "table1-transformer-s0", "table1_pre_norm-grassmann-s0")
    ]
    res = _grassflow("diff", *map(str, runs), "--json", cwd=demo)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    evs = [json.loads((r / "eval.json").read_text()) for r in runs]
    (val,) = [f for f in data["figures"] if f[0] == "best val"]
    first = evs[0]["validation"]["chunked_ppl"]
    assert val[1] == [e["validation"]["chunked_ppl"] for e in evs]
    assert val[2] == pytest.approx([e["validation"]["chunked_ppl"] - first for e in evs], abs=1e-9)
    assert val[3] == pytest.approx(
        [100 * (e["validation"]["chunked_ppl"] - first) / first for e in evs], abs=1e-9
    )
    env = dict((n, v) for n, v in data["environment"])
    assert set(env) == {"python", "torch", "CUDA", "CuPy", "device", "commit", "dirty"}
    assert env["torch"][0] == json.loads((runs[0] / "run.json").read_text())["packages"]["torch"]
    assert {"model_kind", "model.norm"} <= {k for k, _ in data["spec"]}
    md = _grassflow("diff", *map(str, runs), cwd=demo).stdout
    assert "## Environment" in md and "best val: Δ %" in md and md.count("table1-grassmann-s0") >= 1
    one = _grassflow("diff", str(runs[0]), cwd=demo)
    assert one.returncode == 1 and "two or more" in one.stderr
