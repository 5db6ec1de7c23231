"""Floats that change between calls become graph inputs (automatic dynamic), as sizes do.

The first call specialises a float; when a later call brings another value, the float is
a 0-d float64 tensor input from then on, with Python's double arithmetic done on it in the
graph. A comparison of such an input with a number (and its truth) is guarded as an outcome,
so values with the same outcome reuse the entry. Where a use needs a number (an argument no
tensor fits, a comparison of a float computed from it) it is specialised again: guarded to
its value, so a new value recompiles; never a wrong result.
"""
import warnings

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


def test_comparison_guards_the_comparison_only():
    # Once the float is an input, the entry holds for every value on the same side: one graph
    # per side, as torch.compile (which guards the comparison of its symbolic float).
    def f(x, s):
        if s > 0.5:
            return x * s
        return x - s

    x = torch.randn(3)
    calls = [(x, s) for s in (0.1, 0.2, 0.9, 0.3, 0.95)]
    cnt = _run(f, calls)
    assert cnt.frame_count == 3 == torch_compile_graphs(f, *calls)


def test_every_comparison_of_one_float_is_guarded():
    # Two outcomes of one float (a reflected comparison, then its truth): each is guarded, so
    # 0.0 (False, False) does not reuse the entry of 0.2 (False, True).
    def f(x, s):
        k = 2 if 0.5 <= s else 3
        if s:
            k += 1
        return x * k + s

    x = torch.randn(3)
    cnt = _run(f, [(x, s) for s in (0.6, 0.7, 0.2, 0.0, 0.9, 0.3, -0.0, 4)])
    # 0.6 a constant; then (True, True), (False, True), (False, False); the int 4 another type
    assert cnt.frame_count == 5


def test_a_break_on_item_in_each_layer_compiles_once_per_outcome():
    # The float .item() leaves on the stack at the break goes into the resumed function, where
    # it is compared: each layer's value differs, and each call's. Guarded by value, the resumed
    # function recompiled for every one until config.cache_size_limit and then ran eagerly.
    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            h = self.lin(x).relu()
            n = int(h.sum().item() > 0)
            return h * (n + 1)

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Layer() for _ in range(10)])
    cnt = CompileCounter()
    compiled = bytegraph.compile(model, backend=cnt)
    counts = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(6):
            x = torch.randn(2, 8)
            assert same(model(x), compiled(x))
            counts.append(cnt.frame_count)
    assert not [w for w in caught if "cache_size_limit" in str(w.message)]
    assert counts[1] == counts[-1], counts


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


# --- a symbolic int meeting a float (n * 0.5, n / 3): a float computed in the graph ------------

def _int_meets_float_cases():
    def scaled(x, n):
        return x * (n * 0.001) + x.sum() * (n / 3)

    def reflected(x, n):
        m = 0.5 * n - n / 4
        m += 1.25
        return x + m, x * (2 / n)

    def compared(x, n):
        # the float is needed as a number: specialised (the int guarded), still eager's result
        if n * 0.5 > 3:
            return x + 1
        return x - 1

    def used_as_number(x, n):
        return torch.full((2,), n * 0.25) + x[:2], int(n / 2), float(n * 1.5)

    def with_a_changing_float(x, n, lr):
        return x * (n * lr)

    return [scaled, reflected, compared, used_as_number, with_a_changing_float]


@pytest.mark.parametrize("fn", _int_meets_float_cases(), ids=lambda f: f.__name__)
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_symbolic_int_meeting_a_float(fn, backend):
    x = torch.randn(5)
    extra = (0.1,) if fn.__name__ == "with_a_changing_float" else ()
    calls = [(x, n, *[e * n for e in extra]) for n in (3, 4, 7, 10, 16)]
    _run(fn, calls, backend)


def test_a_number_a_break_hands_over_times_a_float_compiles_once_more():
    # The count .tolist() hands the resumed function changes every call; times a float it made
    # a float the graph could not hold, so it broke again and recompiled on the float's values.
    def f(x):
        c = (x > 0).sum().tolist()
        return x * 2 + c * 0.001

    torch.manual_seed(0)
    calls = [(torch.randn(16),) for _ in range(5)]
    cnt = _run(f, calls)
    assert cnt.frame_count == torch_compile_graphs(f, *calls) == 3


def test_a_symbolic_int_divided_raises_as_python_does():
    # n / 0 raises int division's message, n / 0.0 float division's; n / m with both ints stays
    # with the ints (its divisor may be 0).
    def f(x, n, d):
        try:
            r = n / d
        except ZeroDivisionError as e:
            return x, str(e)
        return x * r, "divided"

    _run(f, [(torch.ones(2), n, d) for n, d in [(3, 2), (4, 2), (5, 0), (6, 0.0), (7, 2), (8, 3), (9, 0)]])
