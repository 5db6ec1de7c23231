import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # so that `from helpers import check` works

import bytegraph  # noqa: E402

# Under pytest-xdist (pyproject's addopts), the workers share the cores rather than each
# starting one torch thread per core.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _workers))


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
