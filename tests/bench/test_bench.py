"""The benchmark runs end to end (smoke sizes) and reports what it promises; no timing asserted."""

import json
from pathlib import Path

import pytest
import torch

from grassflow.bench import grassmann_backends, main

ROOT = Path(__file__).resolve().parents[2]


def test_bench_quick_reports_every_part(tmp_path):
    res = main(["--quick", "--device", "cpu", "--out", str(tmp_path), "--name", "b"])
    saved = json.loads((tmp_path / "b.json").read_text())
    assert saved["sgemm"]["gflops"] > 0
    backends = grassmann_backends(torch.device("cpu"))
    assert [r["backend"] for r in saved["op"]] == ["reference", *backends]
    assert {(r["L"], r["head"], r["backend"]) for r in res["step"]} == {
        (L, head, b) for L in (32, 64) for head in (True, False) for b in backends
    }
    for row in saved["step"]:
        assert (
            row["time_ratio"] > 0 and row["transformer_mem_mb"] > 0 and row["grassmann_mem_mb"] > 0
        )
    md = (tmp_path / "b.md").read_text()
    assert "sgemm roof" in md and "| fast |" in md
    # old vs new kernels at the smoke size, same inputs; the head's three paths; no graph off CUDA
    assert [(r["tokens"], r["r"]) for r in saved["kernels"]] == [(256, 32)]
    assert all(r["old_s"] > 0 and r["new_s"] > 0 for r in saved["kernels"])
    # chunked-bf16, fused: CUDA's
    assert [r["backend"] for r in saved["head"]] == [
        "reference",
        "chunked",
    ]
    assert (
        saved["head"][0]["rel_diff_vs_reference"] == 0
        and saved["head"][1]["rel_diff_vs_reference"] < 1e-4
    )
    assert saved["graph"] == [] and "old (441a7fd) vs new" in md and "| chunked |" in md
    assert [(r["model"], r["members"]) for r in saved["fused"]] == [
        ("transformer", 3),
        ("grassmann", 3),
    ]


def test_head_bytes_report_is_the_arithmetic():
    """reports/bench/head-bytes.md is what bench/head_bytes.py computes (regenerate it with its
    command), and the fused head's loss and gradient stay under 1 GB per member-step at Table 1's
    shape."""
    from grassflow.bench import head_bytes

    assert (ROOT / "reports" / "bench" / "head-bytes.md").read_text() == head_bytes.report()
    N, V = head_bytes.TABLE1
    assert (
        head_bytes.per_logit("fused", loss_only=True) * N * V
        <= 1e9
        < head_bytes.per_logit("reference", True) * N * V
    )


def test_bench_profile_names_each_models_top_ops(tmp_path):
    res = main(["--quick", "--device", "cpu", "--profile", "--out", str(tmp_path), "--name", "p"])
    assert [r["model"] for r in res["rows"]] == ["transformer", "grassmann"]
    for row in res["rows"]:
        names = [t["name"] for t in row["top"]]
        assert len(names) == 15 and "aten::mm" in names and row["wall_s"] > 0
    md = (tmp_path / "p.md").read_text()
    assert md.count("| `aten::mm` |") == 2


# A stand-in for a checkout of kanenorman/grassmann: its model.py's interface (LMConfig with their
# field names, Transformer(cfg) returning logits), a tiny body. What it exercises is ours: loading
# their file, building their config from the paper's setting, their training step, and the table
# beside ours. The real checkout is what a user passes (see bench/peer.py).
PEER_MODEL = """
from dataclasses import dataclass
import torch

@dataclass
class LMConfig:
    vocab_size: int
    max_context_len: int
    num_layers: int
    tensor_lifting_strategy: str
    lags: list
    d_model: int
    num_heads: int
    expansion_ratio: int
    dropout_rate: float
    weight_tying: bool
    d_low: int

class Transformer(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        assert cfg.tensor_lifting_strategy == "grassmann" and cfg.lags == [1, 2, 4, 8, 12, 16]
        self.emb = torch.nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.mix = torch.nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x):
        return self.mix(self.emb(x)) @ self.emb.weight.t()
"""


@pytest.mark.slow  # default tier under 5 min: the peer benchmark through the CLI
def test_bench_peer_through_the_cli(tmp_path):
    import subprocess
    import sys

    peer = tmp_path / "grassmann"
    peer.mkdir()
    (peer / "model.py").write_text(PEER_MODEL)
    out = tmp_path / "out"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "grassflow.bench",
            "--quick",
            "--device",
            "cpu",
            "--parts",
            "op",
            "--peer",
            str(peer),
            "--out",
            str(out),
            "--name",
            "p",
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    saved = json.loads((out / "p.json").read_text())
    theirs, *ours = saved["peer"]
    assert theirs["model"].startswith("kanenorman/grassmann") and theirs["tokens_per_s"] > 0
    assert [r["backend"] for r in ours] == grassmann_backends(torch.device("cpu"))
    assert all(r["ours"] and r["L"] == theirs["L"] == 32 and r["seconds"] > 0 for r in ours)
    md = (out / "p.md").read_text()
    assert "| kanenorman/grassmann GrassmannLM |" in md and "1.00×" in md

    (peer / "model.py").write_text("import einops_is_not_installed_here\n" + PEER_MODEL)
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "grassflow.bench",
            "--quick",
            "--device",
            "cpu",
            "--parts",
            "op",
            "--peer",
            str(peer),
            "--out",
            str(out),
            "--name",
            "q",
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 1 and not (out / "q.json").exists()
    assert res.stderr.strip().splitlines()[-1] == (
        f"error: --peer {peer}: its model.py needs 'einops_is_not_installed_here' (pip install "
        "einops_is_not_installed_here)"
    )


@pytest.mark.slow
def test_bench_concurrency_runs_k_workers_together(tmp_path):
    """`bench --concurrency 1,2` (smoke sizes, CPU): per model and K a row from K worker processes,
    every one of which was ready before any started timing; MPS off CUDA and a list without K=1 (the
    gains' baseline) are refused, each with one error line."""
    import subprocess
    import sys

    res = main(
        [
            "--quick",
            "--device",
            "cpu",
            "--concurrency",
            "1,2",
            "--steps",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    assert [(r["model"], r["k"], r["mps"]) for r in res["rows"]] == [
        (m, k, False) for m in ("transformer", "grassmann") for k in (1, 2)
    ]
    for r in res["rows"]:
        assert len(r["runs"]) == r["k"] and all(run["start"] >= r["go"] for run in r["runs"])
        assert r["aggregate_tokens_per_s"] > 0 and r["slowdown"] > 0
    assert json.loads((tmp_path / "concurrency-quick-cpu.json").read_text())["rows"][3]["k"] == 2
    assert "| grassmann | 2 | no |" in (tmp_path / "concurrency-quick-cpu.md").read_text()
    for args, error in (
        (["1,2", "--mps"], "error: --mps: MPS is CUDA's"),
        (["2,4"], "error: --concurrency 2,4: list 1, the baseline of the gains"),
    ):
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "grassflow.bench",
                "--quick",
                "--device",
                "cpu",
                "--out",
                str(tmp_path),
                "--concurrency",
                *args,
            ],
            capture_output=True,
            text=True,
        )
        assert out.returncode != 0 and error in out.stderr, out.stderr


def test_bench_generate_measures_both_ways_and_grassmanns_state_is_constant(tmp_path):
    """`bench --generate --quick`: per model, prompt lengths up to the context and a row past it,
    incremental and recompute side by side; Grassmann's state the same at every prompt length
    (max(offsets) reduced states per layer), the Transformer's growing with it."""
    res = main(["--quick", "--device", "cpu", "--generate", "--out", str(tmp_path)])
    rows = {(r["model"], r["prompt"]): r for r in res["rows"]}
    assert sorted(rows) == sorted(
        (m, p) for m in ("transformer", "grassmann") for p in (4, 16, 28, 32)
    )
    # once the prompt holds max(offsets) = 8 positions
    g = [rows["grassmann", p] for p in (16, 28, 32)]
    # layers · 8 · r
    assert {r["state_after_prompt"] for r in g} == {r["state_at_end"] for r in g} == {2 * 8 * 8}
    t = [rows["transformer", p]["state_after_prompt"] for p in (4, 16, 28)]
    assert t == [2 * 2 * 32 * p for p in (4, 16, 28)]  # layers · (keys + values) · d · positions
    assert rows["grassmann", 32]["past_context"] and not rows["grassmann", 28]["past_context"]
    assert all(
        r["incremental_tokens_per_s"] > 0 and r["recompute_tokens_per_s"] > 0 for r in res["rows"]
    )
    assert (
        "| grassmann | 32 | 16 (past the context) |"
        in (tmp_path / "generate-quick-cpu.md").read_text()
    )


# --- bench/loc.py: the lines-of-code measure of reports/loc.md ------------------------------------
def test_loc_counts_code_lines_of_the_pipeline_at_a_revision(tmp_path, monkeypatch):
    """Counted: code lines of src/**/*.py, workflow/**/*.{py,smk} and the Snakefile, read from git
    objects; not counted: blank lines, comments, docstrings, other directories, uncommitted
    edits."""
    import importlib.util
    import subprocess
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "loc", Path(__file__).parents[2] / "bench" / "loc.py"
    )
    loc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loc)
    files = {
        "src/pkg/a.py": '"""Module docstring,\non two lines."""\n\nimport os  # why\n\n\ndef '
        "f(x):\n"
        '    """Docstring."""\n    # a comment\n    return (x +\n            1)\n',  # 4 lines
        "workflow/rules/r.smk": "# a comment\nrule r:\n    shell:\n        'true'\n",  # 3 lines
        "Snakefile": 'include: "workflow/rules/r.smk"\n',  # 1 line
        "tests/test_x.py": "x = 1\n",
        "bench/b.py": "y = 2\n",
        "src/pkg/notes.md": "text\n",  # not counted
    }
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)

    def git(*a):
        return subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *a],
            cwd=tmp_path,
            check=True,
            capture_output=True,
        )

    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "one")
    # uncommitted: not in HEAD
    (tmp_path / "src/pkg/a.py").write_text(files["src/pkg/a.py"] + "z = 3\n")
    monkeypatch.chdir(tmp_path)
    assert loc.loc("HEAD") == 8
    git("commit", "-qam", "two")
    assert loc.loc("HEAD") == 9 and loc.loc("HEAD~1") == 8


def test_the_kernels_part_runs_its_cuda_path(monkeypatch):
    """bench/kernels.py on a GPU, through the CuPy stand-in: the baseline's module compiled from its
    own source and kept while its functions launch (one collected after the lookup made the first
    launch fail with CUDA_ERROR_INVALID_CONTEXT on an H200), both kernel sets on torch's stream."""
    from grassflow.bench import kernels
    from helpers import fake_cupy

    kernels._cuda_module.cache_clear()
    kernels._cuda_function.cache_clear()
    with fake_cupy.installed(monkeypatch) as state:
        rows = kernels.bench_kernels(torch.device("cpu"), [64], T=32, r=8, d=16)
    kernels._cuda_module.cache_clear()
    kernels._cuda_function.cache_clear()
    assert (
        [(r["tokens"], r["r"]) for r in rows] == [(64, 8)]
        and rows[0]["old_s"] > 0
        and rows[0]["new_s"] > 0
    )
    names = {name for name, *_ in state.launches}
    assert {"plucker_coeff_f32", "plucker_coeff_r8_f32"} <= names  # the baseline's and today's
    assert {s for *_, s in state.launches} == {fake_cupy.STREAM}
