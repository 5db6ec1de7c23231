"""NumPy in the trace: what NumPy code does with arrays (``values.arrays.NdarrayValue``).

NumPy functions, ufuncs, array methods, attributes, operators, indexing and iteration
on arrays become graph nodes (``graph/numpy_ops.py``) with NumPy's semantics: dtypes as
NumPy resolves them (ufuncs through NumPy's own ``resolve_dtypes``, NEP 50), results
returned as ``np.ndarray`` where eager NumPy returns one and as NumPy scalars where it
returns those. NumPy calls on constants only are run now (folded) unless they make an
array. Conversions between tensors and arrays (``t.numpy()``, ``torch.from_numpy``,
``np.asarray(t)``, ``torch.as_tensor(a)``) are the same graph value seen as the other
kind, so mixed programs stay in one graph (``numpy_conversions``); ufuncs are ``numpy_ufuncs``.

What is not traced breaks the graph with a reason and runs natively (FAQ, "fall-backs"):
non-numeric and unsupported dtypes, ndarray subclasses and masked arrays, ufunc methods
(``np.add.reduce``) and esoteric ufunc arguments, ``np.poly1d``/``np.polynomial``,
objects with ``__array_function__``-style protocols, ``.ctypes``, random numbers, and any
function without a checked implementation (``TRACED``).
"""
from __future__ import annotations

import operator
import types

import numpy as np
import torch

from ...errors import Unsupported
from ...graph import numpy_ops as nops
from ...values.arrays import NUMPY_TO_TORCH, NdarrayMethodValue, NdarrayValue, dtype_unsupported_reason
from ...values.base import (ConstantValue, ContextManagerValue, DictValue, ListValue, ObjectValue, SliceValue, SymValue,
                           TensorValue, TupleValue)
from ..core.basics import MissingAttribute, PythonError, as_constant, constant_value, describe, no_attr_name
# (arrays_from_tensors, call_torch_wrap_numpy, tensor_method_to_array, tensors_from_arrays,
# torch_with_arrays: callers reach them as numpy_calls.<name>.)
from .numpy_conversions import (array_as_tensor, arrays_from_tensors, asarray_value, call_torch_wrap_numpy,  # noqa: F401
                                check_writable, tensor_as_array, tensor_method_to_array, tensors_from_arrays,
                                torch_with_arrays)
from .numpy_functions import TRACED, _is_default, bind, call_tnp, mark_reversed
from .numpy_ufuncs import call_ufunc
# (DATA_HINT, involves_arrays, is_numpy_callable, is_numpy_object, object_attr: callers reach them as
# numpy_calls.<name>.)
from .numpy_values import (DATA_HINT, _device_guard, _dtype_of, _enabled, _graph_arg, _graph_call,  # noqa: F401
                           _is_function_like, _new_array, _plain, _protocol_object, involves_arrays,
                           is_numpy_callable, is_numpy_object, numpy_object_reason, object_attr, storage_key,
                           unsupported)
from ...values.base import Value
from ..core.context import RunningFrame


# --- calling NumPy ---------------------------------------------------------------------------------

# Functions with side effects or hidden state: never folded, never traced.
_STATEFUL = {"seterr", "seterrcall", "set_printoptions", "printoptions", "setbufsize", "save", "savez",
             "savez_compressed", "savetxt", "load", "loadtxt", "genfromtxt", "fromfile", "fromregex",
             "show_config", "show_runtime", "info", "test", "get_printoptions", "geterr",
             "getbufsize", "geterrcall", "frombuffer", "may_share_memory", "shares_memory", "copyto"}


def qualname(obj):
    if isinstance(obj, np.ufunc):
        return f"np.{obj.__name__}"
    mod = getattr(obj, "__module__", None) or ""
    name = getattr(obj, "__name__", None) or type(obj).__name__
    if mod == "numpy" or mod.startswith("numpy._core") or mod.startswith("numpy.lib"):
        return f"np.{name}"
    if mod.startswith("numpy."):
        return f"np.{mod.split('.', 2)[1]}.{name}"
    return name


def call_numpy(frame: RunningFrame, fv: ObjectValue, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """``fn(*args, **kwargs)`` for a NumPy callable ``fv.obj``."""
    obj = fv.obj
    name = qualname(obj)
    _enabled(name)
    owner = getattr(obj, "__self__", None)
    if owner is not None and not isinstance(owner, types.ModuleType):
        if isinstance(owner, np.ufunc):
            raise unsupported(f"ufunc methods such as np.{owner.__name__}.{getattr(obj, '__name__', '?')} are not "
                              "traced")
        if isinstance(owner, (np.ndarray, np.generic)):
            raise unsupported(numpy_object_reason(owner))
        raise unsupported(numpy_object_reason(owner))
    module = getattr(obj, "__module__", None) or ""
    short = getattr(obj, "__name__", "")
    if module.startswith("numpy.random") or isinstance(obj, type) and issubclass(
            obj, (np.random.Generator, np.random.RandomState, np.random.BitGenerator)):
        raise unsupported(f"{name}: NumPy's random numbers run natively (their state lives outside the graph)",
                          hint="seed a generator (np.random.default_rng(seed)) and draw outside the compiled "
                               "function, or let the graph break there")
    if short in _STATEFUL:
        raise unsupported(f"{name} changes or reads NumPy's global state or files; it runs natively")
    if isinstance(obj, type):
        return _call_numpy_type(frame, obj, name, args, kwargs)
    if not _is_function_like(obj):
        raise unsupported(numpy_object_reason(obj))
    spec = TRACED.get(name)
    makes_array = spec is not None and spec.array or name in _ARRAY_MAKERS
    if not _any_traced(args, kwargs) and not makes_array:
        # (Functions that make arrays are never run here: np.zeros(10**9) would allocate now.)
        folded = _fold(frame, obj, name, args, kwargs)
        if folded is not None:
            return folded
    if isinstance(obj, np.ufunc):
        return call_ufunc(frame, obj, list(args), dict(kwargs))
    special = _SPECIAL.get(name)
    if special is not None:
        return special(frame, obj, name, list(args), dict(kwargs))
    if name in _PROTOTYPE_FUNCTIONS and args and isinstance(args[0], TensorValue):
        # np.ones_like(t, dtype=...): NumPy takes the tensor's array (Tensor.__array__, t.numpy())
        # as the prototype and returns a C-contiguous ndarray, whatever the tensor's layout.
        t = args[0]
        if not t.fake.is_contiguous():
            t = frame.tx.graph.call("call_method", "contiguous", [t], {})
        args = [tensor_as_array(frame, t, f"{name} of a tensor")] + list(args[1:])
    entry = nops.counterpart(obj)
    if entry is None or spec is None:
        raise unsupported(f"{name} is not traced yet (no checked torch._numpy implementation)")
    return call_tnp(frame, obj, name, entry[2], args, kwargs, spec)


# NumPy functions that convert a tensor given as their first argument (the prototype) with
# Tensor.__array__ and return a plain ndarray. (Many others hand a tensor to its own method of the
# same name, ``np.sum(t)`` -> ``t.sum()``, or wrap the result back into a tensor: those stay native.)
_PROTOTYPE_FUNCTIONS = {"np.zeros_like", "np.ones_like", "np.empty_like", "np.full_like"}


def _any_traced(args, kwargs):
    """Whether any argument (at any depth) is something only the run knows."""
    def traced(v):
        if isinstance(v, (NdarrayValue, TensorValue, SymValue)):
            return True
        if isinstance(v, (TupleValue, ListValue)):
            return any(traced(i) for i in v.items)
        if isinstance(v, DictValue):
            return any(traced(i) for i in v.items.values())
        return False
    return any(traced(a) for a in list(args) + list(kwargs.values()))


def _contains_array(x, depth=0):
    if isinstance(x, np.ndarray):
        return True
    if isinstance(x, (tuple, list)) and depth < 3:
        return any(_contains_array(i, depth + 1) for i in x)
    return False


def _fold(frame, obj, name, args, kwargs):
    """A NumPy call on constants run now when it makes no array (``np.sqrt(2.0)``, ``np.dtype('f4')``,
    ``np.prod((2, 3))``); None when it makes one (that is traced, so each call gets its own array)."""
    try:
        cargs = [_fold_arg(a) for a in args]
        ckwargs = {k: _fold_arg(v) for k, v in kwargs.items()}
    except Unsupported:
        return None
    try:
        result = obj(*cargs, **ckwargs)
    except Exception as e:
        raise PythonError(f"{name}() raised {type(e).__name__}: {e}", e) from e
    if _contains_array(result):
        return None
    return constant_value(result)


def _fold_arg(v):
    if isinstance(v, ObjectValue) and (isinstance(v.obj, type) or v.obj is None):
        return v.obj
    value = as_constant(v)
    if isinstance(value, (list, tuple)) and _contains_array(value):
        raise Unsupported("array inside")
    return value


def _call_numpy_type(frame, cls, name, args, kwargs):
    if issubclass(cls, np.generic) and cls not in (np.generic, np.number, np.integer, np.floating,
                                                    np.inexact, np.complexfloating, np.signedinteger,
                                                    np.unsignedinteger):
        if len(args) == 1 and not kwargs and isinstance(args[0], NdarrayValue):
            # np.float32(array): a NumPy scalar from a 0-d array, a new array otherwise.
            a = args[0]
            dt = NUMPY_TO_TORCH.get(np.dtype(cls))
            if dt is None:
                raise unsupported(dtype_unsupported_reason(np.dtype(cls)))
            out = _new_array(frame, nops.astype, [a, ConstantValue(dt)], {}, name)
            out.scalar = a.fake.dim() == 0
            return out
        if not _any_traced(args, kwargs):
            folded = _fold(frame, cls, name, args, kwargs)
            if folded is not None:
                return folded
        raise unsupported(f"{name}() of {', '.join(describe(a) for a in args)} is not traced")
    if cls in (np.dtype, np.finfo, np.iinfo) or issubclass(cls, np.dtype):
        if cls in (np.finfo, np.iinfo) and len(args) == 1 and isinstance(args[0], NdarrayValue):
            args = [ConstantValue(args[0].dtype)]
        folded = _fold(frame, cls, name, args, kwargs)
        if folded is not None:
            return folded
    if cls is np.errstate:
        # Traced code never warns or raises on floating-point errors; only settings that ask for
        # nothing more than that are traced (as a block that does nothing).
        settings = {k: as_constant(v) for k, v in kwargs.items()}
        if args or any(k not in ("all", "divide", "over", "under", "invalid") or v not in ("ignore", "warn", None)
                       for k, v in settings.items()):
            raise unsupported(f"np.errstate({settings}) inside compiled code is not traced (only 'ignore'/'warn')")
        return ContextManagerValue("noop")
    if cls is np.ndarray:
        raise unsupported("np.ndarray(...) (the low-level constructor) is not traced; use np.empty or np.zeros")
    if cls is np.poly1d or (cls.__module__ or "").startswith("numpy.polynomial"):
        raise unsupported("NumPy's polynomial classes (np.poly1d, np.polynomial) are not traced")
    raise unsupported(f"{name} objects are not traced (they run natively)")


# --- ufuncs ----------------------------------------------------------------------------------------


# --- conversions ------------------------------------------------------------------------------------


def _special_asarray(frame, obj, name, args, kwargs):
    bound = bind(obj, name, args, kwargs)
    for k in ("order", "like", "device"):
        v = bound.get(k)
        if v is not None and k != "order" and not _is_default(v):
            raise unsupported(f"{name}(..., {k}=...) is not traced")
    copy = bound.get("copy")
    if name == "np.array":
        copy_flag = True if copy is None else as_constant(copy)
        ndmin = bound.get("ndmin")
        if ndmin is not None and as_constant(ndmin):
            raise unsupported("np.array(..., ndmin=...) is not traced")
        if copy_flag is not True:
            raise unsupported("np.array(..., copy=False/None) is not traced")
        return asarray_value(frame, bound.get("object"), bound.get("dtype"), name, copy=True)
    if copy is not None and as_constant(copy) is not None:
        raise unsupported(f"{name}(..., copy=...) is not traced")
    first = next(iter(bound.values()))
    result = asarray_value(frame, first, bound.get("dtype"), name)
    if name == "np.ascontiguousarray" and isinstance(result, NdarrayValue) and not result.fake.is_contiguous():
        return _new_array(frame, nops.method("copy"), [result], {}, name)
    return result


def _special_copy(frame, obj, name, args, kwargs):
    bound = bind(obj, name, args, kwargs)
    a = bound.get("a")
    if not isinstance(a, NdarrayValue):
        return asarray_value(frame, a, None, name, copy=True)
    return _new_array(frame, nops.method("copy"), [a], {}, name)


def _special_dtype_query(frame, obj, name, args, kwargs):
    """Functions that look at dtypes only (np.result_type, np.can_cast...): run on the dtypes."""
    def stand_in(v):
        if isinstance(v, NdarrayValue):
            return ConstantValue(v.dtype)
        return v
    folded = _fold(frame, obj, name, [stand_in(a) for a in args], {k: stand_in(v) for k, v in kwargs.items()})
    if folded is None:
        raise unsupported(f"{name} is not traced here")
    return folded


def shape_value(frame, a):
    """``a.shape``: a tuple of ints, with symbolic sizes where the array's are."""
    shape = a.fake.shape
    if not any(isinstance(n, torch.SymInt) for n in shape):
        return ConstantValue(tuple(shape))
    t = array_as_tensor(a)
    return TupleValue([frame.tx.graph.size_value(t, d) for d in range(len(shape))])


def len_value(frame, a):
    """``len(a)``."""
    length(a)
    return frame.tx.graph.size_value(array_as_tensor(a), 0)


def _special_shape(frame, obj, name, args, kwargs):
    a = args[0] if args else None
    if isinstance(a, NdarrayValue) and name == "np.size":
        return _size(frame, a, bind(obj, name, args, kwargs).get("axis"))
    if isinstance(a, NdarrayValue) and len(args) == 1 and not kwargs:
        if name == "np.shape":
            return shape_value(frame, a)
        if name == "np.ndim":
            return ConstantValue(a.fake.dim())
    raise unsupported(f"{name} of {describe(a)} is not traced")


def _size(frame, a, axis):
    """``np.size(a, axis)``: the product of the sizes along ``axis`` (an int or, since NumPy 2.4, a
    tuple of ints), symbolic where those sizes are."""
    if axis is None or _is_default(axis):
        return array_attr(frame, a, "size")
    try:
        axes = np.lib.array_utils.normalize_axis_tuple(as_constant(axis), a.fake.dim(), allow_duplicate=False)
    except (TypeError, ValueError) as e:     # NumPy raises it natively, with its own message
        raise unsupported(f"np.size(..., axis={as_constant(axis)!r}) raises {type(e).__name__} in NumPy") from None
    shape = shape_value(frame, a)
    sizes = [ConstantValue(shape.value[d]) for d in axes] if isinstance(shape, ConstantValue) \
        else [shape.items[d] for d in axes]
    result = ConstantValue(1)
    for n in sizes:
        if isinstance(result, ConstantValue) and isinstance(n, ConstantValue):
            result = ConstantValue(result.value * n.value)
        else:
            result = frame.tx.graph.sym_call(operator.mul, [result, n])
    return result


def _special_isscalar(frame, obj, name, args, kwargs):
    a = args[0]
    if isinstance(a, NdarrayValue):
        return ConstantValue(a.scalar)
    return _special_dtype_query(frame, obj, name, args, kwargs)


def _special_iscomplexobj(frame, obj, name, args, kwargs):
    a = args[0]
    if isinstance(a, NdarrayValue):
        kind = a.dtype.kind
        return ConstantValue(kind == "c" if name == "np.iscomplexobj" else kind != "c")
    return _special_dtype_query(frame, obj, name, args, kwargs)


def _special_fix(frame, obj, name, args, kwargs):
    """np.fix rounds toward zero: np.trunc's loops (torch._numpy's rounds to nearest)."""
    bound = bind(obj, name, args, kwargs)
    if bound.get("out") is not None:
        raise unsupported("np.fix(..., out=...) is not traced")
    return call_ufunc(frame, np.trunc, [bound["x"]], {})


def _special_angle(frame, obj, name, args, kwargs):
    """np.angle as NumPy writes it: arctan2 of the imaginary and real parts (or of 0 and z)."""
    bound = bind(obj, name, args, kwargs)
    z = bound["z"]
    if not isinstance(z, NdarrayValue):
        raise unsupported(f"{name} of {describe(z)} is not traced")
    if z.dtype.kind == "c":
        a = call_ufunc(frame, np.arctan2, [array_attr(frame, z, "imag"), array_attr(frame, z, "real")], {})
    else:
        a = call_ufunc(frame, np.arctan2, [ConstantValue(0), z], {})
    deg = bound.get("deg")
    if deg is not None and as_constant(deg):
        a = call_ufunc(frame, np.multiply, [a, ConstantValue(180 / np.pi)], {})
    return a


_ARRAY_MAKERS = {"np.asarray", "np.array", "np.asanyarray", "np.ascontiguousarray", "np.copy"}

_SPECIAL = {
    "np.asarray": _special_asarray, "np.array": _special_asarray, "np.asanyarray": _special_asarray,
    "np.ascontiguousarray": _special_asarray, "np.copy": _special_copy,
    "np.result_type": _special_dtype_query, "np.can_cast": _special_dtype_query,
    "np.promote_types": _special_dtype_query, "np.issubdtype": _special_dtype_query,
    "np.shape": _special_shape, "np.ndim": _special_shape, "np.size": _special_shape,
    "np.isscalar": _special_isscalar, "np.iscomplexobj": _special_iscomplexobj,
    "np.isrealobj": _special_iscomplexobj, "np.fix": _special_fix, "np.angle": _special_angle,
}


# --- arrays: attributes, methods, operators, indexing ----------------------------------------------

_META = {"ndim", "size", "itemsize", "nbytes"}
_NOT_TRACED_ATTRS = {"ctypes": "ndarray.ctypes is not traced", "flags": "ndarray.flags is not traced",
                     "strides": "ndarray.strides of an array a NumPy operation made is not traced (torch may lay it out "
                                "otherwise than NumPy; the strides of argument arrays and of t.numpy() are)",
                     "base": "ndarray.base is not traced", "data": "ndarray.data (the buffer) is not traced",
                     "flat": "ndarray.flat is not traced (use ravel())",
                     "__array_interface__": "__array_interface__ is not traced",
                     "__array_struct__": "__array_struct__ is not traced"}
_ATTR_ARRAYS = {"T": "T", "mT": "mT", "real": "real", "imag": "imag"}


def array_attr(frame: RunningFrame, a: NdarrayValue, name: str) -> Value:
    """``a.name`` for a traced array."""
    if name == "shape":
        return shape_value(frame, a)
    if name == "dtype":
        return ConstantValue(a.dtype)
    if name == "size" and isinstance(a.fake.numel(), torch.SymInt):
        return frame.tx.graph.call("call_method", "numel", [array_as_tensor(a)], {})
    if name in _META:
        fake = a.fake
        return ConstantValue({"ndim": fake.dim(), "size": fake.numel(), "itemsize": fake.element_size(),
                              "nbytes": fake.numel() * fake.element_size()}[name])
    if name == "__class__":
        return ObjectValue(a.python_type())
    if name == "strides" and a.strides is not None:
        return ConstantValue(a.strides)
    if name in _NOT_TRACED_ATTRS:
        raise unsupported(_NOT_TRACED_ATTRS[name])
    if name in _ATTR_ARRAYS:
        if name == "mT":
            return _new_array(frame, nops.function("swapaxes", nops.tnp.swapaxes),
                              [a, ConstantValue(-1), ConstantValue(-2)], {}, "ndarray.mT", scalar=a.scalar)
        return _new_array(frame, nops.attr(name), [a], {}, f"ndarray.{name}", scalar=a.scalar)
    owner = a.python_type()
    if not hasattr(owner, name):
        raise MissingAttribute(f"{no_attr_name(owner)} object has no attribute {name!r}")
    attr = getattr(owner, name)
    if callable(attr):
        return NdarrayMethodValue(a, name)
    raise unsupported(f"ndarray.{name} is not traced")


# Array methods that are NumPy functions with the array as first argument.
_METHOD_FUNCTIONS = {
    "sum": np.sum, "prod": np.prod, "mean": np.mean, "std": np.std, "var": np.var, "max": np.max,
    "min": np.min, "argmax": np.argmax, "argmin": np.argmin, "all": np.all, "any": np.any,
    "cumsum": np.cumsum, "cumprod": np.cumprod, "clip": np.clip, "round": np.round, "trace": np.trace,
    "diagonal": np.diagonal, "dot": np.dot, "repeat": np.repeat, "squeeze": np.squeeze,
    "swapaxes": np.swapaxes, "take": np.take, "ravel": np.ravel, "conj": np.conjugate,
    "conjugate": np.conjugate, "searchsorted": np.searchsorted, "argsort": np.argsort,
}
_DATA_METHODS = {"item", "tolist", "tobytes", "tostring", "__bool__", "__int__", "__float__", "__index__",
                 "__complex__", "nonzero", "__array__", "__dlpack__", "tofile", "dump", "dumps", "__reduce__",
                 "__format__", "__str__", "__repr__"}


def call_array_method(frame, a, name, args, kwargs):
    """``a.name(*args, **kwargs)`` for a traced array."""
    _enabled(f"ndarray.{name}")
    if name in _DATA_METHODS:
        raise unsupported(f"ndarray.{name}() needs the array's data, which is unknown while tracing",
                          hint=DATA_HINT)
    fn = _METHOD_FUNCTIONS.get(name)
    if fn is not None:
        return call_numpy(frame, ObjectValue(fn), [a] + list(args), kwargs)
    if name == "astype":
        if not args and "dtype" not in kwargs:
            raise PythonError("astype() missing required argument 'dtype'", TypeError("astype() missing 'dtype'"))
        dtype = args[0] if args else kwargs["dtype"]
        for k in ("order", "casting", "subok", "copy"):
            if k in kwargs and k != "order":
                value = as_constant(kwargs[k])
                if (k, value) not in (("casting", "unsafe"), ("subok", True), ("copy", True)):
                    raise unsupported(f"ndarray.astype(..., {k}={value!r}) is not traced")
        dt = _dtype_of(dtype)
        if dtype_unsupported_reason(dt):
            raise unsupported(dtype_unsupported_reason(dt))
        return _new_array(frame, nops.astype, [a, ConstantValue(NUMPY_TO_TORCH[dt])], {}, "ndarray.astype")
    if name == "copy":
        if args or any(k != "order" for k in kwargs):
            raise unsupported("ndarray.copy(...) with arguments is not traced")
        return _new_array(frame, nops.method("copy"), [a], {}, "ndarray.copy")
    if name in ("reshape", "transpose"):
        if kwargs and set(kwargs) - {"order"} or "order" in kwargs and as_constant(kwargs["order"]) != "C":
            raise unsupported(f"ndarray.{name}(..., {', '.join(kwargs)}=...) is not traced")
        parts = [ConstantValue(_plain(as_constant(x))) if not isinstance(x, SymValue) else x for x in args]
        return _new_array(frame, nops.method(name), [a] + parts, {}, f"ndarray.{name}", scalar=False)
    if name == "flatten":
        return _new_array(frame, nops.method("flatten"), [a], {}, "ndarray.flatten")
    if name == "view":
        if len(args) != 1 or kwargs:
            raise unsupported("ndarray.view(...) other than view(dtype) is not traced")
        dt = _dtype_of(args[0])
        if dt != a.dtype:
            raise unsupported("ndarray.view(dtype) reinterpreting bytes is not traced")
        return _new_array(frame, nops.method("view"), [a], {}, "ndarray.view")
    if name in ("fill", "sort", "put"):
        check_writable(frame, a, f"ndarray.{name}()")
        if name == "sort" and a.dtype.kind == "c":
            raise unsupported("sorting complex arrays is not traced")
        if name == "sort" and (len(args) > 1 or set(kwargs) - {"axis"}):
            raise unsupported("ndarray.sort(...) with kind/order is not traced")
        converted = [_graph_arg(frame, x, True) for x in args]
        ckwargs = {k: _graph_arg(frame, v, False) for k, v in kwargs.items()}
        _device_guard(frame)
        _graph_call(frame, nops.method(name, in_place=True), [a] + converted, ckwargs, f"ndarray.{name}")
        return ConstantValue(None)
    dunder = _DUNDER_OPS.get(name)
    if dunder is not None:
        kind, op = dunder
        if kind == "binary":
            return binary(frame, op, a, args[0])
        if kind == "rbinary":
            return binary(frame, op, args[0], a)
        if kind == "compare":
            return compare(frame, op, a, args[0])
        return unary(frame, op, a)
    if name == "__getitem__":
        return getitem(frame, a, args[0])
    if name == "__setitem__":
        setitem(frame, a, args[0], args[1])
        return ConstantValue(None)
    if name == "__len__":
        return len_value(frame, a)
    raise unsupported(f"ndarray.{name}() is not traced yet")


# --- operators --------------------------------------------------------------------------------------

BINARY_UFUNCS = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.true_divide, "//": np.floor_divide,
                 "%": np.remainder, "**": np.power, "@": np.matmul, "&": np.bitwise_and, "|": np.bitwise_or,
                 "^": np.bitwise_xor, "<<": np.left_shift, ">>": np.right_shift}
COMPARE_UFUNCS = {"<": np.less, "<=": np.less_equal, "==": np.equal, "!=": np.not_equal, ">": np.greater,
                  ">=": np.greater_equal}
UNARY_UFUNCS = {operator.neg: np.negative, operator.pos: np.positive, operator.invert: np.invert,
                operator.abs: np.absolute, abs: np.absolute}
# Tensor (left) op array (right): torch converts the array and gives a tensor (checked against eager);
# other mixes NumPy and torch resolve in ways left to eager.
_TENSOR_LEFT_OPS = {"+", "-", "*", "//", "%", "**", "&", "|", "^", "<<", ">>", "@"}
_TORCH_BINARY = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv,
                 "%": operator.mod, "**": operator.pow, "&": operator.and_, "|": operator.or_,
                 "^": operator.xor, "<<": operator.lshift, ">>": operator.rshift, "@": operator.matmul}
_DUNDER_OPS = {}
for _op, _uf in BINARY_UFUNCS.items():
    _n = {"+": "add", "-": "sub", "*": "mul", "/": "truediv", "//": "floordiv", "%": "mod", "**": "pow",
          "@": "matmul", "&": "and", "|": "or", "^": "xor", "<<": "lshift", ">>": "rshift"}[_op]
    _DUNDER_OPS[f"__{_n}__"] = ("binary", _op)
    _DUNDER_OPS[f"__r{_n}__"] = ("rbinary", _op)
    _DUNDER_OPS[f"__i{_n}__"] = ("binary", _op + "=")
for _op, _n in {"<": "lt", "<=": "le", "==": "eq", "!=": "ne", ">": "gt", ">=": "ge"}.items():
    _DUNDER_OPS[f"__{_n}__"] = ("compare", _op)
_DUNDER_OPS.update({"__neg__": ("unary", operator.neg), "__pos__": ("unary", operator.pos),
                    "__invert__": ("unary", operator.invert), "__abs__": ("unary", operator.abs)})


def _foreign(v):
    if is_numpy_object(v):
        raise unsupported(numpy_object_reason(v.obj))


def binary(frame, op, a, b):
    """``a op b`` where an operand is an array (or a NumPy object that is not traced)."""
    _foreign(a)
    _foreign(b)
    _enabled(f"operator {op}")
    inplace = op.endswith("=")
    base = op[:-1] if inplace else op
    if isinstance(a, TensorValue) or isinstance(b, TensorValue):
        if isinstance(a, TensorValue) and isinstance(b, NdarrayValue) and not inplace and base in _TENSOR_LEFT_OPS:
            return frame.tx.graph.call("call_function", _TORCH_BINARY[base], [a, array_as_tensor(b)], {})
        raise unsupported(f"{describe(a)} {op} {describe(b)}: mixing a tensor and a NumPy array here is left to eager "
                          "(NumPy and torch resolve it in their own ways)",
                          hint="convert explicitly: torch.from_numpy(a) or t.numpy()")
    uf = BINARY_UFUNCS[base]
    operands = [a, b]
    if base == "**" and isinstance(b, ConstantValue) and type(b.value) is int and b.value == 2:
        uf, operands = np.square, [a]    # ndarray.__pow__'s own fast path (bool ** 2 is int8)
    if inplace and isinstance(a, NdarrayValue) and not a.scalar:
        return call_ufunc(frame, uf, operands, {"out": a})
    return call_ufunc(frame, uf, operands, {})


def compare(frame, op, a, b):
    _foreign(a)
    _foreign(b)
    _enabled(f"comparison {op}")
    if isinstance(a, TensorValue) or isinstance(b, TensorValue):
        raise unsupported("comparing a tensor with a NumPy array is left to eager",
                          hint="convert explicitly: torch.from_numpy(a) or t.numpy()")
    for v in (a, b):
        if isinstance(v, ConstantValue) and v.value is None:
            raise unsupported("comparing an array with None is not traced")
    return call_ufunc(frame, COMPARE_UFUNCS[op], [a, b], {})


def unary(frame, fn, a):
    _foreign(a)
    _enabled("a unary operator")
    uf = UNARY_UFUNCS.get(fn)
    if uf is None:
        raise unsupported(f"{getattr(fn, '__name__', fn)} of an array is not traced")
    return call_ufunc(frame, uf, [a], {})


def truth(a):
    _foreign(a)
    raise unsupported("the truth value of a NumPy array (data-dependent control flow)", hint=DATA_HINT)


def length(a):
    _foreign(a)
    if a.fake.dim() == 0:
        raise unsupported("len() of a 0-d array (eager raises TypeError)")
    n = a.fake.shape[0]
    return n


def iterate(frame, a):
    _foreign(a)
    if a.fake.dim() == 0:
        raise unsupported("iterating over a 0-d array (eager raises TypeError)")
    return [getitem(frame, a, ConstantValue(i)) for i in range(int(a.fake.shape[0]))]


def _index(frame, v):
    """An index as the graph gets it; also (has Ellipsis, has a negative step)."""
    if isinstance(v, NdarrayValue):
        return v, False, False
    if isinstance(v, TensorValue):
        raise unsupported("indexing a NumPy array with a torch.Tensor is left to eager")
    if is_numpy_object(v):
        raise unsupported(numpy_object_reason(v.obj))
    if isinstance(v, SymValue):
        return v, False, False
    if isinstance(v, SliceValue):
        step = v.step
        neg = isinstance(step, ConstantValue) and isinstance(step.value, int) and step.value < 0
        if isinstance(step, SymValue):
            raise unsupported("a slice with a symbolic step over an array is not traced")
        if any(isinstance(p, NdarrayValue) for p in (v.start, v.stop, v.step)):
            raise unsupported("a NumPy array or scalar the graph computes (or takes as an input) as a slice bound: "
                              "its value decides the result's shape", hint=DATA_HINT)
        return SliceValue(*[ConstantValue(_plain(p.value)) if isinstance(p, ConstantValue) else p
                            for p in (v.start, v.stop, v.step)]), False, neg
    if isinstance(v, ConstantValue):
        value = v.value
        if isinstance(value, np.ndarray):
            raise unsupported("an array constant as an index")
        plain = _plain(value)
        ell = value is Ellipsis or isinstance(value, tuple) and any(x is Ellipsis for x in value)
        neg = any(isinstance(x, slice) and x.step is not None and x.step < 0
                  for x in (value if isinstance(value, tuple) else (value,)))
        return ConstantValue(plain), ell, neg
    if isinstance(v, TupleValue):
        parts = [_index(frame, i) for i in v.items]
        return (TupleValue([p[0] for p in parts]), any(p[1] for p in parts), any(p[2] for p in parts))
    if isinstance(v, ListValue):
        parts = [_index(frame, i) for i in v.items]
        return ListValue([p[0] for p in parts]), False, False
    raise unsupported(f"indexing an array with {describe(v)} is not traced")


def getitem(frame, a, index):
    _foreign(a)
    _enabled("array indexing")
    if not isinstance(a, NdarrayValue):
        raise unsupported(f"indexing {describe(a)} with a NumPy array or scalar is left to eager",
                          hint="convert the index with torch.from_numpy, or int() it outside the compiled code")
    idx, has_ellipsis, negative = _index(frame, index)
    result = _new_array(frame, nops.getitem, [a, idx], {}, "array indexing", scalar=not has_ellipsis)
    if negative:
        try:
            recipe = (operator.getitem, [a, ConstantValue(as_constant(idx))], {})
        except Unsupported:
            recipe = None     # a symbolic bound: the view cannot be made again outside the graph
        mark_reversed(frame, a, result, recipe)
    return result


def setitem(frame, a, index, value):
    _foreign(a)
    _foreign(value)
    _enabled("array item assignment")
    if not isinstance(a, NdarrayValue):
        raise unsupported(f"assigning into {describe(a)} with a NumPy array index or value is left to eager",
                          hint="convert with torch.from_numpy")
    check_writable(frame, a, "array item assignment")
    idx, _, negative = _index(frame, index)
    if negative:
        raise unsupported("assigning through a negative-step slice of an array is not traced")
    if isinstance(value, TensorValue):
        raise unsupported("assigning a torch.Tensor into a NumPy array is left to eager")
    if isinstance(value, (ListValue, TupleValue)) or isinstance(value, ConstantValue) and isinstance(
            value.value, (list, tuple)):
        value = asarray_value(frame, value, None, "np.asarray")
    elif isinstance(value, ConstantValue):
        if isinstance(value.value, np.generic):
            value = ConstantValue(_plain(value.value))
        if not isinstance(value.value, (bool, int, float, complex)):
            raise unsupported(f"assigning {describe(value)} into an array is not traced")
    elif not isinstance(value, (NdarrayValue, SymValue)):
        raise unsupported(f"assigning {describe(value)} into an array is not traced")
    _device_guard(frame)
    _graph_call(frame, nops.setitem_, [a, idx, value], {}, "array item assignment")


# --- wrap_numpy -----------------------------------------------------------------------------------


