"""What the interpreter's operations need to know about a value without a frame.

``as_constant``: its Python value if fully known; ``constant_value``: the value for a
Python result computed at trace time; ``describe``: how to name it in a message. Every
module of trace/ may import these (they sit below all of them).
"""
import collections
import enum
import operator
import sys
import types

import torch

from ...errors import Unsupported
from ...values.base import (MUTABLE_CONSTANT_TYPES, ConstantValue, DefaultDictValue, DictValue, DictViewValue,
                           ExceptionValue, FloatTensorValue, FunctionValue, GeneratorValue, HeldValue, ListValue,
                           ObjectValue, SliceValue, SymValue, TensorValue, TupleValue, UserObjectValue, holds_traced_id,
                           holds_values)


class PythonError(Unsupported):
    """A fold on constants raised a real Python exception (``exc``): the traced code raises it."""

    def __init__(self, reason, exc, hint=None):
        super().__init__(reason, hint)
        self.exc = exc


class MissingAttribute(Unsupported):
    """Reading an attribute the object does not have (AttributeError in eager)."""


_NAMED_CALLABLES = (type, types.FunctionType, types.MethodDescriptorType, types.WrapperDescriptorType,
                    types.MethodWrapperType, types.ClassMethodDescriptorType)


def type_name(cls):
    """The class's C-level ``tp_name``, as CPython's messages spell it (``int``, ``torch.dtype``)."""
    if cls.__flags__ & (1 << 9) or cls.__module__ == "builtins":   # a heap type: its __name__
        return cls.__name__
    return f"{cls.__module__}.{cls.__qualname__}"


def no_attr_name(cls):
    """``cls`` as CPython's AttributeError messages quote it (``tp_name``, cut to 50 characters)."""
    return repr(type_name(cls)[:50])


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
        # (raises GuardOnDataDependentSymNode for a number only the graph knows: a break)
        return v.python_type()(v.sym)
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
        items = {k: as_constant(i) for k, i in v.items.items()}
        # An OrderedDict compares its order too.
        return collections.OrderedDict(items) if issubclass(v.cls, collections.OrderedDict) else items
    if isinstance(v, SliceValue):
        return slice(as_constant(v.start), as_constant(v.stop), as_constant(v.step))
    if isinstance(v, ObjectValue) and isinstance(v.obj, (type, torch.finfo, torch.iinfo, enum.Enum)):
        return v.obj   # classes and enum members: fixed once guarded by identity
    if isinstance(v, ObjectValue) and type(v.obj) is frozenset and v.source is None:
        return v.obj    # read from a trusted module (e.g. dataclasses._ATOMIC_TYPES): fixed
    if isinstance(v, ObjectValue) and type(v.obj) is type(sys.version_info):
        return v.obj    # the only instance of its type; it never changes
    if isinstance(v, DictViewValue):
        # A real view over a dict of the constants, for set operations and comparisons (keys
        # are always known; an items view compares values with ==, so they must be constants).
        if v.kind == "keys":
            return dict.fromkeys(v.dict_value.items).keys()
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


def refuse_selected(v):
    """Held by identity: the tensor ``max()``/``min()`` chose is which object only the data says."""
    if isinstance(v, TensorValue) and v.selected is not None:
        raise Unsupported("the tensor max()/min() chose, held by identity: which object it is depends on the "
                          "tensors' data")


def held_item(v):
    """What a set, frozenset or deque made in the frame holds for the value ``v``: a constant as
    itself; a tensor, a function or an object hashed by identity as a HeldValue."""
    if isinstance(v, TupleValue) and v.cls is tuple:
        return tuple(held_item(i) for i in v.items)
    if isinstance(v, (TensorValue, FunctionValue, GeneratorValue, ExceptionValue)):
        refuse_selected(v)
        return HeldValue(v, ("value", id(v)))
    if isinstance(v, UserObjectValue):
        if v.cls.__hash__ is object.__hash__:
            return HeldValue(v, ("value", id(v)))
        raise Unsupported(f"a {v.cls.__qualname__} object (with its own __hash__) in a set is not supported yet")
    if isinstance(v, ObjectValue) and not isinstance(v.obj, (type, enum.Enum)) and (
            type(v.obj).__hash__ is object.__hash__ or isinstance(v.obj, types.FunctionType)):
        return HeldValue(v, ("object", id(v.obj)))
    if isinstance(v, (ListValue, DictValue)):
        exc = TypeError(f"unhashable type: '{v.python_type().__name__}'")
        raise PythonError(str(exc), exc)
    return as_constant(v)


def deque_item(v):
    """What a deque made in the frame holds for ``v``: like a set's element, but anything can be
    held (a list or dict as the very value, so that changes to it show)."""
    refuse_selected(v)
    if isinstance(v, (ListValue, DictValue)) or (isinstance(v, ConstantValue) and isinstance(
            v._value, MUTABLE_CONSTANT_TYPES)):
        return HeldValue(v, ("value", id(v)))
    try:
        return held_item(v)
    except Unsupported:
        return HeldValue(v, ("value", id(v)))


def item_value(x):
    """The value for an element ``x`` taken out of a real container made in the frame."""
    if isinstance(x, HeldValue):
        return x.value
    if type(x) is tuple and holds_values(x):
        return TupleValue([item_value(i) for i in x])
    return ConstantValue(x)


def constant_value(result):
    """Wrap a Python result computed at trace time."""
    if isinstance(result, HeldValue) or (type(result) is tuple and holds_values(result)):
        return item_value(result)
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


def _hash_seeded(x, depth=0):
    """Does ``x``'s hash depend on the process (PYTHONHASHSEED: str and bytes)?"""
    if isinstance(x, (str, bytes)):
        return True
    if isinstance(x, (tuple, frozenset)) and depth < 4:
        return any(_hash_seeded(i, depth + 1) for i in x)
    return not isinstance(x, (int, float, bool, complex, type(None)))


def note_process_local(tx, value):
    """The trace relies on ``value`` in a way another process may not see alike: the order of a
    set of strings (hash seeds differ). Such a trace is not saved to the persistent cache."""
    if isinstance(value, (set, frozenset)) and any(_hash_seeded(x) for x in value):
        tx.process_local += 1


# What an id taken while tracing can be folded by: its number is known only at run time.
_ID_COMPARISONS = {operator.eq, operator.ne, operator.is_, operator.is_not, hash}


def refuse_traced_ids(fn, args, what):
    """A break where ``fn`` would be folded on an id taken while tracing (arithmetic, ordering,
    text): its result would be made up, and the TypeError the placeholder raises is not the
    program's."""
    if fn not in _ID_COMPARISONS and any(holds_traced_id(a) for a in args):
        raise Unsupported(f"{what} of an id() taken while tracing: its number is known only at run time",
                          hint="compare ids with == or `is` inside the compiled function")
