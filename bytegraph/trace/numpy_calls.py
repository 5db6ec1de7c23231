"""NumPy in the trace: what NumPy code does with arrays (``values.arrays.NdarrayValue``).

NumPy functions, ufuncs, array methods, attributes, operators, indexing and iteration
on arrays become graph nodes (``graph/numpy_ops.py``) with NumPy's semantics: dtypes as
NumPy resolves them (ufuncs through NumPy's own ``resolve_dtypes``, NEP 50), results
returned as ``np.ndarray`` where eager NumPy returns one and as NumPy scalars where it
returns those. NumPy calls on constants only are run now (folded) unless they make an
array. Conversions between tensors and arrays (``t.numpy()``, ``torch.from_numpy``,
``np.asarray(t)``, ``torch.as_tensor(a)``) are the same graph value seen as the other
kind, so mixed programs stay in one graph.

What is not traced breaks the graph with a reason and runs natively (FAQ, "fall-backs"):
non-numeric and unsupported dtypes, ndarray subclasses and masked arrays, ufunc methods
(``np.add.reduce``) and esoteric ufunc arguments, ``np.poly1d``/``np.polynomial``,
objects with ``__array_function__``-style protocols, ``.ctypes``, random numbers, and any
function without a checked implementation (``TRACED``).
"""
import inspect
import operator
import types

import numpy as np
import torch

from ..config import config
from ..errors import Unsupported
from ..graph import numpy_ops as nops
from ..guards import builder as g
from ..guards.sources import AttrSource
from ..values.arrays import (NUMPY_TO_TORCH, TORCH_TO_NUMPY, UNREBUILDABLE, NdarrayMethodValue, NdarrayValue,
                             dtype_unsupported_reason, unsupported_reason)
from ..values.base import (ConstantValue, ContextManagerValue, DictValue, ListValue, ObjectValue, SliceValue, SymValue,
                           TensorValue, TupleValue, UserObjectValue)
from ..values.builder import wrap
from . import ops
from .basics import as_constant, constant_value, describe, no_attr_name
from .exceptions import MissingAttribute, PythonError

DATA_HINT = ("keep it an array (np.where instead of an if, x.sum() instead of float(x.sum())), or move "
             "this out of the compiled function; without fullgraph=True it runs natively at a graph break")
NATIVE_HINT = "without fullgraph=True it runs natively (eager NumPy) at a graph break"


def unsupported(reason, hint=NATIVE_HINT):
    return Unsupported(reason, hint=hint)


# --- what is NumPy's -----------------------------------------------------------------------------

def _numpy_module(name):
    return name == "numpy" or name.startswith("numpy.")


def is_numpy_callable(obj):
    """A NumPy function, ufunc, class (``np.float32``, ``np.poly1d``) or a method bound to a
    NumPy object (``rng.normal``, ``np.add.reduce``, ``np.random.rand``)."""
    if isinstance(obj, np.ufunc):
        return True
    if isinstance(obj, type):
        return _numpy_module(obj.__module__ or "")
    if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                        types.BuiltinMethodType, types.MethodWrapperType)) or callable(obj):
        owner = getattr(obj, "__self__", None)
        if owner is not None and not isinstance(owner, types.ModuleType):
            return isinstance(owner, (np.ndarray, np.generic, np.ufunc)) or _numpy_module(type(owner).__module__)
        return _numpy_module(getattr(obj, "__module__", None) or "")
    return False


def is_numpy_object(v):
    """An ObjectValue holding a NumPy object that is not traced: an array of an unsupported kind,
    a scalar of an unsupported dtype, a poly1d, a random generator..."""
    if not isinstance(v, ObjectValue):
        return False
    obj = v.obj
    if isinstance(obj, (np.ndarray, np.generic)):
        return True
    return _numpy_module(type(obj).__module__ or "") and not _is_function_like(obj)


def _is_function_like(obj):
    """NumPy functions and types (``np.sum`` is an ``_ArrayFunctionDispatcher``), not NumPy objects."""
    return isinstance(obj, (type, types.ModuleType, np.ufunc, types.FunctionType, types.BuiltinFunctionType,
                            types.MethodType, types.BuiltinMethodType)) or hasattr(obj, "_implementation")


def numpy_object_reason(obj):
    if isinstance(obj, np.ndarray):
        return unsupported_reason(obj) or "this array is not traced"
    if isinstance(obj, np.generic):
        return dtype_unsupported_reason(obj.dtype) or "this NumPy scalar is not traced"
    if isinstance(obj, (np.random.Generator, np.random.RandomState, np.random.BitGenerator)):
        return f"NumPy's random number generators ({type(obj).__name__}) run natively: their state lives outside the graph"
    if isinstance(obj, np.poly1d) or type(obj).__module__.startswith("numpy.polynomial"):
        return "NumPy's polynomial classes (np.poly1d, np.polynomial) are not traced"
    return f"NumPy {type(obj).__qualname__} objects are not traced"


def _protocol_object(v):
    """A user object NumPy would convert through __array__/__array_function__/... protocols."""
    cls = v.obj.__class__ if isinstance(v, ObjectValue) else v.cls if isinstance(v, UserObjectValue) else None
    if cls is None:
        return False
    return any(hasattr(cls, p) for p in ("__array__", "__array_function__", "__array_ufunc__",
                                         "__array_interface__", "__array_struct__", "__array_wrap__"))


def object_attr(frame, v, name):
    """``obj.name`` of a NumPy object that is not traced: its methods are the real bound methods
    (calling one is a graph break with the reason, never an inlined NumPy internal), other
    attributes are read as usual (None)."""
    try:
        value = getattr(v.obj, name)
    except AttributeError:
        raise MissingAttribute(f"{no_attr_name(type(v.obj))} object has no attribute {name!r}") from None
    except Exception:
        return None
    if callable(value) and not isinstance(value, type):
        # Read again on each call (a bound method is made per read); calling it breaks the graph.
        return ObjectValue(value, AttrSource(v.source, name) if v.source is not None else None)
    return None


def involves_arrays(*values):
    return any(isinstance(v, NdarrayValue) or is_numpy_object(v) for v in values)


def _enabled(what):
    if not config.trace_numpy:
        raise Unsupported(f"{what}: NumPy tracing is off (bytegraph.config.trace_numpy is False)",
                          hint="set bytegraph.config.trace_numpy = True (and call bytegraph.reset()) to trace "
                               "NumPy code; while it is off, NumPy runs natively at graph breaks")


def _device_guard(frame):
    """Arrays live on the default device (``with torch.device(...)``): the trace relies on it."""
    device = g.default_device()
    frame.tx.guards.add(g.GLOBAL_STATE, None, ("_default_device()", device), "default device")
    return device


# --- values <-> graph ----------------------------------------------------------------------------

class _Scratch(TensorValue):
    """An array passed to the graph builder as the tensor it is (same node and fake)."""
    __slots__ = ("array",)


def _as_tensor_values(x):
    if isinstance(x, NdarrayValue):
        t = _Scratch(x.node, x.fake)
        t.array = x
        return t
    if isinstance(x, TupleValue):
        return TupleValue([_as_tensor_values(i) for i in x.items], cls=x.cls)
    if isinstance(x, ListValue):
        return ListValue([_as_tensor_values(i) for i in x.items])
    if isinstance(x, SliceValue):
        return SliceValue(*[_as_tensor_values(p) for p in (x.start, x.stop, x.step)])
    return x


def _graph_call(frame, target, args, kwargs, what):
    args = [_as_tensor_values(a) for a in args]
    kwargs = {k: _as_tensor_values(v) for k, v in kwargs.items()}
    _probe_kernels(target, args, kwargs, what)
    return frame.tx.graph.call("call_function", target, args, kwargs, describe=what)


# Dtypes some torch kernels lack (on the CPU especially); fake tensors do not know it.
_PROBED_DTYPES = {torch.bool, torch.float16, torch.complex64, torch.complex128, torch.int8, torch.int16,
                  torch.uint8}
_probed = {}


def _probe_kernels(target, args, kwargs, what):
    """Run the op once on real zeros of the same shapes and dtypes when a dtype some kernels lack
    is involved: a kernel missing for a dtype must be a fall-back now, not an error at run time."""
    fakes = []

    def collect(x):
        if isinstance(x, TensorValue):
            fakes.append(x.fake)
        elif isinstance(x, (TupleValue, ListValue)):
            for i in x.items:
                collect(i)
        elif isinstance(x, SliceValue):
            for p in (x.start, x.stop, x.step):
                collect(p)
        elif isinstance(x, SymValue):
            fakes.append(None)
    for a in list(args) + list(kwargs.values()):
        collect(a)
    if None in fakes or not any(f.dtype in _PROBED_DTYPES for f in fakes):
        return
    if any(isinstance(n, torch.SymInt) for f in fakes for n in f.shape):
        return
    key = (target, tuple((f.dtype, f.dim()) for f in fakes), repr([_constant_repr(a) for a in args]),
           repr({k: _constant_repr(v) for k, v in kwargs.items()}))
    verdict = _probed.get(key)
    if verdict is None:
        verdict = _run_probe(target, args, kwargs)
        _probed[key] = verdict
    if verdict is not True:
        raise unsupported(f"{what} is not implemented by torch for these dtypes ({verdict})")


def _constant_repr(v):
    if isinstance(v, TensorValue):
        return "T"
    if isinstance(v, (TupleValue, ListValue)):
        return [_constant_repr(i) for i in v.items]
    if isinstance(v, ConstantValue):
        return repr(v.value)
    return type(v).__name__


def _run_probe(target, args, kwargs):
    elementwise = isinstance(target, nops.Ufunc)     # the size does not matter: one element each

    def real(x):
        if isinstance(x, TensorValue):
            shape = (1,) * x.fake.dim() if elementwise else x.fake.shape
            return torch.zeros(shape, dtype=x.fake.dtype, device=x.fake.device)
        if isinstance(x, TupleValue):
            return tuple(real(i) for i in x.items)
        if isinstance(x, ListValue):
            return [real(i) for i in x.items]
        if isinstance(x, SliceValue):
            return slice(real(x.start), real(x.stop), real(x.step))
        if isinstance(x, ConstantValue):
            return x.value
        raise TypeError(type(x).__name__)
    try:
        rargs = [real(a) for a in args]
        rkwargs = {k: real(v) for k, v in kwargs.items()}
    except TypeError:
        return True
    try:
        with torch.no_grad():
            target(*rargs, **rkwargs)
    except NotImplementedError as e:
        return str(e).splitlines()[0]
    except RuntimeError as e:
        text = str(e)
        if "not implemented" in text or "not supported" in text:
            return text.splitlines()[0]
    except Exception:
        pass
    return True


def _array(result, scalar=False):
    """Graph results as arrays: tensors become NdarrayValues (0-d ones NumPy scalars when ``scalar``)."""
    if isinstance(result, _Scratch):
        return result.array
    if isinstance(result, TensorValue):
        return NdarrayValue(result.node, result.fake, scalar=scalar and result.fake.dim() == 0)
    if isinstance(result, TupleValue):
        return TupleValue([_array(i, scalar) for i in result.items], cls=result.cls)
    if isinstance(result, ListValue):
        return ListValue([_array(i, scalar) for i in result.items])
    if isinstance(result, ConstantValue) and isinstance(result.value, tuple) and any(
            isinstance(i, np.dtype) for i in result.value):
        return result
    return result


def _new_array(frame, target, args, kwargs, what, scalar=False):
    _device_guard(frame)
    result = _array(_graph_call(frame, target, args, kwargs, what), scalar)
    if frame.tx.reversed_copies:
        # A view of a negative-stride copy (x[::-1][1:]) cannot be made again as eager's view.
        for v in result.items if isinstance(result, TupleValue) else [result]:
            if isinstance(v, NdarrayValue) and v.view_of is None and storage_key(v.fake) in frame.tx.reversed_copies:
                v.view_of = UNREBUILDABLE
    return result


def _dtype_name(dtype):
    d = np.dtype(dtype)
    reason = dtype_unsupported_reason(d)
    if reason is not None:
        raise unsupported(reason)
    return d.name


def _is_dtype_like(v):
    if isinstance(v, ObjectValue) and isinstance(v.obj, type):
        return issubclass(v.obj, (np.generic, int, float, complex, bool))
    return isinstance(v, ConstantValue) and isinstance(v.value, (np.dtype,))


def _dtype_of(v):
    obj = v.obj if isinstance(v, ObjectValue) else as_constant(v)
    if obj is None:
        return None
    try:
        return np.dtype(obj)
    except TypeError as e:
        raise unsupported(f"{obj!r} is not a NumPy dtype: {e}") from None


def _numpy_scalar_array(frame, value):
    """A NumPy scalar constant as a 0-d array in the graph (NEP 50: it promotes like an array)."""
    reason = dtype_unsupported_reason(value.dtype)
    if reason is not None:
        raise unsupported(reason)
    return _new_array(frame, nops.function("asarray", nops.tnp.asarray),
                      [ConstantValue(value.item())], {"dtype": ConstantValue(value.dtype.name)},
                      "np.asarray", scalar=True)


def _plain(x):
    """NumPy scalars inside constants as Python numbers (what the graph can hold)."""
    if isinstance(x, np.generic):
        if isinstance(x, np.bool_):
            return bool(x)
        return x.item()
    if isinstance(x, tuple):
        return tuple(_plain(i) for i in x)
    if isinstance(x, list):
        return [_plain(i) for i in x]
    if isinstance(x, np.dtype):
        return _dtype_name(x)
    return x


def _graph_arg(frame, v, array_like):
    """A value as the argument of a torch._numpy call (``array_like``: the parameter takes arrays)."""
    if isinstance(v, NdarrayValue):
        return v
    if isinstance(v, TensorValue):
        raise unsupported("a torch.Tensor passed to a NumPy function (NumPy converts it natively)",
                          hint="convert it explicitly with t.numpy() or np.asarray(t) to trace it")
    if is_numpy_object(v):
        raise unsupported(numpy_object_reason(v.obj))
    if _is_dtype_like(v):
        return ConstantValue(_dtype_name(_dtype_of(v)))
    if isinstance(v, ConstantValue):
        value = v.value
        if isinstance(value, np.generic):
            if array_like:
                return _numpy_scalar_array(frame, value)
            return ConstantValue(_plain(value))
        if isinstance(value, np.ndarray):
            raise unsupported("an array constant made while tracing")
        return ConstantValue(_plain(value))
    if isinstance(v, (TupleValue, ListValue)):
        items = [_graph_arg(frame, i, array_like) for i in v.items]
        return TupleValue(items, cls=v.cls if v.cls is not torch.Size else tuple) if isinstance(v, TupleValue) \
            else ListValue(items)
    if isinstance(v, (SymValue, SliceValue)):
        return v
    if isinstance(v, (UserObjectValue, ObjectValue)):
        if _protocol_object(v):
            raise unsupported(f"{describe(v)} converts through __array__/__array_function__ protocols, which are "
                              "not traced")
        if isinstance(v, ObjectValue) and v.obj is None or isinstance(v, ObjectValue) and v.obj is Ellipsis:
            return ConstantValue(v.obj)
    raise unsupported(f"{describe(v)} as an argument of a NumPy function is not traced")


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


def call_numpy(frame, fv, args, kwargs):
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
    entry = nops.counterpart(obj)
    if entry is None or spec is None:
        raise unsupported(f"{name} is not traced yet (no checked torch._numpy implementation)")
    return call_tnp(frame, obj, name, entry[2], args, kwargs, spec)


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


def check_writable(frame, a, what):
    """``a`` is about to be changed in place: refuse what eager NumPy would do differently."""
    if a.scalar:
        raise unsupported(f"{what}: the target is a NumPy scalar in eager NumPy (immutable)")
    storage = storage_key(a.fake)
    if a.view_of is not None or storage in frame.tx.reversed_copies:
        raise unsupported(f"{what}: the array is a negative-stride view in eager NumPy (a copy here), so "
                          "writing to it would not reach the array it views")
    if storage in frame.tx.reversed_bases:
        raise unsupported(f"{what}: a negative-stride view of this array was taken (a copy here); writing to "
                          "the array would not reach it")
    for inp in frame.tx.graph.inputs:
        if inp.array_mode is not None and not inp.writeable and storage_key(inp.node.meta["example_value"]) == storage:
            raise unsupported(f"{what}: assignment destination is read-only")


# --- torch._numpy functions ------------------------------------------------------------------------

class Spec:
    """How a traced NumPy function's results look: ``array``: a 0-d result stays an array (else it is
    a NumPy scalar, as NumPy returns for reductions and the like); ``fix``: adjusts the arguments
    and the result where torch._numpy differs from NumPy."""
    __slots__ = ("array", "fix", "renames")

    def __init__(self, array=False, fix=None, renames=None):
        self.array = array
        self.fix = fix
        self.renames = renames or {}


def _sig(fn):
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


_SIGS = {}


def signature(fn):
    key = id(fn)
    if key not in _SIGS:
        _SIGS[key] = (fn, _sig(fn))
    return _SIGS[key][1]


def bind(np_fn, name, args, kwargs):
    """The call's arguments by NumPy's parameter names (an OrderedDict), or None without a signature."""
    sig = signature(np_fn)
    if sig is None:
        return None
    try:
        return sig.bind(*args, **kwargs).arguments
    except TypeError as e:
        raise PythonError(f"{name}() {e}", TypeError(str(e))) from None


def call_tnp(frame, np_fn, name, tnp_fn, args, kwargs, spec):
    """A NumPy function through its torch._numpy counterpart, arguments given as the user gave them
    (positional ones by position, keywords by name, renamed where torch._numpy names them otherwise)."""
    args = list(args)
    bound = bind(np_fn, name, args, kwargs)
    post = None
    if spec.fix is not None and bound is not None:
        before = dict(bound)
        post = spec.fix(frame, name, bound)
        if isinstance(post, (NdarrayValue, TupleValue)):
            return post      # the fix computed the result itself
        # What a fix changed or added: in the argument's own position, or by keyword.
        kwargs = dict(kwargs)
        order = list(signature(np_fn).parameters)
        for k, v in bound.items():
            if k in before and before[k] is v:
                continue
            i = order.index(k) if k in order else len(args)
            if i < len(args) and k not in kwargs:
                args[i] = v
            else:
                kwargs[k] = v
    call_args, call_kwargs = _match(name, np_fn, tnp_fn, args, kwargs, spec.renames, frame)
    result = _new_array(frame, nops.function(name.split(".")[-1], tnp_fn), call_args, call_kwargs, name,
                        scalar=not spec.array)
    if post is not None:
        result = post(result)
    return result


def _match(name, np_fn, tnp_fn, args, kwargs, renames, frame):
    """(args, kwargs) for the torch._numpy function: positional arguments by position, keywords by
    (renamed) name; a keyword torch._numpy does not take is refused unless it is None."""
    target = signature(tnp_fn)
    params = list(target.parameters.values()) if target is not None else None
    if params is None:
        return ([_graph_arg(frame, a, True) for a in args],
                {k: _graph_arg(frame, v, True) for k, v in kwargs.items()})
    by_name = {p.name: p for p in params}
    var_positional = next((p for p in params if p.kind is inspect.Parameter.VAR_POSITIONAL), None)
    var_keyword = next((p for p in params if p.kind is inspect.Parameter.VAR_KEYWORD), None)
    positional = [p for p in params if p.kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                  inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    call_args = []
    for i, value in enumerate(args):
        if i < len(positional):
            p = positional[i]
        elif var_positional is not None:
            p = var_positional
        else:
            raise unsupported(f"{name}() with {len(args)} positional arguments is not traced")
        call_args.append(_graph_arg(frame, value, "ArrayLike" in str(p.annotation)))
    call_kwargs = {}
    for key, value in kwargs.items():
        key = renames.get(key, key)
        p = by_name.get(key)
        if p is None or p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            if var_keyword is not None:
                call_kwargs[key] = _graph_arg(frame, value, False)
                continue
            if _is_default(value):
                continue
            raise unsupported(f"{name}(..., {key}=...) is not traced")
        if p.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise unsupported(f"{name}(..., {key}=...) is not traced")
        call_kwargs[key] = _graph_arg(frame, value, "ArrayLike" in str(p.annotation))
    return call_args, call_kwargs


def _is_default(value):
    return isinstance(value, ConstantValue) and value.value is None


# -- fixes where torch._numpy and NumPy differ (each checked against NumPy) --

_SMALL_INTS = (np.dtype(np.bool_), np.dtype(np.int8), np.dtype(np.int16), np.dtype(np.int32))


def _first_array(bound):
    v = next(iter(bound.values()))
    return v if isinstance(v, NdarrayValue) else None


def _no_dtype(bound):
    d = bound.get("dtype")
    return d is None or isinstance(d, ConstantValue) and d.value is None


def _fix_accumulate(frame, name, bound):
    """sum/prod/cumsum/cumprod: NumPy accumulates small integers in int64 (unsigned ones in uint64)."""
    a = _first_array(bound)
    if a is None or not _no_dtype(bound):
        return None
    if a.dtype in _SMALL_INTS:
        bound["dtype"] = ConstantValue("int64")
    elif a.dtype.kind == "u":
        raise unsupported(f"{name} of {a.dtype} accumulates in uint64, which torch lacks")
    return None


def _cast_to(frame, dtype):
    def post(result):
        if isinstance(result, NdarrayValue) and result.dtype != dtype:
            out = _new_array(frame, nops.astype, [result, ConstantValue(NUMPY_TO_TORCH[dtype])], {}, "astype")
            out.scalar = result.scalar
            return out
        return result
    return post


def _fix_logical_reduction(frame, name, bound):
    """all/any return bool arrays for every input dtype."""
    return _cast_to(frame, np.dtype(bool))


def _fix_median(frame, name, bound):
    a = _first_array(bound)
    if a is None:
        return None
    if a.dtype.kind == "c":
        raise unsupported(f"{name} of complex arrays is not traced")
    axis = bound.get("axis")
    post_dtype = np.dtype(np.float64) if a.dtype.kind in "biu" else a.dtype
    cast = _cast_to(frame, post_dtype)
    if axis is None or isinstance(axis, ConstantValue) and axis.value is None:
        keep = bound.get("keepdims")
        if keep is not None and as_constant(keep):
            raise unsupported(f"{name}(..., keepdims=True) without an axis is not traced")

        def post(result):
            # torch._numpy's median over everything has shape (1,); NumPy's is 0-d.
            out = _new_array(frame, nops.method("reshape"), [result, ConstantValue(())], {}, name, scalar=True)
            return cast(out)
        return post
    return cast


def _fix_mean_like(frame, name, bound):
    """mean/std/var: NumPy computes float16 in float32 and returns float16; ints give float64."""
    a = _first_array(bound)
    if a is None or not _no_dtype(bound):
        return None
    if a.dtype == np.float16:
        bound["dtype"] = ConstantValue("float32")
        return _cast_to(frame, np.dtype(np.float16))
    return None


def _fix_indices(frame, name, bound):
    """tril_indices/triu_indices(_from): a tuple of index arrays, as NumPy returns."""
    def post(result):
        rows = _graph_call(frame, nops.split_rows, [result], {}, name)
        return _array(rows)
    return post


def _fix_flip(frame, name, bound):
    """np.flip / np.flipud / np.fliplr: eager NumPy returns a negative-stride view; here it is a copy."""
    a = _first_array(bound)
    fn = {"np.flip": np.flip, "np.flipud": np.flipud, "np.fliplr": np.fliplr}[name]
    rest = {k: v for k, v in bound.items() if v is not a}
    recipe = (fn, [a], rest) if all(isinstance(v, ConstantValue) for v in rest.values()) else None

    def post(result):
        mark_reversed(frame, a, result, recipe)
        return result
    return post


def mark_reversed(frame, base, result, recipe):
    """``result`` is eager NumPy's negative-stride view of ``base``, traced as a copy; ``recipe``
    (function, argument values, keyword values) makes the view at run time, or None."""
    if isinstance(result, NdarrayValue):
        result.view_of = recipe if recipe is not None else UNREBUILDABLE
        frame.tx.reversed_copies.add(storage_key(result.fake))
        if isinstance(base, NdarrayValue):
            frame.tx.reversed_bases.add(storage_key(base.fake))


def storage_key(fake):
    """Which memory a (fake) tensor views: views of one array share it."""
    return fake.untyped_storage()._cdata


_LINALG_RESULTS = {}


def _linalg_tuple(np_fn):
    """The namedtuple class NumPy's linalg function returns (SVDResult, EighResult...)."""
    key = id(np_fn)
    if key not in _LINALG_RESULTS:
        try:
            sample = np_fn(np.eye(2))
            _LINALG_RESULTS[key] = type(sample) if isinstance(sample, tuple) else None
        except Exception:
            _LINALG_RESULTS[key] = None
    return _LINALG_RESULTS[key]


def _fix_linalg(frame, name, bound):
    """np.linalg computes integer and bool matrices in float64 (torch._numpy in float32) and refuses
    float16 (except norm)."""
    for key, v in list(bound.items()):
        if isinstance(v, NdarrayValue):
            if v.dtype.kind in "biu":
                bound[key] = _new_array(frame, nops.astype, [v, ConstantValue(torch.float64)], {}, name)
            elif v.dtype == np.float16 and name != "np.linalg.norm":
                raise unsupported(f"{name} of float16 arrays (NumPy raises TypeError)")
    return None


def _fix_linalg_tuple(np_fn):
    def fix(frame, name, bound):
        _fix_linalg(frame, name, bound)
        cls = _linalg_tuple(np_fn)

        def post(result):
            if isinstance(result, TupleValue) and cls is not None and len(result.items) == len(cls._fields):
                return TupleValue(result.items, cls=cls)
            return result
        return post
    return fix


def _result_container(cls):
    """NumPy returns a list here (np.split) or a tuple (np.meshgrid); torch._numpy the other."""
    def fix(frame, name, bound):
        def post(result):
            if isinstance(result, (TupleValue, ListValue)):
                return ListValue(result.items) if cls is list else TupleValue(result.items)
            return result
        return post
    return fix


def _fix_trace(frame, name, bound):
    """np.trace sums: small integers in int64, unsigned ones in uint64 (which torch lacks)."""
    a = _first_array(bound)
    if a is not None and _no_dtype(bound):
        if a.dtype in _SMALL_INTS:
            return _cast_to(frame, np.dtype(np.int64))
        if a.dtype.kind == "u":
            raise unsupported(f"{name} of {a.dtype} accumulates in uint64, which torch lacks")
    return None


def _fix_range_dtype(frame, name, bound):
    """np.arange/linspace/...: a dtype torch cannot make ranges of is a fall-back."""
    dtype = bound.get("dtype")
    if dtype is None or isinstance(dtype, ConstantValue) and dtype.value is None:
        return None
    dt = _dtype_of(dtype)
    if dtype_unsupported_reason(dt):
        raise unsupported(dtype_unsupported_reason(dt))
    if dt.kind == "b":
        raise unsupported(f"{name} of dtype bool (NumPy raises)")
    verdict = _probed.get(("range", dt))
    if verdict is None:
        try:
            torch.arange(2, dtype=NUMPY_TO_TORCH[dt], device=g.default_device())
            torch.linspace(0, 1, 2, dtype=NUMPY_TO_TORCH[dt], device=g.default_device())
            verdict = True
        except (RuntimeError, NotImplementedError) as e:
            verdict = str(e).splitlines()[0]
        _probed[("range", dt)] = verdict
    if verdict is not True:
        raise unsupported(f"{name} of {dt} is not implemented by torch ({verdict})")
    return None


def _fix_complex_unsupported(frame, name, bound):
    a = _first_array(bound)
    if a is not None and a.dtype.kind == "c":
        raise unsupported(f"{name} of complex arrays (ordering them) is not traced")
    return None


def _describe_operand(v):
    """What np.result_type sees for an operand (NEP 50: Python numbers are weak)."""
    if isinstance(v, NdarrayValue):
        return v.dtype
    if isinstance(v, ConstantValue) and isinstance(v.value, np.generic):
        return v.value.dtype
    if isinstance(v, ConstantValue) and isinstance(v.value, (bool, int, float, complex)):
        return v.value
    return None


def _fix_where(frame, name, bound):
    """np.where(c, x, y): the result has NumPy's promoted dtype of x and y; torch._numpy promotes
    Python numbers its own way, so they become 0-d arrays of that dtype first."""
    x, y = bound.get("x"), bound.get("y")
    if x is None or y is None:
        return None
    parts = [_describe_operand(x), _describe_operand(y)]
    if any(p is None for p in parts):
        return None
    dtype = np.result_type(*parts)
    if dtype_unsupported_reason(dtype):
        raise unsupported(dtype_unsupported_reason(dtype))
    for key in ("x", "y"):
        v = bound[key]
        if isinstance(v, ConstantValue):
            bound[key] = _numpy_scalar_array(frame, dtype.type(v.value))
    return _cast_to(frame, dtype)


def _pad_spec(pad_width, ndim):
    """np.pad's pad_width as torch.nn.functional.pad's flat list (last dimension first)."""
    pw = np.broadcast_to(np.asarray(pad_width, dtype=np.int64), (ndim, 2))
    out = []
    for before, after in reversed(pw.tolist()):
        out += [before, after]
    return out


def _fix_pad(frame, name, bound):
    """np.pad with constant padding: torch.nn.functional.pad (torch._numpy's needs the data)."""
    a = _first_array(bound)
    mode = bound.get("mode")
    if a is None or mode is not None and as_constant(mode) != "constant":
        raise unsupported(f"{name} other than mode='constant' is not traced")
    extra = dict(bound.get("kwargs") or {})
    value = extra.pop("constant_values", ConstantValue(0))
    if extra:
        raise unsupported(f"{name}(..., {', '.join(extra)}=...) is not traced")
    value = as_constant(value)
    if not isinstance(value, (int, float, bool)):
        raise unsupported(f"{name}(..., constant_values={value!r}) is not traced")
    spec = _pad_spec(as_constant(bound["pad_width"]), a.fake.dim())
    if min(spec, default=0) < 0:
        raise unsupported(f"{name} with negative widths (eager raises)")
    result = _graph_call(frame, torch.nn.functional.pad, [a, ConstantValue(spec)],
                         {"value": ConstantValue(value)}, name)
    return _array(result)


def _fix_dtype_kept(frame, name, bound):
    """Functions whose result keeps the first array's dtype (torch._numpy may promote)."""
    a = _first_array(bound)
    if a is not None and a.dtype.kind == "b":
        raise unsupported(f"{name} of a bool array (NumPy raises)")
    return _cast_to(frame, a.dtype) if a is not None else None


def _fix_einsum(frame, name, bound):
    """np.einsum keeps the operands' promoted dtype (torch._numpy widens small integers)."""
    operands = [v for v in bound.get("operands", ()) if isinstance(v, NdarrayValue)]
    if not operands or bound.get("dtype") is not None or bound.get("out") is not None:
        return None
    return _cast_to(frame, np.result_type(*[v.dtype for v in operands]))


_A = Spec(array=True)
_S = Spec()

# NumPy functions traced through torch._numpy: name -> Spec (a 0-d result stays an array or
# becomes a NumPy scalar, as NumPy does). Each is compared with NumPy over every supported dtype
# (tests/test_numpy_dtypes.py) and in programs (tests/test_numpy_corpus.py); anything else runs
# natively at a graph break.
TRACED = {
    # creation
    "np.zeros": _A, "np.ones": _A, "np.empty": _A, "np.full": _A, "np.zeros_like": _A, "np.ones_like": _A,
    "np.empty_like": _A, "np.full_like": _A, "np.arange": Spec(array=True, fix=_fix_range_dtype), "np.linspace": Spec(array=True, fix=_fix_range_dtype),
    "np.logspace": Spec(array=True, fix=_fix_range_dtype), "np.geomspace": Spec(array=True, fix=_fix_range_dtype), "np.eye": _A, "np.identity": _A, "np.tri": _A, "np.diag": _A, "np.diagflat": _A,
    "np.meshgrid": Spec(array=True, fix=_result_container(tuple)), "np.indices": _A,
    # shapes
    "np.reshape": Spec(array=True, renames={"shape": "newshape"}), "np.ravel": _A, "np.transpose": _A,
    "np.swapaxes": _A, "np.moveaxis": _A, "np.rollaxis": _A, "np.squeeze": _A, "np.expand_dims": _A,
    "np.atleast_1d": _A, "np.atleast_2d": _A, "np.atleast_3d": _A, "np.broadcast_to": _A,
    "np.broadcast_arrays": Spec(array=True, fix=_result_container(tuple)), "np.concatenate": _A, "np.stack": _A, "np.vstack": _A, "np.hstack": _A,
    "np.dstack": _A, "np.column_stack": _A, "np.row_stack": _A, "np.split": Spec(array=True, fix=_result_container(list)),
    "np.array_split": Spec(array=True, fix=_result_container(list)),
    "np.hsplit": Spec(array=True, fix=_result_container(list)), "np.vsplit": Spec(array=True, fix=_result_container(list)),
    "np.dsplit": Spec(array=True, fix=_result_container(list)), "np.tile": _A, "np.repeat": _A,
    "np.flip": Spec(array=False, fix=_fix_flip), "np.flipud": Spec(array=False, fix=_fix_flip),
    "np.fliplr": Spec(array=False, fix=_fix_flip), "np.roll": _A, "np.rot90": _A,
    "np.tril": _A, "np.triu": _A, "np.diagonal": _A, "np.pad": Spec(array=True, fix=_fix_pad),
    "np.tril_indices": Spec(array=True, fix=_fix_indices), "np.triu_indices": Spec(array=True, fix=_fix_indices),
    "np.tril_indices_from": Spec(array=True, fix=_fix_indices),
    "np.triu_indices_from": Spec(array=True, fix=_fix_indices),
    # reductions
    "np.sum": Spec(fix=_fix_accumulate), "np.prod": Spec(fix=_fix_accumulate),
    "np.cumsum": Spec(fix=_fix_accumulate), "np.cumprod": Spec(fix=_fix_accumulate),
    "np.mean": Spec(fix=_fix_mean_like), "np.std": Spec(fix=_fix_mean_like), "np.var": Spec(fix=_fix_mean_like),
    "np.max": Spec(fix=_fix_complex_unsupported), "np.min": Spec(fix=_fix_complex_unsupported),
    "np.amax": Spec(fix=_fix_complex_unsupported), "np.amin": Spec(fix=_fix_complex_unsupported),
    "np.argmax": Spec(fix=_fix_complex_unsupported), "np.argmin": Spec(fix=_fix_complex_unsupported),
    "np.ptp": Spec(fix=_fix_complex_unsupported),
    "np.all": Spec(fix=_fix_logical_reduction), "np.any": Spec(fix=_fix_logical_reduction),
    "np.median": Spec(fix=_fix_median), "np.average": _S,
    "np.count_nonzero": _S,
    # products, sorting, selection
    "np.dot": _S, "np.vdot": _S, "np.inner": _S, "np.outer": _A, "np.tensordot": _A, "np.einsum": Spec(fix=_fix_einsum),
    "np.kron": _A, "np.cross": _S, "np.trace": Spec(fix=_fix_trace),
    "np.where": Spec(array=True, fix=_fix_where), "np.clip": Spec(renames={"a_min": "min", "a_max": "max"}),
    "np.round": Spec(fix=_fix_dtype_kept), "np.around": Spec(fix=_fix_dtype_kept),
    "np.sort": Spec(array=True, fix=_fix_complex_unsupported), "np.argsort": Spec(array=True, fix=_fix_complex_unsupported),
    "np.take": _S, "np.take_along_axis": _A, "np.diff": _A, "np.ediff1d": _A,
    "np.isclose": _S, "np.nan_to_num": _A, "np.real": _A, "np.imag": _A,
    "np.searchsorted": _S, "np.copy": _A,
    # linalg
    "np.linalg.norm": Spec(fix=_fix_linalg), "np.linalg.det": Spec(fix=_fix_linalg),
    "np.linalg.inv": Spec(array=True, fix=_fix_linalg), "np.linalg.solve": Spec(array=True, fix=_fix_linalg),
    "np.linalg.pinv": Spec(array=True, fix=_fix_linalg), "np.linalg.matrix_power": _A,
    "np.linalg.cholesky": Spec(array=True, fix=_fix_linalg), "np.linalg.eigvalsh": Spec(array=True, fix=_fix_linalg),
    "np.linalg.multi_dot": _S,
    "np.linalg.eigh": Spec(array=True, fix=_fix_linalg_tuple(np.linalg.eigh)),
    "np.linalg.svd": Spec(array=True, fix=_fix_linalg_tuple(np.linalg.svd)),
    "np.linalg.qr": Spec(array=True, fix=_fix_linalg_tuple(np.linalg.qr)),
    "np.linalg.slogdet": Spec(fix=_fix_linalg_tuple(np.linalg.slogdet)),
}


# --- conversions ------------------------------------------------------------------------------------

def asarray_value(frame, v, dtype, name, copy=False):
    """``np.asarray(v, dtype)`` (``copy``: ``np.array``): the same array value when nothing changes."""
    dt = None if dtype is None or isinstance(dtype, ConstantValue) and dtype.value is None else _dtype_of(dtype)
    if dt is not None and dtype_unsupported_reason(dt):
        raise unsupported(dtype_unsupported_reason(dt))
    if isinstance(v, TensorValue):
        v = tensor_as_array(frame, v, name)
    if isinstance(v, NdarrayValue):
        if dt is None or dt == v.dtype:
            if not copy and not v.scalar:
                return v
            # A copy (np.array; or an array made from an immutable NumPy scalar).
            return _new_array(frame, nops.method("copy"), [v], {}, name)
        return _new_array(frame, nops.astype, [v, ConstantValue(NUMPY_TO_TORCH[dt])], {}, name)
    if is_numpy_object(v):
        raise unsupported(numpy_object_reason(v.obj))
    if isinstance(v, (ConstantValue, ListValue, TupleValue)):
        kwargs = {"dtype": ConstantValue(dt.name)} if dt is not None else {}
        arg = _graph_arg(frame, v, True)
        if isinstance(arg, ConstantValue) and isinstance(arg.value, (list, tuple)):
            _check_constant_sequence(arg.value, name)
        return _new_array(frame, nops.function("asarray", nops.tnp.asarray), [arg], kwargs, name)
    raise unsupported(f"{name} of {describe(v)} is not traced")


def _check_constant_sequence(value, name):
    flat = []

    def walk(x):
        if isinstance(x, (list, tuple)):
            for i in x:
                walk(i)
        else:
            flat.append(x)
    walk(value)
    if not all(type(x) in (int, float, bool, complex) for x in flat):
        raise unsupported(f"{name} of a sequence holding {sorted({type(x).__name__ for x in flat})} is not traced")


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
    if isinstance(a, NdarrayValue) and len(args) == 1 and not kwargs:
        if name == "np.shape":
            return shape_value(frame, a)
        if name == "np.ndim":
            return ConstantValue(a.fake.dim())
        if name == "np.size":
            return array_attr(frame, a, "size")
    raise unsupported(f"{name} of {describe(a)} is not traced")


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


def tensor_as_array(frame, t, what, force=False):
    """``t.numpy()`` / ``np.asarray(t)``: the tensor's graph value seen as an array (same memory)."""
    _enabled(what)
    fake = t.fake
    if fake.dtype not in TORCH_TO_NUMPY:
        raise unsupported(f"{what}: tensors of dtype {fake.dtype} have no NumPy counterpart")
    if not force:
        if fake.requires_grad:
            raise unsupported(f"{what} on a tensor that requires grad (eager raises; use t.detach().numpy())")
        if fake.device.type != "cpu":
            raise unsupported(f"{what} on a {fake.device.type} tensor (eager raises; use t.cpu().numpy())")
        if fake.is_conj() or fake.is_neg():
            raise unsupported(f"{what} on a tensor with its conjugate/negative bit set")
        return NdarrayValue(t.node, fake)
    value = frame.tx.graph.call("call_method", "detach", [t], {})
    if fake.device.type != "cpu":
        value = frame.tx.graph.call("call_method", "cpu", [value], {})
    value = frame.tx.graph.call("call_method", "resolve_conj", [value], {})
    value = frame.tx.graph.call("call_method", "resolve_neg", [value], {})
    return NdarrayValue(value.node, value.fake)


def array_as_tensor(a):
    """The tensor seen by ``torch.from_numpy(a)`` / ``torch.as_tensor(a)``: the same graph value."""
    return TensorValue(a.node, a.fake)


def tensor_method_to_array(frame, t, name, args, kwargs):
    """``t.numpy(force=False)``."""
    force = False
    if args:
        force = as_constant(args[0])
    if "force" in kwargs:
        force = as_constant(kwargs["force"])
    return tensor_as_array(frame, t, "Tensor.numpy()", force=bool(force))


def torch_with_arrays(frame, fn, args, kwargs):
    """A torch function given a NumPy array: the conversions are traced, the rest runs natively."""
    name = getattr(fn, "__name__", "")
    _enabled(f"torch.{name}")
    if name in ("from_numpy", "as_tensor", "asarray", "tensor") and args and isinstance(args[0], NdarrayValue):
        a = args[0]
        if name == "from_numpy":
            if kwargs or len(args) != 1:
                raise unsupported("torch.from_numpy takes one array")
            if a.scalar:
                raise unsupported("torch.from_numpy of a NumPy scalar (eager raises)")
            if a.fake.device.type != "cpu":
                raise unsupported("torch.from_numpy under another default device (the array is traced on it; "
                                  "eager gives a CPU tensor)")
            return array_as_tensor(a)
        t = array_as_tensor(a)
        params = dict(zip(("dtype", "device"), args[1:]))
        params.update(kwargs)
        unknown = set(params) - {"dtype", "device", "requires_grad", "copy"}
        if unknown:
            raise unsupported(f"torch.{name}(array, {', '.join(sorted(unknown))}=...) is not traced")
        dtype = params.get("dtype")
        device = params.get("device")
        copy = params.get("copy")
        requires_grad = params.get("requires_grad")
        if requires_grad is not None and as_constant(requires_grad):
            raise unsupported(f"torch.{name}(array, requires_grad=True) is not traced")
        to_kwargs = {}
        if dtype is not None and not (isinstance(dtype, ConstantValue) and dtype.value is None):
            to_kwargs["dtype"] = ConstantValue(as_constant(dtype))
        if device is not None and not (isinstance(device, ConstantValue) and device.value is None):
            to_kwargs["device"] = ConstantValue(torch.device(as_constant(device)))
        else:
            default = _device_guard(frame)
            if a.fake.device != default:
                to_kwargs["device"] = ConstantValue(default)
        # A NumPy scalar is immutable: the tensor made from it is its own memory.
        make_copy = name == "tensor" or a.scalar or (copy is not None and as_constant(copy) is True)
        if to_kwargs or make_copy:
            if make_copy:
                to_kwargs["copy"] = ConstantValue(True)
            return frame.tx.graph.call("call_method", "to", [t], to_kwargs)
        return t
    raise unsupported(f"torch.{name} given a NumPy array is not traced (eager converts it natively)",
                      hint="convert it first with torch.from_numpy(a) or torch.as_tensor(a)")


# --- arrays: attributes, methods, operators, indexing ----------------------------------------------

_META = {"ndim", "size", "itemsize", "nbytes"}
_NOT_TRACED_ATTRS = {"ctypes": "ndarray.ctypes is not traced", "flags": "ndarray.flags is not traced",
                     "strides": "ndarray.strides is not traced (torch lays out traced arrays its own way)",
                     "base": "ndarray.base is not traced", "data": "ndarray.data (the buffer) is not traced",
                     "flat": "ndarray.flat is not traced (use ravel())",
                     "__array_interface__": "__array_interface__ is not traced",
                     "__array_struct__": "__array_struct__ is not traced"}
_ATTR_ARRAYS = {"T": "T", "mT": "mT", "real": "real", "imag": "imag"}


def array_attr(frame, a, name):
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

def arrays_from_tensors(frame, args, kwargs):
    """``wrap_numpy``'s entry: tensors become arrays over the same graph values (no copies)."""
    (v,) = args
    return _map_values(v, lambda t: NdarrayValue(t.node, t.fake) if isinstance(t, TensorValue) else t)


def tensors_from_arrays(frame, args, kwargs):
    """``wrap_numpy``'s exit: arrays become tensors over the same graph values."""
    (v,) = args

    def convert(x):
        if isinstance(x, NdarrayValue):
            return array_as_tensor(x)
        if is_numpy_object(x):
            raise unsupported(numpy_object_reason(x.obj))
        return x
    return _map_values(v, convert)


def _map_values(v, fn):
    if isinstance(v, TupleValue):
        return TupleValue([_map_values(i, fn) for i in v.items], cls=v.cls)
    if isinstance(v, ListValue):
        return ListValue([_map_values(i, fn) for i in v.items])
    if isinstance(v, DictValue) and v.cls is dict:
        return DictValue({k: _map_values(i, fn) for k, i in v.items.items()})
    return fn(v)


def call_torch_wrap_numpy(frame, fv, args, kwargs):
    """A function wrapped by ``torch.compiler.wrap_numpy``: as ``bytegraph.wrap_numpy`` (the
    wrapped function is read through the wrapper, so it is guarded)."""
    inner = fv.obj.__wrapped__
    inner_value = wrap(frame.tx, inner, AttrSource(fv.source, "__wrapped__") if fv.source is not None else None)
    arrays = arrays_from_tensors(frame, [TupleValue(list(args))], {})
    arrays_kw = arrays_from_tensors(frame, [DictValue(dict(kwargs))], {})
    result = ops.call(frame, inner_value, list(arrays.items), dict(arrays_kw.items))
    return tensors_from_arrays(frame, [result], {})
