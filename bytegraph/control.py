"""Fine-grained control over what is traced: disable, allow_in_graph, disallow_in_graph, graph_break;
``wrap_numpy`` (NumPy code as a function of tensors); and torch's own markers of the same kinds
(``torch.compiler.allow_in_graph``, ``torch._dynamo.mark_dynamic``...), read as the data they
leave on what they mark, so code written for torch.compile means the same under bytegraph."""
from __future__ import annotations

import functools
import sys
import types
from typing import Callable

import numpy as np
import torch

from .errors import BytegraphError

class _MarkedSet(set):
    """bytegraph's own marks, and (``in``) the same marks torch's functions of that name left
    in ``torch._dynamo.trace_rules`` (``registry``, a set of ids), read only once loaded.
    ``own_only``: torch's marks count only on callables that are not torch's own (torch marks
    some of its helpers for its own front end; bytegraph handles those itself)."""

    def __init__(self, registry, own_only):
        super().__init__()
        self._registry = registry
        self._own_only = own_only

    def __contains__(self, fn):
        if set.__contains__(self, fn):   # raises TypeError for unhashable callables, as a set does
            return True
        rules = sys.modules.get("torch._dynamo.trace_rules")
        if rules is None or id(fn) not in getattr(rules, self._registry):
            return False
        if (getattr(fn, "__module__", None) or "").startswith("torch._dynamo"):
            return False    # torch's front end's own helpers (graph_break...): trace/torch_wrappers.py
        # A class marked allow_in_graph (diffusers marks its blocks): its instances are traced
        # into, by torch too; making one inside a graph is not a graph operation.
        return not (self._own_only and (_is_torch_own(fn) or isinstance(fn, type)))


def _is_torch_own(fn):
    module = getattr(fn, "__module__", None) or ""
    return module == "torch" or module.startswith("torch.")


# Functions whose calls become one opaque graph node (outputs computed on fake tensors);
# with torch.compiler.allow_in_graph's marks on user functions.
allowed_in_graph = _MarkedSet("_allowed_callable_ids", own_only=True)
# Functions that must never be put in a graph: calling them is a graph break; with
# torch._dynamo.disallow_in_graph's marks (a break is always correct, so on torch's ops too).
disallowed_in_graph = _MarkedSet("_disallowed_callable_ids", own_only=False)


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
    run in the process), also with ``recursive=False`` (``torch_disable_recursive`` tells); else None."""
    if not isinstance(fn, types.FunctionType):
        return None
    if fn.__code__ is _TORCH_DISABLE_WRAPPER_CODE:
        return getattr(fn, "__wrapped__", None)
    marks = fn.__dict__
    if marks.get("_torchdynamo_disable") is True and "_torchdynamo_orig_callable" in marks \
            and fn.__code__.co_filename.replace("\\", "/").endswith(_TORCH_DISABLE_FILES):
        return marks["_torchdynamo_orig_callable"]
    return None


# Where torch's disable wrappers are defined (eval_frame: recursive; external_utils: recursive=False).
_TORCH_DISABLE_FILES = ("torch/_dynamo/eval_frame.py", "torch/_dynamo/external_utils.py")


def torch_disable_recursive(fn):
    """For a wrapper ``torch_disabled_target`` knows: False for ``disable(f, recursive=False)``
    (only ``f``'s own frame runs without the compiler; what it calls is compiled)."""
    return fn.__dict__.get("_torchdynamo_disable_recursive", True) is not False


def is_forbidden(fn):
    """Calls that must not be traced at all (torch.compile raises on them too): setting the
    stance, torch's ``mark_dynamic`` and friends (``forbid_in_graph``) and bytegraph's own."""
    marks = getattr(fn, "__dict__", None) if isinstance(fn, (types.FunctionType, type)) else None
    return bool(marks) and (marks.get("_dynamo_forbidden") is True or marks.get("_bytegraph_forbidden") is True)


def assumed_constant(fn):
    """``torch._dynamo.assume_constant_result(fn)`` (also spelled as the attribute it sets, as
    transformers does under ``lru_cache``): the function's result is a constant of the program."""
    if not isinstance(fn, (types.FunctionType, functools._lru_cache_wrapper)):
        return False
    return fn.__dict__.get("_dynamo_marked_constant") is True


def torch_substitute(fn):
    """The function to trace in place of ``fn`` when user code registered one with
    ``torch.compiler.substitute_in_graph(fn)`` (torch's own substitutes for builtins are not
    used: bytegraph handles those itself), else None."""
    functions = sys.modules.get("torch._dynamo.variables.functions")
    if functions is None:
        return None
    try:
        wrapped = functions.PolyfilledFunctionVariable._get_polyfill_handlers().get(fn)
    except TypeError:   # unhashable
        return None
    substitute = getattr(wrapped, "__torch_dynamo_polyfill__", None)
    if substitute is None or _is_torch_own(substitute):
        return None
    return substitute


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


mark_dynamic._bytegraph_forbidden = True


def mark_static(t: torch.Tensor, dim: int | list[int] | None = None) -> None:
    """Keep ``t``'s size in ``dim`` (all dims if None) static, even under dynamic=True (an explicit
    ``mark_dynamic`` of the same dim wins, as torch's does)."""
    if not isinstance(t, torch.Tensor):
        raise BytegraphError(f"mark_static expects a tensor, got {type(t).__name__}")
    if dim is None:
        t._bytegraph_static = "all"
        return
    dims = [dim] if isinstance(dim, int) else list(dim)
    current = getattr(t, "_bytegraph_static", None)
    current = set() if current in (None, "all") else set(current)
    t._bytegraph_static = current | {d % t.dim() for d in dims}


# torch._dynamo's markers on a tensor: dims made symbolic (mark_dynamic, maybe_mark_dynamic;
# mark_unbacked, traced here as an ordinary symbolic size) and dims kept static (mark_static).
_TORCH_DYNAMIC_MARKS = ("_dynamo_dynamic_indices", "_dynamo_weak_dynamic_indices", "_dynamo_unbacked_indices",
                        "_dynamo_strict_unbacked_indices")


def marked_dims(t):
    """``(dynamic, static)`` marked on ``t`` (a tensor or array) by bytegraph's or torch's
    ``mark_dynamic`` / ``mark_static`` and friends: ``dynamic`` maps dim -> (min, max), ``static``
    is a set of dims. Read from the attributes they set; cheap when there are none."""
    attrs = getattr(t, "__dict__", None)
    if not attrs:
        return {}, ()
    ndim = t.ndim
    dynamic = dict(attrs.get("_bytegraph_dynamic") or {})
    static = attrs.get("_bytegraph_static")
    static = set(range(ndim)) if static == "all" else set(static or ())
    if attrs.get("_has_dynamo_dim_marking"):
        bounds = {r.dim: (r.min, r.max) for r in attrs.get("_dynamo_dynamic_range", ())}
        bounds.update(attrs.get("_dynamo_unbacked_bounds") or {})
        for name in _TORCH_DYNAMIC_MARKS:
            for d in attrs.get(name) or ():
                if isinstance(d, int) and -ndim <= d < ndim:
                    dynamic.setdefault(d % ndim, bounds.get(d, (None, None)))
        static |= {d % ndim for d in attrs.get("_dynamo_static_indices") or ()
                   if isinstance(d, int) and -ndim <= d < ndim}
    return dynamic, static


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
