"""Trace one frame from its real arguments: the entry point of the interpreter."""
from __future__ import annotations

import inspect
import types
from dataclasses import dataclass

import torch

from ..errors import Unsupported
from ..guards.sources import ClosureSource, LocalSource
from ..values.base import RealCell
from .callables import builtin_calls, calls, containers, environ, stdlib_calls  # noqa: F401 (registering handlers)
from .core import ops, state
from .core.context import TraceContext
from .machine import control_opcodes, opcodes  # noqa: F401 (control_opcodes: registering handlers)
from .machine import checkpoint
from .machine.frame import Frame, PendingLocal, inline_call
from .nn import module_calls, module_enumeration  # noqa: F401 (module_enumeration: registering handlers)
from .python import generators, iteration
from .torch_api import checks, pytree  # noqa: F401 (registering handlers)
from .torch_api import function_modes, subclasses, torch_function
from .torch_api import autograd_function, higher_order_flex, higher_order_loops  # noqa: F401 (register their calls with higher_order)
from .nn import higher_order_regions  # noqa: F401 (registers its calls with torch_api.higher_order)
from .torch_api.torch_calls import undo_state_changes

# The interpreter assembled. Lower rooms of trace/ reach the operations of higher ones through
# trace.core.ops (see there); point each of its entries at its implementation. Importing
# opcodes, control_opcodes, builtin_calls, stdlib_calls, environ, pytree, module_enumeration and
# with_blocks also fills the handler tables (opcodes.HANDLERS, core.handlers.BUILTIN_HANDLERS).
ops.wire(HANDLERS=opcodes.HANDLERS,
         call=calls.call, inline_call=inline_call, fold=calls.fold, tensor_method=calls.tensor_method,
         call_stdlib_object=stdlib_calls.call_stdlib_object, iterate=iteration.iterate,
         call_method=containers.call_method, inplace_operator=containers.inplace_operator,
         generator_attr=generators.get_attr, subclass_attr=subclasses.subclass_attr,
         function_subclass_attr=torch_function.tensor_property, function_subclass_binary=torch_function.binary,
         function_subclass_setitem=torch_function.setitem)


@dataclass
class TraceResult:
    tx: TraceContext
    return_value: object       # the value the frame returned (None when stopped at a break)
    frame: Frame = None        # the root frame, for its stack and locals at a break


def frame_params(code: types.CodeType) -> list[str]:
    """Names of a code object's parameters in ``co_varnames`` order: positional, keyword-only, *args, **kwargs."""
    n = code.co_argcount + code.co_kwonlyargcount
    if code.co_flags & inspect.CO_VARARGS:
        n += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        n += 1
    return list(code.co_varnames[:n])


def trace_frame(fn: types.FunctionType, frame_args: list, options, stop_before: int | None = None, cache=None,
                reuse_blocks: bool = True, stop_index=None, known_breaks=None) -> TraceResult:
    """Run ``fn``'s bytecode symbolically on ``frame_args`` (values of its parameters, in order).

    With ``stop_before`` (an instruction index), tracing stops the first time the
    frame is about to run that instruction; the result then holds the frame.
    With ``stop_index`` (row that broke -> row to stop before), a break the root frame can be
    taken back to the row before (``trace.machine.checkpoint``) leaves on the error a result
    stopped there (``Unsupported.stopped``), so the caller need not trace again.
    ``known_breaks`` (row index of a call -> a known break inside its callee): the root frame
    breaks at that call without tracing the callee (``TraceContext.known_breaks``).
    """
    code = fn.__code__
    params = frame_params(code)
    module = frame_args[0] if frame_args else None
    if isinstance(module, (torch.nn.RNNBase, torch.nn.TransformerEncoder)) \
            and code is getattr(type(module).forward, "__code__", None):
        # A module compiled itself, rather than called from compiled code (module_calls.call_module).
        module_calls.refuse_native_module(module, dict(zip(params, frame_args)).get("src_key_padding_mask") is not None)
    tx = TraceContext(options, fn.__globals__,
                      cache.auto_dynamic if cache is not None else None,
                      cache.auto_dynamic_scalars if cache is not None else None)
    tx.reuse_blocks = reuse_blocks
    tx.known_breaks = known_breaks
    # (one table per compiler: the frames of one model repeat each other's calls)
    tx.graph.share_fake_results(vars(options).setdefault("fake_results", {}) if hasattr(options, "__dict__") else None)
    state.tracing = True
    try:
        function_modes.enter_trace(tx)
        local_values = {name: PendingLocal(value, LocalSource(name)) for name, value in zip(params, frame_args)}
        cells = {}
        for i, (name, cell) in enumerate(zip(code.co_freevars, fn.__closure__ or ())):
            cells[name] = RealCell(cell, ClosureSource(i, name))
        frame = Frame(tx, code, fn.__globals__, local_values, cells)
        frame.stop_before = stop_before
        frame.checkpoints = set() if stop_index is not None and stop_before is None else None
        n = code.co_argcount + code.co_kwonlyargcount
        frame.fresh_containers = tuple(code.co_varnames[n:n + bool(code.co_flags & inspect.CO_VARARGS)
                                                        + bool(code.co_flags & inspect.CO_VARKEYWORDS)])
        try:
            ret = frame.run()
        except Unsupported as e:
            if frame.checkpoints is not None and _stop_at_checkpoint(frame, e, stop_index):
                tx.break_grad_mode = torch.is_grad_enabled()
                e.stopped = TraceResult(tx, None, frame)
            raise
        if frame.stopped:
            tx.break_grad_mode = torch.is_grad_enabled()
    finally:
        undo_state_changes(tx)
        state.tracing = False
    return TraceResult(tx, ret, frame)


def _stop_at_checkpoint(frame, err, stop_index) -> bool:
    """Whether the root frame, left by the break ``err``, was given back its state before the row
    the split stops at (``checkpoint.stop_at``)."""
    cp = frame.checkpoint
    frame.checkpoint = None
    if cp is None or err.root_index is None or err.eager_frame or stop_index(err.root_index) != cp.index:
        return False
    try:
        if not checkpoint.stop_at(frame, cp):
            return False
        frame.check_stop()
    except Unsupported:
        return False
    return True
