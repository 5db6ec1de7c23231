"""Code the core tracer may not capture must still run correctly (eager fallback, never a
crash or a wrong result); with ``fullgraph=True`` it must raise ``bytegraph.Unsupported``
naming the user's file and line."""
import inspect
import re

import os

import pytest
import torch

import bytegraph
from bytegraph.testing import same
from helpers import assert_same, clone_input, compile_counted, fresh_input


def t(*shape):
    return torch.randn(*shape)


def marked_line(fn, marker="# <-- unsupported"):
    """Absolute line number of the line of ``fn``'s source carrying ``marker``."""
    lines, start = inspect.getsourcelines(fn)
    hits = [start + i for i, line in enumerate(lines) if marker in line]
    assert len(hits) == 1
    return hits[0]


# ---------------------------------------------------------------- the functions

def prints(x):
    y = x * 2
    print("doubled:", tuple(y.shape), y.dtype)  # <-- unsupported
    return y + 1


def branches_on_tensor_value(x):
    y = x + 1
    if y.sum() > 0:  # <-- unsupported
        return y * 2
    return y - 100


def uses_item(x):
    s = x.abs().sum().item()  # <-- unsupported
    return x / s, s


def mutates_input_list(xs, x):
    xs.append(x * 2)
    return x + len(xs)


def asks_the_os(xs, x):
    one = os.getpid() % 1 + 1  # <-- unsupported
    return x + xs[0] * one


def _helper_that_prints(y):
    print("inside helper")  # <-- unsupported
    return y * 3


def calls_printing_helper(x):
    return _helper_that_prints(x + 1) - 1


# name -> (function, arguments, graphs): the graphs are the tensor code before and after the
# unsupported line (none before it in asks_the_os; in calls_printing_helper the caller's code
# before the call, the helper's after its print and the caller's after the call); torch.compile
# makes as many.
CASES = {
    "print": (prints, lambda: (t(3),), 2),
    "tensor_branch_pos": (branches_on_tensor_value, lambda: (torch.ones(3),), 2),
    "tensor_branch_neg": (branches_on_tensor_value, lambda: (-torch.ones(3) * 5,), 2),
    "item": (uses_item, lambda: (t(4),), 2),
    "os_getpid": (asks_the_os, lambda: ([3, -1, 2], t(2)), 1),
    "nested_print": (calls_printing_helper, lambda: (t(3),), 3),
}


# ---------------------------------------------------------------- correct results

@pytest.mark.parametrize("name", sorted(CASES))
def test_fallback_gives_eager_results(name, capsys):
    fn, make_args, graphs = CASES[name]
    compiled, cnt = compile_counted(fn)
    # First call, then the cached path with other values (fresh_input: signs kept, so the same
    # branches), eager re-run on them.
    first = make_args()
    for args in (first, fresh_input(first)):
        capsys.readouterr()
        eager_args = clone_input(args)
        expected = fn(*eager_args)
        expected_out = capsys.readouterr().out
        comp_args = clone_input(args)
        actual = compiled(*comp_args)
        assert_same(expected, actual)
        assert_same(eager_args, comp_args, what="inputs after the call")
        assert capsys.readouterr().out == expected_out, "printed output must appear exactly once per call"
    # the code around the unsupported line is still compiled, once (the second call hits), except
    # that item()'s float, another on the second call, makes the resume function compile once
    # more with it as an input (automatic dynamic, docs/dynamic-shapes.md)
    assert cnt.frame_count == graphs + (name == "item")


def test_branch_on_tensor_value_takes_the_right_branch_each_call():
    compiled, cnt = compile_counted(branches_on_tensor_value)
    pos, neg = torch.ones(3), -torch.ones(3) * 5
    for x in (pos, neg, pos, neg):
        assert_same(branches_on_tensor_value(x), compiled(x))
    assert cnt.frame_count == 3    # the code before the branch, then each branch once (as torch.compile)


def test_item_value_changes_are_respected():
    compiled, cnt = compile_counted(uses_item)
    for scale in (1.0, 2.0, 3.0):
        x = torch.ones(4) * scale
        assert_same(uses_item(x), compiled(x))
    # the code before .item(); after it, s as a constant, then (another value) as a symbol: as torch.compile
    assert cnt.frame_count == 3


def test_list_mutation_repeated():
    compiled, cnt = compile_counted(mutates_input_list)
    xs_e, xs_c = [], []
    for i in range(3):
        x = torch.full((2,), float(i))
        assert_same(mutates_input_list(xs_e, x), compiled(xs_c, x))
    assert_same(xs_e, xs_c)
    assert len(xs_c) == 3
    assert cnt.frame_count == 3    # len(xs) is guarded: one graph per length (as torch.compile)


def test_print_of_python_values_inside_fallback(capsys):
    def f(x, n):
        print("n =", n)  # <-- unsupported
        return x * n

    compiled, cnt = compile_counted(f)
    x = t(2)
    assert_same(x * 3, compiled(x, 3))
    assert capsys.readouterr().out == "n = 3\n"
    assert cnt.frame_count == 1    # x * n after the print


# ---------------------------------------------------------------- fullgraph=True raises

@pytest.mark.parametrize("name", sorted(CASES))
def test_fullgraph_raises_unsupported_with_user_location(name):
    fn, make_args, _ = CASES[name]
    compiled, cnt = compile_counted(fn, fullgraph=True)
    with pytest.raises(bytegraph.Unsupported) as info:
        compiled(*make_args())
    err = info.value
    assert isinstance(err, bytegraph.BytegraphError)
    message = str(err)
    assert "test_fallback.py" in message, message
    target = fn if fn is not calls_printing_helper else _helper_that_prints
    line = marked_line(target)
    assert re.search(rf"\b{line}\b", message), f"expected line {line} in: {message}"
    assert cnt.frame_count == 0


def test_fullgraph_error_does_not_poison_later_calls():
    compiled, cnt = compile_counted(branches_on_tensor_value, fullgraph=True)
    with pytest.raises(bytegraph.Unsupported):
        compiled(t(3))
    with pytest.raises(bytegraph.Unsupported):
        compiled(t(3))
    # a non-fullgraph compile of the same function still works
    relaxed, relaxed_cnt = compile_counted(branches_on_tensor_value)
    x = t(3)
    assert_same(branches_on_tensor_value(x), relaxed(x))
    assert relaxed_cnt.frame_count == 2    # the code before the branch and the branch taken


def test_unsupported_is_a_bytegraph_error():
    assert issubclass(bytegraph.Unsupported, bytegraph.BytegraphError)


def test_function_reading_its_locals_after_a_break_runs_eagerly_whole():
    # A resume function has only the live locals (and parameters of its own): locals() after a
    # break would miss `x` (KeyError). A frame that reads its own locals is not split.
    def f(x):
        y = x.nonzero().sum()          # a data-dependent size: a break
        return y + locals()["x"].sum()

    def g(x, k=2):
        print("break")
        z = x * k
        return sorted(vars()), z

    for fn in (f, g):
        x = torch.ones(3)
        assert same(fn(x), bytegraph.compile(fn, backend="eager")(x))
    reasons = [r.fallback_reason for r in bytegraph.debug.records.frames if r.fallback_reason]
    assert any("reads its own locals (locals() at line" in r for r in reasons)
    assert any("reads its own locals (vars() at line" in r for r in reasons)
