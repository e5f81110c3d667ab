"""The benchmarks' shapes, each said once (no torch: the parent of the concurrency workers and the
head's byte count import it): the paper's Table 1 step (L, a batch's sequences B, layers N, d, r,
bert-base-uncased's vocabulary) and the smoke sizes of --quick."""

TABLE1 = {"L": 128, "B": 32, "n_layers": 6, "d": 256, "r": 32, "vocab": 30522}
QUICK = {"L": 32, "B": 4, "n_layers": 2, "d": 32, "r": 8, "vocab": 500}
