"""Forward hooks of an ``nn.Module`` called inside the trace, traced like the forward itself.

``module(*args, **kwargs)`` runs, as ``nn.Module._call_impl`` does: each forward
pre-hook (which may replace the arguments), ``forward``, each forward hook (which
may replace the output). The hook tables are read through their sources, so the
guards check their keys (hook handles) and the identity of each hook function:
adding or removing a hook recompiles.
"""
from __future__ import annotations

from torch.nn.modules import module as mm

from ...errors import Unsupported
from ...values.base import DictValue, TupleValue
from ..core import ops
from ..python import attrs
from ..python.operators import is_none
from typing import Callable
from ...values.base import ObjectValue, Value
from ..core.context import RunningFrame


def has_unsupported_hooks(m):
    """Hooks this module's traced call cannot run: global hooks and backward hooks."""
    return bool(mm._global_forward_hooks or mm._global_forward_pre_hooks or m._backward_hooks
                or m._backward_pre_hooks or mm._global_backward_hooks or mm._global_backward_pre_hooks)


def call_with_hooks(frame: RunningFrame, mv: ObjectValue, args: list[Value], kwargs: dict[str, Value],
                    call_forward: Callable[[list[Value], dict[str, Value]], Value]) -> Value:
    """Trace ``mv(*args, **kwargs)`` with its forward pre-hooks and forward hooks."""
    m = mv.obj
    if has_unsupported_hooks(m):
        raise Unsupported(f"{type(m).__name__} has global or backward hooks; tracing those is not supported yet")
    if mv.source is None:
        raise Unsupported(f"hooks of a {type(m).__name__} that cannot be re-read on later calls")
    pre_hooks = _table(frame, mv, "_forward_pre_hooks")
    with_kwargs = set(m._forward_pre_hooks_with_kwargs)
    _table(frame, mv, "_forward_pre_hooks_with_kwargs")
    for key, hook in pre_hooks.items.items():
        if key in with_kwargs:
            result = ops.call(frame, hook, [mv, TupleValue(args), DictValue(kwargs)], {})
            if not is_none(result):
                if not (isinstance(result, TupleValue) and len(result.items) == 2
                        and isinstance(result.items[1], DictValue)):
                    raise Unsupported("a forward pre-hook with kwargs must return None or (args, kwargs)")
                args = list(_as_tuple(result.items[0]).items)
                kwargs = dict(result.items[1].items)
        else:
            result = ops.call(frame, hook, [mv, TupleValue(args)], {})
            if not is_none(result):
                args = list(_as_tuple(result).items)
    output = call_forward(args, kwargs)
    hooks = _table(frame, mv, "_forward_hooks")
    with_kwargs = set(m._forward_hooks_with_kwargs)
    _table(frame, mv, "_forward_hooks_with_kwargs")
    for key, hook in hooks.items.items():
        if key in with_kwargs:
            result = ops.call(frame, hook, [mv, TupleValue(args), DictValue(kwargs), output], {})
        else:
            result = ops.call(frame, hook, [mv, TupleValue(args), output], {})
        if not is_none(result):
            output = result
    return output


def _table(frame, mv, name):
    table = attrs.get_attr(frame, mv, name)
    if not isinstance(table, DictValue):
        raise Unsupported(f"{name} of {type(mv.obj).__name__} is not a dict of hooks")
    return table


def _as_tuple(v):
    return v if isinstance(v, TupleValue) else TupleValue([v])


__all__ = ["call_with_hooks", "has_unsupported_hooks"]
