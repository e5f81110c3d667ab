"""The LM head's memory traffic by arithmetic: the bytes each backend moves through the logits-sized
tensors in one forward + backward under CUDA's bf16 autocast (reports/bench/head-bytes.md; a GPU
measures the time: `python -m grassflow.bench`, head rows). Each pass counted as it reads and writes
whole (N, V) tensors; ATen's log-softmax and its backward read their input twice (a max or sum pass,
then the output pass) at a vocabulary of 30,522, too wide for one block's registers.

    python -m grassflow.bench.head_bytes > reports/bench/head-bytes.md
"""

from __future__ import annotations

from grassflow import markdown
from grassflow.bench.shapes import TABLE1 as SHAPE

# backend -> [(pass, bytes read, bytes written) per logit]
PASSES = {
    "reference": [
        ("GEMM h Wᵀ → bf16 logits", 0, 2),
        ("cast to fp32 (autocast's `.float()`)", 2, 4),
        ("log-softmax (two passes)", 8, 4),
        ("nll backward: the one-hot gradient", 0, 4),
        ("log-softmax backward (two passes)", 12, 4),
        ("cast backward to bf16", 4, 2),
        ("GEMMs G W and Gᵀ h read G", 4, 0),
    ],
    "fused": [
        ("GEMM h Wᵀ → bf16 logits", 0, 2),
        ("ce_partial: max and Σ exp per lane", 2, 0),
        ("ce_grad: the gradient over the logits", 2, 2),
        ("GEMMs G W and Gᵀ h read G", 4, 0),
    ],
}
# the same for any head that is not one GEMM kernel
GEMM_IO = {
    "GEMM h Wᵀ → bf16 logits",
    "GEMMs G W and Gᵀ h read G",
}
# rows (B·L) and vocabulary of one member's step; Table 2's 16 × 256 is the same
TABLE1 = (
    SHAPE["B"] * SHAPE["L"],
    SHAPE["vocab"],
)


def per_logit(backend: str, loss_only: bool = False) -> int:
    """Bytes moved per logit; loss_only: without the GEMMs' own reads and writes."""
    return sum(r + w for name, r, w in PASSES[backend] if not (loss_only and name in GEMM_IO))


def report() -> str:
    N, V = TABLE1
    gb = N * V / 1e9
    rows = [
        [
            b,
            f"{per_logit(b, True)}",
            f"{per_logit(b)}",
            f"{per_logit(b, True) * gb:.2f}",
            f"{per_logit(b) * gb:.2f}",
        ]
        for b in PASSES
    ]
    lead = [
        "# The LM head's memory traffic, by arithmetic",
        "",
        f"One member's training step at Table 1's shape ({N:,} rows × {V:,} logits, bf16 "
        "autocast), forward and backward: bytes through the (N, V) tensors, from the passes below "
        "(`python -m grassflow.bench.head_bytes`; src/grassflow/bench/head_bytes.py says how they "
        "are counted). The per-row statistics of `fused` (N × 256 partials, 8 MB each way) are "
        "left out. Arithmetic, not a measurement: the head's time on a GPU is the benchmark's "
        "`head` rows.",
        "",
    ]
    table = markdown.table(
        [
            "backend",
            "loss and gradient B/logit",
            "with the GEMMs' I/O B/logit",
            "loss and gradient GB",
            "with the GEMMs' I/O GB",
        ],
        rows,
    )
    passes = [[b, name, f"{r} + {w}"] for b in PASSES for name, r, w in PASSES[b]]
    ratio = per_logit("reference", True) / per_logit("fused", True)
    return "\n".join(
        [
            *lead,
            *table,
            "",
            f"The loss and gradient move {ratio:.1f}× fewer bytes fused "
            f"({per_logit('reference') / per_logit('fused'):.1f}× with the GEMMs' reads and "
            "writes).",
            "",
            "## The passes (bytes read + written per logit)",
            "",
            *markdown.table(["backend", "pass", "bytes"], passes),
            "",
        ]
    )


if __name__ == "__main__":
    print(report(), end="")
