"""Fine-grained control over what is traced: disable, allow_in_graph, disallow_in_graph, graph_break;
``wrap_numpy`` (NumPy code as a function of tensors)."""
from __future__ import annotations

import functools
import types
from typing import Callable

import numpy as np
import torch

from .errors import BytegraphError

# Functions whose calls become one opaque graph node (outputs computed on fake tensors).
allowed_in_graph = set()
# Functions that must never be put in a graph: calling them is a graph break.
disallowed_in_graph = set()


def graph_break() -> None:
    """Ends the current graph here; compilation resumes after this call."""


def allow_in_graph(fn: Callable) -> Callable:
    """Put calls to ``fn`` in the graph as a single node instead of tracing into it.

    ``fn`` must be functional: its outputs depend only on its inputs, it mutates
    nothing, and its output shapes can be computed on fake tensors.
    """
    if isinstance(fn, (list, tuple)):
        return [allow_in_graph(f) for f in fn]
    if not callable(fn):
        raise BytegraphError(f"allow_in_graph expects a callable, got {type(fn).__name__}")
    disallowed_in_graph.discard(fn)
    allowed_in_graph.add(fn)
    return fn


def disallow_in_graph(fn: Callable) -> Callable:
    """Never put ``fn`` in a graph: each call to it is a graph break and runs eagerly."""
    if isinstance(fn, (list, tuple)):
        return [disallow_in_graph(f) for f in fn]
    if not callable(fn):
        raise BytegraphError(f"disallow_in_graph expects a callable, got {type(fn).__name__}")
    allowed_in_graph.discard(fn)
    disallowed_in_graph.add(fn)
    return fn


def disable(fn: Callable | None = None, recursive: bool = True) -> Callable:
    """Run ``fn`` without compiling it (also as ``@disable`` / ``@disable(recursive=False)``).

    With ``recursive=False`` only ``fn``'s own frame is skipped: the global
    functions it calls are still compiled (calls through attributes, such as
    ``self.layer(x)``, run as they are: without a frame hook there is no way
    to reach them).
    """
    if not isinstance(recursive, bool):
        raise BytegraphError(f"disable: recursive must be True or False, got {recursive!r}")
    if fn is None:
        return functools.partial(disable, recursive=recursive)
    if not callable(fn):
        raise BytegraphError(f"disable expects a callable, got {type(fn).__name__}")
    target = getattr(fn, "_bytegraph_original", fn)

    @functools.wraps(target)
    def disabled(*args, **kwargs):
        return target(*args, **kwargs)

    disabled._bytegraph_disabled = True
    disabled._bytegraph_disabled_target = target
    disabled._bytegraph_recursive = recursive
    return disabled


def is_disabled(fn: Callable) -> bool:
    return getattr(fn, "_bytegraph_disabled", False)


def _probe():
    pass


# The code of the wrapper torch._disable_dynamo makes (functools.wraps hides its module).
_TORCH_DISABLE_WRAPPER_CODE = torch._disable_dynamo(_probe).__code__


def torch_disabled_target(fn):
    """``f`` when ``fn`` is one of torch's "run without the compiler" wrappers around ``f``:
    ``torch._disable_dynamo(f)`` (e.g. ``Optimizer.zero_grad``), or ``torch.compiler.disable(f)``
    / ``torch._dynamo.disable(f)`` (torch.compile puts them on optimizer methods once it has
    run in the process); else None."""
    if not isinstance(fn, types.FunctionType):
        return None
    if fn.__code__ is _TORCH_DISABLE_WRAPPER_CODE:
        return getattr(fn, "__wrapped__", None)
    if fn.__dict__.get("_torchdynamo_disable") is True and "_torchdynamo_orig_callable" in fn.__dict__ \
            and fn.__code__.co_filename.replace("\\", "/").endswith("torch/_dynamo/eval_frame.py"):
        return fn.__dict__["_torchdynamo_orig_callable"]
    return None


__all__ = ["disable", "allow_in_graph", "disallow_in_graph", "graph_break", "wrap_numpy"]


def fused_optimizer_step(opt, name):
    """Is ``opt.name`` the ``step`` of a torch optimizer whose every parameter group is fused
    (``fused=True``)? Its update is one native kernel per group, with nothing around it worth a
    graph: it runs natively, not traced (tracing it only made frames and guards to run per step).
    Running it natively is eager's behaviour whatever the groups say later, so nothing guards it."""
    return (name == "step" and isinstance(opt, torch.optim.Optimizer) and bool(opt.param_groups)
            and all(g.get("fused") is True for g in opt.param_groups))


def mark_dynamic(t: torch.Tensor, dim: int | list[int], min: int | None = None, max: int | None = None) -> None:
    """Treat ``t``'s size in ``dim`` (an int or a list of ints) as symbolic from the first compile."""
    if not isinstance(t, torch.Tensor):
        raise BytegraphError(f"mark_dynamic expects a tensor, got {type(t).__name__}")
    dims = [dim] if isinstance(dim, int) else list(dim)
    marks = dict(getattr(t, "_bytegraph_dynamic", {}) or {})
    for d in dims:
        if not isinstance(d, int) or not -t.dim() <= d < t.dim():
            raise BytegraphError(f"mark_dynamic: dim {d!r} is out of range for a {t.dim()}-d tensor")
        marks[d % t.dim()] = (min, max)
    t._bytegraph_dynamic = marks


def mark_static(t: torch.Tensor, dim: int | list[int] | None = None) -> None:
    """Keep ``t``'s size in ``dim`` (all dims if None) static, even under dynamic=True."""
    if not isinstance(t, torch.Tensor):
        raise BytegraphError(f"mark_static expects a tensor, got {type(t).__name__}")
    if dim is None:
        t._bytegraph_static = "all"
        return
    dims = [dim] if isinstance(dim, int) else list(dim)
    current = getattr(t, "_bytegraph_static", None)
    current = set() if current in (None, "all") else set(current)
    t._bytegraph_static = current | {d % t.dim() for d in dims}


# --- NumPy code on tensors --------------------------------------------------------------------------

def wrap_numpy(fn: Callable) -> Callable:
    """Make ``fn``, written for ``np.ndarray``s, a function of ``torch.Tensor``s.

    Tensor arguments (also inside tuples, lists and dicts) are handed to ``fn`` as arrays
    and array results come back as tensors. Compiled, the arrays *are* the tensors (no
    copies, no device moves): NumPy code runs on the tensors' device, and gradients flow
    through it (with ``fullgraph=True``). Run eagerly, tensors are converted with
    ``t.numpy(force=True)`` and results with ``torch.as_tensor``.
    """
    if not callable(fn):
        raise BytegraphError(f"wrap_numpy expects a callable, got {type(fn).__name__}")

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        return tensors_from_arrays(fn(*arrays_from_tensors(args), **arrays_from_tensors(kwargs)))

    wrapped._bytegraph_wrap_numpy = fn
    return wrapped


def arrays_from_tensors(value):
    """Tensors in ``value`` (a tuple, list or dict of them, or one) as NumPy arrays."""
    return _map_leaves(value, torch.Tensor, lambda t: t.numpy(force=True))


def tensors_from_arrays(value):
    """NumPy arrays in ``value`` as tensors."""
    return _map_leaves(value, np.ndarray, torch.as_tensor)


def _map_leaves(value, kind, fn):
    if isinstance(value, kind):
        return fn(value)
    if type(value) in (tuple, list):
        return type(value)(_map_leaves(v, kind, fn) for v in value)
    if type(value) is dict:
        return {k: _map_leaves(v, kind, fn) for k, v in value.items()}
    return value


def torch_wrap_numpy_target(fn):
    """The function ``torch.compiler.wrap_numpy`` wrapped, if ``fn`` is such a wrapper (it means what
    ``wrap_numpy`` means, so bytegraph treats it the same way), else None."""
    code = getattr(fn, "__code__", None)
    # functools.wraps gives the wrapper the wrapped function's names; its code keeps torch's.
    if code is None or getattr(code, "co_qualname", "") != "wrap_numpy.<locals>.wrap" \
            or not code.co_filename.replace("\\", "/").endswith("torch/_dynamo/external_utils.py"):
        return None
    return getattr(fn, "__wrapped__", None)
