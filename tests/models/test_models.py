"""Models: the paper's parameter counts, causality under every switch, and learning."""

import itertools

import pytest
import torch

from grassflow.models import GrassmannLM, ModelConfig, TransformerLM, build_model

TINY = dict(
    vocab_size=50, context_len=24, n_layers=2, d_model=32, d_ff=64, n_heads=4, r=6, dropout=0.1
)


def test_paper_parameter_counts():
    cfg = ModelConfig(vocab_size=30522, context_len=128, n_layers=6)
    assert TransformerLM(cfg).num_params() == 12_585_472
    assert GrassmannLM(cfg).num_params() == 12_607_168
    assert TransformerLM(ModelConfig(context_len=128, n_layers=12)).num_params() == 17_324_032


GRASSMANN_SWITCHES = list(
    itertools.product(["post", "pre"], ["default", "small"], ["all", "per_layer"], ["zero", "bias"])
)


@pytest.mark.parametrize("norm, init, schedule, empty", GRASSMANN_SWITCHES)
def test_grassmann_is_causal(norm, init, schedule, empty, gen):
    _check_causal(
        "grassmann",
        dict(
            norm=norm,
            init=init,
            lag_schedule=schedule,
            empty_offsets=empty,
            lags=(1, 2, 4, 8, 12, 16),
        ),
        gen,
    )


@pytest.mark.parametrize(
    "norm, init", list(itertools.product(["post", "pre"], ["default", "small"]))
)
def test_transformer_is_causal(norm, init, gen):
    _check_causal("transformer", dict(norm=norm, init=init), gen)


def _check_causal(kind, switches, gen):
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    model = build_model(kind, ModelConfig(**TINY, **switches)).double().eval()
    idx = torch.randint(0, 50, (2, 24), generator=gen)
    base = model(idx)
    for t in (0, 5, 17, 22):
        changed = idx.clone()
        changed[:, t + 1] = (changed[:, t + 1] + 1 + torch.randint(0, 48, (1,), generator=gen)) % 50
        out = model(changed)
        assert torch.equal(out[:, : t + 1], base[:, : t + 1]), f"{kind}: t={t} sees t+1"
        assert not torch.allclose(out[:, t + 1], base[:, t + 1])


def test_per_layer_schedule_spreads_lags():
    cfg = ModelConfig(n_layers=12, lag_schedule="per_layer")
    assert [cfg.layer_lags(i)[0] for i in range(12)] == [1, 1, 2, 2, 4, 4, 8, 8, 12, 12, 16, 16]
    cfg6 = ModelConfig(n_layers=6, lag_schedule="per_layer")
    assert [cfg6.layer_lags(i) for i in range(6)] == [(1,), (2,), (4,), (8,), (12,), (16,)]


def test_grassmann_backends_agree_inside_the_model(gen):
    torch.manual_seed(0)
    idx = torch.randint(0, 50, (2, 24), generator=gen)
    ref = GrassmannLM(ModelConfig(**TINY, plucker_backend="reference")).double().eval()
    fast = GrassmannLM(ModelConfig(**TINY, plucker_backend="fast")).double().eval()
    fast.load_state_dict(ref.state_dict())
    assert torch.allclose(ref(idx), fast(idx), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", ["grassmann", "transformer"])
def test_overfits_a_tiny_batch(kind, gen):
    torch.manual_seed(0)
    model = build_model(kind, ModelConfig(**{**TINY, "dropout": 0.0}))
    idx = torch.randint(0, 50, (4, 24), generator=gen)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(60):
        logits = model(idx[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 50), idx[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.3 * losses[0], losses[::10]


@pytest.mark.parametrize(
    "bad, key",
    [
        (dict(n_heads=3), "n_heads"),
        (dict(r=1), "model.r"),
        (dict(lags=(0, 1)), "model.lags"),
        (dict(lags=(24,)), "model.lags"),
        (dict(norm="mid"), "model.norm"),
        (dict(lag_schedule="odd"), "model.lag_schedule"),
        (dict(dropout=1.5), "model.dropout"),
    ],
)
def test_bad_config_names_the_key(bad, key):
    with pytest.raises(ValueError, match=key):
        ModelConfig(**{**TINY, **bad})


def test_unknown_config_key_is_named():
    with pytest.raises(ValueError, match="unknown key.*'heads'"):
        ModelConfig.from_dict({"heads": 4})
