"""capture_scalar_outputs / capture_dynamic_output_shape_ops: ops whose result size or value
depends on tensor data traced with unbacked symbols when the mode is on, a graph break when off.

Every case compares the compiled result with eager's (and gradients under aot_eager) and the
number of graphs with torch.compile's under the same settings (tests/helpers.torch_compile_graphs).
"""
import warnings

import pytest
import torch
import torch._dynamo

import bytegraph
from bytegraph.backends.registry import lookup_backend
from bytegraph.runtime import stance
from bytegraph.testing import CompileCounter, same

from helpers import torch_compile_graphs

SCALAR = "capture_scalar_outputs"
SHAPE = "capture_dynamic_output_shape_ops"


def scale_by_item(x):
    return x * x.sum().item()


def zeros_of_item(x):
    return torch.zeros(x.abs().sum().int().item()) + 1


def item_returned(x):
    return x.sum().item() + 1


def item_to_numbers(x):
    n = x.abs().sum().int().item()
    return n * 2 + 1, n // 2


def nonzero(x):
    return x.nonzero() + 1


def bool_mask(x):
    return x[x > 0] * 2


def unique(x):
    return torch.unique(x.round()) + 1


def unique_counts(x):
    values, counts = torch.unique((x > 0).long(), return_counts=True)
    return values + counts


def masked_select(x):
    return torch.masked_select(x, x > 0).sum()


def repeat_interleave(x):
    return torch.repeat_interleave(x, (x > 0).long()) * 3


def argwhere(x):
    return torch.argwhere(x > 0).sum(0)


def nonzero_then_index(x):
    return x[x.nonzero()[:, 0]].sum()


# (function, the mode that captures it)
CASES = [
    (scale_by_item, SCALAR), (zeros_of_item, SCALAR), (item_returned, SCALAR), (item_to_numbers, SCALAR),
    (nonzero, SHAPE), (bool_mask, SHAPE), (unique, SHAPE), (unique_counts, SHAPE), (masked_select, SHAPE),
    (repeat_interleave, SHAPE), (argwhere, SHAPE), (nonzero_then_index, SHAPE),
]
IDS = [fn.__name__ for fn, _ in CASES]


def inputs():
    return [torch.randn(6), torch.tensor([1.5, -2.0, 0.0, 3.0, -1.0, 2.0]), torch.randn(6)]


@pytest.fixture(autouse=True)
def _fresh():
    bytegraph.reset()
    yield
    bytegraph.reset()


def _torch_count(fn, settings, args):
    with warnings.catch_warnings(), torch._dynamo.config.patch(**settings):
        warnings.simplefilter("ignore")
        return torch_compile_graphs(fn, *[(a,) for a in args])


def _run_bytegraph(fn, settings, args, backend="eager"):
    """bytegraph's results for ``args`` (one compiled function, called on each) and its graph count."""
    cnt = CompileCounter(lookup_backend(backend))
    with bytegraph.config.patch(**settings):
        compiled = bytegraph.compile(fn, backend=cnt)
        results = [compiled(a.clone()) for a in args]
    return results, cnt


@pytest.mark.parametrize("fn, mode", CASES, ids=IDS)
@pytest.mark.parametrize("on", [True, False], ids=["on", "off"])
def test_values_and_graph_count_match(fn, mode, on):
    settings = {mode: on}
    args = inputs()
    results, cnt = _run_bytegraph(fn, settings, args)
    for a, r in zip(args, results):
        assert same(fn(a.clone()), r)
    # (off: one call, as a float read at a break is automatic-dynamic in a resume function)
    assert cnt.frame_count == _torch_count(fn, settings, args if on else args[:1]) if on else \
        _run_bytegraph(fn, settings, args[:1])[1].frame_count == _torch_count(fn, settings, args[:1])
    if on:
        # One graph for every input (no guard on what the data decided), holding the op.
        assert cnt.frame_count == 1
        assert any(n.op in ("call_method", "call_function") for n in cnt.graphs[0].graph.nodes)


@pytest.mark.parametrize("fn, mode", CASES, ids=IDS)
def test_mode_off_breaks_at_the_op(fn, mode):
    explained = bytegraph.explain(fn)(inputs()[1])
    reasons = " ".join(b.reason for b in explained.break_reasons)
    assert "data" in reasons, reasons


@pytest.mark.parametrize("fn, mode", [c for c in CASES if c[0] not in (item_returned, item_to_numbers)],
                         ids=[i for i in IDS if i not in ("item_returned", "item_to_numbers")])
def test_gradients_under_aot_eager(fn, mode):
    def loss(x):
        out = fn(x)
        return out.float().sum() if isinstance(out, torch.Tensor) else out
    args = [a.requires_grad_() for a in inputs()]
    cnt = CompileCounter(lookup_backend("aot_eager"))
    with bytegraph.config.patch(**{mode: True}):
        compiled = bytegraph.compile(loss, backend=cnt)
        for a in args:
            x1, x2 = a.detach().clone().requires_grad_(), a.detach().clone().requires_grad_()
            expected, actual = loss(x1), compiled(x2)
            assert same(expected, actual)
            if fn is unique:
                # No derivative: eager raises at backward; the graph runs uncompiled and raises too.
                for out in (expected, actual):
                    with pytest.raises(NotImplementedError, match="derivative"):
                        out.backward()
            elif expected.requires_grad:
                expected.backward()
                actual.backward()
                assert same(x1.grad, x2.grad)
    assert cnt.frame_count == 1


@pytest.mark.parametrize("fn", [scale_by_item, zeros_of_item, bool_mask, unique_counts, nonzero_then_index])
def test_inductor(fn):
    settings = {SCALAR: True, SHAPE: True}
    args = inputs()
    results, cnt = _run_bytegraph(fn, settings, args, backend="inductor")
    for a, r in zip(args, results):
        assert same(fn(a.clone()), r)
    assert cnt.frame_count == 1


def test_inductor_gradient_through_a_mask():
    def f(x):
        return (x[x > 0] ** 2).sum() * x.detach().abs().max().item()
    x1 = torch.tensor([1.5, -2.0, 0.0, 3.0, -1.0, 2.0], requires_grad=True)
    x2 = x1.detach().clone().requires_grad_()
    with bytegraph.config.patch(**{SCALAR: True, SHAPE: True}):
        out = bytegraph.compile(f, backend="inductor")(x2)
    expected = f(x1)
    assert same(expected, out)
    expected.backward()
    out.backward()
    assert same(x1.grad, x2.grad)


# ------------------------------------------------------------- decisions on unbacked values

def branch_on_item(x):
    if x.sum().item() > 0:
        return x + 1
    return x - 1


def range_of_item(x):
    n = x.abs().sum().int().item()
    return [i * 2 for i in range(n)]


@pytest.mark.parametrize("fn", [branch_on_item, range_of_item])
def test_python_decision_on_an_unbacked_value_breaks(fn):
    settings = {SCALAR: True}
    args = [torch.tensor([1.0, 2.0]), torch.tensor([-1.0, -2.5]), torch.tensor([0.5, 0.25])]
    results, cnt = _run_bytegraph(fn, settings, args)
    for a, r in zip(args, results):
        assert same(fn(a.clone()), r)
    with bytegraph.config.patch(**settings):
        explained = bytegraph.explain(fn)(args[0])
    assert explained.graph_break_count >= 1
    assert "decision on a number the graph computes" in explained.break_reasons[0].reason
    assert cnt.frame_count == _torch_count(fn, settings, args)


def int_of_float_item(x):
    return torch.ones(2) * int(x.sum().item()) + float(x.abs().sum().int().item())


def test_int_and_float_of_an_unbacked_number_stay_in_the_graph():
    args = [torch.tensor([1.0, 2.7]), torch.tensor([-1.0, -2.5]), torch.tensor([0.5, 0.25])]
    results, cnt = _run_bytegraph(int_of_float_item, {SCALAR: True}, args)
    for a, r in zip(args, results):
        assert same(int_of_float_item(a.clone()), r)
    assert cnt.frame_count == _torch_count(int_of_float_item, {SCALAR: True}, args) == 1


def test_guards_never_mention_unbacked_symbols():
    def f(x):
        y = x[x > 0]
        return y * x.sum().item(), y.shape[0] + 1
    cnt = CompileCounter()
    with bytegraph.config.patch(**{SCALAR: True, SHAPE: True}):
        compiled = bytegraph.compile(f, backend=cnt)
        for positives in range(7):
            x = torch.cat([torch.rand(positives) + 0.5, -torch.rand(6 - positives)])
            assert same(f(x), compiled(x))
        explained = bytegraph.explain(f)(torch.randn(6))
    assert cnt.frame_count == 1
    guards = " ".join(str(g) for g in explained.out_guards)
    assert "u0" not in guards and "zuf0" not in guards


# --------------------------------------------------------------------------- torch._check

def checked(x):
    n = x.abs().sum().int().item()
    torch._check(n >= 2)
    return torch.zeros(n) + n


def checked_size(x):
    n = x.abs().sum().int().item()
    torch._check_is_size(n)
    return torch.ones(n).sum()


@pytest.mark.filterwarnings("ignore::FutureWarning")     # torch's note on _check_is_size
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("fn", [checked, checked_size])
def test_torch_check_is_a_graph_node_and_fails_as_eager(fn, backend):
    cnt = CompileCounter(lookup_backend(backend))
    with bytegraph.config.patch(**{SCALAR: True}):
        compiled = bytegraph.compile(fn, backend=cnt)
        assert same(fn(torch.ones(3)), compiled(torch.ones(3)))
        assert cnt.frame_count == 1
        graph = cnt.graphs[0]
        assert any(n.target in (torch._check_is_size, torch.ops.aten._assert_scalar.default)
                   for n in graph.graph.nodes)
        if fn is checked:
            with pytest.raises(RuntimeError) as eager_error:
                fn(torch.zeros(3))
            with pytest.raises(RuntimeError) as compiled_error:
                compiled(torch.zeros(3))
            assert str(compiled_error.value) == str(eager_error.value)
    assert cnt.frame_count == _torch_count(fn, {SCALAR: True}, [torch.ones(3)])


# ------------------------------------------------------------------- settings, patch and defaults

def test_modes_are_off_by_default():
    assert bytegraph.config.capture_scalar_outputs is False
    assert bytegraph.config.capture_dynamic_output_shape_ops is False


@pytest.mark.parametrize("fn, mode", [(scale_by_item, SCALAR), (bool_mask, SHAPE), (unique_counts, SHAPE)],
                         ids=["item", "mask", "unique"])
@pytest.mark.parametrize("on", [True, False], ids=["on", "off"])
def test_under_the_patch_torch_settings_are_carried(fn, mode, on):
    x = torch.tensor([1.5, -2.0, 0.0, 3.0, -1.0, 2.0])
    expected_count = _torch_count(fn, {mode: on}, [x])
    cnt = CompileCounter()
    bytegraph.patch_torch_compile()
    try:
        with warnings.catch_warnings(), torch._dynamo.config.patch(**{mode: on}):
            warnings.simplefilter("error", RuntimeWarning)     # a real mode: no "not implemented" warning
            compiled = torch.compile(fn, backend=cnt)
            assert same(fn(x.clone()), compiled(x.clone()))
            assert getattr(bytegraph.config, mode) is on
    finally:
        bytegraph.unpatch_torch_compile()
        stance.apply(stance.DEFAULT)
    assert getattr(bytegraph.config, mode) is False      # put back with the patch
    assert cnt.frame_count == expected_count
