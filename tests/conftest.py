import secrets

import pytest
import torch


@pytest.fixture
def gen(request):
    """A fresh random generator per test run; the seed is printed so a failure can be replayed."""
    seed = secrets.randbits(31)
    print(f"[{request.node.name}] seed={seed}")
    return torch.Generator().manual_seed(seed)
