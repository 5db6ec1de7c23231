"""Turning real objects read through a source into values, guarding what is relied on.

``wrap(tx, obj, source)`` is called whenever the tracer reads something that
exists outside the traced code: an argument, a global, a closure cell, an
attribute of a module. The guard it installs is the least that keeps the
trace valid: a tensor's type/dtype/device/shape/stride, a number's value, a
function's or module's identity, a container's length or keys.
"""
import enum
import functools
import types
import weakref

import torch

from ..errors import Unsupported
from ..guards import builder as g
from ..guards.sources import AttrSource, ItemSource, ModuleEntrySource
from ..residual import AutocastExit, GradModeExit
from .base import (ConstantValue, ContextManagerValue, DictValue, ExitValue, ListValue, ObjectValue, TupleValue,
                   constant)

CONSTANT_TYPES = (int, float, bool, str, bytes, complex, type(None), type(Ellipsis),
                  type(NotImplemented), torch.dtype, torch.device, torch.layout,
                  torch.memory_format, slice, range, torch.Size)

# Python modules whose attributes are taken as fixed: reading torch.nn.functional.relu
# needs no guard of its own.
TRUSTED_MODULE_PREFIXES = ("torch", "math", "operator", "builtins", "functools", "itertools",
                           "collections", "typing", "numpy", "abc", "enum", "dataclasses",
                           "inspect", "warnings", "contextlib", "copy", "types", "re", "string")

_IDENTITY_TYPES = (types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                   types.ModuleType, type, types.MethodDescriptorType,
                   types.WrapperDescriptorType, types.MethodWrapperType,
                   types.BuiltinMethodType, types.ClassMethodDescriptorType, types.CodeType)


def is_trusted_module(mod):
    name = getattr(mod, "__name__", "") or ""
    return name.split(".")[0] in TRUSTED_MODULE_PREFIXES


def wrap(tx, obj, source):
    """The value for ``obj`` as read through ``source`` (None: no guard possible)."""
    memo = tx.memo.get(id(obj))
    if memo is not None and memo[0] is obj and not isinstance(obj, CONSTANT_TYPES):
        value = memo[1]
        if source is not None:
            if value.source is None:
                value.source = source
            elif value.source != source:
                tx.guards.add(g.ALIAS, source, value.source)
        return value
    value = _wrap(tx, obj, source)
    if not isinstance(obj, CONSTANT_TYPES):
        tx.memo[id(obj)] = (obj, value)
    return value


def _guard(tx, kind, source, expected):
    if source is not None and not tx.is_trusted_source(source):
        tx.guards.add(kind, source, expected)


def _wrap(tx, obj, source):
    t = type(obj)
    if t is AutocastExit:
        mgr = ContextManagerValue("autocast_resumed", (obj.device_type,))
        mgr.saved = obj.prev
        _guard(tx, g.TYPE_MATCH, source, t)
        if source is not None:
            _guard(tx, g.CONSTANT_MATCH, AttrSource(source, "prev"), obj.prev)
            _guard(tx, g.CONSTANT_MATCH, AttrSource(source, "device_type"), obj.device_type)
        return ExitValue(mgr, source)
    if t is GradModeExit:
        # The __exit__ of a grad-mode block that a resume function continues.
        mgr = ContextManagerValue("grad", (None,))
        mgr.saved = obj.mode
        _guard(tx, g.TYPE_MATCH, source, t)
        if source is not None:
            _guard(tx, g.CONSTANT_MATCH, AttrSource(source, "mode"), obj.mode)
        return ExitValue(mgr)
    original = _compiled_original(obj)
    if original is not None:
        # Something compiled separately, called from traced code: trace what it wraps.
        return wrap(tx, original, AttrSource(source, "_orig_mod" if isinstance(obj, torch.nn.Module)
                                             else "_bytegraph_original") if source is not None else None)
    if isinstance(obj, torch.Tensor):
        return _wrap_tensor(tx, obj, source)
    if t in CONSTANT_TYPES:
        if source is None:
            return ConstantValue(obj)
        if t is int and tx.is_dynamic_scalar(source):
            _guard(tx, g.TYPE_MATCH, source, int)
            return tx.graph.add_sym_input(obj, source)
        kind = g.ID_MATCH if t in (torch.dtype, torch.layout, torch.memory_format) else g.CONSTANT_MATCH
        return ConstantValue(obj, source, pending_guard=lambda: _guard(tx, kind, source, obj))
    if t is tuple or (isinstance(obj, tuple) and hasattr(t, "_fields")):
        _guard(tx, g.TYPE_MATCH, source, t)
        _guard(tx, g.LENGTH_MATCH, source, len(obj))
        items = [wrap(tx, x, _item(source, i)) for i, x in enumerate(obj)]
        return TupleValue(items, source, cls=t)
    if t is list:
        _guard(tx, g.TYPE_MATCH, source, t)
        _guard(tx, g.LENGTH_MATCH, source, len(obj))
        return _existing(tx, ListValue([wrap(tx, x, _item(source, i)) for i, x in enumerate(obj)], source))
    if t is dict or (isinstance(obj, dict) and t.__module__ == "collections"):
        if all(isinstance(k, (str, int)) for k in obj):
            _guard(tx, g.TYPE_MATCH, source, t)
            _guard(tx, g.DICT_KEYS, source, list(obj))
            return _existing(tx, DictValue({k: wrap(tx, v, _item(source, k)) for k, v in obj.items()},
                                           source, cls=t))
    if t is set and all(type(x) in CONSTANT_TYPES for x in obj):
        # A set of constants is a constant the trace may change (a copy; the guard keeps a
        # snapshot of the contents seen here).
        snapshot = set(obj)
        return _existing(tx, ConstantValue(set(obj), source, pending_guard=lambda: _guard(
            tx, g.CONSTANT_MATCH, source, snapshot)))
    if t is types.FunctionType and source is not None and "<locals>" in obj.__qualname__:
        # A nested function is made anew by each call of the function that makes it: guard
        # its code; its cells and defaults are read through sources (and guarded) when used.
        _guard(tx, g.TYPE_MATCH, source, t)
        _guard(tx, g.ID_MATCH, AttrSource(source, "__code__"), obj.__code__)
        return ObjectValue(obj, source)
    if t is types.MethodType and source is not None:
        # A bound method is made anew on each attribute read: guard its function and the
        # type of its object, not its own identity.
        _guard(tx, g.TYPE_MATCH, source, t)
        _guard(tx, g.ID_MATCH, AttrSource(source, "__func__"), obj.__func__)
        owner = obj.__self__
        owner_kind = g.ID_MATCH if isinstance(owner, (torch.nn.Module, type, types.ModuleType)) else g.TYPE_MATCH
        _guard(tx, owner_kind, AttrSource(source, "__self__"), owner if owner_kind == g.ID_MATCH else type(owner))
        return ObjectValue(obj, source)
    if t is types.BuiltinMethodType and source is not None and obj.__self__ is not None \
            and not isinstance(obj.__self__, types.ModuleType):
        # A builtin method bound to an object (`d.get`) is made anew on each read: guard its
        # type and its object, not its own identity (the name is fixed by the source).
        owner = obj.__self__
        _guard(tx, g.TYPE_MATCH, source, t)
        if type(owner) in CONSTANT_TYPES:
            _guard(tx, g.CONSTANT_MATCH, AttrSource(source, "__self__"), owner)
        else:
            _guard(tx, g.ID_MATCH, AttrSource(source, "__self__"), owner)
        return ObjectValue(obj, source)
    if isinstance(obj, (torch.nn.Module, enum.Enum) + _IDENTITY_TYPES) or (callable(obj) and _is_c_callable(obj)):
        _guard(tx, g.ID_MATCH, source, obj)
        return ObjectValue(obj, source)
    # Other user objects: the type is fixed; attributes get guards as they are read.
    _guard(tx, g.TYPE_MATCH, source, t)
    return ObjectValue(obj, source)


def _existing(tx, value):
    """Remember that ``value`` stands for a real container: changing it is a side effect."""
    tx.existing_containers[id(value)] = value
    return value


def _compiled_original(obj):
    if type(obj).__dict__.get("_bytegraph_compiled_module", False):   # api.OptimizedModule
        return object.__getattribute__(obj, "_orig_mod")
    if isinstance(obj, types.FunctionType):
        return getattr(obj, "_bytegraph_original", None)
    return None


def _is_c_callable(obj):
    return type(obj).__module__ in ("builtins", "torch", "torch._C") or isinstance(obj, functools.partial)


def _item(source, index):
    return ItemSource(source, index) if source is not None else None


# nn.Module -> names of buffers that traced code assigned a new tensor to. Such a buffer is
# a different object on every call, so it is read as a graph input (guarded by its
# metadata) rather than through get_attr (guarded by identity).
_reassigned_buffers = weakref.WeakKeyDictionary()


def note_reassigned_buffer(module, name):
    _reassigned_buffers.setdefault(module, set()).add(name)


def _buffer_reassigned(tensor, source):
    return any(source.key in names and m._buffers.get(source.key) is tensor
               for m, names in list(_reassigned_buffers.items()))


def _wrap_tensor(tx, tensor, source):
    if isinstance(source, ModuleEntrySource) and source.table in ("_parameters", "_buffers") \
            and not (source.table == "_buffers" and _buffer_reassigned(tensor, source)):
        # Module state is reached through get_attr; its identity is what we rely on.
        _guard(tx, g.ID_MATCH, source, tensor)
        return tx.graph.add_module_state(tensor, source, is_parameter=source.table == "_parameters")
    if source is None:
        raise _unsupported("a tensor that cannot be re-read on later calls (no source)")
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter) or tensor.is_sparse or tensor.is_nested:
        raise _unsupported(f"tensor subclass or layout not supported yet: {type(tensor).__name__}")
    dynamic = tx.dynamic_dims_for(tensor, source)
    value = tx.graph.add_input(tensor, source, dynamic)
    symbolic = tuple(d for d in dynamic if isinstance(value.fake.shape[d], torch.SymInt))
    tx.guards.add(g.TENSOR_MATCH, source, g.TensorMeta(tensor), dynamic_dims=symbolic)
    return value


def _unsupported(reason):
    return Unsupported(reason)


__all__ = ["wrap", "constant", "is_trusted_module"]
