import secrets

import pytest
import torch

from specs import make_lm_tokens, make_snli_tokens


@pytest.fixture
def gen(request):
    """A fresh random generator per test run; the seed is printed so a failure can be replayed."""
    seed = secrets.randbits(31)
    print(f"[{request.node.name}] seed={seed}")
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="session")
def tokens(tmp_path_factory):
    """Token files of a tiny synthetic corpus with a trained tokenizer (language modelling)."""
    return make_lm_tokens(tmp_path_factory.mktemp("tokens"))


@pytest.fixture(scope="session")
def snli_tokens(tmp_path_factory):
    """Token files of tiny synthetic sentence pairs (SNLI)."""
    return make_snli_tokens(tmp_path_factory.mktemp("snli"))
