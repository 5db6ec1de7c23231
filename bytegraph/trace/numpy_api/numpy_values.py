"""NumPy in the trace, the lowest layer: what counts as NumPy's (functions, ufuncs, types, objects
with array protocols), the reasons and hints of its fall-backs, and how array, tensor and constant
values become graph arguments and graph results (``np.ndarray`` values over tensors).
``numpy_functions`` and ``numpy_calls`` build on it."""
import types

import numpy as np
import torch

from ...config import config
from ...errors import Unsupported
from ...graph import numpy_ops as nops
from ...guards import builder as g
from ...guards.sources import AttrSource
from ...values.arrays import UNREBUILDABLE, NdarrayValue, dtype_unsupported_reason, unsupported_reason
from ...values.base import (ConstantValue, ListValue, ObjectValue, SliceValue, SymValue, TensorValue, TupleValue,
                           UserObjectValue)
from ..core.basics import as_constant, describe, no_attr_name
from ..core.basics import MissingAttribute

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
    if isinstance(x, slice):      # x[:n] with n a NumPy int: FX code cannot spell np.int64(n)
        return slice(_plain(x.start), _plain(x.stop), _plain(x.step))
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


def storage_key(fake):
    """Which memory a (fake) tensor views: views of one array share it."""
    return fake.untyped_storage()._cdata


