import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # so that `from helpers import check` works

import bytegraph  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_bytegraph():
    """Every test starts with empty caches, a fixed seed, default settings and grad mode on."""
    bytegraph.reset()
    torch.manual_seed(0)
    limit = bytegraph.config.cache_size_limit
    grad_enabled = torch.is_grad_enabled()
    # Tests do not read or write the persistent cache unless they ask (tests/test_persistent_cache.py).
    persistent = bytegraph.config.persistent_cache
    bytegraph.config.persistent_cache = False
    yield
    bytegraph.config.persistent_cache = persistent
    bytegraph.config.cache_size_limit = limit
    torch.set_grad_enabled(grad_enabled)
    bytegraph.reset()
