"""A public reimplementation's training step beside ours, in one run: `python -m grassflow.bench
--peer <checkout of kanenorman/grassmann>`.

Their GrassmannLM (model.py: the paper's N=6, L=128, d=256, r=32 setting, dropout 0.1, tied head)
trained as their train.py does (AdamW(lr=1e-3) in PyTorch's default form, CrossEntropyLoss on the
logits, `loss.item()` every step), against ours as our training loop takes the step
(grassflow.bench.bench_step with dropout 0.1), at B=32. Their model.py imports einops, which is not
a dependency of this project: install it to run this part.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch


def load_peer_model(checkout) -> object:
    path = Path(checkout) / "model.py"
    if not path.is_file():
        raise FileNotFoundError(
            f"--peer {checkout}: no model.py there (a checkout of kanenorman/grassmann)"
        )
    spec = importlib.util.spec_from_file_location("peer_model", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ModuleNotFoundError as e:
        sys.exit(f"error: --peer {checkout}: its model.py needs {e.name!r} (pip install {e.name})")
    return module


def peer_step(checkout, device, L, B, vocab, n_layers, timeit) -> dict:
    peer = load_peer_model(checkout)
    torch.manual_seed(0)
    cfg = peer.LMConfig(
        vocab_size=vocab,
        max_context_len=L,
        num_layers=n_layers,
        tensor_lifting_strategy="grassmann",
        lags=[1, 2, 4, 8, 12, 16],
        d_model=256,
        num_heads=4,
        expansion_ratio=4,
        dropout_rate=0.1,
        weight_tying=True,
        d_low=32,
    )
    model = peer.Transformer(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    crit = torch.nn.CrossEntropyLoss()
    x = torch.randint(0, vocab, (B, L + 1), device=device)

    def step():
        opt.zero_grad()
        logits = model(x[:, :-1])
        loss = crit(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        loss.item()

    step()
    t = timeit(step, device, repeat=5, best=True, warmup=0)
    return {
        "model": "kanenorman/grassmann GrassmannLM",
        "L": L,
        "B": B,
        "seconds": t,
        "tokens_per_s": B * L / t,
    }
