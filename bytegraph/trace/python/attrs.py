"""Attribute reads on values: ``value.name`` while tracing."""
from __future__ import annotations

import types
from collections import OrderedDict

import torch

from ...errors import Unsupported
from ...guards import builder as g
from ...guards import stamps
from ...guards.builder import MISSING_ATTR
from ...guards.sources import AttrSource, ClassEntrySource, ItemSource, ObjectSource, RawItemSource
from ...values.base import (BoundMethodValue, ConstantValue, ContextManagerValue, DefaultDictValue, DictValue,
                           ExceptionValue, FunctionValue, GeneratorValue, ListValue, MethodOfValue,
                           ObjectValue, PartialValue, PrivateObjectValue, SuperValue, TensorValue,
                           TupleValue, UserObjectValue)
from ...values.builder import CONSTANT_TYPES, is_trusted_module, note_reassigned_buffer, wrap
from ...values.arrays import NdarrayValue
from ...datamodel import MISSING, class_attr, class_lookup, has_python_get, is_data_descriptor
from . import exceptions, lookup, tensor_attrs
from ..core import ops
from ..numpy_api import numpy_calls
from ..core.basics import as_constant, describe, no_attr_name
from ..core.context import DELETED
from .exceptions import MissingAttribute, set_attr as set_exception_attr, super_attr
from .lookup import (_DICT_READS, defined_by_dict as _defined_by_dict, dict_method, note_store as _note_store,  # noqa: F401
                     private_value, set_item as _set_item, table_of as _table_of)
from .protocols import guard_class_method
from ...values.base import Value
from ..core.context import RunningFrame




def get_attr(frame: RunningFrame, v: Value, name: str) -> Value:
    try:
        return _get_attr(frame, v, name)
    except MissingAttribute:
        # The trace goes on knowing the attribute is missing (hasattr, except AttributeError);
        # not when the trace itself deleted it (the object had it when called).
        if isinstance(v, ObjectValue) and v.source is not None and (id(v.obj), name) not in frame.tx.effects.attr_stores:
            frame.tx.guards.add(MISSING_ATTR, v.source, name)
        raise


def _get_attr(frame, v, name):
    reader = _reader_for(type(v))
    value = reader(frame, v, name) if reader is not None else None
    if value is None:
        raise Unsupported(f"attribute {name!r} of {describe(v)} is not supported yet")
    return value


def _reader_for(cls):
    """The attribute reader of a kind of value: the entry of ``cls`` or of its nearest base."""
    try:
        return _READER_OF_TYPE[cls]
    except KeyError:
        reader = next((_READERS[c] for c in cls.__mro__ if c in _READERS), None)
        _READER_OF_TYPE[cls] = reader
        return reader


def _object_value_attr(frame, v, name):
    if numpy_calls.is_numpy_object(v):
        value = numpy_calls.object_attr(frame, v, name)
        if value is not None:
            return value
    return _object_attr(frame, v, name)


def _tuple_attr(frame, v, name):
    fields = getattr(v.cls, "_fields", None) or getattr(v.cls, "__match_args__", None)
    if fields and name in fields:
        return v.items[fields.index(name)]
    if name in ("count", "index"):
        return MethodOfValue(v, name)
    if v.cls not in (tuple, torch.Size) and name not in ("_replace", "_asdict"):
        # Methods, properties and class attributes of a namedtuple (subclass): as for any object.
        attr, found = class_lookup(v.cls, name)
        if found and _defined_in_python_class(v.cls, name):
            return lookup.bind(frame, lookup.Instance(v, v.cls), name, attr)
    return _container_attr(frame, v, name)


def _container_attr(frame, v, name):
    if name == "__class__":
        return wrap(frame.tx, v.python_type(), None)   # its type is fixed (guarded if from outside)
    if name == "default_factory" and isinstance(v, DefaultDictValue):
        return v.factory
    if hasattr(v.python_type(), name):
        return MethodOfValue(v, name)
    return None


def _partial_attr(frame, v, name):
    if name == "func":
        return v.func
    if name == "args":
        return TupleValue(v.args)
    if name == "keywords":
        table = DictValue({})
        table.items = v.kwargs   # the partial's own table, as in CPython
        return table
    return None


def _context_manager_attr(frame, v, name):
    return MethodOfValue(v, name) if name in ("__enter__", "__exit__") else None


def _bound_method_attr(frame, v, name):
    if name == "__self__":
        return v.self_value
    if name == "__func__":
        return v.func
    return None


def _function_attr(frame, v, name):
    """An attribute of a function made in the frame: what was set on it, else what CPython gives."""
    if name in v.attrs:
        return v.attrs[name]
    if name == "__dict__":
        table = DictValue({})
        table.items = v.attrs   # the function's own attribute table
        return table
    if name in ("__name__", "__qualname__"):
        return ConstantValue(v.name if name == "__name__" else v.qualname)
    if name == "__code__":
        return ConstantValue(v.code)
    if name == "__module__":
        return ConstantValue(v.globals.get("__name__"))
    if name == "__doc__":
        # CPython's rule for the docstring, from a throwaway function over the same code.
        cells = tuple(types.CellType() for _ in v.code.co_freevars) or None
        return ConstantValue(types.FunctionType(v.code, {}, None, None, cells).__doc__)
    if name == "__defaults__":
        return TupleValue(v.defaults) if v.defaults else ConstantValue(None)
    if name == "__kwdefaults__":
        return DictValue(v.kwdefaults) if v.kwdefaults else ConstantValue(None)
    if name == "__globals__":
        return wrap(frame.tx, v.globals, None)
    if name == "__type_params__" and hasattr(types.FunctionType, name):
        return ConstantValue(())
    if hasattr(types.FunctionType, name):
        raise Unsupported(f"attribute {name!r} of a function made in the compiled function is not supported yet")
    raise MissingAttribute(f"'function' object has no attribute {name!r}")


_FUNCTION_STR_ATTRS = ("__name__", "__qualname__")


def _set_function_attr(frame, v, name, value):
    if name in _FUNCTION_STR_ATTRS:
        text = value.value if isinstance(value, ConstantValue) else None
        if not isinstance(text, str):
            exceptions.raise_new(TypeError, f"{name} must be set to a string object")
        if name == "__name__":
            v.name = text
        else:
            v.qualname = text
        return
    if name in ("__code__", "__defaults__", "__kwdefaults__", "__closure__", "__globals__", "__dict__",
                "__annotations__", "__builtins__"):
        raise Unsupported(f"setting {name} of a function made in the compiled function is not supported yet")
    if name == "__type_params__" and not (isinstance(value, TupleValue) and value.cls is tuple or
                                          isinstance(value, ConstantValue) and type(value.value) is tuple):
        raise Unsupported("setting __type_params__ to a value that is not a tuple")
    v.attrs[name] = value




def _constant_attr(v, name):
    if isinstance(v.value, set) and hasattr(set, name):
        return MethodOfValue(v, name)   # trace/callables/containers.py: sets are changed in place
    try:
        out = getattr(v.value, name)
    except AttributeError:
        raise MissingAttribute(f"{no_attr_name(type(v.value))} object has no attribute {name!r}") from None
    if isinstance(out, CONSTANT_TYPES) or isinstance(out, (tuple, frozenset)):
        return ConstantValue(out)
    if type(out) is types.MappingProxyType:
        # The read-only view an immutable constant keeps (inspect.Signature.parameters): its
        # methods read it like a dict (diffusers' attention checks its processor's parameters).
        return ObjectValue(out)
    if callable(out):
        # A builtin method of an immutable constant: folded when called.
        return ObjectValue(out)
    return ConstantValue(out)


def _is_torch_nn_module(obj):
    return type(obj).__module__.startswith("torch.nn.")


def _object_attr(frame, v, name):
    tx = frame.tx
    obj = v.obj
    if name == "__dict__" or (name in stamps.STATE_TABLES and isinstance(obj, torch.nn.Module)):
        table = _object_attr_read(frame, v, name)
        if isinstance(table, DictValue):
            for store_key, (_, key, value) in list(tx.effects.attr_stores.items()):
                if store_key[0] == id(obj) and _table_of(obj, key) == name:
                    _set_item(table, key, value)
        return table
    return _object_attr_read(frame, v, name)


def _object_attr_read(frame, v, name):
    tx = frame.tx
    obj, src = v.obj, v.source
    asrc = AttrSource(src, name) if src is not None else None
    if isinstance(obj, types.ModuleType):
        try:
            value = getattr(obj, name)
        except AttributeError:
            raise MissingAttribute(f"module {obj.__name__!r} has no attribute {name!r}") from None
        return wrap(tx, value, None if is_trusted_module(obj) else asrc)
    if isinstance(obj, type):
        trusted = obj.__module__.split(".")[0] in ("torch", "builtins", "collections", "typing", "enum")
        try:
            value = getattr(obj, name)
        except AttributeError:
            if src is None and not trusted:
                tx.guards.add(MISSING_ATTR, ObjectSource(obj, obj.__qualname__), name)
            raise MissingAttribute(f"type object {no_attr_name(obj)} has no attribute {name!r}") from None
        if trusted:
            return wrap(tx, value, None)
        if src is None:
            # A class read without a source (`type(obj).x`): what the attribute is bound to is
            # guarded through the class (`Model.scale = 2` later), by value or identity; its
            # contents are taken as fixed (guarding a dataclass's fields item by item costs
            # every call).
            owner = ObjectSource(obj, obj.__qualname__)
            raw = class_attr(obj, name)
            if raw is not MISSING and raw is not value and not is_data_descriptor(class_attr(type(obj), name)):
                # Bound on every read (a classmethod, ``itertools.chain.from_iterable``): the
                # entry it was bound from is what stays the same.
                tx.guards.add(g.ID_MATCH, ClassEntrySource(owner, name), raw)
                return wrap(tx, value, None)
            fixed = type(value) in CONSTANT_TYPES
            tx.guards.add(g.CONSTANT_MATCH if fixed else g.ID_MATCH, AttrSource(owner, name), value)
            return wrap(tx, value, None)
        return wrap(tx, value, asrc)
    cls = type(obj)
    if cls is types.MappingProxyType and name in _DICT_READS:
        return MethodOfValue(proxy_dict(frame, v), name)
    if isinstance(obj, types.CodeType):
        # Code objects are immutable: once the code is guarded, its attributes are fixed.
        try:
            return wrap(tx, getattr(obj, name), None)
        except AttributeError:
            raise MissingAttribute(f"'code' object has no attribute {name!r}") from None
    if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
        if name in ("__name__", "__qualname__", "__module__", "__doc__"):
            return ConstantValue(getattr(obj, name))
        if isinstance(obj, types.MethodType) and name in ("__self__", "__func__"):
            return wrap(tx, getattr(obj, name), asrc)
    if found_dict_read(cls, name) and isinstance(obj, dict) and src is not None:
        # dict's own read methods on a dict subclass from outside the trace (a ModelOutput
        # returned by a call before a graph break): read its items, guarded on keys.
        return MethodOfValue(_dict_view(frame, v), name)
    inst = lookup.PrivateInstance(v) if isinstance(v, PrivateObjectValue) else lookup.ExistingInstance(v)
    return lookup.instance_attr(frame, inst, name)


def found_dict_read(cls, name):
    """Is ``cls.name`` one of dict's own read methods (not overridden in Python)?"""
    return name in _DICT_READS and _defined_by_dict(cls, name)


def _defined_in_python_class(cls, name):
    """True if ``cls.name`` comes from a class other than the builtin ones (tuple, object...)."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__module__ != "builtins"
    return False


def _user_object_attr(frame, v, name):
    """``v.name`` for an object made in the trace (a user class's, an exception)."""
    return lookup.instance_attr(frame, lookup.TracedInstance(v, v.cls), name)


def _super_attr(frame, sv, name):
    if isinstance(sv.obj, ExceptionValue):
        found = super_attr(frame, sv, name)
        if found is not None:
            return found
    obj_type = sv.obj.python_type() if not isinstance(sv.obj, ObjectValue) else type(sv.obj.obj)
    if isinstance(sv.obj, ObjectValue) and isinstance(sv.obj.obj, type) and issubclass(sv.obj.obj, sv.cls):
        return _super_class_attr(frame, sv, name)   # super() in a classmethod: super(C, cls)
    mro = obj_type.__mro__
    if sv.cls not in mro:
        raise Unsupported("super(): the object is not an instance of the class")
    inst = lookup.instance_of(sv.obj) if isinstance(sv.obj, (ObjectValue, UserObjectValue, ExceptionValue)) \
        else lookup.Instance(sv.obj, obj_type)
    for klass in mro[mro.index(sv.cls) + 1:]:
        if name in klass.__dict__:
            attr = klass.__dict__[name]
            if attr is object.__init__:
                return ObjectValue(_noop_init)
            if attr in (object.__setattr__, object.__getattribute__) \
                    and isinstance(sv.obj, (UserObjectValue, PrivateObjectValue)):
                return BoundMethodValue(ObjectValue(attr), sv.obj)
            if attr in (object.__setattr__, object.__getattribute__) and isinstance(sv.obj, ObjectValue) \
                    and sv.obj.source is not None:
                return BoundMethodValue(ObjectValue(attr), sv.obj)   # the plain store, recorded (set_attr)
            if klass in (dict, OrderedDict) and isinstance(sv.obj, UserObjectValue) \
                    and sv.obj.dict_items is not None:
                return dict_method(frame, sv.obj, name)
            if isinstance(attr, (types.FunctionType, staticmethod, classmethod)) \
                    or isinstance(attr, property) and attr.fget is not None or has_python_get(attr):
                return lookup.bind(frame, inst, name, attr, cls=klass)
            if klass is dict and name in _DICT_READS and isinstance(sv.obj, ObjectValue) \
                    and sv.obj.source is not None:
                # dict's own read methods on a dict subclass that exists outside the trace:
                # read its contents as a dict value (guarded on keys and items as read).
                return MethodOfValue(_dict_view(frame, sv.obj), name)
            break
    raise Unsupported(f"super().{name} is not supported yet")


def _super_class_attr(frame, sv, name):
    """``super(C, cls).name`` for a class ``cls``: classmethods bind to ``cls``, functions stay plain."""
    owner = sv.obj.obj
    mro = owner.__mro__
    for klass in mro[mro.index(sv.cls) + 1:]:
        if name in klass.__dict__:
            attr = klass.__dict__[name]
            if isinstance(attr, classmethod):
                return BoundMethodValue(wrap(frame.tx, attr.__func__, None), sv.obj)
            if isinstance(attr, staticmethod):
                return wrap(frame.tx, attr.__func__, None)
            if isinstance(attr, types.FunctionType):
                return wrap(frame.tx, attr, None)
            break
    raise Unsupported(f"super().{name} in a classmethod is not supported yet")


def _dict_view(frame, ov):
    obj, src = ov.obj, ov.source
    if not all(isinstance(k, (str, int)) for k in obj):
        raise Unsupported("reading a dict subclass with keys other than str/int is not supported yet")
    frame.tx.guards.add(g.DICT_KEYS, src, list(dict.keys(obj)))
    items = {k: wrap(frame.tx, dict.__getitem__(obj, k), RawItemSource(src, k)) for k in dict.keys(obj)}
    view = DictValue(items, src, cls=dict)
    return view


# --- a class's __dict__ (a mappingproxy) ----------------------------------------------------

def is_mapping_proxy(v):
    return isinstance(v, ObjectValue) and type(v.obj) is types.MappingProxyType


def proxy_keys(frame, v):
    """The keys of a mappingproxy value; the trace relies on all of them (guarded)."""
    if v.source is not None:
        frame.tx.guards.add(g.DICT_KEYS, v.source, list(v.obj))
    return list(v.obj)


def proxy_item(frame, v, key):
    """``proxy[key]``: the entry read through its own source; KeyError (guarded) if missing."""
    if key not in v.obj:
        proxy_keys(frame, v)
        exceptions.raise_new(KeyError, key)
    return wrap(frame.tx, v.obj[key], ItemSource(v.source, key) if v.source is not None else None)


def proxy_dict(frame, v):
    """A read-only dict value with every entry of a mappingproxy (for its methods)."""
    return DictValue({k: proxy_item(frame, v, k) for k in proxy_keys(frame, v)}, cls=types.MappingProxyType)
def is_existing_dict(v, method):
    """A dict (or an object of a dict subclass) from outside the trace, read through a source (a
    ModelOutput returned before a graph break, a table keyed by types), whose special ``method``
    is dict's own."""
    return isinstance(v, ObjectValue) and isinstance(v.obj, dict) and v.source is not None \
        and getattr(type(v.obj), method) is getattr(dict, method)


def guarded_dict_keys(frame, ov):
    """The keys of such an object, guarded."""
    keys = list(dict.keys(ov.obj))
    frame.tx.guards.add(g.DICT_KEYS, ov.source, keys)   # the keys themselves are held by the guard
    return keys


def _noop_init(*args, **kwargs):
    return None


def set_attr(frame: RunningFrame, obj: Value, name: str, value: Value, plain: bool = False) -> None:
    """``obj.name = value``: on objects made while tracing, or recorded and replayed after the graph.

    ``plain``: ``object.__setattr__`` itself, skipping a ``__setattr__`` the class defines.
    """
    if isinstance(obj, ExceptionValue):
        return set_exception_attr(frame, obj, name, value)
    if isinstance(obj, FunctionValue):
        return _set_function_attr(frame, obj, name, value)
    if isinstance(obj, TensorValue) and obj.cls in (torch.Tensor, torch.nn.Parameter):
        return tensor_attrs.set_tensor_attr(frame, obj, name, value)
    if isinstance(obj, UserObjectValue):
        hook = obj.cls.__setattr__
        if not plain and hook is not object.__setattr__:
            ops.call(frame, wrap(frame.tx, hook, None), [obj, ConstantValue(name), value], {})
            return
        if descriptor_store(frame, obj, obj.cls, name, value):
            return
        _refuse_without_dict(obj.cls, name, delete=False)
        obj.attrs[name] = value   # a __slots__ member is stored like an attribute
        return
    if isinstance(obj, PrivateObjectValue):
        hook = type(obj.obj).__setattr__
        if hook is torch.nn.Module.__setattr__ and not plain:
            # A module made in the trace: torch's own bookkeeping (submodules, parameters) runs on it.
            hook(obj.obj, name, _real_for_private(value))
            return
        if not plain and isinstance(hook, types.FunctionType):
            ops.call(frame, wrap(frame.tx, hook, None), [obj, ConstantValue(name), value], {})
            return
        # Nothing outside the trace sees this object: the store happens now.
        object.__setattr__(obj.obj, name, as_constant(value))
        return
    if isinstance(obj, ObjectValue) and not isinstance(obj, PrivateObjectValue) and not plain \
            and isinstance(type(obj.obj).__setattr__, types.FunctionType) \
            and not isinstance(obj.obj, (torch.nn.Module, type, types.ModuleType)):
        # The class's own __setattr__ (validation, renaming) is traced; the plain store it
        # ends with (object.__setattr__ / super().__setattr__) is recorded below.
        ops.call(frame, wrap(frame.tx, type(obj.obj).__setattr__, None), [obj, ConstantValue(name), value], {})
        return
    if isinstance(obj, ObjectValue) and obj.source is not None and not isinstance(obj.obj, (type, types.ModuleType)) \
            and (type(obj.obj).__setattr__ is object.__setattr__ or _module_plain_store(obj.obj, name, value)) \
            and descriptor_store(frame, obj, type(obj.obj), name, value):
        return
    if isinstance(obj, ObjectValue) and obj.source is not None and _replayable_store(obj.obj, name, value, plain):
        stores, key = frame.tx.effects.attr_stores, (id(obj.obj), name)
        earlier = stores.get(key)
        if earlier is not None and earlier[2] is DELETED and name in getattr(obj.obj, "__dict__", {}):
            # Deleted, then stored again: both are done (the entry moves to the end of the
            # object's __dict__, as in eager).
            del stores[key]
            stores[key + ("deleted first",)] = earlier
        stores[key] = (obj, name, value)
        _note_store(frame.tx, obj.obj, name, value)
        return
    raise Unsupported(f"setting attribute {name!r} on {describe(obj)} (a side effect) is not supported yet",
                      hint="side effects on objects that exist outside the compiled function run eagerly")


def _refuse_without_dict(cls, name, delete):
    """Objects of a class whose instances have no ``__dict__`` (``__slots__`` all the way up) hold
    nothing but their slot members: storing or deleting another name raises AttributeError
    (CPython's own, got from the same operation on a blank object of the class); so does
    deleting an unset slot member."""
    attr, found = class_lookup(cls, name)
    if class_lookup(cls, "__dict__")[1] and not isinstance(attr, types.MemberDescriptorType):
        return
    if isinstance(attr, types.MemberDescriptorType) and not delete:
        return
    blank = cls.__new__(cls)   # object.__new__ or dict.__new__: objects made in the trace have no other
    try:
        if delete:
            object.__delattr__(blank, name)
        else:
            object.__setattr__(blank, name, None)
    except AttributeError as e:
        exceptions.raise_new(AttributeError, str(e))


def descriptor_store(frame, obj, cls, name, value, delete=False):
    """``obj.name = value`` (or ``del obj.name``) through a data descriptor of ``cls`` written in
    Python or a ``property``: its setter (deleter) is traced. False if no such descriptor applies;
    a slot member (``__slots__``) is left to the caller."""
    attr = class_attr(cls, name)
    if attr is MISSING or not is_data_descriptor(attr) or isinstance(attr, types.MemberDescriptorType):
        return False
    what = "deleter" if delete else "setter"
    if isinstance(attr, property):
        fn = attr.fdel if delete else attr.fset
        if fn is None:
            raise Unsupported(f"property {name!r} of {cls.__qualname__} has no {what} (eager raises AttributeError)")
        fsrc = guard_class_method(frame.tx, cls, name, attr)
        fsrc = fsrc and AttrSource(fsrc, "fdel" if delete else "fset")
        ops.call(frame, wrap(frame.tx, fn, fsrc), [obj] + ([] if delete else [value]), {})
        return True
    method = getattr(type(attr), "__delete__" if delete else "__set__", None)
    if method is None:
        exceptions.raise_new(AttributeError, "__delete__" if delete else "__set__")
    if isinstance(method, types.FunctionType):
        desc = wrap(frame.tx, attr, lookup.descriptor_source(frame.tx, cls, name, attr))
        ops.call(frame, wrap(frame.tx, method, None), [desc, obj] + ([] if delete else [value]), {})
        return True
    raise Unsupported(f"{'deleting' if delete else 'setting'} {cls.__qualname__}.{name} "
                      f"(a {type(attr).__name__} descriptor) is not supported yet")


def _module_plain_store(module, name, value):
    """True if ``nn.Module.__setattr__`` would hand ``module.name = value`` to ``object.__setattr__``
    (so a property's setter runs): no parameter, submodule or buffer is involved."""
    if not isinstance(module, torch.nn.Module) or type(module).__setattr__ is not torch.nn.Module.__setattr__:
        return False
    if isinstance(value, TensorValue) and value.cls is not torch.Tensor:
        return False   # a Parameter is registered
    if isinstance(value, ObjectValue) and isinstance(value.obj, torch.nn.Module):
        return False   # a submodule is registered
    return not any(name in module.__dict__.get(t, ()) for t in ("_parameters", "_buffers", "_modules"))


def del_attr(frame: RunningFrame, obj: Value, name: str) -> None:
    """``del obj.name`` / ``delattr(obj, name)``: on objects made while tracing (or private to
    it) at once (a Python ``__delattr__``, a property's deleter, or the attribute itself); on an
    existing plain object through a Python descriptor's deleter, or recorded like a store and
    done after the graph."""
    if isinstance(obj, UserObjectValue):
        hook = obj.cls.__delattr__
        if hook is not object.__delattr__ and isinstance(hook, types.FunctionType):
            ops.call(frame, wrap(frame.tx, hook, None), [obj, ConstantValue(name)], {})
            return
        if descriptor_store(frame, obj, obj.cls, name, None, delete=True):
            return
        if name not in obj.attrs:
            _refuse_without_dict(obj.cls, name, delete=True)
            raise MissingAttribute(f"{no_attr_name(obj.cls)} object has no attribute {name!r}")
        del obj.attrs[name]
        return
    if isinstance(obj, PrivateObjectValue):
        hook = type(obj.obj).__delattr__
        if isinstance(hook, types.FunctionType):
            ops.call(frame, wrap(frame.tx, hook, None), [obj, ConstantValue(name)], {})
            return
        try:
            hook(obj.obj, name)
        except AttributeError as e:
            raise MissingAttribute(str(e)) from None
        return
    tx = frame.tx
    if isinstance(obj, ObjectValue) and obj.source is not None and type(obj.obj).__delattr__ is object.__delattr__ \
            and not isinstance(obj.obj, (type, torch.nn.Module)) \
            and descriptor_store(frame, obj, type(obj.obj), name, None, delete=True):
        return
    if isinstance(obj, ObjectValue) and obj.source is not None and not isinstance(obj.obj, torch.nn.Module) \
            and type(obj.obj).__delattr__ is object.__delattr__ and type(obj.obj).__setattr__ is object.__setattr__ \
            and not hasattr(type(obj.obj), name) \
            and (name in getattr(obj.obj, "__dict__", {}) or (id(obj.obj), name) in tx.effects.attr_stores):
        key = (id(obj.obj), name)
        earlier = tx.effects.attr_stores.get(key)
        if earlier is not None and earlier[2] is DELETED:
            raise MissingAttribute(f"{no_attr_name(type(obj.obj))} object has no attribute {name!r}")
        tx.effects.attr_stores.pop(key, None)
        tx.effects.attr_stores.pop(key + ("deleted first",), None)
        _note_store(tx, obj.obj, name, DELETED)
        if name in obj.obj.__dict__:
            # The replayed `del` needs the attribute in the object's own __dict__ on entry
            # (`obj.name` could be answered by the class once it is gone): guard that it is there.
            tx.guards.add(g.TYPE_MATCH, ItemSource(AttrSource(obj.source, "__dict__"), name),
                          type(obj.obj.__dict__[name]))
            tx.effects.attr_stores[(id(obj.obj), name)] = (obj, name, DELETED)
        # else: set earlier in this trace only; dropping that store is the whole effect.
        tx.effects.recorded += 1
        return
    raise Unsupported(f"deleting attribute {name!r} of {describe(obj)} is not supported yet")


def _real_for_private(value):
    """The real object to store into an object private to the trace."""
    if isinstance(value, ObjectValue):
        return value.obj
    if isinstance(value, TensorValue):
        raise Unsupported("storing a tensor on a module made inside the compiled function is not supported yet",
                          hint="create modules in __init__, not in forward")
    return as_constant(value)


def _replayable_store(obj, name, value, plain=False):
    """Can ``obj.name = value`` be recorded now and done for real after the graph?

    ``plain``: the store of ``object.__setattr__`` itself, which a Python ``__setattr__``
    of the class calls (replayed as ``obj.name = value``, which runs that hook again)."""
    cls = type(obj)
    if isinstance(obj, (type, types.ModuleType, types.FunctionType)):
        return False
    if isinstance(obj, torch.nn.Module):
        if isinstance(value, TensorValue) and name in obj.__dict__.get("_buffers", ()):
            # A new tensor for an existing buffer (nn.Module.__setattr__ puts it in _buffers).
            note_reassigned_buffer(obj, name)
            return True
        if isinstance(value, TensorValue) and not any(
                name in obj.__dict__.get(t, ()) for t in ("_parameters", "_buffers", "_modules")):
            return True   # a plain tensor attribute
        # Stores that register parameters, buffers or submodules change the module's structure.
        if isinstance(value, (ObjectValue, TensorValue)) or any(
                name in obj.__dict__.get(t, ()) for t in ("_parameters", "_buffers", "_modules")):
            return False
    elif cls.__setattr__ is not object.__setattr__ and not (plain and isinstance(cls.__setattr__, types.FunctionType)):
        return False
    attr, found = class_lookup(cls, name)
    return not (found and is_data_descriptor(attr)) and hasattr(obj, "__dict__")



# value class -> reader(frame, v, name): the attribute's value, or None when the reader has no
# answer for that name (an Unsupported then). A kind of value not listed has no attributes yet.
_READERS = {
    TensorValue: tensor_attrs.tensor_attr,
    NdarrayValue: numpy_calls.array_attr,
    ConstantValue: lambda frame, v, name: _constant_attr(v, name),
    ObjectValue: _object_value_attr,
    UserObjectValue: _user_object_attr,
    SuperValue: _super_attr,
    ExceptionValue: lookup.exception_attr,
    GeneratorValue: lambda frame, v, name: ops.generator_attr(frame, v, name),   # wired at import
    TupleValue: _tuple_attr,
    ListValue: _container_attr,
    DictValue: _container_attr,
    FunctionValue: _function_attr,
    PartialValue: _partial_attr,
    ContextManagerValue: _context_manager_attr,
    BoundMethodValue: _bound_method_attr,
}
_READER_OF_TYPE = {}
