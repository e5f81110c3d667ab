"""What lm.smk's rules read, planned from the preset: the LM's runs by table, the ablation grid, the
runs finished elsewhere and the fused groups, its files and what each table job is handed. Planning:
no job imports it, so editing it reruns only the jobs whose params it changes."""

from __future__ import annotations

from types import SimpleNamespace

from grassflow.lm.grid import (
    ablation_grid,
    finished_runs,
    fused_groups,
    main_run_ids,
    sweep_grid,
    tokenizer_spec,
)
from grassflow.planning.sections import SPLITS, group_seed


def table_files(report: str, name: str) -> list[str]:
    """A table's files (its name: an experiment, "ablations", or rule aggregate's "{exp}")."""
    return [f"{report}/{name}.{ext}" for ext in ("md", "csv", "tex")]


def fused_dir(results: str, group: str) -> str:
    """Where rule train_fused trains a fused group (its last.pt: the group's resume state)."""
    return f"{results}/fused/{group}"


def experiment_figures(report: str, exp: str) -> list[str]:
    return [f"{report}/{kind}_{exp}.png" for kind in ("gap", "curves", "best_ppl")]


# What a table job reads of the preset: where its data came from, the tokenizer, the models and
# seeds it asked for. What each run ran (its model, its training) the table reads from the run's
# record.
TABLE_KEYS = ("data", "tokenizer", "models", "seeds")


def table_preset(p: dict, grid: str | None = None) -> dict:
    """The slice of the preset a table job reads (TABLE_KEYS, and the `grid` it tables: ablations,
    sweep), so that another table's, another task's or an execution edit leaves the table alone, and
    a run's settings reach it once: by its record."""
    return {k: p[k] for k in (*TABLE_KEYS, *([grid] if grid else ())) if k in p}


def lm_layout(name: str, p: dict, config: dict, runs: dict, results: str) -> SimpleNamespace:
    """The names of lm.smk: its part (None where the preset has no experiments), its runs (`runs`:
    its task's specs), their groups, files and outputs, under `results` (results/<preset>)."""
    on = bool(p.get("experiments"))
    report, experiments = f"{results}/report", list(p.get("experiments") or {})
    main = main_run_ids(p)
    ablations = ablation_grid(name, p) if on else {}
    finished = finished_runs(config.get("finished_runs"), runs) if on else {}
    fused = fused_groups(p, runs, finished) if on else {}
    tokens = f"{results}/data/tokens/{p['tokenizer']['name'] if on else None}"
    exp_outputs = {e: table_files(report, e) + experiment_figures(report, e) for e in experiments}
    ablation_files = [
        f"{report}/ablations_gap.png",
        *table_files(report, "ablations"),
        f"{report}/ablations.png",
    ]
    sweep = sweep_grid(name, p) if on else None
    sweep_files = [*table_files(report, "sweep"), f"{report}/sweep.png"] if sweep else []
    return SimpleNamespace(
        part=p if on else None,
        train=p["train"] if on else {},
        bench=p.get("bench") or {},
        runs=runs,
        experiments=experiments,
        exp_runs={e: [r for r in main if runs[r]["experiment"] == e] for e in experiments},
        ablations=ablations,
        ablation_runs=sorted(
            {r for models in ablations.values() for rs in models.values() for r in rs}
        ),
        finished=finished,
        fused=fused,
        fused_runs={r for rs in fused.values() for r in rs},
        fused_seeds=[group_seed(r)[1] for r in next(iter(fused.values()), [])],  # every group's
        fused_first={g: runs[rs[0]] for g, rs in fused.items()},  # its preflight's run
        raw=f"{results}/data/raw",
        tokens=tokens,
        files={s: f"{tokens}/{s}.parquet" for s in SPLITS} if on else None,
        # the token files a run's rules read, by their input names
        train_inputs={"train": f"{tokens}/train.parquet", "val": f"{tokens}/validation.parquet"},
        eval_inputs={
            "val": f"{tokens}/validation.parquet",
            "test": f"{tokens}/test.parquet",
            **{f"{s}_docs": f"{tokens}/docs/{s}.parquet" for s in ("validation", "test")},
        },
        tokenizer=tokenizer_spec(p) if on else None,
        exp_outputs=exp_outputs,
        ablation_files=ablation_files,
        ablation_outputs=ablation_files if ablations else [],
        sweep=sweep,
        sweep_runs=sorted({r for cell in sweep["runs"] for rs in cell.values() for r in rs})
        if sweep
        else [],
        sweep_files=sweep_files,
        outputs=[f for fs in exp_outputs.values() for f in fs]
        + [f"{report}/scaling.png", f"{report}/summary.md"]
        + (ablation_files if ablations else [])
        + sweep_files
        if on
        else [],
        table_preset=table_preset(p) if on else None,
        ablations_preset=table_preset(p, "ablations") if ablations else None,
        sweep_preset=table_preset(p, "sweep") if sweep else None,
    )
