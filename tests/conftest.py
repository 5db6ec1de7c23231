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


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "suppress_errors: the test runs with bytegraph.config.suppress_errors on (an internal error "
        "runs the frame eagerly); for tests of that fallback itself")
    config.addinivalue_line(
        "markers", "mutation_blind(*breaks, reason): the test cannot notice these deliberate breaks of "
        "scripts/mutate.py (say, a result that does not depend on the input values cannot tell a graph "
        "answering its first call's outputs); mutate.py counts it apart from the survivors")


@pytest.fixture(autouse=True)
def fresh_bytegraph(request):
    """Every test starts with empty caches, a fixed seed, default settings and grad mode on.

    Internal errors are raised, not turned into eager runs (``config.suppress_errors`` off), so
    a tracer bug fails the test that meets it instead of passing on eager's result; tests of the
    fallback itself are marked ``suppress_errors``. A frame that still fell back for an internal
    error (a test that turned suppression on itself) fails the test at its end."""
    bytegraph.reset()
    torch.manual_seed(0)
    limit = bytegraph.config.cache_size_limit
    grad_enabled = torch.is_grad_enabled()
    # Tests do not read or write the persistent cache unless they ask (tests/test_persistent_cache.py).
    persistent = bytegraph.config.persistent_cache
    bytegraph.config.persistent_cache = False
    suppressing = request.node.get_closest_marker("suppress_errors") is not None
    bytegraph.config.suppress_errors = suppressing
    yield
    bytegraph.config.suppress_errors = True
    bytegraph.config.persistent_cache = persistent
    bytegraph.config.cache_size_limit = limit
    torch.set_grad_enabled(grad_enabled)
    if not suppressing:
        from helpers import internal_error_fallbacks
        fallbacks = internal_error_fallbacks()
        bytegraph.reset()
        assert not fallbacks, "frames fell back to eager after an internal error:\n" + "\n".join(fallbacks)
    bytegraph.reset()
