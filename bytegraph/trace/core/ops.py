"""The interpreter's operations that lower rooms of trace/ reach by name.

Tracing is mutually recursive: a call inlines a function (``machine.frame``), whose
opcodes (``machine.opcodes``) read attributes (``python.attrs``), apply operators
(``python.operators``), iterate (``python.iteration``, ``python.generators``)..., and each
of those may call user Python again (``callables.calls``). The rooms of trace/ still import
each other in one order (docs/architecture.md, enforced by import-linter): a module imports
what lies below it directly, and reaches an operation implemented in a room *above* its own
through this module, as ``ops.call(frame, fn, args, kwargs)``. ``trace/tracer.py``, the top
of trace/, imports every room and wires each name below to its implementation (``wire``)
before anything is traced.

Each entry is looked up at call time (``ops.call(...)``), never imported by name. The
signatures name the running frame ``RunningFrame`` (``core.context``): the class is
``machine.frame.Frame``, in a room above.
"""
from __future__ import annotations

import types
from typing import Callable

from ...values.base import Value
from .context import RunningFrame

# opcode name -> handler(frame, instruction): ``opcodes.HANDLERS``, read by ``Frame.run``.
HANDLERS = None


def call(frame: RunningFrame, fn: Value, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """``fn(*args, **kwargs)`` in the trace: inlined, a graph node, folded or Unsupported (calls.call)."""
    raise _not_wired("call")


def inline_call(parent: RunningFrame, code: types.CodeType, fn_globals: dict, name: str, defaults, kwdefaults, closure,
                args: list[Value], kwargs: dict[str, Value]) -> Value:
    """Run a Python function's code in a child frame and return its result value (frame.inline_call)."""
    raise _not_wired("inline_call")


def fold(frame: RunningFrame, fn: Callable, args: list[Value], kwargs: dict[str, Value], what: str | None = None) -> Value:
    """Call a pure function on constant arguments at trace time (calls.fold)."""
    raise _not_wired("fold")


def tensor_method(frame: RunningFrame, tensor: Value, name: str, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """``tensor.name(*args, **kwargs)``: a graph node or a known constant (calls.tensor_method)."""
    raise _not_wired("tensor_method")


def call_stdlib_object(frame: RunningFrame, fv: Value, args: list[Value], kwargs: dict[str, Value]) -> Value | None:
    """A call of a standard-library callable object (partial, lru_cache wrapper...), or None
    (stdlib_calls.call_stdlib_object)."""
    raise _not_wired("call_stdlib_object")


def iterate(frame: RunningFrame, v: Value) -> list[Value]:
    """All items of an iterable value, as a new list (iteration.iterate)."""
    raise _not_wired("iterate")


def call_method(frame: RunningFrame, owner: Value, name: str, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """A method of a list, dict, set, tuple or torch context manager value (containers.call_method)."""
    raise _not_wired("call_method")


def inplace_operator(frame: RunningFrame, op: str, a: Value, b: Value) -> Value | None:
    """``a op= b`` on a container value, changing it in place; None if it does not apply
    (containers.inplace_operator)."""
    raise _not_wired("inplace_operator")


def generator_attr(frame: RunningFrame, gen: Value, name: str) -> Value:
    """``gen.name`` for a generator made in the trace: send, throw, close... (generators.get_attr)."""
    raise _not_wired("generator_attr")


def subclass_attr(frame: RunningFrame, tensor: Value, name: str) -> Value | None:
    """``t.name`` on a traceable wrapper subclass (its inner tensors, its own Python methods and
    attributes); None where it reads as on any tensor (torch_api.subclasses.subclass_attr)."""
    raise _not_wired("subclass_attr")


def function_subclass_attr(frame: RunningFrame, tensor: Value, name: str) -> Value | None:
    """``t.name`` for a tensor property of a ``__torch_function__`` subclass value: its override
    traced; None where no override applies (torch_api.torch_function.tensor_property)."""
    raise _not_wired("function_subclass_attr")


def function_subclass_binary(frame: RunningFrame, fn: Callable, a: Value, b: Value) -> Value | None:
    """``a <op> b`` (``b`` None: a unary operator; ``operator.getitem``: ``a[b]``) with a
    ``__torch_function__`` subclass operand: its override traced; None where none applies
    (torch_api.torch_function.binary)."""
    raise _not_wired("function_subclass_binary")


def function_subclass_setitem(frame: RunningFrame, obj: Value, index: Value, value: Value) -> Value | None:
    """``obj[index] = value`` with a ``__torch_function__`` subclass among them: its override
    traced; None where none applies (torch_api.torch_function.setitem)."""
    raise _not_wired("function_subclass_setitem")


_ENTRIES = ("HANDLERS", "subclass_attr", "function_subclass_attr", "function_subclass_binary", "function_subclass_setitem", "call", "inline_call", "fold", "tensor_method", "call_stdlib_object",
            "iterate", "call_method", "inplace_operator", "generator_attr")


def wire(**implementations):
    """Point every entry of this module at its implementation (called once, by trace/tracer.py)."""
    unknown = set(implementations) - set(_ENTRIES)
    missing = set(_ENTRIES) - set(implementations)
    if unknown or missing:
        raise ImportError(f"trace.core.ops.wire: unknown entries {sorted(unknown)}, missing {sorted(missing)}")
    globals().update(implementations)


def _not_wired(name):
    return RuntimeError(f"trace.core.ops.{name} is not wired yet: import bytegraph.trace.tracer first")
