"""Floats that change between calls (``FloatTensorValue``: a 0-d float64 tensor in the graph):
their arithmetic, their comparisons with numbers, and a symbolic int becoming one where it meets
a float. Each answers None where it does not apply; ``operators`` then folds the values as
constants, which specialises the floats (guards their values)."""
from __future__ import annotations

import operator

import torch

from ...values.base import ConstantValue, FloatTensorValue, SymValue, TensorValue
from ..core.basics import as_constant

ARITHMETIC = {operator.add, operator.sub, operator.mul, operator.truediv, operator.pow,
              operator.neg, operator.pos, operator.abs, abs}
# Floats are immutable: `f += x` is `f + x` (an in-place node would change the graph's input
# tensor, which later uses of the same float read).
NOT_IN_PLACE = {operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
                operator.itruediv: operator.truediv, operator.ipow: operator.pow}


def arithmetic(frame, fn, args):
    """``fn(*args)`` (``fn`` not in place) on such floats and plain numbers: one more such float,
    computed in the graph; None where the result is not a finite float or an operand is another
    kind of value."""
    if fn not in ARITHMETIC or not all(isinstance(a, FloatTensorValue) or (
            isinstance(a, ConstantValue) and type(a.value) in (int, float, bool)) for a in args):
        return None
    examples = [a.example if isinstance(a, FloatTensorValue) else a.value for a in args]
    try:
        example = fn(*examples)
    except Exception:
        return None       # what eager raises comes from the specialised fold
    if type(example) is not float or example != example or abs(example) == float("inf"):
        return None
    operands = [TensorValue(a.node, a.fake) if isinstance(a, FloatTensorValue) else a for a in args]
    result = frame.tx.graph.call("call_function", fn, operands, {})
    bases = tuple(b for a in args if isinstance(a, FloatTensorValue) for b in a.bases)
    return FloatTensorValue(result.node, result.fake, example, bases)


_MIRRORED = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}
_COMPARE = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
            ">": operator.gt, ">=": operator.ge}


def comparison(op, a, b):
    """``x OP n`` for a float input that changes between calls and a plain number: its outcome,
    guarded as an outcome (``FloatTensorValue.decide``), not as x's value; None where the
    comparison is of another kind (it is then folded, specialising the float)."""
    if op not in _MIRRORED:
        return None
    if isinstance(b, FloatTensorValue) and not isinstance(a, FloatTensorValue):
        a, b, op = b, a, _MIRRORED[op]      # n < x is x > n, for ints and floats alike
    if not isinstance(a, FloatTensorValue) or a.decide is None or not isinstance(b, ConstantValue) \
            or type(b.value) not in (int, float):
        return None
    number = as_constant(b)       # (its own guard, where it was read from somewhere)
    outcome = _COMPARE[op](a.example, number)
    a.decide(op, number, outcome)
    return ConstantValue(outcome)


_INT_FLOAT_ARITHMETIC = {operator.add, operator.sub, operator.mul, operator.truediv,
                         operator.iadd, operator.isub, operator.imul, operator.itruediv}


def _backed_int(v):
    return isinstance(v, SymValue) and isinstance(v.sym, torch.SymInt) and v.sym.node.hint is not None


def int_meets_float(fn, a, b):
    """Does ``a fn b`` make a float from a symbolic int (``n * 0.5``, ``n / 2``, ``n + lr``)?
    Only for ints with a value now (not one only the graph knows)."""
    if fn not in _INT_FLOAT_ARITHMETIC or not (_backed_int(a) or _backed_int(b)):
        return False
    others = [v for v in (a, b) if not isinstance(v, SymValue)]
    if any(not (isinstance(v, FloatTensorValue) or (isinstance(v, ConstantValue) and type(v.value) in (int, float)))
           for v in others) or any(isinstance(v, SymValue) and not _backed_int(v) for v in (a, b)):
        return False
    if fn in (operator.truediv, operator.itruediv):
        # An int divisor is a nonzero number: what dividing by zero raises comes from the int path.
        return not isinstance(b, SymValue) and not (isinstance(b, ConstantValue) and b.value == 0)
    return any(isinstance(v, FloatTensorValue) or type(v.value) is float for v in others)


def int_as_float(frame, v):
    """A symbolic int in float arithmetic: its value as a 0-d float64 tensor computed in the graph
    (a ``FloatTensorValue``), so the float it makes needs no new graph per value (torch.compile
    computes it as a symbolic float). Where the trace needs that float as a number it is
    specialised, and the int with it (guarded by the ShapeEnv)."""
    sym = v.sym
    value = frame.tx.graph.call("call_function", torch.scalar_tensor, [v], {"dtype": ConstantValue(torch.float64)})

    def specialise():
        torch.fx.experimental.symbolic_shapes.guard_int(sym)
    return FloatTensorValue(value.node, value.fake, float(sym.node.hint), (specialise,))
