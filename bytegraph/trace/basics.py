"""What the interpreter's operations need to know about a value without a frame.

``as_constant``: its Python value if fully known; ``constant_value``: the value for a
Python result computed at trace time; ``describe``: how to name it in a message. Every
module of trace/ may import these (they sit below all of them).
"""
import collections
import enum
import sys
import types

import torch

from ..errors import Unsupported
from ..values.base import (MUTABLE_CONSTANT_TYPES, ConstantValue, DefaultDictValue, DictValue, DictViewValue,
                           ListValue, ObjectValue, SliceValue, SymValue, TensorValue, TupleValue,
                           FloatTensorValue)


_NAMED_CALLABLES = (type, types.FunctionType, types.MethodDescriptorType, types.WrapperDescriptorType,
                    types.MethodWrapperType, types.ClassMethodDescriptorType)


def describe(v):
    if isinstance(v, ObjectValue):
        o = v.obj
        if isinstance(o, types.BuiltinFunctionType):
            owner = getattr(o, "__self__", None)
            if owner is None or isinstance(owner, types.ModuleType):
                module = getattr(o, "__module__", None) or getattr(owner, "__name__", "")
                prefix = "" if module in ("builtins", "io", "_io") else f"{module}."
                return f"builtin function {prefix}{o.__name__}"
            return f"builtin method {type(owner).__qualname__}.{o.__name__}"
        name = getattr(o, "__qualname__", None) if isinstance(o, _NAMED_CALLABLES) else None
        return f"{type(o).__name__} {name}" if name else f"a {type(o).__name__} object"
    if isinstance(v, ConstantValue):
        return f"constant {v.value!r}"
    if isinstance(v, TensorValue):
        return "a tensor"
    return type(v).__name__.replace("Value", "").lower() or "value"


def as_constant(v):
    """The Python value of ``v`` if it is fully known, else Unsupported.

    A symbolic int is specialised here: its current value becomes a guard.
    """
    if isinstance(v, ConstantValue):
        return v.value
    if isinstance(v, SymValue):
        return int(v.sym)
    if isinstance(v, FloatTensorValue):
        return v.specialize()
    if isinstance(v, TupleValue):
        items = tuple(as_constant(i) for i in v.items)
        if v.cls is torch.Size:
            return torch.Size(items)
        if v.cls is not tuple:
            return v.cls(items) if hasattr(v.cls, "n_fields") else v.cls(*items)
        return items
    if isinstance(v, ListValue):
        return [as_constant(i) for i in v.items]
    if isinstance(v, DictValue):
        return {k: as_constant(i) for k, i in v.items.items()}
    if isinstance(v, SliceValue):
        return slice(as_constant(v.start), as_constant(v.stop), as_constant(v.step))
    if isinstance(v, ObjectValue) and isinstance(v.obj, (type, torch.finfo, torch.iinfo, enum.Enum)):
        return v.obj   # classes and enum members: fixed once guarded by identity
    if isinstance(v, ObjectValue) and type(v.obj) is frozenset and v.source is None:
        return v.obj    # read from a trusted module (e.g. dataclasses._ATOMIC_TYPES): fixed
    if isinstance(v, ObjectValue) and type(v.obj) is type(sys.version_info):
        return v.obj    # the only instance of its type; it never changes
    if isinstance(v, DictViewValue):
        # A real view over a dict of the constants, for set operations and comparisons.
        return getattr(as_constant(v.dict_value), v.kind)()
    raise Unsupported(f"{describe(v)} is not a constant")


def is_constant(v):
    if isinstance(v, (SymValue, FloatTensorValue)):
        return False
    try:
        as_constant(v)
        return True
    except Unsupported:
        return False


def constant_value(result):
    """Wrap a Python result computed at trace time."""
    if isinstance(result, MUTABLE_CONSTANT_TYPES):
        return ConstantValue(result)
    if isinstance(result, (list,)):
        return ListValue([constant_value(r) for r in result])
    if isinstance(result, dict):
        items = {k: constant_value(v) for k, v in result.items()}
        if isinstance(result, collections.defaultdict):
            return DefaultDictValue(items, constant_value(result.default_factory))
        return DictValue(items, cls=type(result) if type(result).__module__ == "collections" else dict)
    if isinstance(result, (torch.finfo, torch.iinfo, type)):
        return ObjectValue(result)
    return ConstantValue(result)
