"""``obj.name`` for an instance of a class, answered in Python's own order.

``object.__getattribute__`` looks ``name`` up on the type's MRO first (``datamodel``); a
*data descriptor* found there answers (a property, a slot, a descriptor whose class has
``__set__``/``__delete__``); else the instance's own ``__dict__``; else what the MRO found
(a function binds to the instance, a static or class method unwraps, a non-data
descriptor's ``__get__`` runs, a plain class attribute is the answer); else, when the type
has ``__getattr__``, its answer — for an ``nn.Module`` that is the search of its
``_parameters``, ``_buffers`` and ``_modules``. A ``__getattribute__`` of the class's own
replaces all of this, and an AttributeError raised on the way (a property's getter)
hands over to ``__getattr__`` as in CPython.

``instance_attr`` is that order, once, for every value the tracer models as an instance of
a class: objects made in the trace (``UserObjectValue``, exceptions), objects from outside
read through a source (``ObjectValue``: user objects, ``nn.Module``s) and objects private to
the trace. The kinds differ only in how their own state is read, which an ``Instance``
says; ``super_attr`` is the same binding over the MRO after a class. What an answer
depended on is guarded: a function or descriptor found on the class by identity there
(``protocols.guard_class_method``), a plain class attribute by its value read through the
class, and the instance's not having an attribute of its own where the class answered.
"""
from __future__ import annotations

import collections
import functools
import types
from collections import OrderedDict

import torch

from ...datamodel import (MISSING, class_attr, class_lookup, class_lookup_owner, has_python_get, is_data_descriptor,
                         raw_attr)
from ...errors import Unsupported
from ...guards import builder as g
from ...guards import stamps
from ...guards.sources import (AttrSource, ClassEntrySource, ItemSource, ModuleEntrySource, ObjectSource,
                              RawAttrOrMissingSource, RawAttrSource)
from ...values.base import (BoundMethodValue, ConstantValue, DictValue, ExceptionValue, MethodOfValue, ObjectValue,
                             PrivateObjectValue, TupleValue)
from ...values.builder import CONSTANT_TYPES, wrap
from . import exceptions
from ..core import ops
from ..core.basics import MissingAttribute, no_attr_name
from ..core.context import DELETED
from .exceptions import TracedRaise
from .protocols import guard_class_method
from ...values.base import Value
from ..core.context import RunningFrame

# Builtin types whose ``__getattribute__`` is CPython's generic one (``object.__getattribute__``'s
# order; each type has its own wrapper of it).
_GENERIC_GETATTRIBUTE_TYPES = (object, dict, list, tuple, set, frozenset, int, float, complex, str, bytes,
                               BaseException, collections.defaultdict, collections.deque, types.SimpleNamespace)


def is_generic_getattribute(getattribute):
    """Does this ``__getattribute__`` (found on a class) follow the generic order?"""
    return getattribute is object.__getattribute__ or (
        isinstance(getattribute, types.WrapperDescriptorType)
        and getattribute.__objclass__ in _GENERIC_GETATTRIBUTE_TYPES)
# Classes whose attributes are taken as fixed (as ``guard_class_method`` does): no guard on their
# plain class attributes.
_FIXED_CLASS_MODULES = ("builtins", "torch")


class Instance:
    """How the lookup reads one kind of object: its class and its own state."""

    def __init__(self, value, cls):
        self.value = value
        self.cls = cls

    def own(self, frame, name):
        """The entry ``name`` of the instance's ``__dict__`` as a value, or None."""
        return None

    def slot(self, frame, name):
        """The content of the ``__slots__`` member ``name`` (MissingAttribute when unset)."""
        raise MissingAttribute(self.missing(name))

    def native(self, frame, name, attr):
        """An attribute C code answers (a C descriptor of a builtin base class)."""
        raise Unsupported(f"descriptor {type(attr).__name__} for {self.cls.__qualname__}.{name} "
                          "is not supported yet")

    def class_answered(self, frame, name):
        """The class (or ``__getattr__``) answered ``name``: guard that the instance still has no
        attribute of its own by that name, where it could get one."""

    def module_entry(self, frame, name):
        """``nn.Module.__getattr__``: the parameter, buffer or submodule ``name``, or None."""
        return None

    def cache(self, frame, name, value):
        """``obj.__dict__[name] = value`` (what ``functools.cached_property`` does)."""
        raise Unsupported(f"caching a cached_property on {self.cls.__qualname__} objects is not supported yet")

    def custom_getattribute(self, frame, name, hook):
        """``obj.name`` through a ``__getattribute__`` the class defines."""
        raise Unsupported(f"reading attributes of {self.cls.__qualname__} objects made inside the compiled "
                          "function (a class with its own __getattribute__) is not supported yet")

    def depends_on_class(self, frame, name, attr):
        """The answer for ``name`` rests on the class's MRO holding ``attr`` (``MISSING``: nothing)
        for it. Guarded only for objects made in the trace: an existing object's answer is re-read
        through its source by its own guards. (What ``bind`` finds on a class it guards itself.)"""

    def missing(self, name):
        return f"{no_attr_name(self.cls)} object has no attribute {name!r}"


class TracedInstance(Instance):
    """An object made in the trace (``UserObjectValue``, an exception): its attributes are the
    value's ``attrs`` table, slot members included."""

    def depends_on_class(self, frame, name, attr):
        guard_class_entry(frame, self.cls, name, attr)

    def own(self, frame, name):
        return self.value.attrs.get(name)

    def slot(self, frame, name):
        value = self.value.attrs.get(name)
        if value is None:
            raise MissingAttribute(self.missing(name))
        return value

    def cache(self, frame, name, value):
        if not class_lookup(self.cls, "__dict__")[1]:
            exceptions.raise_new(TypeError, f"No '__dict__' attribute on {self.cls.__name__!r} instance to cache "
                                            f"{name!r} property.")
        self.value.attrs[name] = value

    def native(self, frame, name, attr):
        v = self.value
        if name == "__class__":
            return wrap(frame.tx, self.cls, None)
        if name == "__dict__":
            # A dict value sharing the attribute table: changes through it are attribute changes.
            table = DictValue({})
            table.items = v.attrs
            return table
        if getattr(v, "dict_items", None) is not None and defined_by_dict(self.cls, name):
            return dict_method(frame, v, name)   # an object of a dict subclass made in the trace
        return super().native(frame, name, attr)


class ExceptionInstance(TracedInstance):
    """An exception made in the trace (``ExceptionValue``): BaseException's own C attributes
    answer from the value (``args``, the cause and context, StopIteration's ``value``,
    AttributeError's and NameError's ``name``/``obj``); its other C attributes (tracebacks,
    notes, its ``__dict__``) are not traced."""

    def native(self, frame, name, attr):
        v = self.value
        if name == "args":
            return TupleValue(v.args)
        if name == "__cause__":
            return v.cause if v.cause is not None else ConstantValue(None)
        if name == "__suppress_context__":
            return ConstantValue(v.suppress_context)
        if name == "__context__":
            if v.context is None:
                raise Unsupported("__context__ of an exception raised outside any traced handler "
                                  "(it may be the caller's exception)")
            return v.context
        if getattr(attr, "__objclass__", None) is BaseException or name in ("__traceback__", "with_traceback",
                                                                            "add_note"):
            raise Unsupported(f"{name!r} of an exception made inside the compiled function is not supported yet")
        return super().native(frame, name, attr)

    def slot(self, frame, name):
        v = self.value
        if name in v.attrs:
            return v.attrs[name]
        if name == "value" and issubclass(self.cls, StopIteration):
            return v.args[0] if v.args else ConstantValue(None)
        if name in ("name", "obj") and issubclass(self.cls, (AttributeError, NameError)):
            return ConstantValue(None)
        return super().slot(frame, name)


def exception_attr(frame: RunningFrame, v: ExceptionValue, name: str) -> Value:
    """``v.name`` for an exception made in the trace, in Python's order (``ExceptionInstance``)."""
    try:
        return instance_attr(frame, ExceptionInstance(v, v.cls), name)
    except MissingAttribute:
        if name == "__notes__":
            raise Unsupported(f"{name!r} of an exception made inside the compiled function is not supported yet") \
                from None
        raise


class ExistingInstance(Instance):
    """An object from outside the trace, read through its source (or none): its own state is
    read for real, through the source, so guards re-read it the same way on every call."""

    def __init__(self, value, raw=False):
        super().__init__(value, type(value.obj))
        self.obj = value.obj
        self.source = value.source
        # raw: read past the class's own __getattribute__ (object.__getattribute__(obj, name)),
        # so guards must read that way too.
        self.raw = raw

    def attr_source(self, name):
        if self.source is None:
            return None
        return RawAttrSource(self.source, name) if self.raw else AttrSource(self.source, name)

    def own(self, frame, name):
        tx = frame.tx
        pending = tx.effects.attr_stores.get((id(self.obj), name))
        if pending is not None:
            # Stored (or deleted) earlier in this trace, done after the graph.
            return None if pending[2] is DELETED else pending[2]
        inst_dict = getattr(self.obj, "__dict__", None)
        if not isinstance(inst_dict, dict) or name not in inst_dict:
            return None
        value = inst_dict[name]
        if type(self.obj).__module__.startswith("torch.nn.") and name != "training" \
                and isinstance(value, CONSTANT_TYPES + (tuple,)) and not stamps.watchable(self.obj):
            # Settings of torch's own layers are taken as fixed once built when the module cannot
            # be watched; otherwise they are guarded like any attribute, at no cost per call
            # (guards.stamps: checked only after the module changed).
            tx.unguarded_reads += 1
            return wrap(tx, value, None)
        return wrap(tx, value, self.own_source(name))

    def own_source(self, name):
        """Where guards re-read the instance's own entry ``name``: ``obj.name``, unless something
        else would answer that read — a data descriptor of the class, or its own
        ``__getattribute__`` (``super()`` and cached_property read the entry past them): then
        ``object.__getattribute__(obj, '__dict__')[name]``."""
        if self.source is None:
            return None
        if is_data_descriptor(class_attr(self.cls, name)) or not (
                self.raw or is_generic_getattribute(class_attr(self.cls, "__getattribute__"))):
            return ItemSource(RawAttrSource(self.source, "__dict__"), name)
        return self.attr_source(name)

    def slot(self, frame, name):
        if self.source is not None and raw_attr(self.obj, name) is MISSING:
            # Unset: what answers instead (__getattr__, getattr's default) rests on that.
            frame.tx.guards.add(g.ID_MATCH, RawAttrOrMissingSource(self.source, name), MISSING)
        return self._read(frame, name)

    def cache(self, frame, name, value):
        if self.source is None or not isinstance(getattr(self.obj, "__dict__", None), dict) \
                or isinstance(self.obj, (type, types.ModuleType)) or is_data_descriptor(class_attr(self.cls, name)):
            # (past a data descriptor of the same name the store could not be replayed as a store)
            super().cache(frame, name, value)
        # Recorded like a plain attribute store, done after the graph (object.__setattr__ where
        # the class has its own __setattr__: codegen.transformed).
        frame.tx.effects.attr_stores[(id(self.obj), name)] = (self.value, name, value)
        note_store(frame.tx, self.obj, name, value)

    def native(self, frame, name, attr):
        return self._read(frame, name)

    def _read(self, frame, name):
        try:
            value = (object.__getattribute__ if self.raw else getattr)(self.obj, name)
        except AttributeError:
            raise MissingAttribute(self.missing(name)) from None
        if self.raw and isinstance(value, types.MethodType) and value.__self__ is self.obj \
                and isinstance(value.__func__, types.FunctionType):
            return BoundMethodValue(wrap(frame.tx, value.__func__, None), self.value)
        return wrap(frame.tx, value, self.attr_source(name))

    def class_answered(self, frame, name):
        if self.source is not None and isinstance(getattr(self.obj, "__dict__", None), dict):
            # `obj.method = f` or `cfg.scale = 2.0` later would answer instead.
            frame.tx.guards.add(g.NOT_OWN_ATTR, self.source, name)

    def module_entry(self, frame, name):
        for table in ("_parameters", "_buffers", "_modules"):
            entries = self.obj.__dict__.get(table)
            if entries is not None and name in entries:
                value = entries[name]
                if value is None:
                    return ConstantValue(None)
                return wrap(frame.tx, value, ModuleEntrySource(self.source, table, name)
                            if self.source is not None else None)
        return None

    def custom_getattribute(self, frame, name, hook):
        if isinstance(hook, types.FunctionType) and any(key[0] == id(self.obj) for key in frame.tx.effects.attr_stores):
            # The trace changed the object: its __getattribute__ is traced, over the changed state
            # (object.__getattribute__ inside it sees the stores).
            src = guard_class_method(frame.tx, self.cls, "__getattribute__", hook)
            return ops.call(frame, BoundMethodValue(wrap(frame.tx, hook, src), self.value), [ConstantValue(name)], {})
        # Read through the object's own __getattribute__ (a config mapping aliases); the guard
        # re-reads it the same way on every call.
        return self._read(frame, name)



class PrivateInstance(ExistingInstance):
    """An object only the trace can see (made while tracing by code that runs for real):
    read now, its values kept private (``private_value``)."""

    def own(self, frame, name):
        inst_dict = getattr(self.obj, "__dict__", None)
        if not isinstance(inst_dict, dict) or name not in inst_dict:
            return None
        return private_value(frame, inst_dict[name], self.value)

    def _read(self, frame, name):
        try:
            value = getattr(self.obj, name)
        except AttributeError:
            raise MissingAttribute(self.missing(name)) from None
        return private_value(frame, value, self.value)

    def class_answered(self, frame, name):
        pass

    def module_entry(self, frame, name):
        for table in ("_parameters", "_buffers", "_modules"):
            entries = self.obj.__dict__.get(table)
            if entries is not None and name in entries:
                return private_value(frame, entries[name], self.value)
        return None



def class_source(cls):
    """Where guards read class ``cls`` from (None: it is taken as fixed, or not comparable)."""
    module = getattr(cls, "__module__", "") or ""
    if module.split(".")[0] in _FIXED_CLASS_MODULES:
        return None
    if type(cls).__getattribute__ is not type.__getattribute__ or "__getattr__" in type(cls).__dict__:
        return None   # a metaclass answering reads itself: nothing to compare with
    return ObjectSource(cls, cls.__qualname__)


def guard_class_entry(frame, cls, name, attr):
    """Guard that ``cls``'s MRO still holds ``attr`` for ``name`` (``MISSING``: nothing), before
    any ``__get__``: which of Python's cases answered depends on it (a data descriptor added to
    the class later answers before the instance's own attribute)."""
    if isinstance(attr, types.GetSetDescriptorType):
        return   # a C type's own descriptor (__dict__, __weakref__): classes do not replace them
    csrc = class_source(cls)
    if csrc is not None:
        frame.tx.guards.add(g.ID_MATCH, ClassEntrySource(csrc, name), attr)


def instance_of(v):
    """The ``Instance`` of a value the lookup models."""
    if isinstance(v, PrivateObjectValue):
        return PrivateInstance(v)
    if isinstance(v, ObjectValue):
        return ExistingInstance(v)
    if isinstance(v, ExceptionValue):
        return ExceptionInstance(v, v.cls)
    return TracedInstance(v, v.cls)


def instance_attr(frame: RunningFrame, inst: Instance, name: str) -> Value:
    """``inst.value.name`` in Python's order (module docstring)."""
    cls = inst.cls
    getattribute = class_lookup(cls, "__getattribute__")[0]
    hook, has_hook = class_lookup(cls, "__getattr__")
    try:
        if not is_generic_getattribute(getattribute):
            return inst.custom_getattribute(frame, name, getattribute)
        return generic_attr(frame, inst, name)
    except MissingAttribute:
        if not has_hook:
            inst.depends_on_class(frame, "__getattr__", MISSING)
            raise
    except TracedRaise as e:
        if not (has_hook and issubclass(e.value.cls, AttributeError)):
            raise
    return getattr_hook(frame, inst, name, hook)


def generic_attr(frame, inst, name):
    """``object.__getattribute__(obj, name)``: data descriptors, own ``__dict__``, class."""
    attr = class_attr(inst.cls, name)
    found = attr is not MISSING
    if found and is_data_descriptor(attr):
        return bind(frame, inst, name, attr)   # (bind guards what it found on the class)
    own = inst.own(frame, name)
    if own is not None:
        # (The class is not guarded here: only a data descriptor set on it later would answer
        # instead, and guarding every field of every object made in the trace costs each call.)
        return own
    if found:
        inst.class_answered(frame, name)
        return bind(frame, inst, name, attr)
    inst.depends_on_class(frame, name, MISSING)   # a class attribute set later would answer
    raise MissingAttribute(inst.missing(name))


def getattr_hook(frame, inst, name, hook):
    """``type(obj).__getattr__(obj, name)`` after the generic lookup found nothing."""
    if hook is torch.nn.Module.__getattr__:
        entry = inst.module_entry(frame, name)
        if entry is None:
            raise MissingAttribute(f"{inst.cls.__name__!r} object has no attribute {name!r}")
        # (No NOT_OWN_ATTR guard: nn.Module.__setattr__ keeps a name in one table or __dict__.)
        return entry
    inst.class_answered(frame, name)
    # A class attribute of that name set later would answer before __getattr__ (modules' tables
    # are left unguarded here: a guard per submodule read would cost every call of a deep model).
    guard_class_entry(frame, inst.cls, name, class_attr(inst.cls, name))
    if not isinstance(hook, types.FunctionType):
        return inst.native(frame, name, hook)
    src = guard_class_method(frame.tx, inst.cls, "__getattr__", hook)
    return ops.call(frame, BoundMethodValue(wrap(frame.tx, hook, src), inst.value), [ConstantValue(name)], {})


def bind(frame, inst, name, attr, cls=None):
    """What ``attr``, found on the class for ``name``, gives when read through the instance."""
    cls = cls or inst.cls
    tx = frame.tx
    if isinstance(attr, types.MemberDescriptorType):
        return inst.slot(frame, name)
    if isinstance(attr, (types.FunctionType, staticmethod, classmethod, property)):
        fsrc = guard_class_method(tx, cls, name, attr)
        if isinstance(attr, types.FunctionType):
            return BoundMethodValue(wrap(tx, attr, fsrc), inst.value)
        if isinstance(attr, staticmethod):
            return wrap(tx, attr.__func__, fsrc)
        if isinstance(attr, classmethod):
            return BoundMethodValue(wrap(tx, attr.__func__, fsrc), wrap(tx, inst.cls, None))
        if attr.fget is None:
            raise MissingAttribute(f"property {name!r} of {no_attr_name(inst.cls)} object has no getter")
        return ops.call(frame, wrap(tx, attr.fget, fsrc and AttrSource(fsrc, "fget")), [inst.value], {})
    if isinstance(attr, functools.cached_property):
        return cached_property_value(frame, inst, name, attr, cls)
    if has_python_get(attr):
        # A descriptor written in Python (functools.cached_property, a validating field):
        # its __get__ is traced, on the descriptor object found on the class.
        get = type(attr).__get__
        desc = wrap(tx, attr, descriptor_source(tx, cls, name, attr))
        return ops.call(frame, wrap(tx, get, None), [desc, inst.value, wrap(tx, inst.cls, None)], {})
    if hasattr(type(attr), "__get__") and not isinstance(attr, CONSTANT_TYPES):
        return inst.native(frame, name, attr)
    return wrap(tx, attr, _plain_class_attr_source(inst, name))


def _plain_class_attr_source(inst, name):
    """Where guards re-read a plain class attribute: through the instance's source (which
    follows the whole lookup again), else through the class."""
    if isinstance(inst, ExistingInstance) and inst.source is not None and not isinstance(inst, PrivateInstance):
        module = (inst.cls.__module__ or "").split(".")[0]
        return inst.attr_source(name) if module != "torch" else None
    csrc = class_source(inst.cls)
    return AttrSource(csrc, name) if csrc is not None else None


def descriptor_source(tx, cls, name, attr):
    """The descriptor object found on the class, guarded there by identity."""
    csrc = class_source(cls)
    if csrc is None:
        return None
    src = ClassEntrySource(csrc, name)
    tx.guards.add(g.ID_MATCH, src, attr)
    return src


def private_value(frame, value, owner):
    """The value for ``value``, found inside the private object ``owner``."""
    if isinstance(value, types.MethodType) and value.__self__ is owner.obj \
            and isinstance(value.__func__, types.FunctionType):
        return BoundMethodValue(wrap(frame.tx, value.__func__, None), owner)
    if isinstance(value, CONSTANT_TYPES + (type, types.FunctionType, types.BuiltinFunctionType,
                                             types.ModuleType)):
        return wrap(frame.tx, value, None)
    if type(value) in (list, dict, set, tuple, frozenset):
        # Read-only: changing it would have to change the private object too.
        return ConstantValue(value)
    if isinstance(value, torch.nn.Module):
        known = frame.tx.memo.get(id(value))
        if known is not None and known[0] is value:
            return known[1]   # a module from outside the trace, stored on the private object
        if not any(True for _ in value.parameters()) and not any(True for _ in value.buffers()):
            return PrivateObjectValue(value)
    if isinstance(value, (torch.Tensor, torch.nn.Module)):
        raise Unsupported(f"a {type(value).__name__} inside an object made while tracing is not supported yet")
    return PrivateObjectValue(value)



# --- the instance's own __dict__, as the trace has changed it -------------------------------

def table_of(obj, name):
    """The dict of ``obj`` that ``obj.name = value`` writes to: its ``__dict__``, or for an
    ``nn.Module`` the ``_parameters``/``_buffers``/``_modules`` table that has ``name``."""
    if isinstance(obj, torch.nn.Module):
        for table in stamps.STATE_TABLES:
            if name in obj.__dict__.get(table, ()):
                return table
    return "__dict__"


def set_item(table, key, value):
    if value is DELETED:
        table.items.pop(key, None)
    else:
        table.items[key] = value


def note_store(tx, obj, name, value):
    """``obj.name = value`` (or ``del``, ``value`` DELETED) is recorded to be done after the graph:
    a dict the trace already read for ``obj.__dict__`` (or a module's table) shows it from now on."""
    table = table_of(obj, name)
    real = obj.__dict__ if table == "__dict__" else obj.__dict__.get(table)
    memo = tx.memo.get(id(real))
    if memo is not None and memo[0] is real and isinstance(memo[1], DictValue):
        set_item(memo[1], name, value)


# --- functools.cached_property ----------------------------------------------------------------

def cached_property_value(frame, inst, name, attr, cls):
    """``obj.name`` for a ``functools.cached_property``: the value cached in the instance's own
    ``__dict__``, else its function traced and the value stored there as the descriptor does,
    past any ``__setattr__``."""
    tx = frame.tx
    descriptor_source(tx, cls, name, attr)
    if attr.attrname is None:
        exceptions.raise_new(TypeError, "Cannot use cached_property instance without calling __set_name__ on it.")
    cached = inst.own(frame, attr.attrname)   # (super().name does not look there first)
    if cached is not None:
        return cached
    value = ops.call(frame, wrap(tx, attr.func, None), [inst.value], {})
    inst.cache(frame, attr.attrname, value)
    return value


# --- objects of dict subclasses made in the trace -------------------------------------------

_DICT_READS = {"get", "__getitem__", "__contains__", "keys", "items", "values", "__len__"}


def defined_by_dict(cls, name):
    """True if ``cls.name`` comes from ``dict``/``OrderedDict`` rather than Python code."""
    return class_lookup_owner(cls, name) in (dict, OrderedDict)


def dict_method(frame, v, name):
    """A method of ``dict`` acting on the items of ``v``, an object of a dict subclass made in the frame."""
    if name == "__init__":
        name = "update"
    return MethodOfValue(v.dict_items, name)
