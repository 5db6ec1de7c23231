"""explain(), fullgraph errors, and the control functions: disable, allow_in_graph,
disallow_in_graph, graph_break.

explain() is compared with ``torch._dynamo.explain`` on the same functions and
inputs (used only as a reference here, never inside bytegraph).
"""
import inspect
import operator
import re
import traceback

import pytest
import torch

import bytegraph
from bytegraph import control
from bytegraph.debug import records
from helpers import assert_same, check, clone_input, compile_counted


def t(*shape):
    return torch.randn(*shape)


def line_of(fn, text):
    """Absolute line number of the only line of ``fn``'s source containing ``text``."""
    lines, start = inspect.getsourcelines(fn)
    hits = [start + i for i, line in enumerate(lines) if text in line]
    assert len(hits) == 1, hits
    return hits[0]


@pytest.fixture
def restore_control_sets():
    """allow_in_graph / disallow_in_graph are process-wide and bytegraph.reset() keeps them."""
    allowed, disallowed = set(control.allowed_in_graph), set(control.disallowed_in_graph)
    yield
    control.allowed_in_graph.clear()
    control.allowed_in_graph.update(allowed)
    control.disallowed_in_graph.clear()
    control.disallowed_in_graph.update(disallowed)


def dynamo_explain(fn, *args):
    torch._dynamo.reset()
    try:
        return torch._dynamo.explain(fn)(*args)
    finally:
        torch._dynamo.reset()


# ---------------------------------------------------------------- explain

def toy_example(a, b):
    x = a / (torch.abs(a) + 1)
    print("woo")
    if b.sum() < 0:
        b = b * -1
    return x * b


def no_breaks(a, b):
    x = torch.sin(a) + torch.cos(b)
    y = x.relu() * 2
    return torch.tanh(y) - a


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["b_sum_positive", "b_sum_negative"])
def test_explain_toy_example_matches_dynamo(sign, capsys):
    a, b = t(10), torch.rand(10) * sign
    ours = bytegraph.explain(toy_example)(clone_input(a), clone_input(b))
    assert capsys.readouterr().out == "woo\n"
    ref = dynamo_explain(toy_example, clone_input(a), clone_input(b))
    capsys.readouterr()
    assert (ours.graph_count, ours.graph_break_count, ours.op_count) == (
        ref.graph_count, ref.graph_break_count, ref.op_count)
    assert ours.graph_count == 3 and ours.graph_break_count == 2
    assert ours.op_count == (6 if sign < 0 else 5)
    assert len(ours.graphs) == ours.graph_count
    assert [len(ops) for ops in ours.ops_per_graph] == [len(ops) for ops in ref.ops_per_graph]
    assert sum(len(ops) for ops in ours.ops_per_graph) == ours.op_count
    assert ours.out_guards


def test_explain_break_reasons_name_the_user_lines(capsys):
    out = bytegraph.explain(toy_example)(t(10), -torch.rand(10))
    assert len(out.break_reasons) == 2
    print_line, if_line = line_of(toy_example, 'print("woo")'), line_of(toy_example, "if b.sum() < 0")
    first, second = out.break_reasons
    assert "print" in first.reason
    assert isinstance(first.user_stack[-1], traceback.FrameSummary)
    assert (first.user_stack[-1].filename, first.user_stack[-1].lineno) == (__file__, print_line)
    assert "data-dependent" in second.reason or "tensor" in second.reason
    assert (second.user_stack[-1].filename, second.user_stack[-1].lineno) == (__file__, if_line)


def test_explain_str(capsys):
    out = bytegraph.explain(toy_example)(t(10), torch.rand(10))
    text = str(out)
    for needle in ("Graph Count: 3", "Graph Break Count: 2", "Op Count:", "Break Reason",
                   "Ops per Graph", "Out Guards", "test_control.py", 'print("woo")'):
        assert needle in text, f"{needle!r} not in:\n{text}"
    assert re.search(rf"line {line_of(toy_example, 'print(')}\b", text), text


def test_explain_extra_args_form(capsys):
    a, b = t(10), torch.rand(10)
    out = bytegraph.explain(toy_example, a, b)
    assert out.graph_count == 3 and out.graph_break_count == 2


def test_explain_function_without_breaks(capsys):
    a, b = t(4), t(4)
    ours = bytegraph.explain(no_breaks)(a, b)
    ref = dynamo_explain(no_breaks, a, b)
    assert (ours.graph_count, ours.graph_break_count, ours.op_count) == (
        ref.graph_count, ref.graph_break_count, ref.op_count)
    assert ours.graph_count == 1 and ours.graph_break_count == 0 and ours.break_reasons == []
    assert ours.op_count == 6   # sin, cos, add, mul, tanh, sub (the relu method is not counted)
    assert "Graph Break Count: 0" in str(ours)


def test_explain_does_not_change_results_or_prints(capsys):
    a, b = t(10), -torch.rand(10)
    expected = toy_example(a.clone(), b.clone())
    bytegraph.explain(toy_example)(a.clone(), b.clone())
    assert capsys.readouterr().out == "woo\nwoo\n"
    compiled, cnt = compile_counted(toy_example)
    assert_same(expected, compiled(a.clone(), b.clone()))
    assert cnt.frame_count == 3


# ---------------------------------------------------------------- fullgraph=True errors

def fullgraph_print(x):
    y = x + 1
    print("not allowed in fullgraph")
    return y


def fullgraph_item(x):
    return x * x.sum().item()


def fullgraph_branch(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


def fullgraph_graph_break(x):
    y = x + 1
    bytegraph.graph_break()
    return y


@bytegraph.disable
def _disabled_helper(x):
    return x * 2


def fullgraph_disabled_call(x):
    return _disabled_helper(x + 1)


@pytest.mark.parametrize("fn,marker,reason", [
    (fullgraph_print, 'print("not allowed', "print"),
    (fullgraph_item, ".item()", "item"),
    (fullgraph_branch, "if x.sum()", "data-dependent"),
    (fullgraph_graph_break, "graph_break()", "graph_break"),
    (fullgraph_disabled_call, "_disabled_helper(", "disable"),
])
def test_fullgraph_error_text(fn, marker, reason, capsys):
    compiled, cnt = compile_counted(fn, fullgraph=True)
    with pytest.raises(bytegraph.Unsupported) as info:
        compiled(t(3))
    err = info.value
    assert isinstance(err, bytegraph.BytegraphError)
    message = str(err)
    line = line_of(fn, marker)
    source_line = inspect.getsource(fn).splitlines()[line - fn.__code__.co_firstlineno].strip()
    assert message.splitlines()[0] == err.reason and reason in err.reason, message
    assert f'File "{__file__}", line {line}, in {fn.__qualname__}\n    {source_line}' in message, message
    assert f"hint: {err.hint}" in message and err.hint, message
    assert cnt.frame_count == 0
    assert capsys.readouterr().out == ""   # nothing ran natively


def test_fullgraph_error_in_inlined_helper_names_the_helper_line(capsys):
    def outer(x):
        return fullgraph_print(x * 2)
    compiled, _ = compile_counted(outer, fullgraph=True)
    with pytest.raises(bytegraph.Unsupported) as info:
        compiled(t(3))
    line = line_of(fullgraph_print, 'print("not allowed')
    assert f'File "{__file__}", line {line}, in fullgraph_print' in str(info.value)


# ---------------------------------------------------------------- disable

def _global_callee(x):
    return x.sin() + 1


@bytegraph.disable
def disabled_recursive(x):
    y = x * 3
    return _global_callee(y)


@bytegraph.disable(recursive=False)
def disabled_nonrecursive(x):
    y = x * 3
    return _global_callee(y)


def _plain(x):
    return x.cos() * 2


def _targets(cnt):
    return [n.target for g in cnt.graphs for n in g.graph.nodes if n.op in ("call_function", "call_method")]


def test_disable_as_decorator():
    x = t(3)
    compiled, cnt = compile_counted(disabled_recursive)
    assert_same(_global_callee(x * 3), compiled(x))
    assert cnt.frame_count == 0       # neither its own frame nor its callee are compiled
    assert disabled_recursive.__name__ == "disabled_recursive"


def test_disable_as_call_leaves_the_original_alone():
    x = t(3)
    off = bytegraph.disable(_plain)
    compiled, cnt = compile_counted(off)
    assert_same(_plain(x), compiled(x))
    assert cnt.frame_count == 0
    compiled_plain, cnt_plain = compile_counted(_plain)
    assert_same(_plain(x), compiled_plain(x))
    assert cnt_plain.frame_count == 1


def test_disable_decorator_with_parentheses():
    @bytegraph.disable()
    def f(x):
        return x.exp()
    compiled, cnt = compile_counted(f)
    x = t(3)
    assert_same(x.exp(), compiled(x))
    assert cnt.frame_count == 0


def test_disable_non_recursive_compiles_global_callees():
    x = t(3)
    compiled, cnt = compile_counted(disabled_nonrecursive)
    assert_same(_global_callee(x * 3), compiled(x))
    assert cnt.frame_count > 0, "the global callee of a recursive=False disabled function must be compiled"
    targets = _targets(cnt)
    assert "sin" in targets and operator.add in targets, targets
    assert operator.mul not in targets, f"the disabled function's own `x * 3` was captured: {targets}"
    # second call: cached
    assert_same(_global_callee(x * 3), compiled(x))
    assert cnt.frame_count == 1


def test_disable_non_recursive_called_from_compiled_function():
    def top(x):
        return disabled_nonrecursive(x * 2) - 1
    x = t(3)
    compiled, cnt = compile_counted(top)
    assert_same(top(x), compiled(x))
    targets = _targets(cnt)
    assert "sin" in targets, "the callee of the recursive=False function must be compiled"
    assert targets.count(operator.mul) == 1, targets   # x * 2 only, not the disabled x * 3
    assert cnt.frame_count == 3


def test_disable_inside_compiled_function_makes_a_break(capsys):
    def f(x):
        y = x + 1
        z = disabled_recursive(y)
        return z * 2
    x = t(3)
    compiled, cnt = compile_counted(f)
    for _ in range(2):
        assert_same(f(x), compiled(x))
    assert cnt.frame_count == 2
    targets = _targets(cnt)
    assert "sin" not in targets, "a recursive disable must keep its callees out of every graph"
    reasons = [r.break_reason for r in records.frames if r.break_reason]
    assert any("disable" in r for r in reasons), reasons


def test_disabled_function_still_works_eagerly():
    x = t(3)
    assert_same(_global_callee(x * 3), disabled_recursive(x))
    assert_same(_global_callee(x * 3), disabled_nonrecursive(x))


# ---------------------------------------------------------------- allow_in_graph

def _opaque_pure(x, y):
    return torch.sin(x) * y + 1


def uses_opaque(x, y):
    return _opaque_pure(x + 1, y) * 2


def test_allow_in_graph_makes_one_node(restore_control_sets):
    assert bytegraph.allow_in_graph(_opaque_pure) is _opaque_pure
    cnt, _ = check(uses_opaque, t(3), t(3), graphs=1, ops=3)   # add, _opaque_pure, mul (fullgraph)
    nodes = [n for n in cnt.graphs[0].graph.nodes if n.op == "call_function"]
    assert [n.target for n in nodes].count(_opaque_pure) == 1
    assert torch.sin not in [n.target for n in nodes]


def test_allow_in_graph_list_form(restore_control_sets):
    def other(x):
        return x.cos()
    assert bytegraph.allow_in_graph([_opaque_pure, other]) == [_opaque_pure, other]
    check(lambda x, y: other(_opaque_pure(x, y)), t(3), t(3), graphs=1, ops=2)


def test_explain_counts_allowed_function_as_one_op(restore_control_sets):
    bytegraph.allow_in_graph(_opaque_pure)
    out = bytegraph.explain(uses_opaque)(t(3), t(3))
    assert out.graph_count == 1 and out.op_count == 3
    assert _opaque_pure in out.ops_per_graph[0]


# ---------------------------------------------------------------- disallow_in_graph

def uses_sin(x):
    y = x + 1
    z = torch.sin(y)
    return z * 2


def test_disallow_in_graph_torch_sin_breaks(restore_control_sets, capsys):
    bytegraph.disallow_in_graph(torch.sin)
    x = t(3)
    compiled, cnt = compile_counted(uses_sin)
    for _ in range(2):
        assert_same(uses_sin(x), compiled(x))
    assert cnt.frame_count == 2
    assert torch.sin not in _targets(cnt)
    fullgraph, _ = compile_counted(uses_sin, fullgraph=True)
    with pytest.raises(bytegraph.Unsupported) as info:
        fullgraph(x)
    assert str(info.value).startswith("torch.sin is marked bytegraph.disallow_in_graph\n"), str(info.value)
    assert f'File "{__file__}", line {line_of(uses_sin, "torch.sin(")}, in uses_sin' in str(info.value)


def test_disallow_then_allow_again(restore_control_sets):
    bytegraph.disallow_in_graph(torch.sin)
    bytegraph.allow_in_graph(torch.sin)
    check(uses_sin, t(3), graphs=1)


# ---------------------------------------------------------------- graph_break

def with_graph_break(x):
    y = x.sin()
    bytegraph.graph_break()
    return y.cos() + 1


def test_graph_break_gives_two_graphs():
    cnt, _ = check(with_graph_break, t(3), graphs=2)
    assert cnt.op_count == 3
    out = bytegraph.explain(with_graph_break)(t(3))
    assert (out.graph_count, out.graph_break_count) == (2, 1)
    assert out.break_reasons[0].user_stack[-1].lineno == line_of(with_graph_break, "graph_break()")


def test_graph_break_is_a_no_op_eagerly():
    assert bytegraph.graph_break() is None


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("call", [
    lambda: bytegraph.disable(3),
    lambda: bytegraph.disable("not a function"),
    lambda: bytegraph.disable(_plain, recursive="yes"),
    lambda: bytegraph.disable(recursive=1),
    lambda: bytegraph.allow_in_graph("x"),
    lambda: bytegraph.allow_in_graph([_plain, 3]),
    lambda: bytegraph.disallow_in_graph(None),
    lambda: bytegraph.disallow_in_graph(42),
], ids=["disable_int", "disable_str", "disable_recursive_str", "disable_recursive_int",
        "allow_str", "allow_list_with_int", "disallow_none", "disallow_int"])
def test_bad_input_raises_bytegraph_error(call, restore_control_sets):
    with pytest.raises(bytegraph.BytegraphError):
        call()
