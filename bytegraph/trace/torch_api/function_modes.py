"""TorchFunctionModes in a trace: each mode's ``__torch_function__`` runs while tracing, as in eager.

Eager torch hands every torch function, tensor method, operator and tensor property read to the
innermost active mode (``mode.__torch_function__(func, types, args, kwargs)``), with that mode
off the stack while its handler runs, so the handler's own torch calls reach the next mode, then
``__torch_function__`` subclasses, then the op itself. Here the stack is symbolic
(``GraphBuilder.function_modes``, outermost first):

* **Modes around the call** (``with MyMode(): compiled(x)``) are read from the real stack when
  the trace starts, each a value read through ``torch._C._get_function_stack_at(i)``
  (``FunctionModeSource``): attributes the handler reads are guarded there, changes it makes
  replayed there. The graph-level guard on the stack's mode types is the global-state one
  (``guards.probes.function_modes``). The real stack is empty while the frame compiles
  (``runtime.compile_frame.modes_set_aside``) and the graph runs with torch function off
  (``residual.without_torch_function``): its nodes already are what the modes made of the calls.
* **Modes entered inside** (``with MyMode(): ...``, ``mode.__enter__()`` in the compiled function):
  their ``__enter__``/``__exit__`` are traced like any manager's; TorchFunctionMode's own push the
  mode on the trace's stack and pop the innermost (``push_mode``, ``pop_mode``), as eager's
  ``_push_mode``/``_pop_mode``. The generated code sets the real stack to the trace's after the
  graph (``codegen.transformed.mode_stack_lines``): before a graph break's native step, which then
  runs under the modes the trace had there (the resume function finds them around its call, and
  pops them natively when it leaves their block), and before the frame returns.

The handler is traced like any method; anything the trace cannot follow breaks. No node is added
while a mode is on the stack but through the handler (``GraphBuilder._call`` refuses it), so an
operation the trace does not hand to the modes breaks rather than skipping them.
"""
import inspect
import types

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import DeviceContext

from ...errors import Unsupported
from ...guards import probes
from ...guards.sources import FunctionModeSource, ObjectSource
from ...values.base import ConstantValue, DictValue, TupleValue
from ...values.builder import wrap
from ..core import ops
from ..core.handlers import builtin
from ..python import attrs

_IGNORED = torch.overrides.get_ignored_functions()


def enter_trace(tx):
    """The modes around the call as the stack the trace starts with."""
    modes = probes.modes_around_call()
    if not modes or all(isinstance(m, DeviceContext) for m in modes):
        return
    if any(isinstance(m, DeviceContext) for m in modes):
        raise Unsupported("a TorchFunctionMode around the call together with a device context (with "
                          "torch.device(...), torch.set_default_device) is not supported yet",
                          hint="enter the mode inside the compiled function, or leave the device context")
    for m in modes:
        check_mode_class(type(m), "around the call")
    tx.graph.function_modes = [wrap(tx, m, FunctionModeSource(i)) for i, m in enumerate(modes)]
    tx.graph.modes_around_call = len(modes)
    tx.graph.modes_at_entry = tuple(tx.graph.function_modes)


def check_mode_class(cls, where):
    override = inspect.getattr_static(cls, "__torch_function__", None)
    if not isinstance(override, types.FunctionType):
        raise Unsupported(f"{cls.__qualname__}.__torch_function__ ({where}) is not a Python method: it cannot be traced",
                          hint="without fullgraph=True it runs eagerly")
    if inspect.getattr_static(cls, "__getattribute__", object.__getattribute__) is not object.__getattribute__:
        raise Unsupported(f"{cls.__qualname__} ({where}) defines __getattribute__: not traced",
                          hint="without fullgraph=True it runs eagerly")


def reaches_modes(func):
    """Does torch hand ``func`` to the active modes? Every function and method bound in C (the
    factories too: modes see ``torch.zeros``), and the Python ones that are overridable."""
    if func not in _IGNORED:
        return True
    name = getattr(func, "__name__", None)
    return name is not None and (getattr(torch._C._VariableFunctions, name, None) is func
                                 or getattr(torch._C.TensorBase, name, None) is func)


def call_mode(frame, func, classes, args, kwargs, what):
    """``func(*args, **kwargs)`` handed to the innermost mode: its ``__torch_function__`` traced
    with that mode off the stack."""
    tx = frame.tx
    stack = tx.graph.function_modes
    mode = stack.pop()
    try:
        handler = attrs.get_attr(frame, mode, "__torch_function__")
        types_value = TupleValue([wrap(tx, c, ObjectSource(c, c.__qualname__)) for c in classes])
        result = ops.call(frame, handler, [wrap(tx, func, None), types_value, TupleValue(list(args)),
                                           DictValue(dict(kwargs))], {})
    finally:
        stack.append(mode)
    if isinstance(result, ConstantValue) and result.value is NotImplemented:
        raise Unsupported(f"a TorchFunctionMode's __torch_function__ returned NotImplemented for {what} "
                          "(torch then asks the next handler): not traced yet")
    return result


def check_block(cls):
    """``with mode:`` on a TorchFunctionMode in the compiled function: refused here, or None (its
    ``__enter__``/``__exit__`` are then traced as any manager's, TorchFunctionMode's own ones
    reaching ``push_mode``/``pop_mode``)."""
    if issubclass(cls, DeviceContext):
        raise Unsupported(f"entering a {cls.__qualname__} (a device context mode) inside the compiled function "
                          "is not supported yet",
                          hint="without fullgraph=True the with-statement runs natively at a graph break")
    check_mode_class(cls, "entered in the function")


@builtin(TorchFunctionMode.__enter__)
def push_mode(frame, args, kwargs):
    """``TorchFunctionMode.__enter__(mode)`` (a ``with`` block, ``mode.__enter__()``, a subclass's
    ``super().__enter__()``): the mode pushed on the trace's stack; the generated code pushes it
    on the real one before a native step or the return that finds it there."""
    if len(args) != 1 or kwargs:
        raise Unsupported("TorchFunctionMode.__enter__ with unexpected arguments")
    mode = args[0]
    cls = _class_of(mode)
    check_block(cls)
    stack = frame.tx.graph.function_modes
    if isinstance(stack, tuple):
        raise Unsupported(f"entering a {cls.__qualname__} inside a higher-order operator's body is not supported yet")
    stack.append(mode)
    return mode


@builtin(TorchFunctionMode.__exit__)
def pop_mode(frame, args, kwargs):
    """``TorchFunctionMode.__exit__``: pops the innermost mode, whichever it is, as eager's
    ``_pop_mode()`` does (a mode around the call too: the generated code then pops it natively)."""
    stack = frame.tx.graph.function_modes
    if isinstance(stack, tuple) or not stack:
        raise Unsupported("leaving a TorchFunctionMode with no torch function mode traced on the stack: not traced")
    stack.pop()
    return ConstantValue(None)


def _class_of(v):
    cls = getattr(v, "cls", None)
    if isinstance(cls, type):
        return cls
    obj = getattr(v, "obj", None)
    if isinstance(obj, TorchFunctionMode):
        return type(obj)
    raise Unsupported(f"TorchFunctionMode.__enter__ on {attrs.describe(v)}: not traced")


_STACK_QUERIES = (torch._C._len_torch_function_stack, torch._C._get_function_stack_at,
                  torch._C._is_torch_function_mode_enabled)


def refuse_stack_query(frame, fn):
    """The mode stack read while modes are traced: the real one is set aside (or not what the
    trace models), so the answer would be wrong."""
    if fn in _STACK_QUERIES and (frame.tx.graph.function_modes or probes._set_aside):
        raise Unsupported(f"torch._C.{fn.__name__}() while TorchFunctionModes are traced is not supported yet",
                          hint="without fullgraph=True it runs eagerly")


def call_property_getter(frame, fn, args, kwargs):
    """``Tensor.shape.__get__(x)``, the ``func`` a mode (or subclass) handler is handed for a
    property read, called by the handler: the read itself (the next mode or class sees it)."""
    if not isinstance(fn, types.MethodWrapperType):
        return None
    owner = getattr(fn, "__self__", None)
    if fn.__name__ != "__get__" or not isinstance(owner, (types.GetSetDescriptorType, property)):
        return None
    name = getattr(owner, "__name__", None) or getattr(getattr(owner, "fget", None), "__name__", None)
    if name is None or inspect.getattr_static(torch.Tensor, name, None) is not owner:
        return None
    if len(args) != 1 or kwargs:
        raise Unsupported(f"Tensor.{name}.__get__ with unexpected arguments")
    return attrs.get_attr(frame, args[0], name)


__all__ = ["enter_trace", "reaches_modes", "call_mode", "check_block", "push_mode", "pop_mode", "refuse_stack_query", "call_property_getter"]
