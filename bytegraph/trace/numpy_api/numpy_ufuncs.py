"""NumPy ufuncs in the trace: operands, dtypes as NumPy resolves them (``resolve_dtypes``, NEP
50), ``out=`` arrays, and the graph node."""

import numpy as np

from ...graph import numpy_ops as nops
from ...values.arrays import NUMPY_TO_TORCH, NdarrayValue, dtype_unsupported_reason
from ...values.base import ConstantValue, ListValue, SymValue, TensorValue, TupleValue
from ..core.basics import as_constant, describe
from .numpy_conversions import asarray_value, check_writable
from .numpy_values import (_dtype_of, _new_array, _plain, _protocol_object, is_numpy_object, numpy_object_reason,
                           unsupported)


def _operand_dtype(v):
    """What NumPy's type resolution sees for an operand (NEP 50: Python numbers are weak)."""
    if isinstance(v, NdarrayValue):
        return v.dtype
    if isinstance(v, SymValue):
        return int
    if isinstance(v, ConstantValue):
        value = v.value
        if isinstance(value, np.generic):
            reason = dtype_unsupported_reason(value.dtype)
            if reason is not None:
                raise unsupported(reason)
            return value.dtype
        if isinstance(value, bool):
            return np.dtype(bool)
        if type(value) in (int, float, complex):
            return type(value)
    raise unsupported(f"{describe(v)} as a ufunc operand is not traced")


def _operand(frame, v):
    """An operand as the graph gets it: arrays, Python numbers; lists become arrays first."""
    if isinstance(v, (NdarrayValue, SymValue)):
        return v
    if isinstance(v, TensorValue):
        raise unsupported("a torch.Tensor as a NumPy ufunc operand (NumPy converts it natively)",
                          hint="convert it explicitly with t.numpy() or np.asarray(t) to trace it")
    if is_numpy_object(v):
        raise unsupported(numpy_object_reason(v.obj))
    if isinstance(v, ConstantValue) and isinstance(v.value, (bool, int, float, complex, np.generic)):
        return v
    if isinstance(v, (ConstantValue, ListValue, TupleValue)):
        return asarray_value(frame, v, None, "np.asarray")
    if _protocol_object(v):
        raise unsupported(f"{describe(v)} converts through __array__/__array_function__ protocols, which are "
                          "not traced")
    raise unsupported(f"{describe(v)} as a NumPy ufunc operand is not traced")


def call_ufunc(frame, uf, args, kwargs):
    """``uf(*operands, out=..., dtype=..., casting=...)``."""
    name = uf.__name__
    if name not in nops.UFUNC_IMPLS:
        raise unsupported(f"np.{name} is not traced yet")
    nin, nout = uf.nin, uf.nout
    operands = [_operand(frame, a) for a in args[:nin]]
    if len(operands) != nin:
        raise unsupported(f"np.{name} takes {nin} operands, got {len(operands)}")
    extra = args[nin:]
    out = kwargs.pop("out", None)
    if extra:
        if nout > 1 or len(extra) > 1 or out is not None:
            raise unsupported(f"np.{name} with positional out arguments is not traced (out=tuple is)")
        out = extra[0]
    dtype = kwargs.pop("dtype", None)
    casting = as_constant(kwargs.pop("casting", ConstantValue("same_kind")))
    where = kwargs.pop("where", None)
    if where is not None and not (isinstance(where, ConstantValue) and where.value is True):
        raise unsupported(f"np.{name}(..., where=...) is not traced")
    order = kwargs.pop("order", None)
    if order is not None:
        as_constant(order)     # memory order only: the values are the same
    subok = kwargs.pop("subok", None)
    if subok is not None and as_constant(subok) is not True:
        raise unsupported(f"np.{name}(..., subok=False) is not traced")
    if kwargs:
        raise unsupported(f"ufunc arguments {sorted(kwargs)} (np.{name}) are not traced")
    outs = _out_values(out, nout, name)
    dtypes = tuple(_operand_dtype(v) for v in operands)
    signature = None
    if dtype is not None and not (isinstance(dtype, ConstantValue) and dtype.value is None):
        signature = (None,) * nin + (_dtype_of(dtype),) * nout
    out_dtypes = tuple(o.dtype if o is not None else None for o in outs) if outs else (None,) * nout
    try:
        extra_args = {"signature": signature} if signature is not None else {}
        resolved = uf.resolve_dtypes(dtypes + out_dtypes, casting=casting, **extra_args)
    except Exception as e:
        raise unsupported(f"np.{name}: {type(e).__name__}: {e}") from None
    loop_in, loop_out = resolved[:nin], resolved[nin:]
    for d in resolved:
        reason = dtype_unsupported_reason(d)
        if reason is not None:
            raise unsupported(f"np.{name} computes in {d}: {reason}")
    if name in nops.UFUNC_FLOAT_ONLY and loop_in[0].kind not in "fc":
        raise unsupported(f"np.{name} on integers is not traced")
    for v, d in zip(operands, loop_in):
        _check_fits(v, d, name)
    if name in ("power", "pow") and loop_in[1].kind in "iu" and isinstance(operands[1], ConstantValue) \
            and operands[1].value < 0:
        raise unsupported("integers to negative integer powers are not allowed (NumPy raises ValueError)")
    graph_operands = [ConstantValue(_plain(v.value)) if isinstance(v, ConstantValue) else v for v in operands]
    target = nops.ufunc(name, [NUMPY_TO_TORCH[d] for d in loop_in], [NUMPY_TO_TORCH[d] for d in loop_out])
    call_kwargs = {}
    if outs:
        for o in outs:
            if o is not None:
                check_writable(frame, o, f"np.{name}(..., out=...)")
        out_value = outs[0] if nout == 1 else TupleValue([o if o is not None else ConstantValue(None) for o in outs])
        call_kwargs["out"] = out_value
    result = _new_array(frame, target, graph_operands, call_kwargs, f"np.{name}", scalar=True)
    if outs:
        # NumPy returns the out arrays themselves.
        picked = [o if o is not None else r for o, r in zip(outs, result.items if nout > 1 else [result])]
        return picked[0] if nout == 1 else TupleValue(picked)
    return result


def _out_values(out, nout, name):
    if out is None or (isinstance(out, ConstantValue) and out.value is None):
        return None
    items = out.items if isinstance(out, TupleValue) else [out]
    if len(items) != nout:
        raise unsupported(f"np.{name}: out= needs {nout} arrays")
    result = []
    for o in items:
        if isinstance(o, ConstantValue) and o.value is None:
            result.append(None)
        elif isinstance(o, NdarrayValue):
            result.append(o)
        else:
            raise unsupported(f"np.{name}: out= must be traced arrays, got {describe(o)}")
    return result


def _check_fits(v, dtype, name):
    """A Python int operand must fit the integer loop NumPy chose (else NumPy raises OverflowError)."""
    if isinstance(v, ConstantValue) and type(v.value) is int and dtype.kind in "iu":
        info = np.iinfo(dtype)
        if not info.min <= v.value <= info.max:
            raise unsupported(f"np.{name}: Python integer {v.value} out of bounds for {dtype}")
