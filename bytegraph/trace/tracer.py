"""Trace one frame from its real arguments: the entry point of the interpreter."""
from dataclasses import dataclass

from ..guards.sources import ClosureSource, LocalSource
from ..values.base import RealCell
from ..values.builder import wrap
from . import state
from .context import TraceContext
from .frame import Frame
from .torch_calls import undo_state_changes


@dataclass
class TraceResult:
    tx: TraceContext
    return_value: object       # the value the frame returned


def frame_params(code):
    """Names of a code object's parameters in order: positional, *args, keyword-only, **kwargs."""
    n = code.co_argcount + code.co_kwonlyargcount
    if code.co_flags & 0x04:
        n += 1
    if code.co_flags & 0x08:
        n += 1
    return list(code.co_varnames[:n])


def trace_frame(fn, frame_args, options):
    """Run ``fn``'s bytecode symbolically on ``frame_args`` (values of its parameters, in order)."""
    code = fn.__code__
    tx = TraceContext(options, fn.__globals__)
    params = frame_params(code)
    state.tracing = True
    try:
        local_values = {name: wrap(tx, value, LocalSource(name)) for name, value in zip(params, frame_args)}
        cells = {}
        for i, (name, cell) in enumerate(zip(code.co_freevars, fn.__closure__ or ())):
            cells[name] = RealCell(cell, ClosureSource(i, name))
        frame = Frame(tx, code, fn.__globals__, local_values, cells)
        ret = frame.run()
    finally:
        undo_state_changes(tx)
        state.tracing = False
    return TraceResult(tx, ret)
