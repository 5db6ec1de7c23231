"""``torch._check`` and friends on numbers only the graph knows (capture modes).

Under ``capture_scalar_outputs`` / ``capture_dynamic_output_shape_ops`` a condition on an
unbacked value (``torch._check(n > 0)`` with ``n = x.sum().item()``) cannot be decided while
tracing; as torch.compile does, the check becomes a graph node (it raises when the graph runs,
where eager raises) and the ShapeEnv takes it as a fact from there on (``graph.unbacked.check_node``).
Any other condition (a constant, a backed size) is left to the usual path: the Python function
is traced, its ``if`` decided on known values.
"""
import torch

from ...errors import Unsupported
from ...graph import unbacked
from ...values.base import ConstantValue, SymValue
from ..core.handlers import builtin

_CHECKS = (torch._check, torch._check_index, torch._check_value, torch._check_type, torch._check_not_implemented)


def _unbacked(v):
    return isinstance(v, SymValue) and unbacked.involves_unbacked(v.sym)


def _no_message(message):
    if message is not None and not (isinstance(message, ConstantValue) and message.value is None):
        raise Unsupported("torch._check with a message on a number the graph computes from tensor data",
                          hint="drop the message (the check still raises when it fails)")


def _check(check):
    def handler(frame, args, kwargs):
        cond = args[0] if args else kwargs.get("cond")
        if not _unbacked(cond) or not isinstance(cond.sym, torch.SymBool):
            return None
        _no_message(args[1] if len(args) > 1 else kwargs.get("message"))
        unbacked.check_node(frame.tx.graph, check, cond)
        return ConstantValue(None)
    return handler


for _fn in _CHECKS:
    builtin(_fn)(_check(_fn))


@builtin(torch._check_is_size)
def _check_is_size(frame, args, kwargs):
    value = args[0] if args else kwargs.get("i")
    if not _unbacked(value) or not isinstance(value.sym, torch.SymInt):
        return None
    _no_message(args[1] if len(args) > 1 else kwargs.get("message"))
    extra = {}
    if "max" in kwargs:
        if not isinstance(kwargs["max"], ConstantValue):
            raise Unsupported("torch._check_is_size with a max that is not a Python int")
        extra["max"] = kwargs["max"].value
    unbacked.check_node(frame.tx.graph, torch._check_is_size, value, extra)
    return ConstantValue(None)


# int() / float() of an unbacked number: torch.sym_int (truncation, as int() of a float) and
# torch.sym_float keep it in the graph; Python's int() would need its value.
_CONVERSIONS = {(int, torch.SymFloat): torch.sym_int, (float, torch.SymInt): torch.sym_float}


def convert_unbacked(frame, kind, value):
    """``int(value)`` / ``float(value)`` (``kind``) of a number only the graph knows, as a graph
    value; None for any other value (builtin_calls' fold of int and float asks first)."""
    if not _unbacked(value):
        return None
    if type(value.sym) is (torch.SymInt if kind is int else torch.SymFloat):
        return value
    target = _CONVERSIONS.get((kind, type(value.sym)))
    return frame.tx.graph.sym_call(target, [value]) if target is not None else None
