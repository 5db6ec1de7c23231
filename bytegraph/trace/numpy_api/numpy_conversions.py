"""Tensors and arrays as each other: ``t.numpy()``, ``torch.from_numpy(a)``, ``np.asarray(x)``,
torch functions given arrays, ``torch.compiler.wrap_numpy``: the same graph value seen as the
other kind, so mixed programs stay in one graph."""

import torch

from ...graph import numpy_ops as nops
from ...guards.sources import AttrSource
from ...values.arrays import NUMPY_TO_TORCH, TORCH_TO_NUMPY, NdarrayValue, dtype_unsupported_reason
from ...values.base import ConstantValue, DictValue, ListValue, TensorValue, TupleValue
from ...values.builder import wrap
from ..core import ops
from ..core.basics import as_constant, describe
from .numpy_values import (_device_guard, _dtype_of, _enabled, _graph_arg, _new_array, is_numpy_object,
                           numpy_object_reason, storage_key, unsupported)


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
        a = NdarrayValue(t.node, fake)
        a.strides = _torch_strides(fake)
        return a
    value = frame.tx.graph.call("call_method", "detach", [t], {})
    if fake.device.type != "cpu":
        value = frame.tx.graph.call("call_method", "cpu", [value], {})
    value = frame.tx.graph.call("call_method", "resolve_conj", [value], {})
    value = frame.tx.graph.call("call_method", "resolve_neg", [value], {})
    return NdarrayValue(value.node, value.fake)


def _torch_strides(fake):
    """The strides in bytes of ``t.numpy()`` for a tensor like ``fake`` (torch's own layout, the
    same in eager: the fake's strides are the real tensor's), taken now: the array keeps them
    when the tensor is later transposed in place. None where they are symbolic."""
    if any(isinstance(n, torch.SymInt) for n in fake.stride()):
        return None
    return tuple(n * fake.element_size() for n in fake.stride())


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
