"""One GPU lease's decisions, in Python; `bench/gpu_paper_window.sh` keeps what a shell is for (the
environment, the carried wheels and tar, MPS, the GPU's load log, the background Snakemake, its
signals, the pack) and calls `python -m grassflow.lease <verb>`, reading exit codes:

  tree     the copy is the prepared commit's (by content), or git's clean checkout     2: refused
  overlay  the window's config overlay before the first minute
  gate     Snakemake's dry run (pipeline.preview): only the preflight, training,
           evaluations and tables, and something to train                              2, 3
  device   the preflight resolved the device and op backends the lease is for         2
  choose   the first minute: the setting and the seeds (first_minute, trials, budget)  1, 3
  reuse    the lease's next command: the first's decision, timing nothing             1
  targets  the tables the decision trains (a table no seed of which fits is left out)
  left     the lease's seconds left, from the first command's record
  budget   each group's projected finish, once its first epoch is in (said once)
  runs     each run's epochs and best validation PPL so far

Every line a verb prints is for the window's log; none is read back."""


class Stop(Exception):
    """A verb's refusal: one `error:` line, and its exit code for the window (2: a copy or plan the
    lease must not run; 3: nothing to train in this lease; 1: a failure)."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def setting_value(compile_: str):
    """train.compile as the config holds it, from its command-line word (true, false, graph)."""
    return {"true": True, "false": False}.get(compile_, compile_)
