"""Python's special-method protocols on objects whose class implements them in Python.

``obj[k]``, ``k in obj``, ``len(obj)``, ``bool(obj)``, ``iter(obj)`` and the
binary operators on a user object (one made in the frame, or a pre-existing one
read through a source) run the class's own ``__getitem__``/``__contains__``/...
by inlining it, exactly as CPython would look it up: on the type, along the
MRO, never on the instance. Mixin methods written in Python (``collections.abc``
``Mapping.get``, ``Sequence.__iter__``...) are traced the same way.
"""
import types

import numpy as np
import torch

from ...datamodel import class_lookup, tensor_class_attr
from ...guards.builder import ID_MATCH
from ...guards.sources import AttrSource, ObjectSource
from ...values.base import ConstantValue, ObjectValue, TensorValue, UserObjectValue
from ...values.builder import wrap
from ..core import ops

# Classes whose Python-level special methods are *not* traced: their behaviour is known natively
# (NumPy's: arrays, masked arrays and polynomials are trace/numpy_api/numpy_calls.py's, or run natively).
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
_NATIVE_BASES = (torch.nn.Module, torch.Tensor, type, np.ndarray, np.generic, np.poly1d,
                 np.polynomial._polybase.ABCPolyBase)


def guard_class_method(tx, cls, name, attr):
    """Guard that ``cls.name`` still finds ``attr``, a function (plain, static or class method)
    or a property the trace used in place of looking it up: ``Model.helper = f`` after compiling, on the class
    or on a base, must not run the old one. torch's and Python's own classes are taken as fixed.
    Classes are few next to instances, so this costs the same at any depth.

    Returns the source of the function (None where nothing is guarded): a value of it made
    with that source (``wrap(tx, fn, source)``) has its defaults and code guarded as the trace
    uses them (``Model.helper.__defaults__ = (3,)`` after compiling)."""
    if not isinstance(attr, (types.FunctionType, staticmethod, classmethod, property)):
        return None   # a class constant is guarded where it is read, through the instance
    module = getattr(cls, "__module__", None) or ""
    if module == "builtins" or module == "torch" or module.startswith("torch."):
        return None
    if type(cls).__getattribute__ is not type.__getattribute__ or "__getattr__" in type(cls).__dict__:
        return None   # a metaclass answering attribute reads itself: its answer is not cached here
    where = AttrSource(ObjectSource(cls, cls.__qualname__), name)
    if isinstance(attr, classmethod):
        where = AttrSource(where, "__func__")
    tx.guards.add(ID_MATCH, where, attr.__func__ if isinstance(attr, (staticmethod, classmethod)) else attr)
    return where


def python_special_method(v, name):
    """The Python function behind special method ``name`` of ``v``'s class, or None (for a tensor:
    one its Python subclass of torch.Tensor defines, not torch's own)."""
    if isinstance(v, TensorValue):
        attr, found = tensor_class_attr(v.cls, name) if v.cls not in _PLAIN_TENSORS else (None, False)
        return attr if found and isinstance(attr, types.FunctionType) else None
    if isinstance(v, UserObjectValue):
        cls = v.cls
    elif isinstance(v, ObjectValue) and not isinstance(v.obj, _NATIVE_BASES):
        cls = type(v.obj)
    else:
        return None
    attr, found = class_lookup(cls, name)
    return attr if found and isinstance(attr, types.FunctionType) else None


def dict_part(v):
    """The items of an object of a dict subclass made in the frame (what dict's own methods see), else ``v``."""
    if isinstance(v, UserObjectValue) and v.dict_items is not None:
        return v.dict_items
    return v


def has_special_method(v, name):
    return python_special_method(v, name) is not None


def call_special_method(frame, v, name, args, kwargs=None):
    """Inline ``type(v).name(v, *args)``; the method must exist (see ``python_special_method``)."""
    fn = python_special_method(v, name)
    src = guard_class_method(frame.tx, v.cls if isinstance(v, (UserObjectValue, TensorValue)) else type(v.obj),
                             name, fn)
    return ops.call(frame, wrap(frame.tx, fn, src), [v] + list(args), kwargs or {})


def is_not_implemented(v):
    return isinstance(v, ConstantValue) and v.value is NotImplemented


def binary_special_method(frame, op_name, a, b):
    """``a <op> b`` through ``__op__`` / ``__rop__`` written in Python; None if neither applies."""
    if has_special_method(a, f"__{op_name}__"):
        result = call_special_method(frame, a, f"__{op_name}__", [b])
        if not is_not_implemented(result):
            return result
    if has_special_method(b, f"__r{op_name}__"):
        result = call_special_method(frame, b, f"__r{op_name}__", [a])
        if not is_not_implemented(result):
            return result
    return None
