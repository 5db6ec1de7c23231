"""Objects made in the frame (classes, dataclasses, namedtuples, super()), and regressions
found on HuggingFace-style code: closures around frames that break, long loops, **kwargs
edits, calls inside try blocks, torch.finfo, `n += tensor`, is_compiling()."""
import dataclasses
import functools
from typing import NamedTuple, Optional

import torch

import bytegraph
from bytegraph.testing import CompileCounter, same

from helpers import assert_traced, check


@dataclasses.dataclass
class Output:
    logits: torch.Tensor
    hidden: Optional[torch.Tensor] = None
    count: int = 0

    @property
    def doubled(self):
        return self.logits * 2


class Accumulator:
    def __init__(self, scale):
        self.scale = scale
        self.items = []

    def add(self, t):
        self.items.append(t * self.scale)
        return self


class Base:
    def __init__(self, x):
        self.x = x

    def value(self):
        return self.x + 1


class Child(Base):
    def __init__(self, x):
        super().__init__(x * 2)

    def value(self):
        return super().value() * 3


class Pair(NamedTuple):
    a: torch.Tensor
    b: int = 3


def test_dataclass_made_and_returned():
    def f(x):
        out = Output(logits=x.sin(), count=2)
        out.hidden = x.cos()
        return out, out.doubled

    cnt = CompileCounter()
    x = torch.randn(3)
    expected = f(x)
    got = bytegraph.compile(f, backend=cnt, fullgraph=True)(x)
    assert type(got[0]) is Output and got[0].count == 2
    assert same(expected[0].logits, got[0].logits) and same(expected[0].hidden, got[0].hidden)
    assert same(expected[1], got[1])
    assert cnt.frame_count == 1


def test_plain_objects_methods_and_super():
    def f(x):
        acc = Accumulator(2).add(x).add(x + 1)
        return sum(acc.items), Child(x).value(), len(acc.items)

    check(f, torch.randn(3))


def test_namedtuple_made_in_frame():
    def f(x):
        p = Pair(x * 2)
        return p, p.b + 1, p.a.sum()

    check(f, torch.randn(3))


def _decorate(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        flag = kwargs.pop("flag", False)
        kwargs["scale"] = 3
        out = fn(*args, **kwargs)
        return out * 2 if flag else out
    return wrapper


@_decorate
def _decorated(x, scale=1):
    y = x * scale
    print("inside")
    return y + 1


def test_break_under_closure_decorator_and_kwargs_edits(capsys):
    cnt = CompileCounter()
    compiled = bytegraph.compile(_decorated, backend=cnt)
    x = torch.randn(3)
    assert same(_decorated(x, flag=True), compiled(x, flag=True))
    assert capsys.readouterr().out == "inside\ninside\n"
    # The decorator's wrapper, and the decorated body before and after its print: compiled, not
    # run eagerly.
    assert cnt.frame_count == 3


def _long_loop_function():
    # A loop body long enough (over 255 code units) that FOR_ITER needs an EXTENDED_ARG
    # prefix, which the backward jump then targets.
    body = "\n".join(f"        total = total + {i % 7}\n        total = total - {i % 7}" for i in range(90))
    src = (f"def f(x, names):\n    total = x\n    for name in names:\n{body}\n"
           f"        print(name)\n        total = total * 2\n    return total + len(names)\n")
    ns = {}
    exec(compile(src, "<long loop>", "exec"), ns)
    return ns["f"]


def test_long_loop_with_break_keeps_locals_live(capsys):
    import dis
    from bytegraph.bytecode.analysis import live_locals
    f = _long_loop_function()
    ops = list(dis.get_instructions(f))
    assert any(i.opname == "EXTENDED_ARG" for i in ops)
    print_call = next(i for i in ops if i.opname == "LOAD_GLOBAL" and i.argval == "print")
    assert {"total", "names"} <= live_locals(f.__code__, print_call.offset)
    x = torch.randn(3)
    expected = f(x, ["a", "b", "c"])
    capsys.readouterr()
    got = bytegraph.compile(f, backend="eager")(x, ["a", "b", "c"])
    assert capsys.readouterr().out == "a\nb\nc\n"
    assert same(expected, got)
    assert_traced()     # broken at the print inside the loop, resumed after it


def _callee(x):
    y = x.sin()
    print("callee")
    return y.cos()


def test_call_inside_try_goes_through_the_compiler(capsys):
    def f(x, log):
        try:
            z = x + 1
            print("caller")
            w = _callee(z)
        finally:
            log.append("finally")
        return w * 2

    cnt = CompileCounter()
    log = []
    x = torch.randn(3)
    got = bytegraph.compile(f, backend=cnt)(x, log)
    assert log == ["finally"]
    assert same(f(x, []), got)
    names = [r.name for r in bytegraph.debug.records.frames]
    assert "_callee" in names   # called from the step function, still compiled


def test_finfo_and_constant_plus_equals_tensor():
    def f(x):
        n = 0
        n += (x > 0).to(torch.long) * 4
        return x.masked_fill(x < 0, torch.finfo(x.dtype).min), n

    check(f, torch.randn(5))


def test_is_compiling_is_true_inside():
    def f(x):
        if torch.compiler.is_compiling() and bytegraph.is_compiling():
            return x + 1
        return x - 1

    x = torch.randn(3)
    assert same(bytegraph.compile(f, backend="eager", fullgraph=True)(x), x + 1)
    assert not bytegraph.is_compiling()


def test_closure_made_before_a_break_is_carried_across(capsys):
    def f(x, k):
        y = x * 2
        g = lambda z: z + y * k  # noqa: E731
        print("mid")
        return g(x) + y

    cnt = CompileCounter()
    compiled = bytegraph.compile(f, backend=cnt)
    for _ in range(3):
        x = torch.randn(3)
        assert same(f(x, 3), compiled(x, 3))
    assert capsys.readouterr().out == "mid\n" * 6
    assert cnt.frame_count == 2   # before and after the break, no recompiles across calls
    assert not [r for r in bytegraph.debug.records.frames if r.fallback_reason]


def test_cell_reassigned_after_a_break_is_seen_by_the_closure(capsys):
    # The resume function runs over the same cell as `inner` (cells are not copied by value).
    def h(x):
        y = x + 1

        def inner():
            return y * 3
        print("mid")
        y = y * 2          # the closure must see this
        return inner()

    cnt = CompileCounter()
    compiled = bytegraph.compile(h, backend=cnt)
    for _ in range(2):
        x = torch.randn(3)
        assert same(h(x), compiled(x))
    assert not [r for r in bytegraph.debug.records.frames if r.fallback_reason]
    assert cnt.frame_count == 2


def test_star_args_with_keyword_only_parameters_bind_in_order(capsys):
    # The wrappers passed *args before the keyword-only values, while the guard and
    # transformed functions named them in co_varnames order (keyword-only first).
    def f(x, n=2, *rest, scale=1.0, **extra):
        y = x * scale + n + len(rest) + len(extra)
        print("break")
        return y * scale

    for args, kwargs in [((torch.ones(2), 4, "a", "b"), {"scale": 2.0, "tag": 1}),
                         ((torch.ones(2),), {}), ((torch.ones(2), 1, 5), {"scale": 3.0})]:
        assert same(f(*args, **kwargs), bytegraph.compile(f, backend="eager")(*args, **kwargs))
    assert_traced()     # broken at the print, the resume function bound as the wrappers say


def test_a_torch_function_returning_its_arguments_grouped_in_a_dict():
    # torch._C._group_tensors_by_device_and_dtype hands back the tensors it was given, grouped
    # in a dict: the compiled code returns those very tensors (a fake copy frozen into the code
    # as a constant returned fake tensors).
    def group(a, b, c):
        return torch._C._group_tensors_by_device_and_dtype([[a, b, c]], True)

    def use(a, b, c):
        out = []
        for (device, dtype), (lists, indices) in group(a, b, c).items():
            out.extend(t * 2 for t in lists[0])
            out.append(indices)
        return out

    args = torch.randn(3), torch.randn(2, dtype=torch.float64), torch.randn(4)
    check(use, *args)
    compiled = bytegraph.compile(group, fullgraph=True)(*args)
    expected = group(*args)
    assert compiled.keys() == expected.keys()
    for key in expected:
        assert compiled[key][1] == expected[key][1]
        assert all(x is y for x, y in zip(compiled[key][0][0], expected[key][0][0]))


def test_a_fake_tensor_is_never_frozen_into_compiled_code(monkeypatch):
    # The last guard in code generation: were the tracer to make a result holding fake tensors
    # a constant, the frame runs eagerly instead of returning them.
    from bytegraph.graph import builder
    from bytegraph.values.base import ConstantValue
    monkeypatch.setattr(builder, "_constant_result", lambda r, inputs=None: ConstantValue(r))

    def group(a, b):
        return torch._C._group_tensors_by_device_and_dtype([[a, b]], False)

    a, b = torch.randn(3), torch.randn(2)
    result = bytegraph.compile(group)(a, b)
    assert all(x is y for x, y in zip(next(iter(result.values()))[0][0], (a, b)))
    reasons = [r.reason for r in bytegraph.explain(group)(a, b).break_reasons]
    assert any("computed while tracing" in r for r in reasons), reasons
