"""The sweep (grassflow.lm.grid's sweep runs, grassflow.lm.sweep's table): each model's value chosen
on validation, the tuned gap on test, a best at an edge not bracketed; the runs it shares trained
once; what each row ran read from the runs' records, never the preset. The real DAG's sweep on the
demo:
tests/pipeline/test_demo_outputs.py."""

from __future__ import annotations

import math
import re
import statistics

import pytest
import yaml
from scipy import stats

from grassflow.lm import sweep
from grassflow.lm.grid import runs, sweep_grid, value_label
from grassflow.lm.layout import lm_layout
from grassflow.pipeline.presets import config_errors, select_preset
from grassflow.report.figures import plain_log_ticks
from helpers import ROOT
from helpers.records import TEMPLATE, crafted_run
from helpers.specs import PUBLISHED

SCHEMA = ROOT / "workflow/schemas/config.schema.yaml"
VALUES = [1e-3, 3e-3, 1e-2, 3e-2]
LABELS = ["1e-3", "3e-3", "1e-2", "3e-2"]
# {model: [(validation PPL, test PPL) of seeds 0, 1, 2] per value}: the Transformer is best on
# validation at 3e-3 but on test at 1e-2, the Grassmann model best on validation at 1e-2 but on test
# at 3e-3 (so a choice on test, or a report on validation, reads other numbers); one Transformer run
# at 3e-2 diverged
FIGURES = {
    "transformer": [
        [(300, 295), (302, 297), (304, 299)],
        [(250, 245), (252, 247), (254, 249)],
        [(260, 230), (261, 231), (262, 232)],
        [(400, 390), (410, 400), None],
    ],
    "grassmann": [
        [(290, 285), (291, 286), (292, 287)],
        [(270, 250), (272, 251), (274, 252)],
        [(262, 258), (263, 260), (264, 262)],
        [(280, 275), (281, 276), (282, 277)],
    ],
}


def _preset():
    return {
        "data": {"source": "local", "local_dir": "/data/v1"},
        "tokenizer": {"name": "bert-base-uncased"},
        "models": ["transformer", "grassmann"],
        "seeds": [0, 1, 2],
        "sweep": {"base": "table1", "seeds": [0, 1, 2], "train": {"lr": VALUES}},
    }


def _sweep(tmp_path, figures=FIGURES):
    """Crafted records of the sweep and the table job run on them through its command line."""
    runs_dir, grid_runs = tmp_path / "runs", []
    for i, (v, label) in enumerate(zip(VALUES, LABELS)):
        cell = {}
        for model, cells in figures.items():
            cell[model] = []
            for seed, fig in enumerate(cells[i]):
                run = f"table1_lr_{label}-{model}-s{seed}"
                val, test = fig or (1.0, 1.0)
                crafted_run(
                    runs_dir,
                    run,
                    model,
                    seed,
                    val,
                    test,
                    train={"lr": v},
                    state="completed" if fig else "diverged",
                )
                cell[model].append(run)
        grid_runs.append(cell)
    grid = {
        "base": "table1",
        "key": "train.lr",
        "values": VALUES,
        "labels": LABELS,
        "runs": grid_runs,
    }
    out = tmp_path / "report"
    import json

    assert (
        sweep.main(
            [
                "--preset",
                json.dumps(_preset()),
                "--preset-name",
                "crafted",
                "--grid",
                json.dumps(grid),
                "--runs-dir",
                str(runs_dir),
                "--unigram",
                str(TEMPLATE / "data/unigram.json"),
                "--checksums",
                str(TEMPLATE / "data/checksums.json"),
                "--published",
                str(PUBLISHED),
                "--out-dir",
                str(out),
            ]
        )
        == 0
    )
    return out


def _welch_gap(g: list[float], t: list[float]) -> tuple[float, float, float]:
    """The gap (G − T)/T in % and its 95 % interval, by hand: the delta method's variance of the
    ratio of the means, Welch–Satterthwaite's degrees of freedom, Student's t."""
    mg, mt, vg, vt, n = (
        statistics.mean(g),
        statistics.mean(t),
        statistics.variance(g),
        statistics.variance(t),
        3,
    )
    r = mg / mt
    a, b = vg / n, r * r * vt / n
    df = (a + b) ** 2 / (a * a / (n - 1) + b * b / (n - 1))
    half = stats.t.ppf(0.975, df) * math.sqrt(a + b) / mt * 100
    gap = 100 * (mg - mt) / mt
    return gap, gap - half, gap + half


def test_each_model_is_chosen_on_validation_and_the_tuned_gap_is_reported_on_test(tmp_path):
    out = _sweep(tmp_path)
    md = (out / "sweep.md").read_text()
    best = {
        m: re.search(rf"^\| {m} \| (\S+) \| (\S+) \|", md, re.M).groups()
        for m in ("transformer", "grassmann")
    }
    assert best == {"transformer": ("3e-3", "yes"), "grassmann": ("1e-2", "yes")}
    g_test = [f[1] for f in FIGURES["grassmann"][2]]
    t_test = [f[1] for f in FIGURES["transformer"][1]]
    gap, low, high = _welch_gap(g_test, t_test)
    assert f"**Tuned gap G−T on test PPL: {gap:+.1f} %** (95 % CI {low:+.1f} … {high:+.1f} %)" in md
    assert (
        "the grassmann at 1e-2, the transformer at 3e-3" in md
        and "the uncertainty of the choice itself" in md
    )
    g_val = [f[0] for f in FIGURES["grassmann"][2]]
    t_val = [f[0] for f in FIGURES["transformer"][1]]
    vgap, vlow, vhigh = _welch_gap(g_val, t_val)
    assert f"on validation PPL {vgap:+.1f} % ({vlow:+.1f} … {vhigh:+.1f})" in md
    # every shared value's gap on test, beside; a value with a diverged run has none, and says so
    rows = {
        r[0]: r
        for r in (
            line.split(" | ")
            for line in md.splitlines()
            if line.startswith("| ") and "e-" in line[:8]
        )
    }
    sgap, slow, shigh = _welch_gap(
        [f[1] for f in FIGURES["grassmann"][0]], [f[1] for f in FIGURES["transformer"][0]]
    )
    assert rows["| 1e-3"][6] == f"{sgap:+.1f} % ({slow:+.1f} … {shigh:+.1f})"
    assert rows["| 3e-2"][6] == "—" and rows["| 3e-2"][7] == "2/3, 1 diverged"
    assert rows["| 3e-3"][1] == "transformer" and rows["| 1e-2"][1] == "grassmann"
    csv = (out / "sweep.csv").read_text()
    assert (
        csv.count("\n") == 1 + 24
        and (out / "sweep.tex").is_file()
        and (out / "sweep.png").stat().st_size > 0
    )
    assert "tuned gap on test" in (out / "sweep.tex").read_text()


def test_a_best_at_an_edge_is_not_bracketed_and_no_tuned_gap_is_stated(tmp_path):
    """The Grassmann model best at the last value, the Transformer at the first: each said, with the
    end to extend, and no tuned gap (mutation: every choice taken as bracketed)."""
    figures = {
        "transformer": [[(200, 199)] * 3, *FIGURES["transformer"][1:]],
        "grassmann": [*FIGURES["grassmann"][:3], [(250, 240), (251, 241), (252, 242)]],
    }
    md = (_sweep(tmp_path, figures) / "sweep.md").read_text()
    assert (
        "| transformer | 1e-3 | no (the first value) |" in md
        and "| grassmann | 3e-2 | no (the last value) |" in md
    )
    assert (
        "**No tuned gap:** the transformer's best is at the first value tried (1e-3): not "
        "bracketed, extend the sweep below 1e-3; the grassmann's best is at the last value tried "
        "(3e-2): not bracketed, extend the sweep above 3e-2."
    ) in md
    assert "Tuned gap" not in md and "Paper's claim" not in md


def test_a_value_with_a_diverged_run_is_never_chosen():
    cells = [
        {"n": 3, "n_ok": 3, "val": [300.0] * 3},
        {"n": 3, "n_ok": 2, "val": [100.0] * 2},
        {"n": 3, "n_ok": 3, "val": [250.0] * 3},
    ]
    assert sweep.choose(cells) == {"index": 2, "bracketed": False, "edge": "last"}
    assert sweep.choose([{"n": 3, "n_ok": 0, "val": []}] * 3)["index"] is None


def _config(**presets):
    cfg = yaml.safe_load((ROOT / "config.yaml").read_text())
    for name, over in presets.items():
        cfg["presets"][name] = {**cfg["presets"][name], **over}
    return cfg


def _checked(preset, cfg):
    cfg["preset"] = preset
    errors = config_errors(cfg, SCHEMA)
    return errors, (select_preset(cfg) if not errors else None)


def test_the_papers_sweep_shares_table1s_runs_and_the_lr_ablations():
    """paper's sweep at {1e-4, 3e-4, 1e-3}: 3e-4 is Table 1's runs, 1e-3 the ablation's lr_1e-3;
    only 1e-4 is new, trained once (the preset's runs hold each spec once)."""
    errors, (name, p) = _checked("paper", _config())
    assert not errors
    grid = sweep_grid(name, p)
    assert grid["labels"] == ["1e-4", "3e-4", "1e-3"] and grid["key"] == "train.lr"
    assert [grid["runs"][i]["transformer"] for i in range(3)] == [
        [f"{g}-transformer-s{s}" for s in (0, 1, 2)]
        for g in ("table1_lr_1e-4", "table1", "table1_lr_1e-3")
    ]
    specs = runs(name, p)
    assert specs["table1_lr_1e-4-grassmann-s2"]["train"]["lr"] == 1e-4
    contents = [{k: v for k, v in s.items() if k != "run_id"} for s in specs.values()]
    assert len({repr(sorted(c.items())) for c in contents}) == len(contents)  # each spec once
    plan = lm_layout(name, p, {}, specs, "results/paper")
    assert plan.sweep_runs == sorted(r for cell in grid["runs"] for rs in cell.values() for r in rs)
    assert "results/paper/report/sweep.png" in plan.outputs


@pytest.mark.parametrize(
    "sweep_section, words",
    [
        (
            {"base": "table1", "seeds": [0], "train": {"lr": [1e-3, 1e-2]}},
            "sweep.train.lr: [0.001, 0.01] is too short",
        ),
        (
            {"base": "table1", "seeds": [0], "train": {"lr": [1e-3, 1e-2, -1.0]}},
            "sweep.train.lr.2: -1.0 is less than",
        ),
        (
            {"base": "table1", "seeds": [0], "train": {"lr": [1e-2, 1e-3, 3e-3]}},
            "sweep.train.lr: [0.01, 0.001, 0.003] are not in increasing order",
        ),
        (
            {
                "base": "table1",
                "seeds": [0],
                "train": {"lr": [1e-3, 3e-3, 1e-2], "weight_decay": [0, 0.1, 0.2]},
            },
            "sweep: one key to sweep, under train or model",
        ),
        (
            {"base": "table1", "seeds": [0]},
            "sweep: one key to sweep, under train or model (e.g. train: {lr: [1.0e-3, 3.0e-3, "
            "1.0e-2]}); got none",
        ),
        (
            {"base": "table1", "seeds": [0], "train": {"threads": [1, 2, 4]}},
            "sweep.train.threads: not a sweep's to set",
        ),
        (
            {"base": "table1", "seeds": [0], "model": {"norm": ["post", "pre", "post"]}},
            "sweep.model: Additional properties",
        ),
        (
            {"base": "table1", "seeds": [0], "train": {"lr": [1e-3, True, 1e-2]}},
            "sweep.train.lr.1: True is not of type 'number'",
        ),
        (
            {"base": "table1", "seeds": [0], "model": {"nosuch": [1, 2, 3]}},
            "sweep.model: Additional properties",
        ),
        (
            {"base": "table9", "seeds": [0], "train": {"lr": [1e-3, 3e-3, 1e-2]}},
            "sweep.base: 'table9' is not an experiment",
        ),
    ],
)
def test_a_bad_sweep_is_refused_by_key(sweep_section, words):
    errors, _ = _checked("demo", _config(demo={"sweep": sweep_section}))
    assert any(words in e for e in errors), errors


def test_a_model_key_is_swept_and_a_value_labels_its_runs():
    assert [value_label(v) for v in (1e-4, 3e-4, 0.01, 1.5e-3, 64, 0.5)] == [
        "1e-4",
        "3e-4",
        "1e-2",
        "1.5e-3",
        "64",
        "5e-1",
    ]
    errors, (name, p) = _checked(
        "demo",
        _config(demo={"sweep": {"base": "table1", "seeds": [0], "model": {"r": [4, 8, 16]}}}),
    )
    assert not errors
    grid = sweep_grid(name, p)
    # r is the Grassmann model's: the Transformer is the same run at every value (Table 1's)
    assert (
        grid["runs"][0]["transformer"]
        == grid["runs"][2]["transformer"]
        == ["table1-transformer-s0"]
    )
    assert grid["runs"][0]["grassmann"] == ["table1_r_4-grassmann-s0"] and grid["runs"][1][
        "grassmann"
    ] == ["table1-grassmann-s0"]


def test_a_table_says_what_each_model_ran_from_its_records_not_the_preset(tmp_path):
    """Table 1's job handed a preset slice with no model or training section, and records whose
    Transformer trained at lr 1e-3, its Grassmann model at 3e-4 with r 16: the table says what each
    ran (mutation: comparability from the preset slice again: it has no model or train to read)."""
    from grassflow.lm.aggregate import aggregate

    for model, lr in (("transformer", 1e-3), ("grassmann", 3e-4)):
        for seed in (0, 1):
            crafted_run(
                tmp_path / "runs",
                f"table1-{model}-s{seed}",
                model,
                seed,
                250.0 + seed,
                240.0,
                train={"lr": lr},
            )
    preset = _preset()
    preset.pop("sweep")
    preset["seeds"] = [0, 1]
    out = tmp_path / "report"
    aggregate(
        preset,
        "crafted",
        "table1",
        sorted(map(str, (tmp_path / "runs").iterdir())),
        out,
        str(TEMPLATE / "data/unigram.json"),
        str(TEMPLATE / "data/checksums.json"),
        str(PUBLISHED),
    )
    md = (out / "table1.md").read_text()
    assert "the models ran different settings: lr 0.001 (transformer), 0.0003 (grassmann)" in md
    assert (
        "lr 0.001 (paper preset 0.0003)" in md
        and "r 16 (paper 32)" in md
        and "n_layers 2 (paper 6)" in md
    )


def test_runs_of_one_model_that_ran_other_settings_are_said_not_compared():
    from grassflow.lm.comparable import Varies, not_comparable, ran_settings

    specs = [
        {"run_id": f"r-s{s}", "model_kind": "grassmann", "model": {"r": 16}, "train": {"lr": lr}}
        for s, lr in ((0, 3e-4), (1, 1e-3))
    ]
    ran = ran_settings(specs)
    assert ran == {"grassmann": {"r": 16, "lr": Varies([3e-4, 1e-3])}}
    assert ran_settings(specs, varied=["lr"]) == {"grassmann": {"r": 16}}
    from grassflow.lm.comparable import load_published
    from helpers.specs import PUBLISHED as published

    setup = load_published(published)["paper_setup"]
    why = not_comparable(
        {"data": {"source": "local"}, "tokenizer": {"name": "bert-base-uncased"}},
        "table1",
        ran,
        {},
        setup,
        {"grassmann": {"n_learned": 2, "not_learned": []}},
    )
    assert "the grassmann runs ran different settings: lr 0.0003, 0.001" in why, why
    assert not any("lr 0.0003 (paper preset" in w or "lr [" in w for w in why), why


@pytest.mark.parametrize("preset", ["paper", "demo", "laptop_v1_ablations"])
def test_no_table_job_is_handed_a_model_or_training_section(preset):
    """What each run ran reaches a table by its record only: the preset slices of the LM's table
    jobs hold the data, tokenizer, models, seeds and their grid, nothing a run's spec holds."""
    errors, (name, p) = _checked(preset, _config())
    assert not errors
    plan = lm_layout(name, p, {}, runs(name, p), f"results/{name}")
    slices = [plan.table_preset, plan.ablations_preset, plan.sweep_preset]
    for s in filter(None, slices):
        assert not {"model", "train", "model_overrides", "experiments"} & set(s), sorted(s)
    assert {"ablations", "sweep"} <= {k for s in filter(None, slices) for k in s}


def test_the_figures_axes_say_their_values_in_plain_numbers(tmp_path, monkeypatch):
    """Validation PPL within one decade (250–410 here, 237–314 at laptop size) has no major tick on
    a log axis: its minor ticks carry the numbers (mutation: every minor tick off, as the figure
    once did, leaves the y axis unlabelled), the x axis the table's value labels."""
    drawn = []
    monkeypatch.setattr(sweep, "save", lambda fig, path: drawn.append(fig))
    _sweep(tmp_path)
    (fig,) = drawn
    plain_log_ticks(fig)  # as save() labels them
    fig.canvas.draw()
    (ax,) = fig.axes
    lo, hi = ax.get_ylim()
    shown = [
        t.get_text()
        for minor in (False, True)
        for t, v in zip(ax.get_yticklabels(minor=minor), ax.get_yticks(minor=minor))
        if lo <= v <= hi and t.get_text()
    ]
    assert len(shown) >= 2 and all(re.fullmatch(r"\d+", s) for s in shown), shown
    assert [t.get_text() for t in ax.get_xticklabels()] == LABELS
