"""The benchmark runs end to end (smoke sizes) and reports what it promises; no timing asserted."""

import json

import torch

from grassflow.bench import grassmann_backends, main


def test_bench_quick_reports_every_part(tmp_path):
    res = main(["--quick", "--device", "cpu", "--out", str(tmp_path), "--name", "b"])
    saved = json.loads((tmp_path / "b.json").read_text())
    assert saved["sgemm"]["gflops"] > 0
    backends = grassmann_backends(torch.device("cpu"))
    assert [r["backend"] for r in saved["op"]] == ["reference", *backends]
    assert {(r["L"], r["head"], r["backend"]) for r in res["step"]} == {
        (L, head, b) for L in (32, 64) for head in (True, False) for b in backends}
    for row in saved["step"]:
        assert row["time_ratio"] > 0 and row["transformer_mem_mb"] > 0 and row["grassmann_mem_mb"] > 0
    md = (tmp_path / "b.md").read_text()
    assert "sgemm roof" in md and "| fast |" in md
