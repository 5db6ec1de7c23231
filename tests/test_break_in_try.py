"""A native step inside ``try`` that raises into its handler: once the handler ends, what follows
is compiled again (``analysis.handler_exits``, ``resume.step_code``'s exits) instead of running
natively to the end of the frame. Each test compares values, side effects and exceptions with
eager's, on calls that raise and calls that do not."""
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
    counter = CompileCounter()
    compiled = bytegraph.compile(fn, backend=counter)
    for n in (1, 0, 3, 1, 2, 5):
        x = torch.randn(4)
        expected = _run(fn, x, n)
        eager_out = capsys.readouterr().out
        got = _run(compiled, x, n)
        assert capsys.readouterr().out == eager_out, n
        assert got[1] == expected[1] and got[2] == expected[2], (n, got, expected)
        assert _same(got[0], expected[0]), (n, got[0], expected[0])


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
