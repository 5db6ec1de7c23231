"""Calls answered by a handler chosen by the callable itself: ``BUILTIN_HANDLERS``.

It maps a callable (``len``, ``zip``, ``functools.partial``, ``os._Environ.__getitem__``,
``torch.utils._pytree.tree_map``, ``nn.Module.parameters``...) to ``handler(frame, args,
kwargs) -> value``; ``trace.callables.calls`` consults it for every call. The table sits at
the bottom of trace/ so each room registers the callables it understands (``@builtin(fn)``)
without importing the room that reads it.
"""
from __future__ import annotations

from typing import Callable

from ...values.base import Value
from .context import RunningFrame

# handler(frame, args, kwargs) -> the call's value
Handler = Callable[[RunningFrame, list[Value], dict[str, Value]], Value]

BUILTIN_HANDLERS: dict[Callable, Handler] = {}


def builtin(*fns: Callable) -> Callable[[Handler], Handler]:
    """Register the decorated function as the handler of each of ``fns``."""
    def register(h):
        for fn in fns:
            BUILTIN_HANDLERS[fn] = h
        return h
    return register
