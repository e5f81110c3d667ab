"""Incremental decoding (grassflow.decode): each step's logits equal those of recomputing the whole
prefix, for both models and their switches, at odd lengths; the Grassmann state does not grow with
the text; sampling is deterministic under a seed; past the context the window slides."""

import pytest
import torch

from grassflow.decode import Decoder, generate
from grassflow.models import ModelConfig, build_model

SETTINGS = [
    ("transformer", {}),
    ("transformer", {"norm": "pre", "tie_weights": False}),
    ("transformer", {"attention_window": 3}),
    ("grassmann", {}),
    ("grassmann", {"norm": "pre", "empty_offsets": "bias", "init": "small"}),
    ("grassmann", {"lag_schedule": "per_layer", "lags": [1, 2, 5], "ffn": False}),
]


def small(kind, **over):
    cfg = ModelConfig(
        **{
            "vocab_size": 37,
            "context_len": 23,
            "n_layers": 3,
            "d_model": 16,
            "d_ff": 24,
            "n_heads": 2,
            "r": 5,
            "lags": [1, 2, 4, 7],
            "dropout": 0.1,
            **over,
        }
    )
    return build_model(kind, cfg).eval()


@pytest.mark.parametrize(
    "kind,over", SETTINGS, ids=[f"{k}-{'-'.join(o) or 'paper'}" for k, o in SETTINGS]
)
def test_each_step_equals_recomputing_the_prefix(kind, over, gen):
    model = small(kind, **over)
    idx = torch.randint(0, 37, (3, 23), generator=gen)
    full = model(idx)
    dec = Decoder(model)
    got = [dec.feed(idx[:, :5])]  # a prompt of 5, then odd chunks to the end of the context
    for a, b in ((5, 6), (6, 9), (9, 10), (10, 17), *((t, t + 1) for t in range(17, 23))):
        got.append(dec.feed(idx[:, a:b]))
    torch.testing.assert_close(torch.cat(got, dim=1), full, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="exceed context_len 23"):
        dec.feed(idx[:, :1])


def test_grassmann_state_is_constant_and_the_transformers_grows(gen):
    sizes = {}
    for kind in ("grassmann", "transformer"):
        dec = Decoder(small(kind))
        sizes[kind] = []
        for _ in range(20):
            dec.feed(torch.randint(0, 37, (1, 1), generator=gen))
            sizes[kind].append(dec.state_numel())
    # Grassmann: max(offsets)=7 reduced states of r=5 per layer, once 7 positions exist
    assert sizes["grassmann"][6:] == [3 * 7 * 5] * 14
    assert sizes["transformer"] == [3 * 2 * 16 * (t + 1) for t in range(20)]


@pytest.mark.parametrize("kind", ["transformer", "grassmann"])
def test_generation_is_deterministic_under_a_seed_and_incremental_equals_recompute(kind, gen):
    model = small(kind)
    prompt = torch.randint(0, 37, (2, 4), generator=gen)
    # flat: an untrained model
    a = generate(model, prompt, 15, temperature=5.0, top_k=30, top_p=0.95, seed=1)
    assert torch.equal(
        a, generate(model, prompt, 15, temperature=5.0, top_k=30, top_p=0.95, seed=1)
    )
    assert not torch.equal(
        a, generate(model, prompt, 15, temperature=5.0, top_k=30, top_p=0.95, seed=2)
    )
    assert torch.equal(a[:, :4], prompt) and a.shape == (2, 19)
    greedy = generate(model, prompt, 15, temperature=0)
    assert torch.equal(greedy, generate(model, prompt, 15, temperature=0, recompute=True))


@pytest.mark.parametrize("kind", ["transformer", "grassmann"])
def test_sampled_decoding_equals_recompute_to_the_context_limit_and_from_a_prompt_longer_than_it(
    kind, gen
):
    """Sampled under a seed, incremental decoding draws what recomputing every prefix draws: up to
    the last position of the context (prompt 4 + 19 new = 23 = context_len), and from a prompt
    longer than the context (both read its last context_len tokens for the first new one)."""
    model = small(kind)
    sampled = dict(temperature=0.9, top_k=20, top_p=0.9, seed=3)
    prompt = torch.randint(0, 37, (2, 4), generator=gen)
    inc = generate(model, prompt, 19, **sampled)
    assert inc.shape == (2, 23) and torch.equal(
        inc, generate(model, prompt, 19, recompute=True, **sampled)
    )
    long = torch.randint(0, 37, (2, 30), generator=gen)
    first = generate(model, long, 1, **sampled)
    assert torch.equal(first, generate(model, long, 1, recompute=True, **sampled))
    with torch.no_grad():  # and that first token is drawn from the last context_len tokens' logits
        # a generator per row, as generate draws
        gens = [torch.Generator().manual_seed(3) for _ in range(2)]
        from grassflow.decode import sample

        assert torch.equal(first[:, -1:], sample(model(long[:, -23:])[:, -1], 0.9, 20, 0.9, gens))


def test_past_the_context_the_window_slides(gen):
    """Incrementally, past context_len the last context_len/2 tokens are read anew: the step after
    the slide equals recomputing those tokens alone."""
    model = small("grassmann")
    prompt = torch.randint(0, 37, (1, 20), generator=gen)
    positions = []
    out = generate(model, prompt, 6, temperature=0, on_state=lambda d: positions.append(d.pos))
    assert out.shape == (1, 26)  # new tokens 20..25; the context holds 23 positions
    # full at 23: the last 11 tokens read anew, then one by one
    assert positions == [
        20,
        21,
        22,
        23,
        11,
        12,
    ]
    with torch.no_grad():
        assert out[0, 23] == model(out[:, :23])[0, -1].argmax()  # the last step within the context
        # the slide: the last 11 (= 23 // 2) tokens anew
        assert out[0, 24] == model(out[:, 24 - 11 : 24])[0, -1].argmax()


def test_top_k_one_is_greedy(gen):
    model = small("transformer")
    prompt = torch.randint(0, 37, (1, 3), generator=gen)
    assert torch.equal(
        generate(model, prompt, 8, temperature=0.7, top_k=1, seed=5),
        generate(model, prompt, 8, temperature=0),
    )
    with pytest.raises(ValueError, match="top_p"):
        generate(model, prompt, 1, top_p=0)


@pytest.mark.parametrize("kind", ["transformer", "grassmann"])
def test_a_batch_row_is_what_its_prompt_gives_alone(kind, gen):
    """Greedy and sampled under a seed, each row of a batch draws the tokens its prompt draws alone
    (a generator per row): `grassflow generate` batches several prompts of one length."""
    model = small(kind)
    prompts = torch.randint(0, 37, (3, 5), generator=gen)
    for kw in (dict(temperature=0), dict(temperature=0.9, top_k=20, top_p=0.9, seed=4)):
        batch = generate(model, prompts, 12, **kw)
        for b in range(3):
            assert torch.equal(batch[b : b + 1], generate(model, prompts[b : b + 1], 12, **kw)), (
                kw,
                b,
            )
