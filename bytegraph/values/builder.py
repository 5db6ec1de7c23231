"""Turning real objects read through a source into values, guarding what is relied on.

``wrap(tx, obj, source)`` is called whenever the tracer reads something that
exists outside the traced code: an argument, a global, a closure cell, an
attribute of a module. The guard it installs is the least that keeps the
trace valid: a tensor's type/dtype/device/shape/stride, a number's value, a
function's or module's identity, a container's length or keys.
"""
import collections
import enum
import functools
import math
import sys
import types
import weakref

import numpy as np
import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ..config import config
from ..errors import Unsupported
from ..guards import builder as g
from ..guards import stamps
from ..guards.sources import (AttrSource, ItemSource, IteratorRestSource, ModuleEntrySource, ObjectKeySource,
                              ObjectSource, iterator_rest)
from ..residual import AutocastExit, GradModeExit
from .arrays import dtype_unsupported_reason as array_dtype_unsupported_reason
from .arrays import unsupported_reason as array_unsupported_reason
from .base import (ConstantValue, ContextManagerValue, DefaultDictValue, DictValue, ExitValue, IteratorValue,
                   ListValue, ObjectValue, TupleValue, constant)

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
    if tx.state_overrides and isinstance(obj, torch.Tensor):
        override = tx.state_overrides.get(id(obj))
        if override is not None and override[0] is obj:
            return override[1]     # torch.func.functional_call: this tensor in place of the parameter
    guards = tx.guards
    # (by the type: isinstance also reads ``obj.__class__``, through a Python __getattribute__
    # where the class has one: a transformers config, read hundreds of times per trace)
    constant = issubclass(type(obj), CONSTANT_TYPES)
    if source is not None and not constant:
        guards.objects[source] = obj   # what guards.builder needs to tell module-owned state
    if guards.recorders and source is not None and not guards.in_wrap:
        # trace.nn.blocks records each read of the world made by a module's forward.
        memo = tx.memo.get(id(obj))
        hit = memo is not None and memo[0] is obj and not constant
        for r in guards.recorders:
            r.before_wrap()
        guards.in_wrap += 1
        try:
            value = _wrap_memo(tx, obj, source)
        finally:
            guards.in_wrap -= 1
        for r in guards.recorders:
            r.after_wrap(obj, source, value, hit)
        return value
    return _wrap_memo(tx, obj, source)


def _wrap_memo(tx, obj, source):
    memo = tx.memo.get(id(obj))
    if memo is not None and memo[0] is obj:    # (constants are never memoised: below)
        value = memo[1]
        if source is not None:
            if value.source is None:
                value.source = source
                if tx.guards.recorders and not (isinstance(obj, types.ModuleType) and is_trusted_module(obj)):
                    # (reads through a trusted module are the same with a source or without)
                    for r in tx.guards.recorders:
                        r.gave_source()
            elif value.source != source:
                tx.guards.add(g.ALIAS, source, value.source)
        return value
    value = _wrap(tx, obj, source)
    if not issubclass(type(obj), CONSTANT_TYPES):
        tx.memo[id(obj)] = (obj, value)
    if source is not None and type(value) is ObjectValue:
        value.pin = functools.partial(tx.guards.add, g.ID_MATCH, source, obj)
    return value


def _guard(tx, kind, source, expected):
    if source is not None and not tx.is_trusted_source(source):
        tx.guards.add(kind, source, expected)


def _wrap(tx, obj, source):
    """The value of an object not seen before in this trace: by its type (``_handler_for``), else
    an object the trace relies on by identity or by type (``_wrap_object``)."""
    original = _compiled_original(obj)
    if original is not None:
        # Something compiled separately, called from traced code: trace what it wraps.
        return wrap(tx, original, AttrSource(source, "_orig_mod" if isinstance(obj, torch.nn.Module)
                                             else "_bytegraph_original") if source is not None else None)
    if isinstance(obj, torch.Tensor):
        return _wrap_tensor(tx, obj, source)
    handler = _handler_for(type(obj))
    if handler is not None:
        value = handler(tx, obj, source)
        if value is not None:
            return value
    return _wrap_object(tx, obj, source)


def _wrap_autocast_exit(tx, obj, source):
    t = type(obj)
    mgr = ContextManagerValue("autocast_resumed", (obj.device_type,))
    mgr.saved = obj.prev
    _guard(tx, g.TYPE_MATCH, source, t)
    if source is not None:
        _guard(tx, g.CONSTANT_MATCH, AttrSource(source, "prev"), obj.prev)
        _guard(tx, g.CONSTANT_MATCH, AttrSource(source, "device_type"), obj.device_type)
    return ExitValue(mgr, source)


def _wrap_grad_mode_exit(tx, obj, source):
    # The __exit__ of a grad-mode block that a resume function continues.
    mgr = ContextManagerValue("grad", (None,))
    mgr.saved = obj.mode
    _guard(tx, g.TYPE_MATCH, source, type(obj))
    if source is not None:
        _guard(tx, g.CONSTANT_MATCH, AttrSource(source, "mode"), obj.mode)
    return ExitValue(mgr)


def _wrap_array(tx, obj, source):
    if config.trace_numpy and array_unsupported_reason(obj) is None:
        return _wrap_ndarray(tx, obj, source)
    return None


def _wrap_constant(tx, obj, source):
    t = type(obj)
    if source is None:
        return ConstantValue(obj)
    if t is int and tx.is_dynamic_scalar(source):
        _guard(tx, g.TYPE_MATCH, source, int)
        return tx.graph.add_sym_input(obj, source)
    if t is float and tx.is_dynamic_float(source) and math.isfinite(obj):
        # A float seen changing (a scheduled learning rate): an input of the graph, not a constant.
        _guard(tx, g.TYPE_MATCH, source, float)
        return tx.graph.add_float_input(obj, source, lambda: _guard(tx, g.CONSTANT_MATCH, source, obj),
                                        lambda *comparison: _guard(tx, g.FLOAT_COMPARE, source, comparison))
    kind = g.ID_MATCH if t in (torch.dtype, torch.layout, torch.memory_format) else g.CONSTANT_MATCH
    return ConstantValue(obj, source, pending_guard=lambda: _guard(tx, kind, source, obj))


def _wrap_numpy_scalar(tx, obj, source):
    """A NumPy integer or float scalar: a constant, guarded by value; one seen changing between
    calls at its source (automatic dynamic, as for ints and floats: a value a graph break hands
    to the resume function) is a 0-d array input of the graph instead, guarded by its type only,
    so that a new value runs the same graph (torch.compile traces NumPy scalars as 0-d arrays)."""
    if source is None or not config.trace_numpy or not tx.is_dynamic_numpy_scalar(source) \
            or array_dtype_unsupported_reason(obj.dtype) is not None:
        return _wrap_constant(tx, obj, source)
    _guard(tx, g.TYPE_MATCH, source, type(obj))    # the type fixes the dtype and the shape ()
    device = g.default_device()
    tx.guards.add(g.GLOBAL_STATE, None, ("_default_device()", device), "default device")
    value = tx.graph.add_ndarray_input(obj, source, device)     # a copy: a NumPy scalar is read-only
    value.scalar = True
    return value


def _wrap_frozenset(tx, obj, source):
    if not all(type(x) in (str, int, bool, bytes, type(None)) for x in obj):
        return None
    # Immutable: a constant, checked by value when the trace looks at it (diffusers keeps the
    # devices without float64 in one).
    if source is None:
        return ConstantValue(obj)
    return ConstantValue(obj, source, pending_guard=lambda: _guard(tx, g.CONSTANT_MATCH, source, obj))


def _wrap_tuple(tx, obj, source):
    t = type(obj)
    _guard(tx, g.TYPE_MATCH, source, t)
    _guard(tx, g.LENGTH_MATCH, source, len(obj))
    items = [wrap(tx, x, _item(source, i)) for i, x in enumerate(obj)]
    return TupleValue(items, source, cls=t)


def _wrap_list(tx, obj, source):
    _guard(tx, g.TYPE_MATCH, source, list)
    _guard(tx, g.LENGTH_MATCH, source, len(obj))
    return _existing(tx, ListValue([wrap(tx, x, _item(source, i)) for i, x in enumerate(obj)], source))


def _wrap_dict(tx, obj, source):
    if not all(isinstance(k, (str, int)) or g.plain_key(k) or _identity_key(k) for k in obj):
        return None
    t = type(obj)
    _guard(tx, g.TYPE_MATCH, source, t)
    _guard(tx, g.DICT_KEYS, source, list(obj))
    items = {k: wrap(tx, v, _key_item(source, k)) for k, v in obj.items()}
    if id(obj) in tx.param_groups and items.get("capturable") is not None:
        # An optimizer's step is traced on its "capturable" path (as torch.compile does):
        # the same update with the step count kept a tensor, where the other path needs
        # it as a Python number (a data-dependent read). Only the trace sees this value:
        # code run natively after a graph break re-reads the real flag from its source.
        items["capturable"] = ConstantValue(True, items["capturable"].source)
    if t is collections.defaultdict:
        factory = wrap(tx, obj.default_factory, AttrSource(source, "default_factory") if source else None)
        return _existing(tx, DefaultDictValue(items, factory, source))
    # A module's table watched by guards.stamps is traced as the dict it stands for.
    return _existing(tx, DictValue(items, source, cls=stamps.PLAIN.get(t, t)))


def _wrap_set(tx, obj, source):
    if not all(type(x) in CONSTANT_TYPES for x in obj):
        return None
    # A set of constants is a constant the trace may change (a copy; the guard keeps a
    # snapshot of the contents seen here).
    snapshot = set(obj)
    return _existing(tx, ConstantValue(set(obj), source, pending_guard=lambda: _guard(
        tx, g.CONSTANT_MATCH, source, snapshot)))


def _wrap_sequence_iterator(tx, obj, source):
    """A tuple or range iterator from outside (the loop iterator a resume function is handed
    after a break inside a ``for``, or the user's own): the items it has left, each read through
    a source, so that a loop over it is traced. What the trace takes from it is taken from the
    real iterator after the graph (``SideEffects.iterators``). Their sequences cannot change, so
    the items left are what eager would get."""
    if source is None:
        return None
    _guard(tx, g.TYPE_MATCH, source, type(obj))
    rest = iterator_rest(obj)
    rest_source = IteratorRestSource(source)
    _guard(tx, g.LENGTH_MATCH, rest_source, len(rest))
    items = [wrap(tx, x, ItemSource(rest_source, i)) for i, x in enumerate(rest)]
    value = IteratorValue(items, source=source, cls=type(obj))
    tx.effects.iterators[id(value)] = value
    return value


def _wrap_function(tx, obj, source):
    if source is None or "<locals>" not in obj.__qualname__:
        return None
    # A nested function is made anew by each call of the function that makes it: guard
    # its code; its cells and defaults are read through sources (and guarded) when used.
    _guard(tx, g.TYPE_MATCH, source, types.FunctionType)
    _guard(tx, g.ID_MATCH, AttrSource(source, "__code__"), obj.__code__)
    return ObjectValue(obj, source)


def _wrap_partial(tx, obj, source):
    if source is None:
        return None
    # A partial is often made anew for each call (a callback with its settings, passed in):
    # guard its type, not its identity; its function, arguments and keywords are read
    # through sources (and guarded) when it is used.
    _guard(tx, g.TYPE_MATCH, source, functools.partial)
    return ObjectValue(obj, source)


def _wrap_method(tx, obj, source):
    if source is None:
        return None
    # A bound method is made anew on each attribute read: guard its function and the
    # type of its object, not its own identity.
    _guard(tx, g.TYPE_MATCH, source, types.MethodType)
    _guard(tx, g.ID_MATCH, AttrSource(source, "__func__"), obj.__func__)
    owner = obj.__self__
    owner_kind = g.ID_MATCH if isinstance(owner, (torch.nn.Module, type, types.ModuleType)) else g.TYPE_MATCH
    _guard(tx, owner_kind, AttrSource(source, "__self__"), owner if owner_kind == g.ID_MATCH else type(owner))
    return ObjectValue(obj, source)


def _wrap_builtin_method(tx, obj, source):
    if source is None or getattr(obj, "__self__", None) is None or isinstance(obj.__self__, types.ModuleType):
        return None
    # A method bound to an object (``d.get``, ``f.__get__``) is made anew on each read, so its
    # identity never holds: guard its type and its object (the name is fixed by the source).
    owner = obj.__self__
    _guard(tx, g.TYPE_MATCH, source, type(obj))
    if type(owner) in CONSTANT_TYPES:
        _guard(tx, g.CONSTANT_MATCH, AttrSource(source, "__self__"), owner)
    else:
        _guard(tx, g.ID_MATCH, AttrSource(source, "__self__"), owner)
    return ObjectValue(obj, source)


def _wrap_object(tx, obj, source):
    """Any other object: modules, enum members, functions, classes and C callables by identity;
    the rest by type, their attributes guarded as they are read."""
    if isinstance(obj, (torch.nn.Module, enum.Enum) + _IDENTITY_TYPES) or (callable(obj) and _is_c_callable(obj)):
        _guard(tx, g.ID_MATCH, source, obj)
        return ObjectValue(obj, source)
    if isinstance(obj, torch.optim.Optimizer):
        tx.note_optimizer(obj)
    _guard(tx, g.TYPE_MATCH, source, type(obj))
    return ObjectValue(obj, source)


# How an object of each exact type is wrapped; a handler returning None leaves the object to
# ``_wrap_object``. (Subclasses: ``_handler_for``.)
_BY_TYPE = {
    AutocastExit: _wrap_autocast_exit,
    GradModeExit: _wrap_grad_mode_exit,
    np.ndarray: _wrap_array,
    **{t: _wrap_constant for t in CONSTANT_TYPES},
    frozenset: _wrap_frozenset,
    tuple: _wrap_tuple,
    list: _wrap_list,
    dict: _wrap_dict,
    set: _wrap_set,
    type(iter(())): _wrap_sequence_iterator,
    type(iter(range(0))): _wrap_sequence_iterator,
    types.FunctionType: _wrap_function,
    functools.partial: _wrap_partial,
    types.MethodType: _wrap_method,
    types.MethodWrapperType: _wrap_builtin_method,
    types.BuiltinMethodType: _wrap_builtin_method,
}


def _handler_for(t):
    """The handler of objects of type ``t``: by exact type, else NumPy scalars and dtypes as
    constants, named tuples as tuples, the dicts of ``collections`` and the stamped module
    tables as dicts."""
    handler = _BY_TYPE.get(t)
    if handler is not None:
        return handler
    if issubclass(t, (np.integer, np.floating)) and _module_is_numpy(t):
        return _wrap_numpy_scalar
    if issubclass(t, (np.generic, np.dtype)) and _module_is_numpy(t):
        return _wrap_constant
    if issubclass(t, tuple) and hasattr(t, "_fields"):
        return _wrap_tuple
    if is_placement_type(t):
        return _wrap_constant     # Shard(0), Replicate(): immutable, compared by value
    if issubclass(t, dict) and (t.__module__ == "collections" or t in stamps.STAMPED):
        return _wrap_dict
    return None


def _existing(tx, value):
    """Remember that ``value`` stands for a real container: changing it is a side effect."""
    tx.effects.existing_containers[id(value)] = value
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


def _identity_key(k):
    """A dict key compared by identity: a tensor (optimizer state is keyed by parameters), or an
    object whose class keeps object's own hash and equality."""
    if isinstance(k, torch.Tensor):
        return True
    t = type(k)
    return t.__hash__ is object.__hash__ and t.__eq__ is object.__eq__


def _key_item(source, key):
    if source is None:
        return None
    if isinstance(key, (str, int)):
        return ItemSource(source, key)
    label = (f"<{type(key).__name__} {tuple(key.shape)}>" if isinstance(key, torch.Tensor)
             else f"<{type(key).__name__}>")
    return ObjectKeySource(source, ObjectSource(key, label))


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
        value = tx.graph.add_module_state(tensor, source, is_parameter=source.table == "_parameters")
        if is_traceable_wrapper_subclass(tensor):
            _check_fake_class(tensor, value.fake, source.name())
        return value
    if source is None:
        raise _unsupported("a tensor that cannot be re-read on later calls (no source)")
    if id(tensor) in tx.static_tensors:
        # An optimizer's parameters (read through its param_groups) and state: long-lived
        # tensors, read like module state (get_attr, guarded by identity).
        _guard(tx, g.ID_MATCH, source, tensor)
        return tx.graph.add_module_state(tensor, source, is_parameter=type(tensor) is torch.nn.Parameter)
    if is_traceable_wrapper_subclass(tensor):
        return _wrap_subclass(tx, tensor, source)
    if _is_function_subclass(type(tensor)):
        return _wrap_function_subclass(tx, tensor, source)
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter) and not tensor.is_sparse and not tensor.is_nested:
        raise Unsupported(f"{source.name()} is a {type(tensor).__qualname__}, a tensor subclass with its own "
                          "__torch_dispatch__ that is not a traceable wrapper subclass (no "
                          "__tensor_flatten__/__tensor_unflatten__): it cannot be traced",
                          hint="make the class a wrapper subclass; without fullgraph=True the code using it runs "
                               "eagerly")
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter) or tensor.is_sparse or tensor.is_nested:
        raise _unsupported(f"tensor subclass or layout not supported yet: {type(tensor).__name__}")
    dynamic = tx.dynamic_dims_for(tensor, source)
    value = tx.graph.add_input(tensor, source, dynamic)
    symbolic = tuple(d for d in dynamic if isinstance(value.fake.shape[d], torch.SymInt))
    tx.guards.add(g.TENSOR_MATCH, source, g.TensorMeta(tensor), dynamic_dims=symbolic)
    return value


def _is_function_subclass(cls):
    """A plain subclass of torch.Tensor (not Parameter): its torch calls go through its
    ``__torch_function__`` (trace/torch_api/torch_function.py traces it)."""
    return issubclass(cls, torch.Tensor) and not issubclass(cls, torch.nn.Parameter) and cls is not torch.Tensor \
        and getattr(cls, "__torch_dispatch__", torch.Tensor.__torch_dispatch__) is torch.Tensor.__torch_dispatch__ \
        and not hasattr(cls, "__tensor_flatten__")


def _wrap_function_subclass(tx, tensor, source):
    """A tensor of a ``__torch_function__`` class as a graph input: a plain tensor in the graph
    (which runs with subclass dispatch off), its class kept on the value; guarded like any
    tensor (TENSOR_MATCH checks the class)."""
    with torch._C.DisableTorchFunctionSubclass():   # our reads, not the program's: no override
        if tensor.is_sparse or tensor.is_nested:
            raise _unsupported(f"tensor subclass or layout not supported yet: {type(tensor).__name__}")
        plain = tensor.as_subclass(torch.Tensor)
        dynamic = tx.dynamic_dims_for(plain, source)
        value = tx.graph.add_input(plain, source, dynamic)
        meta = g.TensorMeta(plain)
    meta.cls = type(tensor)
    value.cls = type(tensor)
    value.node.meta["function_subclass"] = type(tensor)
    tx.graph.function_subclass_inputs = True
    symbolic = tuple(d for d in dynamic if isinstance(value.fake.shape[d], torch.SymInt))
    tx.guards.add(g.TENSOR_MATCH, source, meta, dynamic_dims=symbolic)
    return value


def _wrap_subclass(tx, tensor, source):
    """A traceable wrapper subclass (``__tensor_flatten__``/``__torch_dispatch__``) as a graph
    input: its fake is the subclass over fake inner tensors, so its ``__torch_dispatch__`` runs
    as the graph is built; the graph takes (and the backend gets) the subclass itself. Sizes are
    symbolic where ``_subclass_dynamic_dims`` allows, else static (a new size recompiles)."""
    dynamic, inner = _subclass_dynamic_dims(tx, tensor, source)
    if not inner:
        guard_subclass_layout(tx, tensor, source)
    value = tx.graph.add_input(tensor, source, dynamic, inner)
    _check_fake_class(tensor, value.fake, source.name())
    if inner:
        symbolic_inner = {name: tuple(d for d in dims if isinstance(getattr(value.fake, name).shape[d], torch.SymInt))
                          for name, dims in inner.items()}
        outer_symbolic = any(isinstance(s, torch.SymInt) for s in value.fake.shape)
        guard_subclass_layout(tx, tensor, source, symbolic_inner, sizes_by_shape_guards=outer_symbolic)
    symbolic = tuple(d for d in dynamic if isinstance(value.fake.shape[d], torch.SymInt))
    tx.guards.add(g.TENSOR_MATCH, source, g.TensorMeta(tensor), dynamic_dims=symbolic)
    return value


def _subclass_dynamic_dims(tx, tensor, source):
    """Symbolic dims of a wrapper subclass input and of its inner tensors (name -> dims): the
    outer ones as for any tensor (marked, or seen changing); an inner tensor's are its own seen
    changing and the outer's it shares (same dim, same size). Only plain inner tensors of a class
    whose flatten context holds no sizes (TwoTensor) or only the outer tensor's own (DTensor's
    TensorMeta) take part: else all static. Opaque parts (DTensor's mesh) are left aside."""
    dynamic = tx.dynamic_dims_for(tensor, source)
    names, ctx = tensor.__tensor_flatten__()
    inners = {n: getattr(tensor, n) for n in names if isinstance(getattr(tensor, n), torch.Tensor)}
    if not (_sizes_free(ctx) or _context_sizes_checked_by_shape_guards(tensor, ctx) is not None) \
            or any(type(t) not in (torch.Tensor, torch.nn.Parameter) for t in inners.values()):
        return {}, {}
    inner = {}
    for name, t in inners.items():
        dims = {d: b for d, b in dynamic.items() if d < t.dim() and t.shape[d] == tensor.shape[d]}
        dims.update(tx.dynamic_dims_for(t, AttrSource(source, name)))
        if dims:
            inner[name] = dims
    if not inner:
        return {}, {}    # nothing inside changes: the outer sizes follow from the inner ones
    return dynamic, inner


def _sizes_free(ctx):
    """Does a flatten context hold nothing that depends on sizes (None, strings, numbers that
    are not sizes cannot be told apart: only None and strings count)?"""
    return ctx is None or isinstance(ctx, str)


def _context_sizes_checked_by_shape_guards(tensor, ctx):
    """DTensor's flatten context, ``(placements, TensorMeta(shape, stride, dtype), shard order,
    requires_grad)``, holds the DTensor's own sizes and strides: the context with those two left
    to TENSOR_MATCH and the shape guards (as torch.compile compares a DTensor's spec without its
    shape); None for any other context."""
    module = sys.modules.get("torch.distributed.tensor._dtensor_spec")
    meta_type = getattr(module, "TensorMeta", None)
    if meta_type is None or not isinstance(ctx, tuple):
        return None
    found = [i for i, part in enumerate(ctx) if isinstance(part, meta_type)]
    if len(found) != 1:
        return None
    meta = ctx[found[0]]
    if tuple(meta.shape) != tuple(tensor.shape) or tuple(meta.stride) != tuple(tensor.stride()):
        return None
    loose = meta._replace(shape=g.SIZES_BY_SHAPE_GUARDS, stride=g.SIZES_BY_SHAPE_GUARDS)
    return ctx[:found[0]] + (loose,) + ctx[found[0] + 1:]


def is_placement_type(t):
    """A DTensor placement class (``Shard``, ``Replicate``, ``Partial``...): immutable values that
    compare by their fields, constants of a trace as torch.compile takes them."""
    module = sys.modules.get("torch.distributed.tensor.placement_types")
    placement = getattr(module, "Placement", None)
    return placement is not None and isinstance(t, type) and issubclass(t, placement)


def _is_opaque_reference(obj):
    """An object torch's compile stack carries by reference through a graph (torch 2.13's opaque
    objects: a DeviceMesh among DTensor's flattened parts)."""
    try:
        from torch._library.opaque_object import is_opaque_reference_type
    except ImportError:
        return False
    return is_opaque_reference_type(type(obj))


def _check_fake_class(tensor, fake, where):
    """The fake made through ``__tensor_unflatten__`` is of the tensor's class, all the way in (a
    subclass inheriting its base's unflatten would be traced as the base)."""
    if not is_traceable_wrapper_subclass(tensor):
        return      # a plain inner tensor: its fake is a FakeTensor
    if type(fake) is not type(tensor):
        raise Unsupported(f"{where}: {type(tensor).__qualname__}.__tensor_unflatten__ makes a {type(fake).__qualname__}, "
                          f"not a {type(tensor).__qualname__}, so its operations cannot be traced as its own",
                          hint=f"define __tensor_unflatten__ on {type(tensor).__qualname__} returning its own class")
    for name in tensor.__tensor_flatten__()[0]:
        if isinstance(getattr(tensor, name), torch.Tensor):
            _check_fake_class(getattr(tensor, name), getattr(fake, name), f"{where}.{name}")


def guard_subclass_layout(tx, tensor, source, inner_dynamic=None, sizes_by_shape_guards=False):
    """Guards on how a wrapper subclass is made: its inner tensor names and flatten context, and
    each inner tensor's type, dtype, device, sizes and strides (nested subclasses too; the
    sizes in ``inner_dynamic`` (name -> dims) are left to the shape guards, and so are the outer
    sizes a context holds with ``sizes_by_shape_guards``)."""
    meta = g.subclass_flatten_meta(tensor)
    if sizes_by_shape_guards:
        loose = _context_sizes_checked_by_shape_guards(tensor, meta[1])
        if loose is not None:
            meta = (meta[0], loose)
    if not g.KINDS[g.SUBCLASS_META].holds(tensor, meta):
        raise _unsupported(f"{type(tensor).__name__}: the context of __tensor_flatten__ ({meta[1]!r}) is not equal "
                           f"to itself, so no guard can tell when it changes")
    tx.guards.add(g.SUBCLASS_META, source, meta)
    for name in meta[0]:
        inner, inner_source = getattr(tensor, name), AttrSource(source, name)
        if not isinstance(inner, torch.Tensor):
            if not _is_opaque_reference(inner):
                raise _unsupported(f"{type(tensor).__name__}.{name} (from __tensor_flatten__) is not a tensor")
            # An opaque object kept by reference (DTensor's DeviceMesh): the same one, then.
            _guard(tx, g.ID_MATCH, inner_source, inner)
            continue
        if is_traceable_wrapper_subclass(inner):
            guard_subclass_layout(tx, inner, inner_source)
        elif type(inner) not in (torch.Tensor, torch.nn.Parameter) or inner.is_sparse or inner.is_nested:
            raise _unsupported(f"{type(tensor).__name__}.{name}: tensor subclass or layout not supported "
                               f"inside a wrapper subclass: {type(inner).__name__}")
        dims = tuple((inner_dynamic or {}).get(name, ()))
        tx.guards.add(g.TENSOR_MATCH, inner_source, g.TensorMeta(inner), dynamic_dims=dims)


def _module_is_numpy(t):
    return t.__module__ == "numpy" or t.__module__.startswith("numpy.")


def _wrap_ndarray(tx, array, source):
    """An np.ndarray read through a source: a graph input over its data (values/arrays.py)."""
    if source is None:
        raise _unsupported("an np.ndarray that cannot be re-read on later calls (no source)")
    device = g.default_device()
    tx.guards.add(g.GLOBAL_STATE, None, ("_default_device()", device), "default device")
    dynamic = tx.dynamic_dims_for(array, source)
    value = tx.graph.add_ndarray_input(array, source, device, dynamic)
    symbolic = tuple(d for d in dynamic if isinstance(value.fake.shape[d], torch.SymInt))
    tx.guards.add(g.NDARRAY_MATCH, source, g.ArrayMeta(array), dynamic_dims=symbolic)
    if not symbolic:
        value.strides = array.strides    # NDARRAY_MATCH guards them
    return value


def _unsupported(reason):
    return Unsupported(reason)


__all__ = ["wrap", "constant", "is_trusted_module"]
