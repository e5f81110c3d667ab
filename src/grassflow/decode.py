"""Generation with incremental decoding, for both language models.

Each step feeds the new tokens only, and each layer keeps what later positions read of it:
  Transformer  a key/value cache: every position's keys and values (grows with the text);
  Grassmann    the last max(offsets) reduced states z (r numbers each): the only earlier values
               its mixing reads (z_{t−Δ}, Δ ≤ max offset), so its state does not grow.
The layers run as they are: the attention and the mixer of each block are swapped, for the duration
of a step, for wrappers that read and extend the cache (the blocks' norms, FFNs and residuals are
the model's own code). Within the trained context each step's logits equal those of recomputing the
whole prefix (tests/core/test_decode.py).

Past the trained context (positions are learned absolute embeddings, context_len of them) the window
slides as nanoGPT's sampler does, by cropping: with `recompute` every step reads the last
context_len tokens anew; incrementally, when the cache is full, the last context_len/2 tokens are
read anew at positions 0… (one prefill) and decoding goes on from there, so each token is predicted
from between context_len/2 and context_len tokens.

This module is read by `grassflow generate` and the decoding benchmark, never by a training or
evaluation job.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F

from grassflow.models.grassmann import GrassmannMixer, gated_mix
from grassflow.models.transformer import SelfAttention
from grassflow.ops.plucker import plucker_mix


class CachedAttention(nn.Module):
    """A causal SelfAttention over its cached keys and values and the new positions'."""

    def __init__(self, attn: SelfAttention):
        super().__init__()
        self.attn, self.k, self.v = attn, None, None

    def forward(self, x, mask=None):
        a = self.attn
        B, T, C = x.shape
        q, k, v = a.qkv(x).view(B, T, 3, a.n_heads, C // a.n_heads).permute(2, 0, 3, 1, 4)
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        S = self.k.shape[2]
        qpos = torch.arange(S - T, S, device=x.device)[:, None]
        back = qpos - torch.arange(S, device=x.device)[None, :]
        allowed = (back >= 0) & (back <= (a.window if a.window is not None else S))
        y = F.scaled_dot_product_attention(q, self.k, self.v, attn_mask=allowed)
        return a.proj(y.transpose(1, 2).reshape(B, T, C))

    def state_numel(self) -> int:
        return 0 if self.k is None else self.k.numel() + self.v.numel()


class CachedMixer(nn.Module):
    """A GrassmannMixer over the last max(offsets) reduced states and the new positions'."""

    def __init__(self, mixer: GrassmannMixer):
        super().__init__()
        self.mixer, self.z = mixer, None
        self.keep = max(mixer.lags)

    def forward(self, h):
        m, cfg = self.mixer, self.mixer.cfg
        z = m.reduce(h)
        T = z.shape[1]
        # the window starts at most max(offsets) before the first new position: an offset Δ is valid
        # at window index i iff Δ ≤ i, as it is at position t iff Δ ≤ t
        window = z if self.z is None else torch.cat([self.z, z], dim=1)
        g = plucker_mix(
            window,
            m.lags,
            m.plucker.weight,
            m.plucker.bias,
            eps=cfg.eps,
            empty=cfg.empty_offsets,
            backend=cfg.plucker_backend,
        )[:, -T:]
        self.z = window[:, -self.keep :]
        return gated_mix(m.gate, h, g)

    def state_numel(self) -> int:
        return 0 if self.z is None else self.z.numel()


class Decoder:
    """A model's incremental state: feed(tokens) → the logits of their positions."""

    def __init__(self, model):
        self.model = model
        self.caches = []
        for block in model.blocks:
            name = "attn" if hasattr(block, "attn") else "mix"
            wrap = CachedAttention if name == "attn" else CachedMixer
            self.caches.append((block, name, wrap(getattr(block, name))))
        self.pos = 0

    @contextmanager
    def _swapped(self):
        originals = [(block, name, getattr(block, name)) for block, name, _ in self.caches]
        try:
            for block, name, cached in self.caches:
                setattr(block, name, cached)
            yield
        finally:
            for block, name, original in originals:
                setattr(block, name, original)

    @torch.no_grad()
    def feed(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, V) of the T new tokens `idx` (B, T), at the positions after those fed so
        far."""
        m, T = self.model, idx.shape[1]
        if self.pos + T > m.cfg.context_len:
            raise ValueError(
                f"positions {self.pos}..{self.pos + T - 1} exceed context_len {m.cfg.context_len}"
            )
        pos = torch.arange(self.pos, self.pos + T, device=idx.device)
        x = m.drop(m.tok_emb(idx) + m.pos_emb(pos))
        with self._swapped():
            for block in m.blocks:
                x = block(x)
        self.pos += T
        return m.head(m.ln_f(x))

    def state_numel(self) -> int:
        """Numbers held across steps (keys and values, or reduced states), over all layers."""
        return sum(cached.state_numel() for _, _, cached in self.caches)


def sample(
    logits: torch.Tensor,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    gens: list[torch.Generator],
) -> torch.Tensor:
    """Next tokens (B, 1) from last-position logits (B, V): greedy at temperature 0; row b drawn
    with its own generator gens[b], so that a row's tokens do not depend on the rows beside it."""
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        order = logits.sort(dim=-1, descending=True)
        cum = order.values.softmax(-1).cumsum(-1)
        # keep the smallest prefix whose mass reaches top_p
        drop = cum - order.values.softmax(-1) > top_p
        logits = logits.scatter(-1, order.indices, order.values.masked_fill(drop, float("-inf")))
    probs = logits.softmax(-1).cpu()
    return (
        torch.cat([torch.multinomial(p, 1, generator=g) for p, g in zip(probs, gens)])
        .view(-1, 1)
        .to(logits.device)
    )


@torch.no_grad()
def generate(
    model,
    idx: torch.Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    recompute: bool = False,
    on_state=None,
) -> torch.Tensor:
    """idx (B, T) followed by max_new_tokens generated tokens, each row as it would be alone (its
    own generator, seeded `seed`). Incremental by default; `recompute`: every step runs the whole
    (cropped) prefix, as a model without a cache must. `on_state(decoder)` is called after each step
    (the benchmark reads the state's size)."""
    if (
        temperature < 0
        or (top_p is not None and not 0 < top_p <= 1)
        or (top_k is not None and top_k < 1)
    ):
        raise ValueError(
            f"temperature ≥ 0, 0 < top_p ≤ 1, top_k ≥ 1; got {temperature}, {top_p}, {top_k}"
        )
    model.eval()
    L = model.cfg.context_len
    gens = [torch.Generator().manual_seed(seed) for _ in range(idx.shape[0])]
    out, decoder, pending = idx, None, idx[:, -L:]
    for _ in range(max_new_tokens):
        if recompute:
            logits = model(out[:, -L:])[:, -1]
        else:
            # (re)start: the window slides
            if decoder is None or decoder.pos + pending.shape[1] > L:
                decoder, pending = Decoder(model), out[:, -(L // 2 if decoder is not None else L) :]
            logits = decoder.feed(pending)[:, -1]
            if on_state:
                on_state(decoder)
        nxt = sample(logits, temperature, top_k, top_p, gens)
        out = torch.cat([out, nxt], dim=1)
        pending = nxt
    return out


def open_model(path, device="cpu", tokenizer=None):
    """(model, tokenizer, the unknown token's id where `<unk>` is read as it (the model was trained
    on Wikitext-2 v1 with tokenizer.map_unk), else None) of an export or a finished run directory:
    the model from its model.safetensors and config.json; the tokenizer `tokenizer`, or the one
    beside it (an export), or where the pipeline keeps the run's (a run directory)."""
    from pathlib import Path

    from tokenizers import Tokenizer

    from grassflow.errors import CommandError
    from grassflow.finished_run import find_tokenizer, model_from_run, unk_mapped
    from grassflow.lm.tokenize import unk_id_of
    from grassflow.pretrained import load_model, read_config

    path = Path(path)
    if not (path / "run.json").is_file():  # an export
        config = read_config(path)
        tok_file = Path(tokenizer) if tokenizer else path / "tokenizer.json"
        if not tok_file.is_file():
            raise CommandError(
                f"{path}: no tokenizer.json beside the model: give its tokenizer with --tokenizer "
                f"(the one config.json's tokenizer sha256 names)"
            )
        tok_cfg = config.get("tokenizer") or {}
        map_unk, name = tok_cfg.get("map_unk"), tok_cfg.get("name", "")
        if not isinstance(map_unk, bool):  # guessing would change what a v1 model's numbers mean
            raise CommandError(
                f"{path / 'config.json'}: no tokenizer.map_unk (true: the model read Wikitext-2 "
                "v1's `<unk>` as one unknown token); export the run again with `grassflow export`"
            )
        model = load_model(path, device)
    else:
        model, record = model_from_run(path)
        model, map_unk, name = (
            model.to(device),
            unk_mapped(record),
            record["data"]["train"]["tokenizer"],
        )
        tok_file = find_tokenizer(path, record, tokenizer)
    try:
        tok = Tokenizer.from_file(str(tok_file))
    except Exception as e:  # the tokenizers library raises its own Exception on a bad file
        raise CommandError(f"{tok_file}: not a tokenizer.json ({str(e).splitlines()[0]})") from None
    return model, tok, unk_id_of(tok, name) if map_unk else None


def generate_text(
    model,
    prompts,
    max_new_tokens=50,
    temperature=1.0,
    top_k=None,
    top_p=None,
    seed=0,
    device="cpu",
    recompute=False,
    tokenizer=None,
) -> list[str]:
    """`grassflow generate`: each prompt's continuation, printed (one paragraph each, in order) and
    returned. The prompts run as batches of those of one token length, each row what its prompt
    gives alone. A prompt is encoded as the model's training text was (a literal `<unk>` is the
    unknown token where its tokens mapped it); one longer than the model's context is cropped to its
    last context_len tokens, said on stderr."""
    import sys

    import torch

    from grassflow.errors import CommandError
    from grassflow.lm.tokenize import encode_rows

    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise CommandError(
            f"--device {device}: no CUDA device here (torch {torch.__version__}, built for CUDA "
            f"{torch.version.cuda}); use --device cpu"
        )
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    net, tok, unk_id = open_model(model, device, tokenizer)
    L, rows = net.cfg.context_len, []
    for prompt, ids in zip(prompts, encode_rows(tok, prompts, unk_id=unk_id)):
        ids = ids.tolist()
        if not ids:
            raise CommandError(f"--prompt {prompt!r}: no tokens to start from")
        if len(ids) > L:
            print(
                (
                    f"note: the prompt {prompt[:40]!r} is {len(ids)} tokens; the model reads its "
                    f"last {L} (context_len)"
                ),
                file=sys.stderr,
            )
        rows.append(ids[-L:])
    texts = [""] * len(prompts)
    for n in sorted({len(r) for r in rows}):  # a batch per length: no padding, each row as alone
        which = [i for i, r in enumerate(rows) if len(r) == n]
        out = generate(
            net,
            torch.tensor([rows[i] for i in which], device=device),
            max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            recompute=recompute,
        )
        for i, o in zip(which, out):
            texts[i] = tok.decode(o[n:].tolist())
    print(
        "\n\n".join(
            p + (" " if t and not t.startswith(" ") else "") + t for p, t in zip(prompts, texts)
        )
    )
    return texts
