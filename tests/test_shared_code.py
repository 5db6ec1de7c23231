"""One code object, many function objects; closures read after a graph break.

Every function a decorator wraps shares the decorator's inner code object, every closure
a factory makes shares the factory's inner code, and a nested function is made anew on
each call of its parent. What bytegraph caches per code object (transformed functions,
resume functions, eager fallbacks) must therefore run over the closure, defaults and
globals of the function being called *now*, never those of the first one compiled.

Each test calls eager and compiled versions several times with new values of the same
shapes and compares return values, printed output, mutated arguments and gradients.
"""
import contextlib
import functools
import io
import sys
import warnings

import pytest
import torch

import bytegraph
from bytegraph.debug import records
from helpers import CompileCounter, assert_same, assert_traced, clone_input, torch_compile_graphs


def run_calls(fn, inputs, backend="eager", grad=False, counter=None):
    """[(result, printed output, inputs afterwards, grads)] for each call, eager and compiled."""
    compiled = bytegraph.compile(fn, backend=backend if counter is None else counter)
    outs = []
    for f in (fn, compiled):
        runs = []
        for args in inputs:
            args = clone_input(args)
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                result = f(*args)
            grads = None
            if grad:
                result.sum().backward()
                grads = [a.grad for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
                grads += [p.grad for a in args if isinstance(a, torch.nn.Module) for p in a.parameters()]
                for a in args:
                    if isinstance(a, torch.nn.Module):
                        a.zero_grad(set_to_none=True)
            runs.append((result, buf.getvalue(), args, grads))
        outs.append(runs)
    return outs


# WORSE on 3.11 (correct): a comprehension runs in a frame of its own, which bytegraph runs
# natively when it breaks, so the functions it calls are not compiled (torch.compile compiles
# their frames). From 3.12 comprehensions are inlined into their function, and compile.
COMPREHENSION_FRAMES = sys.version_info < (3, 12)


def assert_same_calls(fn, inputs, backend="eager", breaks_in_comprehension=False, **kw):
    """Eager and compiled agree on every call; graphs were compiled where torch.compile makes
    any (asked only when none were)."""
    from bytegraph.backends.registry import lookup_backend
    counter = CompileCounter(None if backend == "eager" else lookup_backend(backend))
    eager, compiled = run_calls(fn, inputs, backend=backend, counter=counter, **kw)
    if counter.frame_count == 0 and not (breaks_in_comprehension and COMPREHENSION_FRAMES):
        with contextlib.redirect_stdout(io.StringIO()):
            made = torch_compile_graphs(fn, *inputs)
        assert made == 0, f"no graph compiled where torch.compile makes {made}"
    elif counter.frame_count == 0:
        assert_traced()     # 3.11: the frame broke at its comprehension, rather than running unread
    for i, (e, c) in enumerate(zip(eager, compiled)):
        assert_same(e[0], c[0], what=f"result of call {i + 1}")
        assert e[1] == c[1], f"printed output of call {i + 1}: eager {e[1]!r}, compiled {c[1]!r}"
        assert_same(e[2], c[2], what=f"inputs after call {i + 1}")
        if e[3] is not None:
            assert [g is None for g in e[3]] == [g is None for g in c[3]], f"None grads differ in call {i + 1}"
            assert_same([g for g in e[3] if g is not None], [g for g in c[3] if g is not None],
                        what=f"gradients of call {i + 1}")


def values(*shapes, calls=3, start=0.0):
    """Inputs for ``calls`` calls: same shapes, different values each call."""
    return [tuple(torch.full(s, float(start + k)) + torch.arange(torch.Size(s).numel()).reshape(s) * 0.1
                  for s in shapes) for k in range(calls)]


# --- closures read after a break inside a nested function -------------------------------

def test_nested_function_prints_closure_after_tensor_branch():
    def f(x, y, z):
        def helper(u):
            if z.sum() > 2:
                print(f"sum={y.sum().item():.4f}")
            return u
        return helper(x)

    inputs = [(torch.randn(2), torch.full((2,), float(s)), torch.ones(4)) for s in range(3)]
    counter = CompileCounter()
    eager, compiled = run_calls(f, inputs, counter=counter)
    assert [e[1] for e in eager] == ["sum=0.0000\n", "sum=2.0000\n", "sum=4.0000\n"]
    assert [c[1] for c in compiled] == [e[1] for e in eager]
    # The branch's condition, and y.sum() before .item(): the same two graphs on every call.
    assert counter.frame_count == 2


def test_nested_function_returns_closure_value_after_item_break():
    def f(x, y):
        def helper(u):
            k = u.sum().item()          # a graph break inside the nested function
            return y * k + x
        return helper(x)

    assert_same_calls(f, values((3,), (3,)))


def test_nested_function_updates_argument_in_place_after_print():
    def f(x, y):
        def bump(n):
            print("bump", n)
            y.add_(x * n)               # y is the caller's argument, read through the closure
            return y
        for n in range(2):
            bump(n)
        return y

    assert_same_calls(f, values((2, 2), (2, 2)))


def test_nested_function_with_tensor_branch_in_a_loop():
    def f(x, scale):
        def step(t):
            if (t * scale).sum() > 0:
                return t + scale
            return t - scale
        for _ in range(3):
            x = step(x)
        return x

    inputs = [(torch.randn(4), torch.tensor(float(s) - 1.0)) for s in range(4)]
    assert_same_calls(f, inputs)


# --- decorators: one wrapper code, many decorated functions --------------------------------

def traced(func):
    @functools.wraps(func)
    def wrapper(self, x):
        scale = 2
        double = lambda t: t * scale
        if x.sum() > 0:                 # a graph break in the wrapper
            x = x + 0
        return func(self, double(x))
    return wrapper


class Enc(torch.nn.Module):
    @traced
    def forward(self, x):
        return x + 1


class Dec(torch.nn.Module):
    @traced
    def forward(self, x):
        return x * 10


class EncDec(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc, self.dec = Enc(), Dec()

    def forward(self, x):
        return self.dec(self.enc(x))


def test_decorated_methods_of_different_modules():
    m = EncDec()
    x = torch.ones(3)
    counter = CompileCounter()
    assert torch.equal(bytegraph.compile(m, backend=counter)(x), m(x))
    assert counter.frame_count == 3     # split at the two wrappers' branches on x.sum()
    assert m(x).tolist() == [60.0, 60.0, 60.0]


def keep(func):
    @functools.wraps(func)
    def wrapper(t):
        k = 3
        sq = lambda u: u * k
        t.data = t.data.clone()         # bytegraph runs this frame eagerly
        return func(sq(t))
    return wrapper


@keep
def plus_one(t):
    return t + 1


@keep
def times_100(t):
    return t * 100


def test_decorated_functions_falling_back_to_eager():
    def f(t):
        return times_100(plus_one(t))

    assert_same_calls(f, values((2,)))
    assert f(torch.ones(2)).tolist() == [1200.0, 1200.0]


def logged(func):
    # No functools.wraps; *args/**kwargs passing, kwargs.pop and try/finally around the call.
    def wrapper(*args, **kwargs):
        verbose = kwargs.pop("verbose", False)
        try:
            out = func(*args, **kwargs)
            if out.sum() > 0:
                print("positive", func.__name__)
            return out
        finally:
            if verbose:
                print("done")
    return wrapper


@logged
def square(t, bias=0.0):
    return t * t + bias


@logged
def negate(t, bias=0.0):
    return -t + bias


def test_decorated_functions_with_star_args_and_print():
    def f(x):
        a = square(x, bias=1.0, verbose=True)
        b = negate(x)
        return a + b, square(b)

    assert_same_calls(f, values((3,), start=-1.0) + values((3,), start=2.0))


def repeat_calls(times):
    # A decorator factory: the wrapper's closure holds both ``func`` and ``times``.
    def deco(func):
        @functools.wraps(func)
        def wrapper(x):
            for _ in range(times):
                x = func(x)
                if x.mean().item() > 100:   # a graph break each iteration
                    x = x / 2
            return x
        return wrapper
    return deco


@repeat_calls(2)
def grow(x):
    return x * 3


@repeat_calls(3)
def shift(x):
    return x + 7


def test_decorator_factory_with_different_arguments():
    def f(x):
        return grow(x), shift(x), grow(shift(x))

    assert_same_calls(f, values((2,), start=1.0) + values((2,), start=60.0))


def test_decorated_modules_gradients_aot_eager():
    class Lin(torch.nn.Module):
        def __init__(self, scale):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)
            self.scale = scale

        @traced
        def forward(self, x):
            return torch.tanh(self.lin(x)) * self.scale

    class Other(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3))

        @traced
        def forward(self, x):
            return x * self.w

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = Lin(1.0), Other(), Lin(-2.0)

        def forward(self, x):
            return self.c(self.b(self.a(x)))

    torch.manual_seed(0)
    model = Model()
    inputs = [(model, torch.randn(2, 3, requires_grad=True)) for _ in range(3)]
    assert_same_calls(lambda m, x: m(x), inputs, backend="aot_eager", grad=True)


def test_many_modules_of_one_class_keep_their_own_cache_budget():
    # Twelve layers share one decorated forward (and one resume code): more than
    # cache_size_limit entries for one code object, but one per layer.
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        @traced
        def forward(self, x):
            return torch.relu(self.lin(x))

    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList(Block() for _ in range(12))

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return x

    torch.manual_seed(0)
    model = Stack()
    cnt = CompileCounter()
    compiled = bytegraph.compile(model, backend=cnt)
    records.clear()
    inputs = [torch.randn(2, 4) for _ in range(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")     # no "reached cache_size_limit" warning
        for x in inputs:
            assert_same(model(x), compiled(x))
    frames = cnt.frame_count
    assert frames > 12
    assert not any(r.fallback_reason for r in records.frames), [r.fallback_reason for r in records.frames]
    for x in inputs:                        # the same branches again: all from the cache
        assert_same(model(x), compiled(x))
    assert cnt.frame_count == frames, "a later call recompiled"


# --- closure factories, lambdas in loops, differing defaults --------------------------------

def scaler(n):
    def inner(t):
        if t.sum() > 0:
            print("scaling by", n)
        return t * n
    return inner


def test_closure_factory_several_closures_in_one_frame():
    def f(x):
        double, triple = scaler(2), scaler(3)
        return double(x) + triple(x), triple(double(x))

    assert_same_calls(f, values((3,), start=-2.0) + values((3,), start=1.0))


def test_closure_factory_closures_from_outside():
    fns = [scaler(k) for k in (2, 5, -1)]

    def f(x):
        return [g(x) for g in fns]

    assert_same_calls(f, values((2,), start=1.0), breaks_in_comprehension=True)


def test_lambdas_made_in_a_loop_late_binding():
    def f(x):
        fs = [lambda t: t * i + x.sum().item() for i in range(3)]   # every lambda sees the last i
        return [g(x) for g in fs]

    assert_same_calls(f, values((2,)), breaks_in_comprehension=True)


def test_lambdas_made_in_a_loop_with_default_binding():
    def f(x):
        fs = []
        for i in range(3):
            fs.append(lambda t, i=i: t * i if t.sum() > 0 else t - i)
        return [g(x) for g in fs]

    assert_same_calls(f, values((2,), start=-1.0) + values((2,), start=1.0), breaks_in_comprehension=True)


def make_adder(k):
    def add(t, k=k):              # same code, a different default per function
        print("adding", k)
        return t + k
    return add


def test_functions_with_differing_defaults_share_code():
    adders = [make_adder(k) for k in (1, 10, 100)]

    def f(x):
        return [a(x) for a in adders] + [adders[1](x, 0)]

    assert_same_calls(f, values((2,)))


def test_compiled_functions_sharing_code_called_directly():
    # Each closure compiled on its own, called in turns: entries for one code object.
    fns = [scaler(k) for k in (2, 3, 4)]
    compiled = [bytegraph.compile(g, backend="eager") for g in fns]
    for x in (torch.ones(2), -torch.ones(2), torch.arange(2.0)):
        for g, cg in zip(fns, compiled):
            buf_e, buf_c = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(buf_e):
                expected = g(x)
            with contextlib.redirect_stdout(buf_c):
                actual = cg(x)
            assert_same(expected, actual)
            assert buf_e.getvalue() == buf_c.getvalue()
    assert_traced()     # each closure traced to its branch on the tensor


def test_same_code_different_globals():
    src = "def f(x):\n    if x.sum() > 0:\n        x = x + 1\n    return x * K\n"
    code = compile(src, "<shared>", "exec").co_consts[0]
    import types
    f1 = types.FunctionType(code, {"K": 2, "__builtins__": __builtins__})
    f2 = types.FunctionType(code, {"K": 5, "__builtins__": __builtins__})

    def g(x):
        return f1(x), f2(x)

    assert_same_calls(g, values((2,)))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_closure_over_parameters_gradients(backend):
    def f(x, w):
        def act(t):
            if t.mean() > 0:
                return torch.relu(t * w)
            return torch.sigmoid(t) * w
        return act(x) + act(-x)

    inputs = [(torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)) for _ in range(3)]
    assert_same_calls(f, inputs, backend=backend, grad=True)
