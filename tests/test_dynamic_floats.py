"""Floats that change between calls become graph inputs (automatic dynamic), as sizes do.

The first call specialises a float; when a later call brings another value, the float is
a 0-d float64 tensor input from then on, with Python's double arithmetic done on it in the
graph. Where a use needs a number (a comparison, an argument no tensor fits) it is
specialised again: guarded to its value, so a new value recompiles; never a wrong result.
"""
import pytest
import torch

from torch.utils import _pytree as pytree

import bytegraph
from bytegraph.testing import CompileCounter, same
from helpers import torch_compile_graphs


def _run(fn, calls, backend="eager"):
    cnt = CompileCounter(bytegraph.backends.registry.lookup_backend(backend))
    compiled = bytegraph.compile(fn, backend=cnt)
    for args in calls:
        expected, actual = fn(*args), compiled(*args)
        assert same(expected, actual, rtol=1e-6, atol=1e-7), (args, expected, actual)
        for e, a in zip(pytree.tree_leaves(expected), pytree.tree_leaves(actual)):
            assert type(e) is type(a)
            if isinstance(e, torch.Tensor):
                assert e.dtype == a.dtype
    return cnt


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_changing_float_compiles_twice(backend):
    def f(x, s):
        t = (1 - s * 0.5) ** 2 / (s + 3)
        return x * t + x.sum() * s

    x = torch.randn(4)
    cnt = _run(f, [(x, 0.1), (x, 0.2), (x, 0.3), (x, 1.5), (x, -2.0)], backend)
    assert cnt.frame_count == 2


def test_float_keeps_tensor_dtype_rules():
    def f(x, h, i, s):
        return x * s, h * s, i * s, (x.sum() / s), x.add(h.float(), alpha=s)

    x, h, i = torch.randn(3), torch.randn(3).half(), torch.arange(3)
    cnt = CompileCounter()
    compiled = bytegraph.compile(f, backend=cnt)
    for s in (0.1, 0.7, 3.25):
        for e, a in zip(f(x, h, i, s), compiled(x, h, i, s)):
            assert e.dtype == a.dtype and torch.allclose(e, a)
    assert cnt.frame_count == 2


def test_comparison_specialises_but_stays_right():
    def f(x, s):
        if s > 0.5:
            return x * s
        return x - s

    x = torch.randn(3)
    values = (0.1, 0.2, 0.9, 0.3, 0.95)
    cnt = _run(f, [(x, s) for s in values])
    # The comparison specialises the float to its value: one graph per value (see below).
    assert cnt.frame_count == len(values)


# WORSE (correct, see above): torch.compile guards on the comparison only, so after the float
# turns symbolic there is one graph per side: 3 for these values.
@pytest.mark.xfail(strict=True, reason="WORSE: a compared float is specialised to its value, not to the comparison")
def test_comparison_guards_the_comparison_only():
    def f(x, s):
        if s > 0.5:
            return x * s
        return x - s

    x = torch.randn(3)
    calls = [(x, s) for s in (0.1, 0.2, 0.9, 0.3, 0.95)]
    cnt = _run(f, calls)
    assert cnt.frame_count == 3 == torch_compile_graphs(f, *calls)


def test_float_where_only_a_number_fits():
    def f(x, s):
        return torch.full((2,), s) + x.clamp(max=s)

    _run(f, [(torch.randn(2), 0.1), (torch.randn(2), 0.2), (torch.randn(2), 0.3)])


def test_float_live_across_a_break_is_a_float():
    def f(x, s):
        y = s * 2.0 + 1
        print(end="")         # a break
        return x * y, y

    _run(f, [(torch.randn(2), 0.5), (torch.randn(2), 0.25), (torch.randn(2), 0.125)])


def test_float_inside_higher_order_body():
    def f(x, s):
        return torch.func.vmap(lambda r: r * s + s ** 2)(x)

    cnt = _run(f, [(torch.randn(3, 2), 0.5), (torch.randn(3, 2), 0.25), (torch.randn(3, 2), 0.75)])
    assert cnt.frame_count == 2


def test_cuda_graph_backends_keep_floats_constant():
    """A float handed over as a CPU tensor would keep a graph from being recorded as a CUDA
    graph: with the cudagraphs backend (and mode="reduce-overhead") floats stay constants."""
    from bytegraph.backends.registry import lookup_backend, replays_cuda_graphs

    assert replays_cuda_graphs(lookup_backend("cudagraphs"))
    assert replays_cuda_graphs(lookup_backend("inductor", mode="reduce-overhead"))
    assert not replays_cuda_graphs(lookup_backend("inductor"))
    from bytegraph.debug import records

    def f(x, s):
        return x * s

    bytegraph.reset()
    compiled = bytegraph.compile(f, backend="cudagraphs")
    for s in (0.5, 0.25, 0.125):
        assert torch.equal(compiled(torch.ones(2), s), torch.ones(2) * s)
    graphs = [r.graph for r in records.frames if r.name.endswith("f") and r.graph is not None]
    assert len(graphs) == 3     # one per value: each a constant
    assert all(len([n for n in g.graph.nodes if n.op == "placeholder"]) == 1 for g in graphs)
