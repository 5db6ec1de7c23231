"""Which graph operators write their first argument in place.

Below every floor: the tracer's graph builder (``graph.builder._mutates``) and the backends
(``backends._common.writes``) must agree on it, and they do not import each other.
"""
import operator

# ``x += y`` on a tensor: the operator node writes ``x`` in place, as ``x.add_(y)`` does.
INPLACE_OPERATORS = frozenset({
    operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv, operator.imod,
    operator.ipow, operator.imatmul, operator.iand, operator.ior, operator.ixor, operator.ilshift,
    operator.irshift})


def is_inplace_operator(target):
    try:
        return target in INPLACE_OPERATORS
    except TypeError:      # an unhashable callable
        return False
