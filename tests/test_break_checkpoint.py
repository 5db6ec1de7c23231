"""A break met by the trace that compiles a frame stops it there without a second trace
(trace/machine/checkpoint.py), unless the breaking instruction changed what cannot be taken back.

Each program breaks inside a call (or at an instruction of the compiled frame) after doing
something first. Every program is compared with eager (``check_program``: result, printed
output, mutated state, inputs afterwards); its graphs and ops are compared with those of the
same compile with checkpoints off (the frame traced again to stop before the break); and the
frame is traced once where the checkpoint can be used, twice where it must not be.
"""
import pytest
import torch

import bytegraph
from bytegraph.runtime import compile_frame
from bytegraph.trace.machine import checkpoint
from helpers import check_program


def _breaks(t):
    return int(t.sum().item() > -1e9)    # a number of the tensor's data: a graph break


# --- callees: each does something, then breaks -------------------------------------------------

def fresh_work(x):
    buf = torch.zeros(3, 4)
    buf += x                 # in place on a tensor it made itself: erased with the rest
    buf[0] = 1.0
    return buf * _breaks(buf)


def append_then_break(items, x):
    items.append(x * 2)
    return x + _breaks(x)


def inplace_arg_then_break(x):
    x.add_(1)
    return x * _breaks(x)


def inplace_view_then_break(x):
    x[0].mul_(3)
    return x * _breaks(x)


def attr_then_break(obj, x):
    obj.seen = x.sum()
    return x + _breaks(x)


def next_then_break(it, x):
    first = next(it)
    return x * first + _breaks(x)


def no_grad_then_break(x):
    with torch.no_grad():
        y = x * 2
        return y + _breaks(y)


def dict_then_break(d, x):
    d["k"] = x - 1
    return x + _breaks(x)


class Box:
    pass


# --- programs: (name, fn, make, traced once) ---------------------------------------------------

def _x(seed=0):
    return torch.randn(3, 4, generator=torch.Generator().manual_seed(seed))


def p_fresh(x):
    y = x.cos()
    z = fresh_work(y)
    return z + y


def p_direct(x):
    y = x.sin()
    n = y.sum().item()     # the frame's own instruction breaks
    return y * 2, n > -1e9


def p_append(x):
    items = [x]
    y = append_then_break(items, x.cos())
    return y, items


def p_inplace_arg(x):
    y = x.cos()
    z = inplace_arg_then_break(y)
    return y, z


def p_inplace_view(x):
    y = x.cos()
    z = inplace_view_then_break(y)
    return y, z


def p_attr(x):
    obj = Box()
    obj.seen = None
    z = attr_then_break(obj, x.cos())
    return z, obj.seen


def p_next(x):
    it = iter([x.sin(), x.cos()])
    z = next_then_break(it, x)
    return z, next(it)


def p_no_grad(x):
    y = x * 3
    z = no_grad_then_break(y)
    return z + 1, torch.is_grad_enabled()


def p_dict(x):
    d = {"k": x}
    z = dict_then_break(d, x.cos())
    return z, d


def p_closure(x):
    total = x.sin()

    def bump(t):
        nonlocal total
        total = total + t
        return t + _breaks(t)

    z = bump(x.cos())
    return z, total


def p_module_list(x):
    m = STATE["module"]
    m.buf = []
    z = append_then_break(m.buf, x.cos())
    return z, list(m.buf)


STATE = {"module": torch.nn.Module()}

PROGRAMS = [
    (p_fresh, True), (p_direct, True),
    (p_append, False), (p_inplace_arg, False), (p_inplace_view, False), (p_attr, False),
    (p_next, False), (p_no_grad, True), (p_dict, False), (p_closure, False), (p_module_list, False),
]


def _make():
    x = _x()
    return (x,), {}, None


def _run(fn, use_checkpoints, monkeypatch):
    """check_program on ``fn``; (graphs, ops, traces of fn's own code with stop_before)."""
    bytegraph.reset()
    stops = []
    trace = compile_frame._Compile.trace

    def counting_trace(self, values, stop_before=None):
        if self.fn.__code__ is fn.__code__:
            stops.append(stop_before is not None)
        return trace(self, values, stop_before)

    with monkeypatch.context() as m:
        m.setattr(compile_frame._Compile, "trace", counting_trace)
        if not use_checkpoints:
            m.setattr(checkpoint, "take", lambda frame, index, seen: None)
        ops = []

        def backend(gm, example_inputs):
            ops.append(sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")))
            return gm.forward
        compiled = bytegraph.compile(fn, backend=backend)
        for i in range(2):
            args = (_x(i),)
            expected = fn(*[a.clone() for a in args])
            actual = compiled(*args)
            torch.testing.assert_close(actual, expected, check_dtype=True)
    bytegraph.reset()
    return len(ops), sum(ops), stops


@pytest.mark.parametrize("fn,once", PROGRAMS, ids=[p[0].__name__ for p in PROGRAMS])
def test_same_as_eager(fn, once):
    check_program(fn, _make, graphs=_graphs(fn))


_GRAPHS = {}


def _graphs(fn):
    if fn not in _GRAPHS:
        with pytest.MonkeyPatch.context() as m:
            _GRAPHS[fn] = _run(fn, False, m)[0]
    return _GRAPHS[fn]


@pytest.mark.parametrize("fn,once", PROGRAMS, ids=[p[0].__name__ for p in PROGRAMS])
def test_one_trace_where_nothing_to_take_back(fn, once, monkeypatch):
    graphs, ops, stops = _run(fn, True, monkeypatch)
    graphs_off, ops_off, stops_off = _run(fn, False, monkeypatch)
    assert (graphs, ops) == (graphs_off, ops_off)
    assert stops_off.count(True) == 1           # traced again to stop before the break
    assert stops.count(True) == (0 if once else 1), stops
