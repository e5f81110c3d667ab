"""What every task's figures share: the models' colours, a figure written atomically, the curves of
a record per run (the LM's own figures: grassflow.lm.figures)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
# every text a figure holds (a preset's name, a device's, a label) drawn as the text it is: a `$` in
# it never starts mathtext (which would draw it otherwise, or fail the figure)
matplotlib.rcParams["text.parse_math"] = False
import matplotlib.pyplot as plt  # noqa: E402

from grassflow.io import atomic_path  # noqa: E402
from grassflow.report.records import read_metrics  # noqa: E402

COLORS = {"transformer": "tab:blue", "grassmann": "tab:orange"}


def plain_log_ticks(fig) -> None:
    """Every log axis of `fig` labelled as matplotlib would, in plain numbers: its default log
    labels are mathtext (`$\\mathdefault{10^{2}}$`), which these figures draw as the text it is
    (text.parse_math off, above). Labels a figure set itself are kept."""
    from matplotlib.ticker import LogFormatter, LogFormatterSciNotation

    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for minor, f in (
                (False, axis.get_major_formatter()),
                (True, axis.get_minor_formatter()),
            ):
                if type(f) is LogFormatterSciNotation:
                    plain = LogFormatter(
                        base=f._base,
                        labelOnlyBase=f.labelOnlyBase,
                        minor_thresholds=f.minor_thresholds,
                    )
                    (axis.set_minor_formatter if minor else axis.set_major_formatter)(plain)


def save(fig, path):
    plain_log_ticks(fig)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)


def curves(
    df, exp_name, preset, path, key="val_ppl", ylabel="validation perplexity (chunked)", log=True
):
    fig, ax = plt.subplots(figsize=(6, 4))
    for _, run in df.iterrows():
        rows = read_metrics(run.metrics, ("epoch", key))
        if rows:
            ax.plot(
                [r["epoch"] for r in rows],
                [r[key] for r in rows],
                marker="o",
                ms=3,
                color=COLORS.get(run.model),
                alpha=0.8,
                label=f"{run.model} s{run.seed}",
            )
    ax.set(
        xlabel="epoch",
        ylabel=ylabel,
        yscale="log" if log else "linear",
        title=f"{exp_name} — preset {preset}",
    )
    ax.legend(fontsize=7)
    save(fig, path)
