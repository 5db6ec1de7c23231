"""``__torch_function__`` subclasses and TorchFunctionModes (issue 38): operators, in-place
operators and stores on such a subclass, and modes entered inside or around the compiled
function, each compared with eager (results, classes, the functions each override is handed)."""
import pytest
import torch
import torch.nn.functional as F

import bytegraph
from bytegraph.testing import CompileCounter
from helpers import torch_compile_fullgraph_count, torch_compile_graphs
from test_subclasses import Logged, check_logged, compiled


def logged(*shape, dtype=torch.float32):
    t = torch.randn(*shape) if dtype.is_floating_point else torch.randint(1, 5, shape, dtype=dtype)
    return t.as_subclass(Logged)


def assert_same(expected, actual, what="out"):
    """Equal structure, classes and values, read without the classes' overrides (a test may
    compare the overrides' records after it)."""
    assert type(actual) is type(expected), f"{what}: {type(actual).__name__} vs eager's {type(expected).__name__}"
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(actual.as_subclass(torch.Tensor), expected.as_subclass(torch.Tensor), msg=what)
    elif isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected), what
        for i, (e, a) in enumerate(zip(expected, actual)):
            assert_same(e, a, f"{what}[{i}]")
    else:
        assert actual == expected, what


# --- operators on a __torch_function__ subclass ---------------------------------------------

def test_reflected_operators():
    def fn(x, p):
        return (2 + x, 2 - x, 2 * x, 2 / x, 2 // x, 2 % x, 2 ** x, p - x, p @ x.reshape(4, 1),
                -x, +x, abs(x), x // 3, x % 3, x ** 2)
    check_logged(fn, lambda: (logged(4), torch.randn(4)))


def test_bitwise_operators():
    def fn(x):
        return (x & 3, 3 & x, x | 8, 8 | x, x ^ 5, 5 ^ x, x << 1, 1 << x, x >> 1, 64 >> x, ~x)
    check_logged(fn, lambda: (logged(5, dtype=torch.int64),))


def test_comparisons():
    def fn(x, y):
        return x > 0, 0 < x, y <= x, x == 1, 1 != x, x >= y, y == x
    check_logged(fn, lambda: (logged(4), torch.randn(4)))


def test_inplace_operators_on_an_input():
    def fn(x, y):
        x += y
        x *= 2
        x -= 1
        x /= 3
        x **= 2
        return x, x.add_(y), x.mul_(2).sub_(y)
    check_logged(fn, lambda: (logged(4), torch.randn(4)))


def test_inplace_bitwise_and_integer_operators():
    def fn(x):
        x //= 2
        x %= 7
        x &= 6
        x |= 1
        x ^= 2
        x <<= 1
        x >>= 1
        return x
    check_logged(fn, lambda: (logged(6, dtype=torch.int64) * 5,))


def test_inplace_operator_on_a_plain_tensor_gives_the_class():
    # p += x with p plain: torch hands add_(p, x) and gives the result the class; p (the object
    # the caller holds) is still a plain tensor whose values changed.
    def fn(p, x):
        q = p
        p += x
        return type(p) is Logged, p * 2, q
    check_logged(fn, lambda: (torch.randn(3), logged(3)))


def test_special_methods_called_by_name():
    def fn(x):
        y = x.__iadd__(1)
        return y * 2, x.__imul__(3), y is x
    check_logged(fn, lambda: (logged(3),))


def test_stores_into_subscripts():
    def fn(x, p, v):
        x[0] = 5.0
        x[1:3] = v
        p[0] = x[2]
        x[x > 4] = 0.0
        return x * 2, p
    check_logged(fn, lambda: (logged(4), torch.randn(4), torch.randn(2)))


def test_operators_with_intermediates_of_the_class():
    def fn(x):
        y = torch.zeros(3)
        y += x.sin()           # a plain intermediate made the class by an in-place operator
        z = 1 - y
        z[0] = 7.0
        return z, 3 / (z + 10), type(y) is Logged
    check_logged(fn, lambda: (logged(3),))


def test_torch_compile_makes_one_graph_of_inplace_operators():
    # The reference: torch.compile traces the in-place forms in one graph (it breaks on the
    # reflected ones, which bytegraph traces: test_reflected_operators).
    def fn(x, y):
        x += y
        x[0] = 1.0
        return x.mul_(2)
    assert torch_compile_fullgraph_count(fn, logged(3), torch.randn(3)) == 1


# --- TorchFunctionModes: traced as torch.compile does -----------------------------------------

class SinIsCos(torch.overrides.TorchFunctionMode):
    """A mode that changes what a call does and records the functions it is handed."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen.append(func.__name__)
        if func is torch.sin:
            func = torch.cos
        return func(*args, **(kwargs or {}))


class Scaled(torch.overrides.TorchFunctionMode):
    """A mode whose effect depends on its own state: adds are scaled by ``self.scale``."""

    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.Tensor.add:
            out = out * self.scale
        return out


def test_mode_entered_inside():
    def fn(x):
        mode = SinIsCos()
        with mode:
            y = torch.sin(x) * 2
            z = x.sin() + y
        return y, z, torch.sin(x), mode.seen
    check_logged(fn, lambda: (torch.randn(3),))
    assert torch_compile_fullgraph_count(fn, torch.randn(3)) == 1


def test_mode_made_outside_entered_inside():
    mode = Scaled(3.0)

    def fn(x):
        with mode:
            y = x + 1
        return y, y + 1
    check_logged(fn, lambda: (torch.randn(3),))
    assert torch_compile_fullgraph_count(fn, torch.randn(3)) == 1


def test_nested_modes_entered_inside():
    def fn(x):
        outer = SinIsCos()
        with outer:
            with Scaled(2.0):
                y = torch.sin(x) + 1      # Scaled first, its calls reach SinIsCos
            z = torch.sin(y)
        return y, z, outer.seen
    check_logged(fn, lambda: (torch.randn(3),))
    assert torch_compile_fullgraph_count(fn, torch.randn(3)) == 1


def _around(make_mode, fn, make, calls=3, fullgraph=True):
    """``fn(*make())`` compiled and eager, each call under a fresh ``make_mode()`` around it:
    equal results and equal mode records (the mode sees what eager hands it, and nothing the
    guards or the graph read). The compiled function and its counter."""
    cfn, cnt = compiled(fn, fullgraph=fullgraph)
    for seed in range(calls):
        torch.manual_seed(seed)
        args = make()
        with make_mode() as eager_mode:
            expected = fn(*args)
        with make_mode() as mode:
            actual = cfn(*args)
        assert_same(expected, actual)
        assert getattr(mode, "seen", None) == getattr(eager_mode, "seen", None)
    return cfn, cnt


def test_mode_around_the_call():
    def fn(x):
        return torch.sin(x) + x.shape[0], x.dtype, F.relu(x) * 2
    _, cnt = _around(SinIsCos, fn, lambda: (torch.randn(4),))
    assert cnt.frame_count == 1
    with SinIsCos():
        assert torch_compile_fullgraph_count(fn, torch.randn(4)) == 1


def test_mode_around_the_call_reads_its_state_through_the_stack():
    # Scaled(2) then Scaled(5): the mode's scale is read from the mode on the stack at run time.
    def fn(x):
        return x + 1
    cfn, cnt = compiled(fn, fullgraph=False)
    x = torch.ones(3)
    for scale in (2.0, 2.0, 5.0):
        with Scaled(scale):
            expected, actual = fn(x), cfn(x)
        assert_same(expected, actual)
    assert cnt.frame_count == 2      # the scale is guarded


def test_mode_stack_is_guarded():
    def fn(x):
        return torch.sin(x) + 1
    cfn, cnt = compiled(fn, fullgraph=False)
    x = torch.randn(3)
    for make, graphs in [(SinIsCos, 1), (SinIsCos, 1), (lambda: Scaled(2.0), 2), (None, 3), (SinIsCos, 3)]:
        if make is None:
            expected, actual = fn(x), cfn(x)
        else:
            with make():
                expected, actual = fn(x), cfn(x)
        assert_same(expected, actual)
        assert cnt.frame_count == graphs


def test_mode_and_subclass():
    # The mode is asked first; its call reaches the class's override.
    def fn(x, y):
        return torch.sin(x) + y, x.sin()
    cfn, cnt = compiled(fn)
    for seed in range(2):
        torch.manual_seed(seed)
        x, y = logged(3), torch.randn(3)
        Logged.log.clear()
        with SinIsCos() as eager_mode:
            expected = fn(x, y)
        eager_log = list(Logged.log)
        Logged.log.clear()
        with SinIsCos() as mode:
            actual = cfn(x, y)
        assert_same(expected, actual)
        assert mode.seen == eager_mode.seen and Logged.log == eager_log
    assert cnt.frame_count == 1
    with SinIsCos():
        assert torch_compile_fullgraph_count(fn, logged(3), torch.randn(3)) == 1


@pytest.mark.parametrize("fn, reason", [
    # a higher-order operator's body: eager hands the mode checkpoint's own reads and runs the
    # recomputation without it (torch.compile's one graph computes sin there, not cos)
    (lambda x: _checkpoint_under_mode(x), "under a TorchFunctionMode"),
])
def test_modes_that_break(fn, reason, capsys):
    cfn, _ = compiled(fn)
    with pytest.raises(bytegraph.Unsupported, match=reason):
        cfn(torch.ones(3))
    cfn, _ = compiled(fn, fullgraph=False)
    x = torch.randn(3)
    assert_same(fn(x), cfn(x))
    assert torch._C._len_torch_function_stack() == 0


def _checkpoint_under_mode(x):
    mode = SinIsCos()
    with mode:
        y = torch.utils.checkpoint.checkpoint(torch.sin, x, use_reentrant=False)
    return y, mode.seen


def test_checkpoint_inside_a_mode_block_runs_at_a_break():
    # checkpoint runs natively under the mode (pushed at the break), the rest of the block and
    # after it in two graphs: eager's values and record, its reads of x.device included.
    # torch.compile makes one graph, which hands the mode `checkpoint` itself and computes the
    # body's sin as sin (eager: cos, through the mode).
    def fn(x):
        mode = SinIsCos()
        with mode:
            y = torch.sin(x) + 1
            y = torch.utils.checkpoint.checkpoint(lambda t: torch.sin(t) * 2, y, use_reentrant=False)
            y = torch.sin(y)
        return y, torch.sin(y), mode.seen
    _check_split(fn, lambda: (torch.randn(3),), graphs=2, reference_graphs=1)


def test_checkpoint_under_a_mode_around_the_call():
    def fn(x):
        y = torch.sin(x) + 1
        y = torch.utils.checkpoint.checkpoint(lambda t: torch.sin(t) * 2, y, use_reentrant=False)
        return torch.sin(y)
    _, cnt = _around(SinIsCos, fn, lambda: (torch.randn(3),), calls=2, fullgraph=False)
    assert cnt.frame_count == 2
    with SinIsCos():     # one graph, which hands the mode `checkpoint` itself (eager: its calls)
        assert torch_compile_graphs(fn, (torch.randn(3),)) == 1


def _check_split(fn, make, graphs, mode_arg=None, calls=2, raises=None, reference_graphs=None):
    """``fn`` compiled without fullgraph against eager over ``calls`` calls: equal results (or
    the same exception), the mode (``mode_arg()``, passed last, if given) handed the same calls,
    no mode left on the stack; ``graphs`` graphs, as torch.compile makes (``reference_graphs``
    where it makes another number)."""
    cfn, cnt = compiled(fn, fullgraph=False)
    for seed in range(calls):
        outcomes = []
        for run in (fn, cfn):
            torch.manual_seed(seed)
            args = make() + ((mode_arg(),) if mode_arg else ())
            if raises is None:
                out = run(*args)
            else:
                with pytest.raises(raises) as info:
                    run(*args)
                out = str(info.value)
            assert torch._C._len_torch_function_stack() == 0
            outcomes.append((out, getattr(args[-1], "seen", None) if mode_arg else None))
        (expected, eager_seen), (actual, seen) = outcomes
        assert_same(expected, actual)
        assert seen == eager_seen, (seen, eager_seen)
    assert cnt.frame_count == graphs
    reference = graphs if reference_graphs is None else reference_graphs
    assert torch_compile_graphs(fn, *[make() + ((mode_arg(),) if mode_arg else ()) for _ in range(calls)]) == reference
    return cnt


def _break_inside_mode(x):
    mode = SinIsCos()
    with mode:
        y = torch.sin(x)
        print("inside")
        y = torch.sin(y) + x.shape[0]
    return y, torch.sin(y), mode.seen


def test_graph_break_inside_a_mode_block(capsys):
    # The graph before the print under the mode, the print natively under it, the resume
    # function entering the block again under it and leaving it at the block's end: two graphs.
    _check_split(_break_inside_mode, lambda: (torch.randn(3),), graphs=2)
    # the block in a function the compiled one calls: that call runs natively, its frame split
    _check_split(lambda x: _break_inside_mode(x), lambda: (torch.randn(3),), graphs=2)
    cfn, _ = compiled(_break_inside_mode)
    with pytest.raises(bytegraph.Unsupported, match="print"):
        cfn(torch.ones(3))
    assert torch._C._len_torch_function_stack() == 0


def test_graph_break_inside_a_mode_block_under_a_device_context(capsys):
    # The frame runs eagerly (a frame compiled under the pushed mode and the device context
    # would compile under them): eager's values and record, the stack as eager leaves it.
    cfn, _ = compiled(_break_inside_mode, fullgraph=False)
    for _ in range(2):
        x = torch.randn(3)
        with torch.device("cpu"):
            expected, actual = _break_inside_mode(x), cfn(x)
            assert torch._C._len_torch_function_stack() == 1
        assert_same(expected, actual)


def test_graph_break_inside_a_mode_block_mode_made_outside(capsys):
    def fn(x, mode):
        with mode:
            y = x + 1
            print("inside")
            y = y + torch.sin(x)
        return y * 2
    _check_split(fn, lambda: (torch.randn(3),), graphs=2, mode_arg=lambda: Scaled(3.0))
    _check_split(fn, lambda: (torch.randn(3),), graphs=2, mode_arg=SinIsCos)


def test_graph_break_inside_nested_modes(capsys):
    # Two modes entered in the function, the break in the inner block; the resume function
    # leaves the inner, runs under the outer, leaves it.
    def fn(x, outer):
        with outer:
            y = torch.sin(x)
            with Scaled(2.0):
                y = torch.sin(y) + 1
                print("inside")
                y = y + torch.sin(x)
            z = torch.sin(y) + 1
        return y, z, torch.sin(z)
    _check_split(fn, lambda: (torch.randn(3),), graphs=2, mode_arg=SinIsCos)


def test_graph_break_inside_a_mode_block_under_a_mode_around_the_call(capsys):
    def fn(x):
        inner = SinIsCos()
        with inner:
            y = torch.sin(x) + 1
            print("inside")
            y = torch.sin(y) + 1
        return y + 1, torch.sin(y), inner.seen
    cfn, cnt = _around(lambda: Scaled(2.0), fn, lambda: (torch.randn(3),), calls=2, fullgraph=False)
    assert cnt.frame_count == 2
    with Scaled(2.0):
        assert torch_compile_graphs(fn, (torch.randn(3),)) == 2


def test_graph_breaks_in_a_loop_inside_a_mode_block(capsys):
    def fn(x, mode):
        with mode:
            for i in range(3):
                x = torch.sin(x) + i
                print(i)
        return torch.sin(x)
    # Four graphs, as with a `with` block of any other manager there (torch.compile: six): the
    # loop's FOR_ITER, a native step inside the block, hands over where the loop ends too, so
    # the last sin is in a graph.
    _check_split(fn, lambda: (torch.randn(3),), graphs=4, mode_arg=SinIsCos, reference_graphs=6)


def test_mode_entered_and_left_by_hand_across_a_break(capsys):
    def fn(x, mode):
        mode.__enter__()
        y = torch.sin(x)
        print("between")
        y = torch.sin(y)
        mode.__exit__(None, None, None)
        return torch.sin(y)
    _check_split(fn, lambda: (torch.randn(3),), graphs=2, mode_arg=SinIsCos)


def test_mode_entered_by_the_function_stays_after_it():
    # mode.__enter__() with no exit: eager returns with the mode on the stack, and so does the
    # compiled function (pushed after the graph); a mode around the call left by the function is
    # off the stack after it.
    def enters(x, mode):
        mode.__enter__()
        return torch.sin(x) + 1

    def leaves(x, mode):
        y = torch.sin(x)
        mode.__exit__(None, None, None)
        return y, torch.sin(y)

    cfn, cnt = compiled(enters)
    for _ in range(2):
        x = torch.randn(3)
        results = []
        for run in (enters, cfn):
            mode = SinIsCos()
            out = run(x, mode)
            assert torch._C._len_torch_function_stack() == 1 and torch._C._get_function_stack_at(0) is mode
            with mode:              # (the mode's own exit takes it off again)
                pass
            mode.__exit__(None, None, None)
            results.append((out, mode.seen))
        assert torch._C._len_torch_function_stack() == 0
        assert_same(results[0][0], results[1][0])
        assert results[0][1] == results[1][1]
    assert cnt.frame_count == 1

    cfn, cnt = compiled(leaves)
    for _ in range(2):
        x = torch.randn(3)
        results = []
        for run in (leaves, cfn):
            mode = SinIsCos()
            mode.__enter__()
            out = run(x, mode)
            assert torch._C._len_torch_function_stack() == 0
            results.append((out, mode.seen))
        assert_same(results[0][0], results[1][0])
        assert results[0][1] == results[1][1]
    assert cnt.frame_count == 1


class Loud(SinIsCos):
    """A mode whose handler breaks the graph (a print) for sin."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.sin:
            print("sin")
        return super().__torch_function__(func, types, args, kwargs)


def test_graph_break_in_the_handler_of_a_mode_entered_inside(capsys):
    # The torch.sin that the handler breaks on runs natively under the mode (its handler, the
    # print, eagerly); the rest of the block and after it in one graph (torch.compile: two).
    def fn(x, mode):
        with mode:
            y = torch.sin(x) + 1
            y = y * 2
        return y, torch.sin(y)
    _check_split(fn, lambda: (torch.randn(3),), graphs=1, mode_arg=Loud, reference_graphs=2)


def _raise_inside(x, mode):
    with mode:
        y = torch.sin(x)
        print("inside")
        if y.shape[0] == 3:
            raise ValueError(f"three: {torch.sin(y).shape}")
    return y


def _call_that_raises(x, mode):
    with mode:
        y = torch.sin(x)
        y = _native_failure(y)
    return y


def _native_failure(y):
    torch.sin(y)
    print("failing")
    raise KeyError("native")


def _raise_without_break(x, mode):
    with mode:
        y = torch.sin(x)
        if y.shape[0] == 3:
            raise ValueError("three")
    return y


@pytest.mark.parametrize("fn, error", [(_raise_inside, ValueError), (_call_that_raises, KeyError),
                                       (_raise_without_break, ValueError)])
def test_exception_inside_a_mode_block_after_a_break(fn, error, capsys):
    # The mode is left as eager leaves it (its __exit__ natively) and sees the same calls.
    cfn, _ = compiled(fn, fullgraph=False)
    for seed in range(2):
        outcomes = []
        for run in (fn, cfn):
            torch.manual_seed(seed)
            mode = SinIsCos()
            with pytest.raises(error) as info:
                run(torch.randn(3), mode)
            assert torch._C._len_torch_function_stack() == 0
            outcomes.append((str(info.value), mode.seen))
        assert outcomes[0] == outcomes[1]


class OwnEnter(SinIsCos):
    """A mode with its own __enter__/__exit__ in Python (traced)."""

    def __enter__(self):
        self.entered = getattr(self, "entered", 0) + 1
        return super().__enter__()

    def __exit__(self, *exc):
        self.seen.append("exit")
        return super().__exit__(*exc)


def test_mode_with_its_own_enter_and_exit():
    def fn(x):
        mode = OwnEnter()
        with mode as m:
            y = torch.sin(x)
        return y, torch.sin(y), mode.seen, m.entered, m is mode
    check_logged(fn, lambda: (torch.randn(3),))
    assert torch_compile_fullgraph_count(fn, torch.randn(3)) == 1


def test_mode_with_its_own_enter_and_a_break_inside(capsys):
    def fn(x, mode):
        with mode:
            y = torch.sin(x)
            print("inside")
            y = torch.sin(y)
        return y, mode.entered
    _check_split(fn, lambda: (torch.randn(3),), graphs=2, mode_arg=OwnEnter)


class PrintingEnter(SinIsCos):
    """A mode whose __enter__ breaks the graph (print): the with-statement runs natively."""

    def __enter__(self):
        print("entering")
        return super().__enter__()


def test_mode_whose_enter_breaks(capsys):
    def fn(x, mode):
        y = torch.cos(x)
        with mode:
            y = torch.sin(y)
        return y, torch.sin(y)
    cfn, _ = compiled(fn)
    with pytest.raises(bytegraph.Unsupported, match="print"):
        cfn(torch.ones(3), PrintingEnter())
    assert torch._C._len_torch_function_stack() == 0
    # cos before the with-statement, the block after it (torch.compile: the cos graph, the rest eager)
    _check_split(fn, lambda: (torch.randn(3),), graphs=2, mode_arg=PrintingEnter, reference_graphs=1)


class DepthRecording(SinIsCos):
    """A mode whose __enter__ reads the real mode stack (refused while modes are traced)."""

    def __enter__(self):
        out = super().__enter__()
        self.depth = torch._C._len_torch_function_stack()
        return out


def test_mode_whose_enter_cannot_be_traced():
    def fn(x, mode):
        y = torch.cos(x)
        with mode:
            y = torch.sin(y)
        return y, torch.sin(y), mode.depth
    cfn, _ = compiled(fn)
    with pytest.raises(bytegraph.Unsupported, match="_len_torch_function_stack"):
        cfn(torch.ones(3), DepthRecording())
    assert torch._C._len_torch_function_stack() == 0
    # The with-statement runs natively (its __enter__ pushed the mode, read the depth) at a break.
    _check_split(fn, lambda: (torch.randn(3),), graphs=2, mode_arg=DepthRecording, reference_graphs=1)


def _break_between(x):
    y = torch.sin(x) * 2
    print("between")
    return torch.sin(y) + 1


def test_mode_around_a_graph_break(capsys):
    # Two graphs, the native print between them, both traced under the mode; the mode sees what
    # eager hands it, in order.
    _, cnt = _around(SinIsCos, _break_between, lambda: (torch.randn(3),), calls=2, fullgraph=False)
    assert cnt.frame_count == 2
    with SinIsCos():
        assert torch_compile_graphs(_break_between, (torch.randn(3),)) == 2


def test_mode_around_dynamic_sizes():
    def fn(x):
        return torch.sin(x) * x.shape[0]
    cfn, cnt = compiled(fn)
    for n in (3, 4, 5, 7):
        x = torch.randn(n)
        with SinIsCos() as eager_mode:
            expected = fn(x)
        with SinIsCos() as mode:
            actual = cfn(x)
        assert_same(expected, actual)
        assert mode.seen == eager_mode.seen
    assert cnt.frame_count == 2


def test_mode_stack_read_while_traced_breaks():
    def fn(x):
        return torch.sin(x) * torch._C._len_torch_function_stack()
    cfn, _ = compiled(fn)
    with SinIsCos(), pytest.raises(bytegraph.Unsupported, match="_len_torch_function_stack"):
        cfn(torch.randn(3))
    cfn, _ = compiled(fn, fullgraph=False)
    x = torch.randn(3)
    with SinIsCos():
        expected, actual = fn(x), cfn(x)
    assert_same(expected, actual)


class Recorder(torch.overrides.TorchFunctionMode):
    """A mode that changes nothing and records the functions it is handed."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_module_training_under_a_mode(backend):
    # A module's forward under a mode around the call: its handler sees F.linear, relu, the
    # parameters' reads as eager does; the backend compiles without it; gradients equal.
    from bytegraph.backends.registry import lookup_backend
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    cnt = CompileCounter(lookup_backend(backend))
    cmodel = bytegraph.compile(model, backend=cnt, fullgraph=True)
    for step in range(2):
        x = torch.randn(3, 4)
        with Recorder() as eager_mode:
            expected = model(x).square().sum()
        eager_grads = torch.autograd.grad(expected, list(model.parameters()))
        with Recorder() as mode:
            actual = cmodel(x).square().sum()
        grads = torch.autograd.grad(actual, list(model.parameters()))
        assert_same(expected, actual)
        for e, a in zip(eager_grads, grads):
            torch.testing.assert_close(a, e)
        assert mode.seen == eager_mode.seen, (mode.seen, eager_mode.seen)
    assert cnt.frame_count == 1


class DoubledSin(torch.overrides.TorchFunctionMode):
    """A mode whose handler runs the call with torch function off (the next mode is skipped)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunction():
            out = func(*args, **(kwargs or {}))
        return out * 2 if func is torch.sin else out


class PlusHundred(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return out + 100 if func is torch.sin else out


def test_torch_function_turned_off_inside_a_handler():
    # Eager: DoubledSin's call runs with torch function off, so PlusHundred never sees sin.
    def fn(x):
        return torch.sin(x) + 1

    def make_modes():
        outer, inner = PlusHundred(), DoubledSin()
        outer.__enter__()
        inner.__enter__()
        return outer, inner

    cfn, cnt = compiled(fn)
    for _ in range(2):
        x = torch.randn(3)
        for run in (fn, cfn):
            outer, inner = make_modes()
            try:
                out = run(x)
            finally:
                inner.__exit__(None, None, None)
                outer.__exit__(None, None, None)
            if run is fn:
                expected = out
        assert_same(expected, out)
    assert cnt.frame_count == 1

    def inside(x):
        with PlusHundred(), DoubledSin():
            return torch.sin(x) + 1
    check_logged(inside, lambda: (torch.randn(3),))


class Cosine(torch.Tensor):
    """sin is cos on this class."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.sin:
            func = torch.cos
        return super().__torch_function__(func, types, args, kwargs or {})


def test_subclass_override_off_in_a_block():
    def fn(x):
        with torch._C.DisableTorchFunctionSubclass():
            plain = torch.sin(x)          # no override: sin, a plain tensor
        return plain, torch.sin(x), type(plain) is torch.Tensor
    check_logged(fn, lambda: (torch.randn(3).as_subclass(Cosine),))


def test_graph_break_inside_a_torch_function_off_block():
    def fn(x):
        with torch._C.DisableTorchFunctionSubclass():
            y = torch.sin(x)
            print("inside")
            y = torch.sin(y)
        return y
    cfn, _ = compiled(fn, fullgraph=False)
    x = torch.randn(3).as_subclass(Cosine)
    assert_same(fn(x), cfn(x))
