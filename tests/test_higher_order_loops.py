"""Loops taking functions, traced into one graph as torch's loop operators: while_loop, scan and
map of torch._higher_order_ops. Values and gradients equal eager's; bodies that torch refuses
to capture break the graph with a reason and run natively."""
import pytest
import torch
from torch._higher_order_ops import map as hop_map, scan, while_loop

import bytegraph
from bytegraph.backends.registry import lookup_backend
from bytegraph.testing import CompileCounter
from helpers import assert_traced
from test_higher_order import BACKENDS, _x, check


def _graph(fn, *args):
    cnt = CompileCounter()
    bytegraph.compile(fn, backend=cnt, fullgraph=True)(*args)
    assert cnt.frame_count == 1
    return cnt.graphs[0]


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _breaks(fn, *args):
    """(explain output, compiled result, eager result) of a call expected to break."""
    expected = fn(*args)
    explained = bytegraph.explain(fn)(*args)
    bytegraph.reset()
    actual = bytegraph.compile(fn, backend="eager")(*args)
    assert_traced()     # the compiled call broke where explain says, rather than running unread
    return explained, actual, expected


# --- while_loop ---------------------------------------------------------------------------------

W = torch.randn(3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_while_loop_carried_and_closed_over(backend):
    w = _x(3)

    def fn(x, n):
        def cond(i, y):
            return i < n

        def body(i, y):
            return i + 1, y * w + W.cos()
        return while_loop(cond, body, (torch.zeros((), dtype=torch.int64), x))

    cnt = check(fn, _x(3), torch.tensor(4), backend=backend)
    assert torch.ops.higher_order.while_loop in _targets(cnt.graphs[0])


def test_while_loop_graph_shape():
    def fn(x):
        return while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, y * W), (torch.tensor(0), x))

    gm = _graph(fn, torch.randn(3))
    node = next(n for n in gm.graph.nodes if n.target is torch.ops.higher_order.while_loop)
    cond, body, carried, additional = node.args
    assert cond.op == body.op == "get_attr" and len(carried) == 2 and len(additional) == 1
    # both bodies take the carried tensors, then what either reads from around it
    for name in (cond.target, body.target):
        assert len([n for n in getattr(gm, name).graph.nodes if n.op == "placeholder"]) == 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_while_loop_nested_carry(backend):
    def fn(x, y):
        def body(i, pair):
            a, b = pair
            return i + 1, (a * 2, b + a)
        return while_loop(lambda i, pair: pair[1].sum() < 100, body, (torch.tensor(0), (x, y)))

    check(fn, torch.ones(2), torch.zeros(2), backend=backend, grads=False)


@pytest.mark.mutation_blind("memo_graph", reason="the loop is never entered: the graph computes only the constant "
                            "counter, and the carried tensor is returned as given, outside the graph")
def test_while_loop_never_entered():
    def fn(x):
        return while_loop(lambda i, y: False, lambda i, y: (i + 1, y * 2), (torch.tensor(0), x))

    check(fn, torch.randn(3), grads=False)


def test_while_loop_module_state():
    lin = torch.nn.Linear(4, 4)

    def fn(x):
        return while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, torch.tanh(lin(y))), (torch.tensor(0), x))

    check(fn, _x(2, 4), backend="aot_eager")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["counter", "mixed_with_tensors", "constant_result"])
def test_while_loop_int_carries(backend, case):
    # torch.compile carries a Python int as an unbacked symbolic int (a number only the loop
    # knows) and gives it back as an int: one graph; so here.
    from helpers import torch_compile_graphs

    def counter(x, n):
        return while_loop(lambda i, y: i < n, lambda i, y: (i + 1, y * 2 + i), (0, x))

    def mixed_with_tensors(x, n):
        i, total, y = while_loop(lambda i, t, y: i < n, lambda i, t, y: (i + 2, t + y.sum(), y.cos()),
                                 (1, torch.zeros(()), x))
        return y * i, total, i

    def constant_result(x, n):
        return while_loop(lambda i, y: i < n, lambda i, y: (n, y * 2), (0, x))

    fn = {"counter": counter, "mixed_with_tensors": mixed_with_tensors, "constant_result": constant_result}[case]
    x = torch.randn(3)
    expected = fn(x, 5)
    cnt = CompileCounter(lookup_backend(backend))
    actual = bytegraph.compile(fn, backend=cnt, fullgraph=True)(x, 5)
    assert len(actual) == len(expected)
    for e, a in zip(expected, actual):
        if isinstance(e, int):
            assert type(a) is int and a == e
        else:
            assert torch.allclose(e, a)
    assert cnt.frame_count == 1 == torch_compile_graphs(fn, (x, 5))
    node = next(n for n in cnt.graphs[0].graph.nodes if n.target is torch.ops.higher_order.while_loop)
    assert node.args[2][0] in (0, 1)                  # the int goes in as it is


def test_while_loop_int_carry_decided_on_after_the_loop_breaks():
    # The loop's int is known only when the graph runs: a Python branch on it breaks the graph
    # (as on any number the graph computes), and the function gives eager's answer.
    def fn(x):
        i, y = while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, y * 2), (0, x))
        return y + 1 if i > 2 else y - 1

    explained, actual, expected = _breaks(fn, torch.randn(3))
    assert explained.graph_break_count >= 1
    assert torch.equal(actual, expected)


def test_while_loop_float_carry_breaks_as_eager_refuses():
    def fn(x):
        return while_loop(lambda i, y: y.sum() < 100, lambda i, y: (i + 0.5, y * 2), (0.5, x.abs() + 1))

    with pytest.raises(AssertionError, match="can only be of"):      # eager's own refusal
        fn(torch.randn(3))
    bytegraph.reset()
    with pytest.raises(AssertionError, match="can only be of"):
        bytegraph.compile(fn, backend="eager")(torch.randn(3))
    assert_traced()
    with pytest.raises(bytegraph.errors.Unsupported, match="only tensors and ints are carried"):
        bytegraph.compile(fn, backend="eager", fullgraph=True)(torch.randn(3))


def test_while_loop_body_with_side_effect_breaks():
    seen = []

    def fn(x):
        def body(i, y):
            seen.append(1)
            return i + 1, y * 2
        return while_loop(lambda i, y: i < 3, body, (torch.tensor(0), x * 1))

    with pytest.raises(bytegraph.errors.Unsupported, match="changes Python state outside itself"):
        bytegraph.compile(fn, backend="eager", fullgraph=True)(torch.randn(3))


def test_while_loop_returning_input_refused_as_eager():
    def fn(x):
        return while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, y), (torch.tensor(0), x))

    with pytest.raises(bytegraph.errors.Unsupported, match="returns one of its inputs"):
        bytegraph.compile(fn, backend="eager", fullgraph=True)(torch.randn(3))
    with pytest.raises(Exception) as eager_error:
        fn(torch.randn(3))
    bytegraph.reset()
    with pytest.raises(type(eager_error.value)):
        bytegraph.compile(fn, backend="eager")(torch.randn(3))
    assert_traced()


# --- scan ---------------------------------------------------------------------------------------

def _cumulative(c, x):
    n = c * 0.5 + x.sin()
    return n, n * 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_scan_values_and_grads(backend):
    w = _x(3)

    def fn(init, xs):
        def combine(c, x):
            n = c * w + x
            return n, n.tanh()
        return scan(combine, init, xs)

    cnt = check(fn, _x(3), _x(5, 3), backend=backend)
    assert torch.ops.higher_order.scan in _targets(cnt.graphs[0])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dim,reverse", [(1, False), (0, True), (-1, True)])
def test_scan_dim_reverse(backend, dim, reverse):
    def fn(init, xs):
        return scan(_cumulative, init, xs, dim=dim, reverse=reverse)

    init = _x(4) if dim == 0 else _x(2)
    xs = _x(5, 4) if dim == 0 else _x(2, 5)
    check(fn, init, xs, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_scan_pytrees(backend):
    def combine(carry, x):
        a, b = carry["a"], carry["b"]
        na = a + x[0] * b
        nb = b * 0.9 + x[1]
        return {"a": na, "b": nb}, (na.clone(), nb.sum())

    def fn(a, b, x0, x1):
        return scan(combine, {"a": a, "b": b}, [x0, x1])

    check(fn, _x(3), _x(3), _x(4, 3), _x(4, 3), backend=backend)


def test_scan_without_xs():
    def fn(init):
        carry, ys = scan(_cumulative, init * 2, [])
        return carry + 1, ys

    check(fn, torch.randn(3), grads=False)


def test_scan_carry_mismatch_breaks():
    def fn(init, xs):
        return scan(lambda c, x: (c.double() + x, x.clone()), init, xs)

    with pytest.raises(bytegraph.errors.Unsupported, match="differs from init"):
        bytegraph.compile(fn, backend="eager", fullgraph=True)(torch.randn(3), torch.randn(2, 3))


# --- map ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_map_values_and_grads(backend):
    lin = torch.nn.Linear(3, 3)

    def fn(xs, y):
        return hop_map(lambda x, y: lin(x.sin()) + y * W, xs, y)

    cnt = check(fn, _x(4, 3), _x(3), backend=backend)
    assert torch.ops.higher_order.map_impl in _targets(cnt.graphs[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_map_pytrees(backend):
    def f(xs, scale):
        a, b = xs
        return {"sum": a + b * scale, "prod": (a * b).cos()}

    def fn(a, b, scale):
        return hop_map(f, (a, b), scale)

    check(fn, _x(5, 2, 2), _x(5, 2, 2), _x(2), backend=backend)


def test_functorch_control_flow_map():
    from functorch.experimental import control_flow

    def fn(xs):
        return control_flow.map(lambda x: x * 2 + 1, xs)

    check(fn, torch.randn(3, 4), grads=False)


def test_map_returning_slice_refused():
    def fn(xs):
        return hop_map(lambda x: x, xs)

    with pytest.raises(bytegraph.errors.Unsupported, match="returns one of its inputs"):
        bytegraph.compile(fn, backend="eager", fullgraph=True)(torch.randn(3, 2))
