"""What users see when something cannot be compiled: the whole user stack, the reason, a hint.

Every test names the frames it expects (file, line computed from this file's source,
qualified function name, source text), outermost first, and checks them in
``Unsupported.user_stack``, in ``str(err)``, in ``bytegraph.explain`` output and in
the ``graph_breaks`` log.
"""
import inspect
import logging
import os
import re
import sys
import textwrap
import warnings
from dataclasses import dataclass

import pytest
import torch

import bytegraph
from bytegraph import stacks
from bytegraph.testing import CompileCounter
from helpers import assert_same, assert_traced, compile_counted

HERE = __file__


@dataclass
class Entry:
    filename: str
    lineno: int
    name: str
    text: str

    def rendered(self):
        """The traceback line of this frame and its source line (any indentation)."""
        return (re.escape(f'File "{self.filename}", line {self.lineno}, in {self.name}') + r"\n +"
                + re.escape(self.text) + r"\n")


def at(fn, marker, name=None):
    """The entry for the line of ``fn`` (a function or method) that contains ``marker``."""
    lines, first = inspect.getsourcelines(fn)
    hits = [i for i, text in enumerate(lines) if marker in text]
    assert len(hits) == 1, f"{marker!r} is on {len(hits)} lines of {fn.__qualname__}"
    return Entry(inspect.getsourcefile(fn), first + hits[0], name or fn.__qualname__,
                 lines[hits[0]].strip())


def stack_of(summaries):
    return [Entry(s.filename, s.lineno, s.name, (s.line or "").strip()) for s in summaries]


def assert_rendered(text, expected):
    """``text`` shows each expected frame, with its source line, in order."""
    pos = 0
    for e in expected:
        found = re.compile(e.rendered()).search(text + "\n", pos)
        assert found, f"frame not found in order: {e}\n--- in ---\n{text}"
        pos = found.end()


def fullgraph_error(fn, *args):
    compiled, cnt = compile_counted(fn, fullgraph=True)
    with pytest.raises(bytegraph.Unsupported) as info:
        compiled(*args)
    assert cnt.frame_count == 0
    return info.value


def check_error(err, expected, reason_part):
    assert stack_of(err.user_stack) == expected
    text = str(err)
    lines = text.splitlines()
    assert lines[0] == err.reason and reason_part in err.reason, text
    assert lines[1] == "from user code:", text
    assert lines[-1] == f"hint: {err.hint}" and err.hint, text
    assert_rendered(text, expected)
    assert "[library]" not in text


def t(*shape):
    return torch.randn(*shape)


# ---------------------------------------------------------------- three helper levels

def level3(x):
    y = x * 3
    print("level3 reached")
    return y


def level2(x):
    return level3(x + 2) - 1


def level1(x):
    return level2(x * 2) + 1


def three_deep(x):
    y = x.sin()
    return level1(y) + 1


def expected_three_deep():
    return [at(three_deep, "level1(y)"), at(level1, "level2(x * 2)"), at(level2, "level3(x + 2)"),
            at(level3, 'print("level3')]


def test_fullgraph_error_shows_every_helper_frame(capsys):
    err = fullgraph_error(three_deep, t(3))
    check_error(err, expected_three_deep(), "print")
    assert "eagerly" in err.hint
    assert capsys.readouterr().out == ""


def test_explain_shows_every_helper_frame(capsys):
    out = bytegraph.explain(three_deep)(t(3))
    assert capsys.readouterr().out == "level3 reached\n"
    expected = expected_three_deep()
    # The root breaks at its call of level1; level1, level2 and level3 are compiled when
    # called from the break and each breaks on its way down, with its own stack.
    assert [stack_of(b.user_stack) for b in out.break_reasons] == [expected[i:] for i in range(4)]
    assert all(b.graph_break and "print" in b.reason and "eagerly" in b.hint for b in out.break_reasons)
    text = str(out)
    assert_rendered(text, expected)
    assert text.count("Hint: ") == 4


def test_graph_breaks_log_carries_the_stack(caplog, capsys):
    compiled, _ = compile_counted(three_deep)
    with caplog.at_level(logging.DEBUG, logger="bytegraph.graph_breaks"):
        assert_same(three_deep(torch.ones(3)), compiled(torch.ones(3)))
    messages = [r.getMessage() for r in caplog.records if r.name == "bytegraph.graph_breaks"]
    first = next(m for m in messages if m.startswith("graph break in three_deep:"))
    assert_rendered(first, expected_three_deep())
    assert "hint: " in first


# ---------------------------------------------------------------- nn.Module forwards and methods

class Inner(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x + 1
        return x - 1


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.inner = Inner()

    def forward(self, x):
        return self.scaled(self.lin(x))

    def scaled(self, x):
        return self.inner(x * 2)


def run_model(model, x):
    return model(x) + 1


def expected_module_frames():
    return [at(Outer.forward, "self.scaled("), at(Outer.scaled, "self.inner("), at(Inner.forward, "if x.sum()")]


def test_fullgraph_error_in_submodule_forward():
    err = fullgraph_error(Outer(), t(2, 3))
    check_error(err, expected_module_frames(), "data-dependent")
    # The hint for a branch on tensor data names what to do instead.
    assert "torch.where" in err.hint and "static" in err.hint


def test_fullgraph_error_in_module_called_from_function():
    err = fullgraph_error(run_model, Outer(), t(2, 3))
    check_error(err, [at(run_model, "model(x)")] + expected_module_frames(), "data-dependent")


def test_explain_module_stack():
    out = bytegraph.explain(Outer())(t(2, 3))
    first = out.break_reasons[0]
    assert stack_of(first.user_stack) == expected_module_frames()
    assert_rendered(str(out), expected_module_frames())


# ---------------------------------------------------------------- generators

def numbers(x):
    for i in range(3):
        if x.sum() > i:
            yield x + i
        else:
            yield x - i


def consume_generator(x):
    total = x * 0
    for y in numbers(x):
        total = total + y
    return total


def test_fullgraph_error_inside_generator():
    err = fullgraph_error(consume_generator, t(3))
    check_error(err, [at(consume_generator, "for y in numbers(x)"), at(numbers, "if x.sum() > i")],
                "data-dependent")


def test_explain_inside_generator():
    out = bytegraph.explain(consume_generator)(t(3))
    assert stack_of(out.break_reasons[0].user_stack) == [at(consume_generator, "for y in numbers(x)"),
                                                         at(numbers, "if x.sum() > i")]


# ---------------------------------------------------------------- comprehensions and lambdas

def in_list_comprehension(x):
    y = x + 1
    return [print(i) or y * i for i in range(2)]


def expected_comprehension():
    line = at(in_list_comprehension, "print(i)")
    if sys.version_info >= (3, 12):
        return [line]   # PEP 709: the comprehension runs in the function's own frame
    return [line, Entry(line.filename, line.lineno, "in_list_comprehension.<locals>.<listcomp>", line.text)]


def test_fullgraph_error_inside_list_comprehension(capsys):
    err = fullgraph_error(in_list_comprehension, t(3))
    check_error(err, expected_comprehension(), "print")


def test_explain_inside_list_comprehension(capsys):
    out = bytegraph.explain(in_list_comprehension)(t(3))
    assert capsys.readouterr().out == "0\n1\n"
    assert stack_of(out.break_reasons[0].user_stack) == expected_comprehension()


def apply_twice(f, x):
    return f(f(x))


def with_lambda(x):
    return apply_twice(lambda v: v.sin() if v.sum() > 0 else v.cos(), x)


def test_fullgraph_error_inside_lambda():
    err = fullgraph_error(with_lambda, t(3))
    lam = at(with_lambda, "lambda v")
    check_error(err, [lam, at(apply_twice, "f(f(x))"),
                      Entry(lam.filename, lam.lineno, "with_lambda.<locals>.<lambda>", lam.text)],
                "data-dependent")


# ---------------------------------------------------------------- with blocks

class Noisy:
    def __init__(self, on_enter):
        self.on_enter = on_enter

    def __enter__(self):
        if self.on_enter:
            print("enter")
        return self

    def __exit__(self, *exc):
        if not self.on_enter:
            print("exit")
        return False


def with_noisy_enter(x):
    y = x + 1
    with Noisy(True):
        y = y * 2
    return y


def with_noisy_exit(x):
    y = x + 1
    with Noisy(False):
        y = y * 2
    return y


def test_fullgraph_error_inside_enter(capsys):
    err = fullgraph_error(with_noisy_enter, t(3))
    check_error(err, [at(with_noisy_enter, "with Noisy"), at(Noisy.__enter__, 'print("enter")')], "print")


def test_fullgraph_error_inside_exit(capsys):
    err = fullgraph_error(with_noisy_exit, t(3))
    check_error(err, [at(with_noisy_exit, "with Noisy"), at(Noisy.__exit__, 'print("exit")')], "print")


def test_explain_inside_enter(capsys):
    out = bytegraph.explain(with_noisy_enter)(t(3))
    assert capsys.readouterr().out == "enter\n"
    assert stack_of(out.break_reasons[0].user_stack) == [at(with_noisy_enter, "with Noisy"),
                                                         at(Noisy.__enter__, 'print("enter")')]


# ---------------------------------------------------------------- special methods

class Table:
    def __init__(self, scale):
        self.scale = scale

    def __getitem__(self, x):
        return x * float(self.scale)

    def __add__(self, other):
        return Table(self.scale + other.sum().item())


def index_table(table, x):
    return table[x] + 1


def add_to_table(table, x):
    return (table + x).scale


def test_fullgraph_error_inside_getitem():
    err = fullgraph_error(index_table, Table(torch.tensor(2.0)), t(3))
    check_error(err, [at(index_table, "table[x]"), at(Table.__getitem__, "float(self.scale)")], "float(tensor)")
    assert "x.sum() instead of x.sum().item()" in err.hint


def test_fullgraph_error_inside_add():
    err = fullgraph_error(add_to_table, Table(1.0), t(3))
    check_error(err, [at(add_to_table, "table + x"), at(Table.__add__, ".item()")], "Tensor.item()")


# ---------------------------------------------------------------- exceptions, resumes, library code

def check_positive(x):
    if x.shape[0] < 5:
        raise ValueError("need at least 5 elements")
    return x


def raises_in_helper(x):
    y = x + 1
    return check_positive(y)


def test_escaping_exception_points_at_the_raise():
    err = fullgraph_error(raises_in_helper, t(3))
    check_error(err, [at(raises_in_helper, "check_positive(y)"), at(check_positive, "raise ValueError")],
                "ValueError")
    bytegraph.reset()
    with pytest.raises(ValueError, match="at least 5"):
        bytegraph.compile(raises_in_helper)(t(3))
    assert_traced()     # raised natively from the break at the raise, as eager raises it


def two_prints(x):
    y = x + 1
    print("first")
    y = y * 2
    print("second")
    return y


def test_break_in_resume_function_names_the_user_function(capsys):
    out = bytegraph.explain(two_prints)(t(3))
    assert [stack_of(b.user_stack) for b in out.break_reasons] == [
        [at(two_prints, '"first"')], [at(two_prints, '"second"')]]


def reads_environment(x):
    return x * len(textwrap.dedent(os.environ["BYTEGRAPH_TEST_SCALE"]))


def calls_reader(x):
    return reads_environment(x + 1)


def test_library_frames_are_marked(monkeypatch):
    # Relies on textwrap.dedent's regular expression not being traced: the failure is inside
    # the standard library, below the user's two frames.
    monkeypatch.setenv("BYTEGRAPH_TEST_SCALE", "2")
    err = fullgraph_error(calls_reader, t(3))
    user = [at(calls_reader, "reads_environment(x + 1)"), at(reads_environment, "textwrap.dedent(")]
    assert stack_of(err.user_stack)[:2] == user
    library = err.user_stack[2:]
    assert library and all(stacks.is_library(s.filename) for s in library)
    assert library[0].name == "dedent"
    text = str(err)
    assert_rendered(text, user)
    assert f'File "{library[0].filename}", line {library[0].lineno}, in dedent  [library]' in text
    assert text.count("[library]") == len(library)


def test_library_runs_are_cut_to_their_ends():
    import traceback
    call_impl = torch.nn.Module._call_impl
    user = at(calls_reader, "reads_environment(x + 1)")
    torch_file = inspect.getsourcefile(call_impl)
    first_line = call_impl.__code__.co_firstlineno
    library = [traceback.FrameSummary(torch_file, first_line + i, f"f{i}") for i in range(4)]
    lines = stacks.format_stack([traceback.FrameSummary(user.filename, user.lineno, user.name)] + library)
    assert lines == [
        f'  File "{user.filename}", line {user.lineno}, in {user.name}',
        f"    {user.text}",
        f'  File "{torch_file}", line {first_line}, in f0  [library]',
        "  ... 2 more library frames ...",
        f'  File "{torch_file}", line {first_line + 3}, in f3  [library]',
        f"    {inspect.getsourcelines(call_impl)[0][3].strip()}",   # the innermost line: where it failed
    ]
    assert stacks.is_library(os.__file__) and stacks.is_library(torch_file)
    assert not stacks.is_library(HERE)


# ---------------------------------------------------------------- hints naming what failed

def opens_file(x):
    with open(os.devnull) as f:
        f.read()
    return x + 1


def test_unsupported_builtin_is_named():
    err = fullgraph_error(opens_file, t(3))
    check_error(err, [at(opens_file, "open(os.devnull)")], "builtin function open")
    assert "allow_in_graph" not in err.hint


SCALE = 3


def uses_globals(x):
    return x * globals()["SCALE"]


def uses_locals(x):
    k = 2
    y = x * 2
    return y + locals()["k"]


def uses_eval(x):
    k = 4
    return x + eval("k * SCALE")


def uses_vars_and_dir(x):
    k = 5
    return x * vars()["k"] + len(dir())


def calls_uses_locals(x):
    return uses_locals(x.cos()) * 2


@pytest.mark.parametrize("fn,builtin_name", [(uses_globals, "globals"), (uses_locals, "locals"),
                                             (uses_eval, "eval"), (uses_vars_and_dir, "vars"),
                                             (calls_uses_locals, "locals")])
def test_frame_reading_builtins_run_eagerly(fn, builtin_name):
    # They read the running frame: tracing them (or calling them from generated code) would see
    # the wrong namespace.
    x = t(3)
    compiled, _ = compile_counted(fn)
    assert_same(fn(x), compiled(x))
    assert_same(fn(x), compiled(x))
    from bytegraph.debug import records     # eager for that reason, found by the tracer
    reasons = [r.fallback_reason or "" for r in records.frames]
    assert any(r.startswith(f"builtin {builtin_name}() cannot run inside a graph") for r in reasons), reasons
    err = fullgraph_error(fn, x)
    assert err.reason.startswith(f"builtin {builtin_name}() cannot run inside a graph: it "), err.reason
    assert f"the function calling {builtin_name}() runs eagerly" in err.hint
    assert stack_of(err.user_stack)[-1] == at(fn if fn is not calls_uses_locals else uses_locals,
                                              f" {builtin_name}(")


def reads_input(x):
    return x * float(input())


def test_input_is_not_called_while_tracing():
    # Under pytest, reading stdin raises; the trace must not call input() at all.
    err = fullgraph_error(reads_input, t(3))
    check_error(err, [at(reads_input, "input()")], "builtin input() cannot run inside a graph")


def test_break_reasons_name_operators_as_users_call_them():
    # torch.ops.* operators and the functions torch keeps on _VariableFunctionsClass are named
    # the way user code reaches them, not by their Python class's internals.
    from bytegraph.debug import records

    def f(x):
        idx = torch.ops.aten.nonzero(x > 0)
        return idx.sum() + x.sum()

    x = torch.tensor([1.0, -2.0, 3.0])
    assert_same(f(x), bytegraph.compile(f, backend="eager")(x))
    reasons = [r.break_reason for r in records.frames if r.break_reason]
    assert reasons and reasons[0].startswith("torch.ops.aten.nonzero has an output whose shape depends on tensor data")

    # torch.unique_consecutive is made by a factory in torch.functional (its qualified name is
    # boolean_dispatch.<locals>.fn); BART's classification head calls it.
    def g(x):
        return torch.unique_consecutive(x).sum() + x.sum()

    x = torch.tensor([1.0, 1.0, 3.0])
    assert_same(g(x), bytegraph.compile(g, backend="eager")(x))
    reasons = [r.break_reason for r in records.frames if r.break_reason]
    assert reasons and reasons[-1].startswith("torch.unique_consecutive has an output whose shape depends on tensor data")

    # x[mask] is named by its syntax, not as operator.getitem
    def h(x):
        return x[x > 0].sum() + 1

    assert_same(h(x), bytegraph.compile(h, backend="eager")(x))
    reasons = [r.break_reason for r in records.frames if r.break_reason]
    assert reasons[-1].startswith("indexing a tensor (t[index]) has an output whose shape depends on tensor data")


@torch.library.custom_op("bytegraph_tests::concrete_sizes_only", mutates_args=())
def _concrete_sizes_only(x: torch.Tensor) -> torch.Tensor:
    return x + 1


@_concrete_sizes_only.register_fake
def _(x):
    # As a C++ kernel that reads its sizes as plain integers fails on symbolic ones.
    if any(isinstance(s, torch.SymInt) for s in x.shape):
        raise RuntimeError("SymIntArrayRef expected to contain only concrete integers\n"
                           "Exception raised from asIntArrayRefSlow at c10/core/SymIntArrayRef.h:1 (most recent "
                           "call first):\nframe #0: c10::Error::Error(...)")
    return torch.empty_like(x)


def test_an_op_without_symbolic_size_support_breaks_with_a_short_reason(caplog):
    # The break reason is the error's first line, without the C++ backtrace, with what to do.
    from bytegraph.debug import records

    def f(x):
        return torch.ops.bytegraph_tests.concrete_sizes_only(x * 2) + 1

    x = torch.randn(3, 4)
    with caplog.at_level(logging.DEBUG, logger="torch._subclasses.fake_tensor"):
        assert_same(f(x), bytegraph.compile(f, backend="eager", dynamic=True)(x))
    broken = [r for r in records.frames if r.break_reason]
    assert broken[0].break_reason == ("torch.ops.bytegraph_tests.concrete_sizes_only raised RuntimeError while "
                                      "tracing: SymIntArrayRef expected to contain only concrete integers")
    assert "dynamic=False" in broken[0].hint


def test_constant_pad_with_a_symbolic_pad_is_traced_through_its_decomposition():
    # constant_pad_nd's C++ kernel takes only concrete pads; its Python decomposition takes
    # symbolic ones (as torch.compile reaches it): one graph for every size, equal to eager.
    def f(x):
        return torch.constant_pad_nd(x, (0, x.shape[0])) + 1

    cnt = CompileCounter()
    compiled = bytegraph.compile(f, backend=cnt, dynamic=True)
    for n in (3, 5, 7):
        x = torch.randn(n, 4)
        assert_same(f(x), compiled(x))
    assert cnt.frame_count == 1


_test_log = logging.getLogger("bytegraph_tests.user_code")


def logs_and_warns(x):
    y = x + 1
    _test_log.debug("debug %d", 1)
    _test_log.log(logging.INFO, "info")
    _test_log.warning("warning %s", "w")
    return y * 2


def test_log_calls_break_at_the_users_line_only_when_a_record_is_written(caplog):
    from bytegraph.debug import records
    x = torch.ones(2)
    compiled, cnt = compile_counted(logs_and_warns)
    with caplog.at_level(logging.ERROR, logger=_test_log.name):
        # Nothing is written at ERROR: one graph, the logger's level guarded.
        assert_same(logs_and_warns(x), compiled(x))
        assert cnt.frame_count == 1 and not [r for r in records.frames if r.break_reason]
        assert not caplog.records
    with caplog.at_level(logging.INFO, logger=_test_log.name):
        caplog.clear()
        expected = logs_and_warns(x)
        # Where a record says it was written (formats show it): the user's line, as in eager.
        written = [(r.getMessage(), r.pathname, r.lineno, r.funcName) for r in caplog.records]
        caplog.clear()
        assert_same(expected, compiled(x))
        assert [(r.getMessage(), r.pathname, r.lineno, r.funcName) for r in caplog.records] == written
        assert [w[0] for w in written] == ["info", "warning w"] and written[0][3] == "logs_and_warns"
    broken = [r for r in records.frames if r.break_reason]
    assert [r.break_reason for r in broken] == ["logger.log() writes a log record, which a graph cannot",
                                                "logger.warning() writes a log record, which a graph cannot"]
    assert stack_of(broken[0].user_stack)[-1] == at(logs_and_warns, "_test_log.log(")


def warns_twice(x):
    warnings.warn("careful")
    x = x + 1
    warnings.warn("careful")
    return x


def test_warnings_warn_is_shown_after_the_graph_from_the_users_line():
    from bytegraph.debug import records

    def shown(fn):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")    # once per place: each of the two lines
            fn(torch.ones(2))
        return [(str(w.message), w.filename, w.lineno) for w in caught]

    expected = shown(warns_twice)
    lines, first = inspect.getsourcelines(warns_twice)
    assert [w[1:] for w in expected] == [(__file__, first + i) for i, text in enumerate(lines) if "careful" in text]
    compiled, cnt = compile_counted(warns_twice)
    assert shown(compiled) == expected
    reasons = [r.break_reason for r in records.frames if r.break_reason]
    assert reasons == [] and cnt.frame_count == 1   # one graph, the warnings replayed after it
