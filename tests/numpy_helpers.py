"""Differential checks for NumPy programs: eager NumPy vs compiled, on values, dtypes, types and
the arguments the program changes.

``check_np(fn, make, graphs=1)``: ``make()`` returns fresh arguments (a tuple) for each run;
``fn`` runs eagerly on one set and compiled (``CompileCounter`` backend, ``fullgraph`` when one
graph is expected) on another, twice, and everything is compared: the result's structure and
exact types (``np.ndarray`` vs NumPy scalar vs tensor vs Python value), dtypes, shapes and
values, and every argument afterwards (in-place updates must reach the caller's arrays). Later
calls must not recompile (unless ``recompiles`` says how many times).
"""
import numpy as np
import torch

import bytegraph
from bytegraph.testing import CompileCounter


def same_np(expected, actual, path="result", rtol=1e-6, atol=1e-8):
    """Raise AssertionError naming the first difference between two results."""
    if type(expected) is not type(actual):
        raise AssertionError(f"{path}: type {type(expected).__name__} (eager) vs {type(actual).__name__} (compiled)")
    if isinstance(expected, np.ndarray):
        if expected.dtype != actual.dtype or expected.shape != actual.shape:
            raise AssertionError(f"{path}: {expected.dtype}{expected.shape} (eager) vs "
                                 f"{actual.dtype}{actual.shape} (compiled)")
        if not np.allclose(expected, actual, rtol=rtol, atol=atol, equal_nan=True) if expected.dtype.kind in "fc" \
                else not np.array_equal(expected, actual):
            raise AssertionError(f"{path}: values differ\n eager:    {expected!r}\n compiled: {actual!r}")
        return
    if isinstance(expected, np.generic):
        if expected.dtype.kind in "fc":
            ok = np.allclose(expected, actual, rtol=rtol, atol=atol, equal_nan=True)
        else:
            ok = expected == actual
        if not ok:
            raise AssertionError(f"{path}: {expected!r} (eager) vs {actual!r} (compiled)")
        return
    if isinstance(expected, torch.Tensor):
        if expected.dtype != actual.dtype or expected.shape != actual.shape or expected.device != actual.device:
            raise AssertionError(f"{path}: tensor {expected.dtype}{tuple(expected.shape)} vs "
                                 f"{actual.dtype}{tuple(actual.shape)}")
        if not torch.allclose(expected, actual, rtol=rtol, atol=atol, equal_nan=True):
            raise AssertionError(f"{path}: tensor values differ\n eager:    {expected}\n compiled: {actual}")
        if expected.requires_grad != actual.requires_grad:
            raise AssertionError(f"{path}: requires_grad differs")
        return
    if isinstance(expected, (tuple, list)):
        if len(expected) != len(actual):
            raise AssertionError(f"{path}: length {len(expected)} vs {len(actual)}")
        for i, (e, a) in enumerate(zip(expected, actual)):
            same_np(e, a, f"{path}[{i}]", rtol, atol)
        return
    if isinstance(expected, dict):
        if list(expected) != list(actual):
            raise AssertionError(f"{path}: keys {list(expected)} vs {list(actual)}")
        for k in expected:
            same_np(expected[k], actual[k], f"{path}[{k!r}]", rtol, atol)
        return
    if isinstance(expected, float) and np.isnan(expected) and np.isnan(actual):
        return
    if isinstance(expected, np.random.Generator):
        return
    if type(expected).__eq__ is object.__eq__ and hasattr(expected, "__dict__") and not callable(expected):
        same_np(vars(expected), vars(actual), f"{path}.__dict__", rtol, atol)
        return
    if expected != actual:
        raise AssertionError(f"{path}: {expected!r} (eager) vs {actual!r} (compiled)")


def _scaled(args, factor=1.25):
    """``args`` (fresh from ``make()``) with every writeable floating array and tensor scaled by
    ``factor`` in place, and every writeable integer and boolean array permuted (the same values
    in other places, so indices stay in range and zeros stay; ascending ones, offsets and
    boundaries, kept), so layouts, views and shared memory stay as made (scalars and other
    values as they are: specialised numbers stay valid)."""
    seen = set()
    rng = np.random.default_rng(int(factor * 100))

    def scale(a):
        if isinstance(a, np.ndarray) and a.dtype.kind in "fcbiu" and a.flags.writeable:
            base = a.base if a.base is not None else a
            if id(base) in seen:     # views of one array: changed once, through the first
                return a
            seen.add(id(base))
            if a.dtype.kind in "fc":
                np.multiply(a, a.dtype.type(factor), out=a)
            elif a.size > 1:
                flat = a.reshape(-1)
                if a.dtype.kind == "b" or not (flat[1:] >= flat[:-1]).all():
                    a[...] = flat[rng.permutation(flat.size)].reshape(a.shape)
        elif isinstance(a, torch.Tensor) and (a.is_floating_point() or a.is_complex()) and not a.requires_grad:
            key = a.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                a.mul_(factor)
        elif type(a) in (list, tuple):
            for x in a:
                scale(x)
        return a
    for a in args:
        scale(a)
    return args


def run_both(fn, make, fullgraph=False, backend=None):
    """(eager result, eager args after, compiled fn, counter)."""
    eager_args = make()
    expected = fn(*eager_args)
    cnt = CompileCounter() if backend is None else backend
    compiled = bytegraph.compile(fn, backend=cnt, fullgraph=fullgraph)
    return expected, eager_args, compiled, cnt


def check_np(fn, make, graphs=1, rtol=1e-6, atol=1e-8, fullgraph=None, calls=2, vary=True, recompiles=0):
    """The differential check of the module docstring; returns the counter. ``vary``: later calls
    get floating arrays and tensors scaled by 1.25, 1.5, ... (eager re-run on the same), so a
    result frozen at the first call is caught; False where the program's result may not change
    that way. ``graphs``: the graphs of the first call; ``recompiles``: how many graphs the later
    calls add (automatic dynamic: a number seen changing is compiled again once, as an input)."""
    if fullgraph is None:
        fullgraph = graphs in (0, 1)
    expected, eager_args, compiled, cnt = run_both(fn, make, fullgraph)
    first = None
    for call in range(calls):
        if call > 0 and vary:
            # Other values of the same kinds (floating arrays and tensors scaled), eager re-run on
            # them: a graph answering its first call's outputs again must not pass.
            factor = 1 + 0.25 * call
            eager_args = _scaled(make(), factor)
            expected = fn(*eager_args)
            args = _scaled(make(), factor)
        else:
            args = make()
        actual = compiled(*args)
        same_np(expected, actual, "result" if call == 0 else "result of the second call", rtol, atol)
        same_np(eager_args, args, "arguments after the call", rtol, atol)
        if first is None:
            first = cnt.frame_count
    assert cnt.frame_count == first + recompiles, \
        f"later calls with the same kind of inputs compiled {cnt.frame_count - first} graph(s), expected {recompiles}"
    if graphs is not None:
        assert first == graphs, f"expected {graphs} graph(s), got {first}"
    return cnt
