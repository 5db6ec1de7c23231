"""Graph breaks: bytegraph.explain vs torch._dynamo.explain on small functions.

    python bench/breaks_vs_dynamo.py

For each case prints graphs, graph breaks and ops (call_function nodes) as
``bytegraph / dynamo``, and whether the compiled function (backend "eager",
called twice on fresh inputs) returned and printed exactly what eager did.
Everything the cases print, and every warning, is swallowed: the table is the
only output.
"""
import contextlib
import io
import logging
import os
import sys
import warnings

import torch
import torch._dynamo

import bytegraph
from bytegraph.testing import same

bytegraph.config.persistent_cache = False   # measure compiles, not loads from an earlier run's cache

# The engine under test provides these two (see _use_engine): a graph break and
# a disabled helper. bytegraph.graph_break is an empty Python function that
# Dynamo would trace straight through, and vice versa.
GRAPH_BREAK = None
DISABLED_DOUBLE = None


def _double(v):
    return v * 2


def _use_engine(name):
    global GRAPH_BREAK, DISABLED_DOUBLE
    if name == "bytegraph":
        GRAPH_BREAK, DISABLED_DOUBLE = bytegraph.graph_break, bytegraph.disable(_double)
    elif name == "dynamo":
        GRAPH_BREAK, DISABLED_DOUBLE = torch._dynamo.graph_break, torch._dynamo.disable(_double)
    else:
        GRAPH_BREAK, DISABLED_DOUBLE = (lambda: None), _double


# ---------------------------------------------------------------- the cases

def toy_example(a, b):
    x = a / (torch.abs(a) + 1)
    print("woo")
    if b.sum() < 0:
        b = b * -1
    return x * b


def print_mid(x):
    y = x.sin() + 1
    print("mid")
    return y.cos() * 2


def item_use(x):
    s = x.sum().item()
    return x * s + 1


def data_dependent_if(x):
    y = x * 2
    if y.sum() > 0:
        return y + 1
    return y - 1


def while_tensor_cond(x):
    while x.sum() > 0:
        x = x - 1
    return x


def for_loop_print(x):
    for i in range(5):
        x = x * 1.5 + 1
        print("iteration", i)
    return x


def with_no_grad_break(x):
    with torch.no_grad():
        y = x * 2
        print("inside no_grad")
        z = y + 1
    return z, x * 3


def try_except_break(x):
    try:
        y = x * 2
        print("in try")
        raise KeyError("after the break")
    except KeyError:
        return y + 1


def _level2(y):
    z = y * 3
    print("level 2")
    return z + 1


def _level1(y):
    return _level2(y.sin()) * 2


def nested_inlined_break(x):
    return _level1(x + 1).exp()


def explicit_graph_break(x):
    y = x.sin()
    GRAPH_BREAK()
    return y.cos() + 1


def disabled_call(x):
    y = x + 1
    z = DISABLED_DOUBLE(y)
    return z * 3


def four_prints(x):
    x = x + 1
    print("p1")
    x = x * 2
    print("p2")
    x = x - 3
    print("p3")
    x = x.sin()
    print("p4")
    return x.abs()


def _gen(x):
    y = x * 2
    print("generator body")
    yield y
    yield y + 1


def generator_with_break(x):
    return list(_gen(x))


def try_in_loop_break(x):
    for i in range(3):
        try:
            x = x * 2
            print("iteration", i)
        except ValueError:
            pass
    return x


def _t(*shape):
    return torch.randn(*shape)


CASES = [
    ("toy_example (b.sum<0)", toy_example, lambda: (_t(10), -torch.rand(10))),
    ("print", print_mid, lambda: (_t(4),)),
    (".item()", item_use, lambda: (_t(4),)),
    ("data-dependent if", data_dependent_if, lambda: (_t(4),)),
    ("while tensor cond", while_tensor_cond, lambda: (torch.full((3,), 4.0),)),
    ("for loop + print", for_loop_print, lambda: (_t(4),)),
    ("with no_grad + print", with_no_grad_break, lambda: (_t(4).requires_grad_(),)),
    ("try/except + print", try_except_break, lambda: (_t(4),)),
    ("nested inlined print", nested_inlined_break, lambda: (_t(4),)),
    ("graph_break()", explicit_graph_break, lambda: (_t(4),)),
    ("disable'd call", disabled_call, lambda: (_t(4),)),
    ("4 prints", four_prints, lambda: (_t(4),)),
    ("generator + print", generator_with_break, lambda: (_t(4),)),
    ("try in loop + print", try_in_loop_break, lambda: (_t(4),)),
]


# ---------------------------------------------------------------- running

def _clone(args):
    return tuple(a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                 for a in args)


def _call(fn, args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            result = fn(*args)
        except Exception as exc:  # noqa: BLE001
            result = ("raised", type(exc).__name__, str(exc))
    return result, out.getvalue()


def _explain(engine, fn, args):
    """(graphs, breaks, ops) or None when explain itself failed."""
    _use_engine(engine)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            if engine == "bytegraph":
                bytegraph.reset()
                out = bytegraph.explain(fn)(*_clone(args))
            else:
                torch._dynamo.reset()
                out = torch._dynamo.explain(fn)(*_clone(args))
        return out.graph_count, out.graph_break_count, out.op_count
    except Exception:  # noqa: BLE001
        return None
    finally:
        bytegraph.reset()
        torch._dynamo.reset()


def _matches(engine, fn, args):
    """'yes' when two compiled calls return and print what eager does, else 'NO' / 'ERR'."""
    _use_engine("eager")
    expected = _call(fn, _clone(args))
    _use_engine(engine)
    try:
        if engine == "bytegraph":
            bytegraph.reset()
            compiled = bytegraph.compile(fn, backend="eager")
        else:
            torch._dynamo.reset()
            compiled = torch.compile(fn, backend="eager")
        ok = True
        for _ in range(2):
            actual = _call(compiled, _clone(args))
            if isinstance(actual[0], tuple) and actual[0][:1] == ("raised",) and not (
                    isinstance(expected[0], tuple) and expected[0][:1] == ("raised",)):
                return "ERR"
            ok = ok and same(expected[0], actual[0]) and expected[1] == actual[1] and torch.is_grad_enabled()
        return "yes" if ok else "NO"
    except Exception:  # noqa: BLE001
        return "ERR"
    finally:
        torch.set_grad_enabled(True)
        bytegraph.reset()
        torch._dynamo.reset()


def _pair(a, b):
    return f"{'-' if a is None else a} / {'-' if b is None else b}"


def main():
    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)
    os.environ.setdefault("TORCH_LOGS", "")
    rows = []
    with contextlib.redirect_stderr(io.StringIO()):
        for name, fn, make_args in CASES:
            torch.manual_seed(0)
            args = make_args()
            bg = _explain("bytegraph", fn, args) or (None, None, None)
            dy = _explain("dynamo", fn, args) or (None, None, None)
            rows.append((name, _pair(bg[0], dy[0]), _pair(bg[1], dy[1]), _pair(bg[2], dy[2]),
                         _pair(_matches("bytegraph", fn, args), _matches("dynamo", fn, args))))
    header = ("case", "graphs bg / dyn", "breaks bg / dyn", "ops bg / dyn", "matches eager bg / dyn")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths))
    print(line)
    print("-" * len(line))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
