"""What a graph call's arguments and results are, below ``GraphBuilder``: values unwrapped to
nodes and fakes, results that alias an argument, results that are constants, storages an op
writes, and the names ops and graph inputs get in messages and printed code.
"""
import logging
import operator
import re
import weakref

import numpy as np
import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorConfig

from ..errors import Unsupported
from ..guards.sources import AttrSource
from ..inplace import is_inplace_operator
from ..values.base import (ConstantValue, DictValue, FloatTensorValue, ListValue, ObjectValue, SliceValue,
                           SubgraphValue, SymValue, TensorValue, TupleValue)


def _input_storages(template, copy, out):
    """storage of each tensor in ``template`` -> the tensor at the same place in ``copy``."""
    if isinstance(template, torch.Tensor):
        if isinstance(copy, torch.Tensor):
            out.setdefault(template.untyped_storage()._cdata, copy)
    elif isinstance(template, (tuple, list)) and isinstance(copy, (tuple, list)) and len(copy) == len(template):
        for t, c in zip(template, copy):
            _input_storages(t, c, out)


def _meta_like(shape, stride, offset, dtype, itemsize, nbytes):
    """A meta tensor with this layout over a storage of ``nbytes`` (static sizes only), or None."""
    if not all(type(n) is int for n in shape) or not all(type(n) is int for n in stride) \
            or type(offset) is not int or type(nbytes) is not int or nbytes % itemsize:
        return None
    numel = 1
    for n in shape:
        numel *= n
    span = (sum((n - 1) * st for n, st in zip(shape, stride)) + 1) * itemsize if numel else 0
    if offset == 0 and span == nbytes:
        return torch.empty_strided(tuple(shape), tuple(stride), dtype=dtype, device="meta")
    # A view of a larger buffer (linear's output over its matmul, a slice of a mask): same layout.
    return torch.empty((nbytes // itemsize,), dtype=dtype, device="meta").as_strided(shape, stride, offset)


# (fake mode -> {device: the instance state of a FakeTensor just made}; False: the quick way
# was found not to give what ``FakeTensor.__new__`` gives, so it is not used)
_FRESH_STATE = weakref.WeakKeyDictionary()
_QUICK = [None]


def new_fake(fake_mode, meta, device, requires_grad=None):
    """``FakeTensor(fake_mode, meta, device)`` for a plain meta tensor ``meta`` made for it (its own,
    not read anywhere else), made without ``FakeTensor.__new__``'s Python work (~60 calls, ~15 us;
    a deep model makes thousands: every parameter of every layer, remembered fake results): the
    subclass made from ``meta`` as ``__new__`` makes it, then the instance state of a FakeTensor
    just made for the same mode and device (the attributes ``__new__`` sets, all None but the mode
    and the device) copied in. ``requires_grad``: None keeps ``meta``'s. The first use checks the
    quick way against ``__new__`` (instance state, dispatch keys); if they differ, or where
    ``__new__`` does more (its debug traces, an export's leak tracker, a device it normalises),
    ``__new__`` makes it."""
    if requires_grad is None:
        requires_grad = meta.requires_grad
    quick = _QUICK[0]
    if quick is False or type(device) is not torch.device or (device.index is None and device.type != "cpu") \
            or FakeTensorConfig.debug or torch.compiler.is_exporting():
        return _slow_fake(fake_mode, meta, device, requires_grad)
    states = _FRESH_STATE.get(fake_mode)
    state = states.get(device) if states is not None else None
    if state is None:
        fake = _slow_fake(fake_mode, meta, device, requires_grad)
        if device.type == "meta":
            return fake     # (a mode that allows it: rare, left to __new__)
        state = dict(fake.__dict__)
        if quick is None:
            other = _quick_fake(fake_mode, torch.empty_like(meta), device, requires_grad, state)
            _QUICK[0] = quick = type(other) is FakeTensor and other.__dict__ == fake.__dict__ \
                and torch._C._dispatch_keys(other) == torch._C._dispatch_keys(fake) \
                and other.requires_grad == fake.requires_grad and other.device == fake.device
            if not quick:
                return fake
        if states is None:
            states = _FRESH_STATE[fake_mode] = {}
        states[device] = state
        return fake
    return _quick_fake(fake_mode, meta, device, requires_grad, state)


def _quick_fake(fake_mode, meta, device, requires_grad, state):
    fake = torch.Tensor._make_subclass(FakeTensor, meta, requires_grad, dispatch_device=True,
                                       device_for_backend_keys=device)
    if fake_mode._allow_unsafe_data_ptr_access:
        torch._C._set_warn_deprecated_on_mutable_data_ptr(fake)
    else:
        torch._C._set_throw_on_mutable_data_ptr(fake)
    fake.__dict__ = state.copy()
    return fake


def _slow_fake(fake_mode, meta, device, requires_grad):
    if requires_grad != meta.requires_grad:
        meta.requires_grad_(requires_grad)
    return FakeTensor(fake_mode, meta, device)


def _example(node):
    return node.meta["example_value"]


def _tensors_of(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors_of(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors_of(x)


def _writes_call(target, kwargs):
    """Does a call of ``target`` with ``kwargs`` (values) write a tensor argument in place?"""
    inplace = kwargs.get("inplace")
    return _mutates(target) or "out" in kwargs or (isinstance(inplace, ConstantValue) and inplace.value is True)


def _mutates(target):
    if target is operator.setitem or target is operator.delitem or is_inplace_operator(target):
        return True
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    return name.endswith("_") and not name.endswith("__") or name.startswith("_foreach")


def _structseq(cls):
    return cls is not tuple and issubclass(cls, tuple) and hasattr(cls, "n_fields")


def _constant_result(r, inputs=None):
    """The value of a part of a call's result that no graph node stands for. A tensor there is
    only allowed as one of the call's own tensor arguments handed back (``inputs``: {id(fake):
    value}; torch._C._group_tensors_by_device_and_dtype groups its arguments in a dict); any other
    tensor would be a fake one frozen into the code as a constant."""
    if isinstance(r, torch.Tensor):
        if inputs and id(r) in inputs:
            return inputs[id(r)]
        raise Unsupported("tensor in an unexpected position of a result")
    if isinstance(r, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise Unsupported("symbolic size in an unexpected position of a result")
    if isinstance(r, (tuple, list)):
        items = [_constant_result(x, inputs) for x in r]
        return ListValue(items) if isinstance(r, list) else TupleValue(items, cls=type(r) if type(r) is torch.Size else tuple)
    if type(r) is dict:
        if any(_holds_traced(k) for k in r):
            raise Unsupported("tensor in a dict key of a result")
        return DictValue({k: _constant_result(v, inputs) for k, v in r.items()})
    if _holds_traced(r):
        raise Unsupported(f"a result of type {type(r).__name__} holding tensors")
    return ConstantValue(r)


def _holds_traced(obj, _seen=None):
    """Does ``obj`` hold a tensor or a symbolic number anywhere its containers (and the
    attributes of a plain object) reach?"""
    if isinstance(obj, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if obj is None or isinstance(obj, (bool, int, float, complex, str, bytes, torch.dtype, torch.device)):
        return False
    _seen = set() if _seen is None else _seen
    if id(obj) in _seen:
        return False
    _seen.add(id(obj))
    if isinstance(obj, dict):
        return any(_holds_traced(k, _seen) or _holds_traced(v, _seen) for k, v in obj.items())
    if isinstance(obj, (tuple, list, set, frozenset)):
        return any(_holds_traced(x, _seen) for x in obj)
    state = getattr(obj, "__dict__", None)
    return isinstance(state, dict) and not isinstance(obj, type) and any(
        _holds_traced(v, _seen) for v in state.values())


def _storage_key(tensor):
    return tensor.untyped_storage()._cdata if isinstance(tensor, torch.Tensor) else None


def _is_data_source(source):
    return isinstance(source, AttrSource) and source.attr == "data"


def _is_data_input(value):
    """Is ``value`` an input standing for ``t.data`` of a tensor from outside?"""
    return value.source is not None and _is_data_source(value.source)


def _tensor_values(args, kwargs):
    """{id(fake): value} of the tensor values among ``args``/``kwargs``, in lists and tuples too."""
    found = {}

    def visit(v):
        if isinstance(v, TensorValue):
            found[id(v.fake)] = v
        elif isinstance(v, (list, tuple)):
            for x in v:
                visit(x)
        elif isinstance(v, (ListValue, TupleValue)):
            for x in v.items:
                visit(x)
    for v in list(args) + list(kwargs.values()):
        visit(v)
    return found


def _find_alias(result, args, kwargs):
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, TensorValue) and v.fake is result:
            return v
    return None


# Integer arithmetic whose result on 0-d int64 tensors is the same as on Python ints.
_INT_ARITHMETIC = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.neg,
                   torch.add, torch.sub, torch.mul}


def _swap_values(obj, swaps):
    """``obj`` (values, possibly in lists/tuples/dicts) with the values whose id is in ``swaps``
    replaced by what it maps them to."""
    if id(obj) in swaps:
        return swaps[id(obj)]
    if isinstance(obj, dict):
        return {k: _swap_values(v, swaps) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_swap_values(v, swaps) for v in obj)
    if isinstance(obj, TupleValue):
        return TupleValue([_swap_values(v, swaps) for v in obj.items], cls=obj.cls)
    if isinstance(obj, ListValue):
        return ListValue([_swap_values(v, swaps) for v in obj.items])
    return obj


def _unwrap(obj, node_of=None):
    """Values -> (what goes in the FX node, what the fake run receives).

    ``node_of(value)`` gives a tensor's or symbolic int's node in the graph being built (a
    subgraph lifts values of the graph around it as its inputs)."""
    if node_of is None:
        node_of = _own_node
    if isinstance(obj, dict):
        pairs = {k: _unwrap(v, node_of) for k, v in obj.items()}
        return {k: p[0] for k, p in pairs.items()}, {k: p[1] for k, p in pairs.items()}
    if isinstance(obj, (list, tuple)):
        pairs = [_unwrap(v, node_of) for v in obj]
        return [p[0] for p in pairs], [p[1] for p in pairs]
    if isinstance(obj, TensorValue):
        return node_of(obj), obj.fake
    if isinstance(obj, SymValue):
        return node_of(obj), obj.sym
    if isinstance(obj, ConstantValue):
        value = obj.value
        if isinstance(value, (np.generic, np.dtype)):
            value = _numpy_scalar(value)
        return value, value
    if isinstance(obj, TupleValue):
        nodes, fakes = _unwrap(obj.items, node_of)
        if obj.cls is torch.Size:
            # A size holding symbolic dims is a plain tuple in the graph (torch.Size takes only ints).
            graph_side = tuple(nodes) if any(isinstance(n, fx.Node) for n in nodes) else torch.Size(nodes)
            return graph_side, torch.Size(fakes)
        return tuple(nodes), tuple(fakes)
    if isinstance(obj, ListValue):
        return _unwrap(obj.items, node_of)
    if isinstance(obj, DictValue):
        return _unwrap(obj.items, node_of)
    if isinstance(obj, SliceValue):
        (a, b, c), (fa, fb, fc) = _unwrap([obj.start, obj.stop, obj.step], node_of)
        return slice(a, b, c), slice(fa, fb, fc)
    if isinstance(obj, ObjectValue) and _is_plain_constant(obj.obj):
        return obj.obj, obj.obj
    if isinstance(obj, ObjectValue) and is_opaque_reference(obj.obj):
        # A DeviceMesh: held by the graph module, read through get_attr (FX cannot write it).
        return node_of(obj), obj.obj
    if isinstance(obj, ObjectValue) and type(obj.obj) is type and obj.obj in _PYTHON_DTYPES:
        return _PYTHON_DTYPES[obj.obj], _PYTHON_DTYPES[obj.obj]
    if isinstance(obj, SubgraphValue):
        return node_of(obj), obj.gm
    if isinstance(obj, FloatTensorValue):
        value = obj.specialize()      # an argument only a Python number fits
        return value, value
    raise Unsupported(f"cannot pass {obj!r} to a graph operation")


def _numpy_scalar(value):
    """A NumPy integer or float scalar given to a torch op: torch takes it as the Python number it
    holds (checked against eager); FX code cannot spell NumPy objects, so the graph holds that number."""
    if isinstance(value, (np.integer, np.floating)) and not isinstance(value, np.bool_):
        return value.item()
    raise Unsupported(f"a NumPy {type(value).__name__} passed to a torch operation is not traced")
def _has_scalar_tensors(args, kwargs):
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, FloatTensorValue):
            return True
        if isinstance(v, (ListValue, TupleValue)) and any(isinstance(i, FloatTensorValue) for i in v.items):
            return True
        if isinstance(v, TensorValue) and v.fake.dim() == 0 and v is kwargs.get("alpha", kwargs.get("value")):
            return True
    return False


def _own_node(value):
    return value.node


def is_opaque_reference(obj):
    """An object torch's compile stack passes by reference through a graph (torch 2.13's opaque
    reference types: DTensor's DeviceMesh)."""
    try:
        from torch._library.opaque_object import is_opaque_reference_type
    except ImportError:
        return False
    return is_opaque_reference_type(type(obj))


def _is_plain_constant(o):
    return isinstance(o, (torch.dtype, torch.device, torch.layout, torch.memory_format, type(None),
                          int, float, bool, str)) or o is Ellipsis


# Python's number types stand for dtypes in torch's calls (``torch.ones(n, dtype=int)``); FX
# cannot write a type into its code, so the graph gets the dtype torch reads them as.
_PYTHON_DTYPES = {int: torch.int64, float: torch.float64, bool: torch.bool, complex: torch.complex128}


# FakeTensorMode logs the traceback of an op whose meta function failed, then raises; the
# tracer turns that error into a graph break with its reason, so the traceback is only noise
# (a changed shape in HF's Git model printed eight of them).
_quiet_meta_failures = [0]


def _drop_meta_failure(record):
    return not (_quiet_meta_failures[0] and record.getMessage().startswith("failed while attempting to run meta"))


logging.getLogger("torch._subclasses.fake_tensor").addFilter(_drop_meta_failure)


# Operators named by the Python syntax that reaches them.
_SYNTAX_NAMES = {operator.getitem: "indexing a tensor (t[index])", operator.setitem: "assigning into a tensor (t[index] = v)"}


def _target_name(target):
    if target is operator.getitem or target is operator.setitem:
        return _SYNTAX_NAMES[target]
    if isinstance(target, str):
        return f"Tensor.{target}"
    if isinstance(target, (torch._ops.OpOverloadPacket, torch._ops.OpOverload)):
        return f"torch.ops.{target}"     # torch.ops.torchvision.nms, torch.ops.aten.add.Tensor
    mod = getattr(target, "__module__", None) or ""
    if mod == "_operator":
        mod = "operator"
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(target))
    if name.startswith("_VariableFunctionsClass."):    # torch.lstm, not torch._VariableFunctionsClass.lstm
        name = name.split(".", 1)[1]
    if "<locals>" in name:     # a function made by a factory: the name it was given
        name = getattr(target, "__name__", name)
    if mod.startswith("torch.") and getattr(torch, name, None) is target:
        mod = "torch"          # torch.unique_consecutive, not torch.functional.unique_consecutive
    return f"{mod}.{name}" if mod else name


# Names fx's printed code uses for itself (the forward's `self`, globals it imports): a
# placeholder keeps its name as the forward's parameter, which would hide them.
_PRINTER_NAMES = {"self", "inf", "nan", "NoneType", "torch", "device", "fx_pytree", "pytree", "math",
                  "getattr", "operator", "builtins"}


_NON_WORD = re.compile(r"\W+")


def _identifier(text):
    name = _NON_WORD.sub("_", text).strip("_") or "x"
    if name[0].isdigit():
        name = "_" + name
    if name in _PRINTER_NAMES:
        name += "_"
    return name.lower() if name.startswith("global_") else name
