"""Corpus: ``with`` blocks on user context managers inside the compiled function.

Objects of user classes with ``__enter__``/``__exit__`` (made in the frame or
pre-existing), ``@contextlib.contextmanager`` functions, ``nullcontext`` and
``suppress``; normal exits and exits by exception (``__exit__`` sees it, a true
return suppresses it), nested blocks, and torch's own managers next to them.

PYTEST_DONT_REWRITE
"""
import contextlib

import torch
import torch.nn as nn

from helpers import check, check_program


def t(*shape):
    return torch.randn(*shape)


X = torch.randn(4, 3)


class Recorder:
    """Logs enter/exit into a list; optionally swallows some exception types."""

    def __init__(self, log, name="rec", swallow=()):
        self.log = log
        self.name = name
        self.swallow = swallow

    def __enter__(self):
        self.log.append(f"enter {self.name}")
        return self

    def __exit__(self, exc_type, exc, tb):
        self.log.append(f"exit {self.name} {exc_type.__name__ if exc_type else None}")
        return exc_type is not None and issubclass(exc_type, self.swallow)


class Scaler:
    def __init__(self, factor):
        self.factor = factor
        self.depth = 0

    def __enter__(self):
        self.depth += 1
        return self.factor

    def __exit__(self, *exc):
        self.depth -= 1
        return False


class Base(contextlib.AbstractContextManager):
    def __init__(self):
        self.closed = False

    def __exit__(self, *exc):
        self.closed = True
        return None


SCALER = Scaler(2.5)


@contextlib.contextmanager
def tagged(log, tag):
    log.append(f"open {tag}")
    try:
        yield tag.upper()
    finally:
        log.append(f"close {tag}")


@contextlib.contextmanager
def ignoring(log, *kinds):
    try:
        yield
    except kinds as e:
        log.append(f"ignored {type(e).__name__}")


@contextlib.contextmanager
def scaled(x, factor=2):
    yield x * factor


@contextlib.contextmanager
def never_yields():
    if False:
        yield


def test_user_manager_made_in_frame():
    def f(x):
        log = []
        with Recorder(log) as r:
            y = x * 2
            log.append(r.name)
        return y, log
    check(f, t(3))


def test_pre_existing_manager_object():
    def f(x):
        with SCALER as k:
            y = x * k
        return y
    check(f, t(3))
    assert SCALER.depth == 0


def test_exit_suppresses_exception():
    def f(x):
        log = []
        with Recorder(log, swallow=(KeyError,)):
            y = x + 1
            raise KeyError("dropped")
        return y, log
    check(f, t(3))


def test_exit_does_not_suppress():
    def f(x):
        log = []
        try:
            with Recorder(log, swallow=(KeyError,)):
                raise ValueError("kept")
        except ValueError as e:
            log.append(str(e))
        return x * 3, log
    check(f, t(3))


def test_exit_sees_exception_object():
    class Inspect:
        def __init__(self):
            self.seen = None

        def __enter__(self):
            return self

        def __exit__(self, typ, value, tb):
            self.seen = (typ.__name__, value.args)
            return True

    def f(x):
        probe = Inspect()
        with probe:
            raise IndexError("slot", 3)
        return x - 1, probe.seen
    check(f, t(3))


def test_nested_with_single_statement():
    def f(x):
        log = []
        with Recorder(log, "a") as a, Recorder(log, "b") as b:
            y = x * len(a.name + b.name)
        return y, log
    check(f, t(3))


def test_contextmanager_yields_value():
    def f(x):
        log = []
        with tagged(log, "block") as tag:
            y = x * len(tag)
            log.append(tag)
        return y, log
    check(f, t(3))


def test_contextmanager_finally_on_exception():
    def f(x):
        log = []
        try:
            with tagged(log, "t"):
                raise RuntimeError("boom")
        except RuntimeError as e:
            log.append(f"caught {e}")
        return x + 2, log
    check(f, t(3))


def test_contextmanager_swallowing():
    def f(x):
        log = []
        with ignoring(log, KeyError, IndexError):
            y = x * 2
            [][3]
        return y, log
    check(f, t(3))


def test_contextmanager_not_swallowing_other():
    def f(x):
        log = []
        try:
            with ignoring(log, KeyError):
                raise TypeError("other")
        except TypeError:
            log.append("outer")
        return x.exp(), log
    check(f, t(3))


def test_contextmanager_with_args_and_kwargs():
    def f(x):
        with scaled(x, factor=3) as y:
            z = y + 1
        return z
    check(f, t(3))


def test_contextmanager_that_never_yields():
    def f(x):
        try:
            with never_yields():
                x = x * 100
        except RuntimeError as e:
            return x + 1, str(e)
    check(f, t(3))


def test_nullcontext_enter_result():
    def f(x, use_grad):
        ctx = contextlib.nullcontext(x * 2) if use_grad else torch.no_grad()
        with ctx as v:
            return v + 1
    check(f, t(3), True)


def test_suppress_matching():
    def f(x, table):
        y = x
        with contextlib.suppress(KeyError):
            y = y * table["missing"]
        return y + 1
    check(f, t(3), {"present": 2.0})


def test_suppress_multiple_and_not_matching():
    def f(x):
        out = []
        with contextlib.suppress(IndexError, ZeroDivisionError):
            out.append(x / 1)
            out.append(1 / 0)
        try:
            with contextlib.suppress(IndexError):
                int("z")
        except ValueError:
            out.append(x * 0)
        return out
    check(f, t(3))


def test_user_manager_next_to_no_grad():
    def f(x):
        log = []
        with torch.no_grad():
            with Recorder(log):
                y = x * 2
        z = x * 3
        return y, z, log
    check(f, t(3).requires_grad_())


def test_return_inside_with_runs_exit():
    def compute(x, log):
        with Recorder(log):
            return x.sin()

    def f(x):
        log = []
        y = compute(x, log)
        log.append("after")
        return y, log
    check(f, t(3))


def test_with_in_loop_with_break_and_continue():
    def f(x):
        log = []
        for i in range(4):
            with Recorder(log, str(i)):
                if i == 1:
                    continue
                if i == 3:
                    break
                x = x + i
        return x, log
    check(f, t(3))


def test_with_in_inlined_helper():
    def helper(x, log):
        with tagged(log, "helper") as tag:
            return x * len(tag)

    def f(x):
        log = []
        return helper(x, log) + helper(x + 1, log), log
    check(f, t(3))


def test_enter_returns_tensor():
    class Normalized:
        def __init__(self, x):
            self.x = x

        def __enter__(self):
            return self.x / (self.x.norm() + 1)

        def __exit__(self, *exc):
            return False

    def f(x):
        with Normalized(x) as n:
            return n * 2
    check(f, t(4))


def test_timer_like_manager_records_sections():
    class Sections:
        def __init__(self):
            self.names = []
            self.current = None

        def section(self, name):
            self.current = name
            return self

        def __enter__(self):
            self.names.append(self.current)

        def __exit__(self, *exc):
            self.names.append("/" + self.current)

    def f(x):
        s = Sections()
        with s.section("proj"):
            x = x @ x.t()
        with s.section("act"):
            x = torch.relu(x)
        return x, s.names
    check(f, t(3, 3))


def test_escape_through_user_manager():
    log = []

    def f(x):
        with Recorder(log, "outer"):
            y = x * 2
            raise ValueError("escapes")
        return y

    def make():
        log.clear()
        return (X.clone(),), {}, lambda: list(log)
    check_program(f, make, graphs=1, fullgraph=False)


def test_nested_contextmanagers():
    def f(x):
        log = []
        with tagged(log, "a") as a:
            with tagged(log, "b") as b:
                y = x * len(a + b)
        return y, log
    check(f, t(3))


def test_abstract_context_manager_default_enter():
    def f(x):
        with Base() as b:
            y = x + 1
        return y, b.closed
    check(f, t(3))


def test_same_manager_object_twice():
    def f(x):
        s = Scaler(3.0)
        with s as a:
            x = x * a
        with s as b:
            x = x + b
        return x, s.depth
    check(f, t(3))


def test_enter_raises_caught_outside():
    class Broken:
        def __enter__(self):
            raise RuntimeError("cannot enter")

        def __exit__(self, *exc):
            return True

    def f(x):
        try:
            with Broken():
                x = x * 10
        except RuntimeError as e:
            return x + 1, str(e)
    check(f, t(3))


def test_with_inside_module_forward():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)
            self.trace = []

        def forward(self, x):
            with Recorder(self.trace, "fc"):
                return torch.tanh(self.fc(x))

    m = Block()

    def f(x):
        return m(x) * 2

    x = t(2, 3)

    def make():
        m.trace.clear()   # the list's length is guarded: same length, same graph
        return (x.clone(),), {}, lambda: list(m.trace)

    # Appending to the module's existing list is a replayed side effect: one graph.
    check_program(f, make, graphs=1)


def test_exit_mutates_tensor_in_place():
    class Accumulate:
        def __init__(self, buf):
            self.buf = buf

        def __enter__(self):
            return self.buf

        def __exit__(self, *exc):
            self.buf.mul_(0.5)
            return False

    def f(x, buf):
        with Accumulate(buf) as b:
            b.add_(x)
            y = b * 2
        return y, b + 1
    check(f, t(3), t(3))


def test_exit_raising_replaces_exception():
    class Translate:
        def __enter__(self):
            return self

        def __exit__(self, typ, value, tb):
            if typ is KeyError:
                raise LookupError("translated")
            return False

    def f(x):
        try:
            with Translate():
                {}["k"]
        except LookupError as e:
            return x * 2, type(e).__name__, str(e)
    check(f, t(3))


def test_enable_grad_inside_no_grad_with_user_manager():
    def f(x):
        log = []
        with torch.no_grad():
            a = x * 2
            with Recorder(log), torch.enable_grad():
                b = x * 3
        return a, b, log
    check(f, t(3).requires_grad_())


def test_contextmanager_used_twice():
    def f(x):
        log = []
        for tag in ("first", "second"):
            with tagged(log, tag) as name:
                x = x + len(name)
        return x, log
    check(f, t(3))


def test_exception_inside_contextmanager_body_is_replaced():
    @contextlib.contextmanager
    def converting():
        try:
            yield
        except KeyError as e:
            raise ValueError(f"bad key {e}") from e

    def f(x):
        try:
            with converting():
                {}["w"]
        except ValueError as e:
            return x + 1, str(e), type(e.__cause__).__name__
    check(f, t(3))


def test_manager_with_print_matches_eager():
    class Loud:
        def __enter__(self):
            print("enter")
            return 2

        def __exit__(self, *exc):
            print("exit")

    def f(x):
        with Loud() as k:
            y = x * k
        return y
    # print() in __enter__: the frame breaks at the with (entered natively); y = x * k is
    # traced in the resume function, which breaks again at the exit call (print).
    check_program(f, lambda: ((X.clone(),), {}, None), graphs=1, fullgraph=False)
    from bytegraph.debug import records
    assert not [r for r in records.frames if r.fallback_reason]


def test_exception_from_native_call_inside_with_reaches_exit():
    log = []

    class Logged:
        def __enter__(self):
            log.append("enter")
            return self

        def __exit__(self, typ, value, tb):
            log.append(("exit", typ.__name__ if typ else None))
            return False

    def boom(y):
        print("boom")
        raise ValueError("from a native call")

    def f(x):
        y = x * 2
        with Logged():
            y = y + 1
            boom(y)
        return y

    def make():
        log.clear()
        return (X.clone(),), {}, lambda: list(log)
    # Breaks at the call inside the with: it runs natively inside the original exception
    # table, so __exit__ sees the exception as in eager. The appends to `log` are replayed
    # side effects, so the only graph is the one before the break.
    check_program(f, make, graphs=1, fullgraph=False)


def test_manager_logging_into_enclosing_list():
    log = []

    class Traced:
        def __enter__(self):
            log.append("enter")
            return 3

        def __exit__(self, *exc):
            log.append("exit")

    def f(x):
        with Traced() as k:
            y = x * k
        return y

    def make():
        log.clear()
        return (X.clone(),), {}, lambda: list(log)
    # The enclosing list is pre-existing state: its appends run natively at breaks.
    check_program(f, make, graphs=1, fullgraph=False)


def test_contextmanager_decorating_a_nested_function():
    def f(x):
        log = []

        @contextlib.contextmanager
        def phase(name):
            log.append(f"start {name}")
            yield len(name)
            log.append(f"end {name}")

        with phase("warmup") as n:
            x = x * n
        with phase("run") as n:
            x = x + n
        return x, log
    check(f, t(3))


# --- @contextmanager as a decorator; managers that switch grad mode themselves --------------------

LOG = []


@contextlib.contextmanager
def traced_section(name):
    LOG.append(f"enter {name}")
    try:
        yield
    finally:
        LOG.append(f"exit {name}")


@traced_section("helper")
def decorated_helper(x):
    LOG.append("body")
    return x * 2


def test_contextmanager_as_decorator_on_a_module_function():
    def f(x):
        return decorated_helper(x) + 1

    def make():
        LOG.clear()
        return (X.clone(),), {}, lambda: list(LOG)
    check_program(f, make)


def test_contextmanager_as_decorator_in_the_frame():
    def f(x):
        log = []

        @contextlib.contextmanager
        def section(name):
            log.append(f"in {name}")
            yield
            log.append(f"out {name}")

        @section("a")
        def work(v):
            log.append("work")
            return v.relu()
        return work(x), work(x - 1), log, work.__name__
    check(f, t(3))


class NoGradBySetter:
    """Switches grad mode with the private switch torch's own managers use."""

    def __enter__(self):
        self.prev = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)
        return self

    def __exit__(self, *exc):
        torch._C._set_grad_enabled(self.prev)
        return False


class GradModeByPublicApi:
    def __init__(self, mode):
        self.mode = mode

    def __enter__(self):
        self.prev = torch.is_grad_enabled()
        torch.set_grad_enabled(self.mode)

    def __exit__(self, *exc):
        torch.set_grad_enabled(self.prev)


def test_class_managers_switching_grad_mode():
    def f(x):
        with NoGradBySetter():
            a = x * 2
            inside = torch.is_grad_enabled()
        with GradModeByPublicApi(False):
            b = x * 3
            with GradModeByPublicApi(True):
                c = x * 4
        return a, b, c, inside, torch.is_grad_enabled()
    check(f, t(3).requires_grad_())


def test_class_manager_switching_grad_mode_exits_on_exception():
    def f(x):
        try:
            with NoGradBySetter():
                y = x * 2
                raise ValueError("stop")
        except ValueError:
            pass
        return y, x * 3, torch.is_grad_enabled()
    check(f, t(3).requires_grad_())


def test_grad_mode_switched_at_function_level():
    def f(x):
        torch._C._set_grad_enabled(False)
        y = x * 2
        torch._C._set_grad_enabled(True)
        return y, x * 3
    check(f, t(3).requires_grad_())


def test_inference_mode_block_in_the_graph():
    # The block is torch's own enter/exit nodes in the graph (as under torch.compile): one graph.
    def f(x):
        a = x + 1
        with torch.inference_mode():
            y = a * 2
            z = y.sin()
            inside = torch.is_inference_mode_enabled()
        return z + 1, z.is_inference(), inside, torch.is_inference_mode_enabled()
    check_program(f, lambda: ((X.clone(),), {}, None), graphs=1)


def test_inference_mode_false_and_nested_inside_inference():
    def f(x):
        with torch.inference_mode(False):
            y = x * 2
        return y
    check(f, t(3))
    with torch.inference_mode():
        check(f, t(3))


def test_record_function_is_a_noop_range():
    def f(x):
        with torch.profiler.record_function("stage one"):
            y = x * 2
        with torch.autograd.profiler.record_function("stage two"):
            y = y.relu() + 1
        return y
    check(f, t(3), ops=3)


# --- graph counts next to torch.compile's (measured here, with torch._dynamo as the reference) ----

def _nested_grad_break(graph_break):
    def f(x):
        with torch.enable_grad():
            a = x * 2
            with torch.no_grad():
                b = a * 3
                graph_break()
                c = b + 1
            d = a + c
        return d
    return f


def test_break_inside_no_grad_nested_in_enable_grad_matches_torch_compile():
    import bytegraph
    import torch._dynamo
    from helpers import torch_compile_graphs
    x = t(3).requires_grad_()
    reference = torch_compile_graphs(_nested_grad_break(torch._dynamo.graph_break), (x,))
    for outer in (True, False):
        with torch.set_grad_enabled(outer):
            cnt = check(_nested_grad_break(bytegraph.graph_break), x, graphs=reference)[0]
    assert cnt.frame_count == reference == 2
