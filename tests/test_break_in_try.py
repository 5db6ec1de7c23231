"""A native step inside ``try`` that raises into its handler: once the handler ends, what follows
is compiled again (``analysis.handler_exits``, ``resume.step_code``'s exits) instead of running
natively to the end of the frame. Each test compares values, side effects and exceptions with
eager's, on calls that raise and calls that do not."""
import sys

import pytest
import torch

import bytegraph
from bytegraph.testing import CompileCounter

LOG = []


def loud_check(v):
    """A native step (print cannot be put in a graph) that raises for odd values."""
    print("checking", v)
    if v % 2:
        raise ValueError(f"odd {v}")
    return v


def in_a_loop(x, n):
    acc = []
    for i in range(2):
        try:
            acc.append(loud_check(i + n))
        except ValueError as e:
            acc.append(str(e))
    y = x.sin() + 1
    return (y * len(acc)).cos(), acc


def straight(x, n):
    try:
        loud_check(n)
        scale = 2.0
    except ValueError:
        LOG.append("handled")
        scale = 3.0
    return (x * scale).exp().sum()


def deletes_what_is_read_after(x, n):
    y = x + 1
    try:
        loud_check(n)
    except ValueError:
        del y
    return y * 2


def binds_in_the_handler(x, n):
    try:
        loud_check(n)
        msg = "even"
    except ValueError as e:
        msg = str(e)
    return x * len(msg)


def nested(x, n):
    try:
        try:
            loud_check(n)
        except ValueError:
            LOG.append("inner")
            raise KeyError("again")
        y = x + 1
    except KeyError:
        LOG.append("outer")
        y = x - 1
    return y.relu()


def raises_after_the_handler(x, n):
    try:
        try:
            loud_check(n)
        except ValueError:
            LOG.append("inner")
        y = x + 1
        if n > 2:
            raise KeyError("big")
    except KeyError:
        LOG.append("outer")
        y = x - 1
    return y * 3


def returns_from_the_handler(x, n):
    try:
        loud_check(n)
    except ValueError:
        return x.neg()
    return x.abs() + 1


def reraises(x, n):
    try:
        loud_check(n)
    except ValueError:
        LOG.append("seen")
        raise
    return x + 1


def _run(fn, x, n):
    LOG.clear()
    try:
        out = fn(x, n)
        exc = None
    except Exception as e:     # noqa: BLE001 - compared with eager's
        out, exc = None, type(e)
    return out, exc, list(LOG)


def _same(a, b):
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return torch.allclose(a, b)
    return a == b


@pytest.mark.parametrize("fn", [in_a_loop, straight, deletes_what_is_read_after, binds_in_the_handler, nested,
                                raises_after_the_handler, returns_from_the_handler, reraises])
def test_what_follows_a_handler_a_native_step_raised_into_equals_eager(fn, capsys):
    _check_against_eager(fn, capsys)


def _check_against_eager(fn, capsys):
    """``fn`` compiled against eager on values, exception, log and printed output, over calls
    that raise and calls that do not; nothing is left handled (``sys.exc_info()``) after each."""
    compiled = bytegraph.compile(fn, backend=CompileCounter())
    for n in (1, 0, 3, 1, 2, 5):
        x = torch.randn(4)
        expected = _run(fn, x, n)
        eager_out = capsys.readouterr().out
        got = _run(compiled, x, n)
        assert capsys.readouterr().out == eager_out, n
        assert got[1] == expected[1] and got[2] == expected[2], (n, got, expected)
        assert _same(got[0], expected[0]), (n, got[0], expected[0])
        assert sys.exc_info() == (None, None, None)


@pytest.mark.parametrize("fn, ops", [(in_a_loop, 4), (straight, 2), (raises_after_the_handler, 2)])
def test_the_work_after_the_handler_is_in_a_graph(fn, ops):
    """The first call raises into the handler; the tensor work after it runs in a graph."""
    counter = CompileCounter()
    bytegraph.compile(fn, backend=counter)(torch.randn(4), 1)
    assert counter.frame_count >= 1
    assert counter.op_count >= ops


def test_a_local_deleted_in_the_handler_is_not_handed_over():
    """A local read after the handler but deleted in it: the rest runs natively and raises as
    eager does, no graph after the handler."""
    counter = CompileCounter()
    with pytest.raises(UnboundLocalError):
        bytegraph.compile(deletes_what_is_read_after, backend=counter)(torch.randn(4), 1)


# --- a break inside a handler, the exception raised in the trace ----------------------------------
# The code after the break enters the handler again with the exception it handles
# (``bytecode.resume.HANDLED_PREFIX``): what it reads of ``sys.exc_info()``, a bare ``raise``, the
# context of an exception raised there, and the state once the handler ends are eager's.

def breaks_in_the_handler(x, n):
    y = x * 2
    try:
        if n % 2:
            raise ValueError(f"odd {n}")
        y = y + 1
    except ValueError as e:
        print("handling", e)              # the break
        LOG.append((str(e), sys.exc_info()[0].__name__))
        y = y.sin() + 1                   # in the graph after the break
    LOG.append(sys.exc_info())            # nothing handled any more
    return y.exp()


def breaks_in_a_finally_with_an_exception_pending(x, n):
    y = x * 2
    try:
        try:
            if n % 2:
                raise KeyError(n)
        finally:
            print("finally")              # the break, with the KeyError on its way out
            y = y.cos()
    except KeyError as e:
        LOG.append(("caught", e.args))
    return y + 1, sys.exc_info()[0]


def breaks_in_nested_handlers(x, n):
    y = x + 1
    try:
        raise ValueError("outer")
    except ValueError:
        try:
            if n > 2:
                raise KeyError("inner")
        except KeyError:
            print("inner handler")        # the break, two handlers deep
            LOG.append(sys.exc_info()[1].args)
            y = y * 3
        LOG.append(sys.exc_info()[1].args)   # the outer one again
    return y.tanh(), sys.exc_info()[0]


def reraises_after_a_break(x, n):
    y = x * 2
    try:
        if n % 2:
            raise ValueError(f"odd {n}")
    except ValueError:
        print("about to re-raise")        # the break
        LOG.append("seen")
        raise
    return y + 1


def chains_after_a_break(x, n):
    try:
        raise ValueError(f"first {n}")
    except ValueError:
        print("chaining")                 # the break
        if n > 1:
            raise KeyError("second")
    return x + 1


def _chained(fn, x, n):
    try:
        return fn(x, n), None
    except KeyError as e:
        return None, (type(e.__context__), e.__context__.args)


@pytest.mark.parametrize("fn", [breaks_in_the_handler, breaks_in_a_finally_with_an_exception_pending,
                                breaks_in_nested_handlers, reraises_after_a_break])
def test_a_break_inside_a_handler_equals_eager(fn, capsys):
    _check_against_eager(fn, capsys)


def test_the_context_of_an_exception_raised_in_a_handler_after_a_break_is_the_handled_one():
    compiled = bytegraph.compile(chains_after_a_break, backend="eager")
    for n in (0, 2, 3):
        x = torch.randn(3)
        got, want = _chained(compiled, x, n), _chained(chains_after_a_break, x, n)
        assert got[1] == want[1], n
        if want[0] is not None:
            assert torch.equal(got[0], want[0])


def finally_with_a_pending_exception_in_a_resumed_frame(x, y, log):
    x = x * 2
    try:
        if y.min() < -0.5:        # data-dependent: the code after it is a resume function
            raise RuntimeError("data")
        x = x + 1
    except RuntimeError as e:
        log.append(type(e).__name__)
        log.append(sum(log))      # a TypeError on its way out, through the finally
    finally:
        print("finally")          # a break inside the finally, the TypeError pending
        x = x.sin()
    return x


def test_a_break_in_a_finally_left_by_an_exception_is_resumed_not_run_eagerly_whole(capsys):
    from bytegraph.debug import records
    compiled = bytegraph.compile(finally_with_a_pending_exception_in_a_resumed_frame, backend="eager")
    for y in (-torch.ones(3), torch.ones(3), -torch.ones(3)):
        records.clear()
        x = torch.randn(3)
        runs = []
        for fn in (finally_with_a_pending_exception_in_a_resumed_frame, compiled):
            log = []
            try:
                out, exc = fn(x, y, log), None
            except TypeError as e:
                out, exc = None, (type(e), type(e.__context__))
            runs.append((out, exc, log, capsys.readouterr().out))
        assert runs[1][1:] == runs[0][1:]
        assert _same(runs[1][0], runs[0][0])
        assert sys.exc_info() == (None, None, None)
        fallbacks = [(r.name, r.fallback_reason) for r in records.frames if r.fallback_reason]
        assert not fallbacks, fallbacks


def handles_a_native_raise_with_a_break(x, n):
    y = x * 2
    try:
        loud_check(n)                     # a native step; raises for odd n
    except ValueError as e:
        print("handling", e)              # a break inside the handler
        LOG.append(sys.exc_info()[1].args)
        y = y.sin() + 1
    return y.exp(), sys.exc_info()[0]


def test_a_handler_a_native_step_raises_into_is_compiled_and_equals_eager(capsys):
    """The step hands over as the handler starts (``breaks._handler_entries``): the handler is
    traced with the real exception, its break resumes inside it, and its tensor work is in a
    graph."""
    from bytegraph.debug import records
    _check_against_eager(handles_a_native_raise_with_a_break, capsys)
    records.clear()
    bytegraph.compile(handles_a_native_raise_with_a_break, backend=CompileCounter())(torch.randn(4), 1)
    assert not [r.fallback_reason for r in records.frames if r.fallback_reason]
    targets = [str(node.target) for r in records.frames if r.graph is not None for node in r.graph.graph.nodes]
    assert "sin" in targets, targets


def branches_on_data_inside_try(x, n):
    try:
        if x.sum() > 0:                   # data-dependent: a native step inside try
            x = x + n
        x = x * 2
    except ValueError:
        x = x - 1
    return x.sin() + 1


def loops_with_a_break_inside_try(x, n):
    try:
        for i, v in zip(range(3), [n, n + 1, n + 2, n + 3]):
            print("step", i)              # the resume gets a real zip: FOR_ITER is a native step
            x = x + v
        x = x * 2
    except IndexError:
        x = x - 1
    return x.cos() * 3


@pytest.mark.parametrize("fn", [branches_on_data_inside_try, loops_with_a_break_inside_try])
def test_a_native_branch_or_loop_step_inside_try_hands_over_on_both_sides(fn, capsys):
    """A branch or FOR_ITER run natively inside ``try`` (a generic step) hands over at its jump
    target too (``resume.step_code``'s jump): the other side of the branch, and the code after
    the exhausted loop, are compiled instead of running natively to the end of the frame."""
    from bytegraph.debug import records
    _check_against_eager(fn, capsys)
    for x in (torch.ones(4), -torch.ones(4)):     # both sides of the branch
        records.clear()
        bytegraph.compile(fn, backend=CompileCounter())(x, 1)
        targets = [str(node.target) for r in records.frames if r.graph is not None for node in r.graph.graph.nodes]
        assert "sin" in targets or "cos" in targets, targets


def spells_a_native_exception(x, n):
    try:
        loud_check(n)
        msg = "fine"
    except ValueError as e:               # a real exception, raised by the native step
        msg = str(e) + "|" + repr(e)
    try:
        {}[f"k{n}"] if n > 2 else loud_check(n)
    except (KeyError, ValueError) as e:
        msg += str(e) + repr(e)
    return x * len(msg), msg


def test_str_and_repr_of_an_exception_a_native_step_raised_are_traced(capsys):
    """str()/repr() of an exception from outside the trace, of a class whose text is made from
    its args (ValueError, KeyError): answered in the trace, its class and args guarded."""
    from bytegraph.debug import records
    _check_against_eager(spells_a_native_exception, capsys)
    records.clear()
    bytegraph.compile(spells_a_native_exception, backend=CompileCounter())(torch.randn(4), 3)
    reasons = [str(r.break_reason) for r in records.frames if r.break_reason]
    assert not [r for r in reasons if r.startswith(("str()", "repr()"))], reasons


def asks_what_is_handled(x, n):
    out = []
    try:
        loud_check(n)
    except ValueError:
        e = sys.exception()
        kind, value, tb = sys.exc_info()
        out += [str(e), kind.__name__, value is e, tb is not None, tb.tb_lineno > 0]
        x = x + 1
    try:
        raise KeyError("made in the trace")
    except KeyError:
        out.append(repr(sys.exception()))
        x = x * 2
    try:
        {}[n] if n > 2 else loud_check(n + 1)
    except:                               # noqa: E722 - no class matched: exc_info's is guarded
        out.append(sys.exc_info()[0].__name__)
    return x.sin(), out


def test_sys_exception_and_exc_info_inside_a_handler_are_traced(capsys):
    """sys.exception() answers the exception the trace handles (made in the trace or from a
    native step); sys.exc_info() too for one from outside (its traceback read from it)."""
    from bytegraph.debug import records
    _check_against_eager(asks_what_is_handled, capsys)
    records.clear()
    bytegraph.compile(asks_what_is_handled, backend=CompileCounter())(torch.randn(4), 1)
    reasons = [str(r.break_reason) for r in records.frames if r.break_reason]
    assert not [r for r in reasons if "sys." in r], reasons
