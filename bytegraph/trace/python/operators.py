"""Python operators on values: arithmetic, comparison, truth, subscripts."""
from __future__ import annotations

import enum
import operator

import numpy as np
import torch

from ...datamodel import class_lookup
from ...errors import BytegraphError, Unsupported
from ...null import NULL
from ...guards.builder import NOT_ALIAS, TYPE_MATCH
from ...guards.sources import AttrSource, ModuleEntrySource
from ...values.base import (MUTABLE_CONSTANT_TYPES, BoundMethodValue, ConstantValue, ContextManagerValue,
                           DefaultDictValue, DictValue, DictViewValue, ExceptionValue, FloatTensorValue,
                           FormattedTextValue, FunctionValue, GeneratorValue, IteratorValue, LazyIteratorValue,
                           ListValue, MethodOfValue, ObjectValue, SliceValue, SymValue, TensorMethodValue,
                           TensorValue, TupleValue, UserObjectValue, holds_values)
from ...values.builder import wrap
from . import attrs, changing_floats, protocols
from ..core import ops
from ..numpy_api import numpy_calls
from ..core.basics import as_constant, constant_value, held_item, is_constant, refuse_traced_ids
from .exceptions import PythonError, raise_new, to_str
from .protocols import is_not_implemented
from typing import Callable
from ...values.base import Value
from ..core.context import RunningFrame

BINARY = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    "//": operator.floordiv, "%": operator.mod, "**": operator.pow, "@": operator.matmul,
    "&": operator.and_, "|": operator.or_, "^": operator.xor, "<<": operator.lshift,
    ">>": operator.rshift,
    "+=": operator.iadd, "-=": operator.isub, "*=": operator.imul, "/=": operator.itruediv,
    "//=": operator.ifloordiv, "%=": operator.imod, "**=": operator.ipow, "@=": operator.imatmul,
    "&=": operator.iand, "|=": operator.ior, "^=": operator.ixor, "<<=": operator.ilshift,
    ">>=": operator.irshift,
}
# Special-method names of the binary operators (in-place forms fall back to the plain one).
SPECIAL_NAMES = {"+": "add", "-": "sub", "*": "mul", "/": "truediv", "//": "floordiv", "%": "mod",
                 "**": "pow", "@": "matmul", "&": "and", "|": "or", "^": "xor", "<<": "lshift",
                 ">>": "rshift"}
REFLECTED_COMPARE = {"<": "gt", "<=": "ge", "==": "eq", "!=": "ne", ">": "lt", ">=": "le"}
COMPARE_NAMES = {"<": "lt", "<=": "le", "==": "eq", "!=": "ne", ">": "gt", ">=": "ge"}
COMPARE = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
           ">": operator.gt, ">=": operator.ge}


def key_of(v):
    """A dict key: constants by value, objects by identity (module state tensors too)."""
    if isinstance(v, ObjectValue):
        v.pin_identity()     # a dict made in the trace keeps this very object as its key
        return v.obj
    if isinstance(v, TensorValue) and v.node.op == "get_attr":
        # Identity-guarded (parameters, optimizer state): the real tensor is the key.
        return v.node.meta["real_tensor"]
    k = as_constant(v)
    if isinstance(k, frozenset) and holds_values(k):
        raise Unsupported("a frozenset holding tensors or objects as a dict key is not supported yet")
    return k


def constant_fold(frame, fn, args, what):
    try:
        cargs = [as_constant(a) for a in args]
    except Unsupported:
        raise Unsupported(f"{what} on non-constant values is not supported yet") from None
    refuse_traced_ids(fn, cargs, what)
    try:
        return constant_value(fn(*cargs))
    except Exception as e:
        raise PythonError(f"{what} raised {type(e).__name__}: {e}", e) from e


def graph_op(frame, fn, args, kwargs=None):
    return frame.tx.graph.call("call_function", fn, list(args), kwargs or {})


def _user_objects(*values):
    return any(isinstance(v, (UserObjectValue, ObjectValue)) for v in values)


def _overridable(frame, *values):
    """May a ``__torch_function__`` override handle this operator: a TorchFunctionMode is active,
    or an operand's class is not a plain tensor's (trace/torch_api/torch_function.py decides)."""
    return bool(frame.tx.graph.function_modes) or any(
        isinstance(v, TensorValue) and v.cls not in (torch.Tensor, torch.nn.Parameter) for v in values)


def binary(frame: RunningFrame, op: str, a: Value, b: Value, own_methods: bool = True) -> Value:
    """``a <op> b`` as Python does it. ``own_methods=False``: torch's operator for tensors, past
    special methods a tensor subclass defines in Python (``Tensor.__add__(x, y)`` called by name,
    or torch's default ``__torch_function__`` running the operator it was handed)."""
    fn = BINARY[op]
    if numpy_calls.involves_arrays(a, b):
        return numpy_calls.binary(frame, op, a, b)
    if op.endswith("=") and isinstance(a, (ListValue, DictValue, ConstantValue)):
        changed = ops.inplace_operator(frame, op, a, b)
        if changed is not None:
            return changed
    if _user_objects(a, b):
        name = SPECIAL_NAMES[op.rstrip("=")]
        if op.endswith("=") and protocols.has_special_method(a, f"__i{name}__"):
            result = protocols.call_special_method(frame, a, f"__i{name}__", [b])
            if not is_not_implemented(result):
                return result
        result = protocols.binary_special_method(frame, name, a, b)
        if result is not None:
            return result
    if op in ("+", "+=") and (isinstance(a, FormattedTextValue) or isinstance(b, FormattedTextValue)):
        pieces = []
        for side in (a, b):
            if isinstance(side, FormattedTextValue):
                pieces += side.parts
            elif is_constant(side) and isinstance(as_constant(side), str):
                pieces.append(as_constant(side))
            else:
                raise Unsupported(f"operator + of a string and {attrs.describe(side)}")
        return lazy_text(frame, pieces)
    if isinstance(a, TensorValue) or isinstance(b, TensorValue):
        if op.endswith("=") and not isinstance(a, TensorValue):
            # `n += tensor` with a Python number on the left is just `n + tensor`.
            fn, op = BINARY[op[:-1]], op[:-1]
        name = SPECIAL_NAMES[op.rstrip("=")]
        if not own_methods:
            own = None
        elif op.endswith("="):
            own = tensor_special_method(frame, a, None, f"__i{name}__", None, f"operator {op}")
        else:
            own = tensor_special_method(frame, a, b, f"__{name}__", f"__r{name}__", f"operator {op}")
        if own is not None:
            return own
        if _overridable(frame, a, b):
            overridden = ops.function_subclass_binary(frame, fn, a, b)   # a __torch_function__ class's
            if overridden is not None:
                return overridden
        return graph_op(frame, fn, [a, b])
    if changing_floats.int_meets_float(fn, a, b):
        return float_op(frame, fn, [changing_floats.int_as_float(frame, v) if isinstance(v, SymValue) else v
                                    for v in (a, b)])
    if isinstance(a, FloatTensorValue) or isinstance(b, FloatTensorValue):
        return float_op(frame, fn, [a, b])
    if isinstance(a, SymValue) or isinstance(b, SymValue):
        # Ints are immutable: `n += 1` is `n + 1` (an in-place operator node would make FX's
        # generated code rebind the graph's input name, so later uses would see the sum).
        return _sym_op(frame, BINARY[op[:-1]] if op.endswith("=") else fn, [a, b])
    if isinstance(a, (ListValue, TupleValue)) or isinstance(b, (ListValue, TupleValue)):
        seq = _sequence_op(frame, op, a, b)
        if seq is not None:
            return seq
    if op in ("|", "|=") and isinstance(a, DictValue) and isinstance(b, DictValue):
        return ops.call_method(frame, a, "__ior__" if op == "|=" else "__or__", [b], {})
    return constant_fold(frame, fn, [a, b], f"operator {op}")


_UNARY_NAMES = {operator.neg: "__neg__", operator.pos: "__pos__", operator.abs: "__abs__",
                operator.invert: "__invert__"}


def tensor_special_method(frame, a, b, name, reflected, what, args=None):
    """``a <op> b`` (or ``a.name(*args)``) where a tensor operand's class, a Python subclass of
    torch.Tensor, defines the special method in Python: it is traced, in the order Python asks
    (``b``'s reflected one first when its class derives from ``a``'s); None where torch's own
    methods answer. Where the class's method gives NotImplemented and Python would go on to
    torch's, the trace stops (a graph break) rather than guess."""
    left = protocols.python_special_method(a, name) if isinstance(a, TensorValue) else None
    right = protocols.python_special_method(b, reflected) if reflected and isinstance(b, TensorValue) else None
    if left is None and right is None:
        return None
    first_right = right is not None and (
        not isinstance(a, TensorValue) or (b.cls is not a.cls and issubclass(b.cls, a.cls)))
    own = (a, name, [b] if args is None else args)
    if first_right:
        order = [(b, reflected, [a])] + ([own] if left is not None else [])
    elif left is not None:
        order = [own] + ([(b, reflected, [a])] if right is not None else [])
    else:
        return None    # torch's own method of `a` answers first
    for owner, method, call_args in order:
        result = protocols.call_special_method(frame, owner, method, call_args)
        if not is_not_implemented(result):
            return result
    raise Unsupported(f"{what}: the tensor subclass's {order[-1][1]} returned NotImplemented; what Python "
                      "asks next is not traced yet", hint="without fullgraph=True it runs eagerly")


def _sequence_op(frame, op, a, b):
    if op in ("+", "+="):
        if isinstance(a, ListValue) and op == "+=":
            items = ops.iterate(frame, b)
            frame.tx.effects.mark_mutated(a, "+= on")
            a.items.extend(items)
            return a
        if type(a) is type(b) and isinstance(a, ListValue):
            return ListValue(a.items + b.items)
        if isinstance(a, (TupleValue, ConstantValue)) and isinstance(b, (TupleValue, ConstantValue)):
            left, right = _tuple_parts(a), _tuple_parts(b)
            if left is not None and right is not None:
                # tuple + torch.Size and friends: the result type is whatever Python gives.
                cls = type(_empty(left[0]) + _empty(right[0]))
                return TupleValue(left[1] + right[1], cls=cls if cls is torch.Size else tuple)
    if op in ("*", "*="):
        seq, n = (a, b) if isinstance(a, (ListValue, TupleValue)) else (b, a)
        if isinstance(n, ConstantValue) and isinstance(n.value, int):
            items = seq.items * n.value
            return ListValue(items) if isinstance(seq, ListValue) else TupleValue(items)
    return None


def _sym_op(frame, fn, args):
    for a in args:
        if not isinstance(a, (SymValue, ConstantValue)):
            raise Unsupported(f"{fn.__name__} of a symbolic size and {attrs.describe(a)} is not supported yet")
    try:
        return frame.tx.graph.sym_call(fn, args)
    except BytegraphError:
        raise
    except Exception:
        # It fails on the current values (`n // 0`, a negative shift): fold on them, guarded, so the
        # traced code raises what Python raises (never an internal error).
        return constant_fold(frame, fn, args, getattr(fn, "__name__", "operator"))


def _tuple_parts(v):
    """(class, item values) of a tuple-like value, or None."""
    if isinstance(v, TupleValue) and v.cls in (tuple, torch.Size):
        return v.cls, list(v.items)
    if isinstance(v, ConstantValue) and type(v.value) in (tuple, torch.Size):
        return type(v.value), [ConstantValue(x) for x in v.value]
    return None


def _empty(cls):
    return torch.Size([]) if cls is torch.Size else ()


def compare(frame: RunningFrame, op: str, a: Value, b: Value, own_methods: bool = True) -> Value:
    fn = COMPARE[op]
    if numpy_calls.involves_arrays(a, b):
        return numpy_calls.compare(frame, op, a, b)
    if _user_objects(a, b):
        result = _compare_special(frame, op, a, b)
        if result is not None:
            return result
    if (isinstance(a, SymValue) or isinstance(b, SymValue)) and not (
            isinstance(a, TensorValue) or isinstance(b, TensorValue)):
        if is_none(a) or is_none(b):
            return ConstantValue(op == "!=")
        return _sym_op(frame, fn, [a, b])
    if isinstance(a, TensorValue) or isinstance(b, TensorValue):
        if a is NULL or b is NULL:
            raise Unsupported("comparison with NULL")
        own = tensor_special_method(frame, a, b, f"__{COMPARE_NAMES[op]}__", f"__{REFLECTED_COMPARE[op]}__",
                                    f"comparison {op}") if own_methods else None
        if own is not None:
            return own
        if (isinstance(a, ConstantValue) and a.value is None) or (isinstance(b, ConstantValue) and b.value is None):
            return ConstantValue(op == "!=")
        if _overridable(frame, a, b):
            overridden = ops.function_subclass_binary(frame, fn, a, b)   # a __torch_function__ class's
            if overridden is not None:
                return overridden
        return graph_op(frame, fn, [a, b])
    if isinstance(a, FloatTensorValue) or isinstance(b, FloatTensorValue):
        decided = changing_floats.comparison(op, a, b)
        if decided is not None:
            return decided
    if op in ("==", "!=") and (isinstance(a, ObjectValue) or isinstance(b, ObjectValue)):
        oa = a.obj if isinstance(a, ObjectValue) else as_constant(a) if is_constant(a) else a
        ob = b.obj if isinstance(b, ObjectValue) else as_constant(b) if is_constant(b) else b
        if isinstance(oa, np.dtype) or isinstance(ob, np.dtype):
            # A NumPy dtype equals the scalar types and names that spell it (x.dtype == np.float32).
            return constant_fold(frame, fn, [a, b], f"comparison {op}")
        if type(oa).__eq__ is object.__eq__ or type(ob).__eq__ is object.__eq__ or isinstance(oa, type):
            same = oa is ob
            return ConstantValue(same if op == "==" else not same)
    return constant_fold(frame, fn, [a, b], f"comparison {op}")


def _compare_special(frame, op, a, b):
    name = f"__{COMPARE_NAMES[op]}__"
    if protocols.has_special_method(a, name):
        result = protocols.call_special_method(frame, a, name, [b])
        if not is_not_implemented(result):
            return result
    reflected = f"__{REFLECTED_COMPARE[op]}__"
    if protocols.has_special_method(b, reflected):
        result = protocols.call_special_method(frame, b, reflected, [a])
        if not is_not_implemented(result):
            return result
    if op == "!=" and protocols.has_special_method(a, "__eq__"):
        # Python's default __ne__ inverts __eq__.
        result = protocols.call_special_method(frame, a, "__eq__", [b])
        if not is_not_implemented(result):
            return ConstantValue(not truth(frame, result))
    if op in ("==", "!=") and (isinstance(a, UserObjectValue) or isinstance(b, UserObjectValue)):
        same = is_same(a, b)   # no __eq__ anywhere: identity
        return ConstantValue(same if op == "==" else not same)
    return None


def is_same(a, b):
    if a is b:
        return True
    if getattr(a, "selected", None) is not None or getattr(b, "selected", None) is not None:
        raise Unsupported("whether the tensor max()/min() chose is this object depends on the tensors' data")
    if isinstance(a, ConstantValue) and isinstance(b, ConstantValue):
        return a.value is b.value
    if isinstance(a, ObjectValue) and isinstance(b, ObjectValue):
        return a.obj is b.obj
    if isinstance(a, (ConstantValue, ObjectValue)) and isinstance(b, (ConstantValue, ObjectValue)):
        return _real(a) is _real(b)
    return False


def identical(frame, a, b):
    """``a is b``; when two objects from outside differ, the trace relies on it: guard it."""
    same = is_same(a, b)
    if not same:
        guard_distinct(frame, a, b)
    return same


def guard_distinct(frame, a, b):
    if a.source is not None and b.source is not None and a is not b \
            and not isinstance(a, ConstantValue) and not isinstance(b, ConstantValue):
        frame.tx.guards.add(NOT_ALIAS, a.source, b.source, detail=b.source.name())


def _real(v):
    return v.obj if isinstance(v, ObjectValue) else v.value


def is_none(v):
    return isinstance(v, ConstantValue) and v.value is None


def contains(frame, container, item):
    if numpy_calls.involves_arrays(container):
        raise Unsupported("`in` on a NumPy array needs its data", hint=numpy_calls.DATA_HINT)
    if protocols.has_special_method(container, "__contains__"):
        return truth(frame, protocols.call_special_method(frame, container, "__contains__", [item]))
    container = protocols.dict_part(container)
    if isinstance(container, DictValue):
        return key_of(item) in container.items
    if isinstance(container, (TupleValue, ListValue)):
        return any(element_equal(frame, x, item) for x in list(container.items))
    if isinstance(container, DictViewValue):
        return contains(frame, TupleValue(container.materialize()), item)
    if attrs.is_existing_dict(container, "__contains__"):
        return key_of(item) in attrs.guarded_dict_keys(frame, container)
    if isinstance(container, ObjectValue) and isinstance(container.obj, torch.nn.Module):
        if isinstance(container.obj, torch.nn.ModuleDict):
            return as_constant(item) in container.obj
    if isinstance(container, TensorValue):
        raise Unsupported("`in` on a tensor needs its data")
    if attrs.is_mapping_proxy(container):
        return key_of(item) in attrs.proxy_keys(frame, container)
    if isinstance(container, ConstantValue) and isinstance(container.value, (set, frozenset)):
        return held_item(item) in container.value
    return as_constant(item) in as_constant(container)


def element_equal(frame, element, item):
    """How ``in``, ``index``, ``count`` and ``remove`` compare (PyObject_RichCompareBool):
    the same object is equal, else ``element == item`` decides (a tensor's needs its data)."""
    if is_same(element, item):
        return True
    if is_constant(element) and is_constant(item) and not isinstance(element, SymValue) \
            and not isinstance(item, SymValue):
        return as_constant(element) == as_constant(item)
    return truth(frame, compare(frame, "==", element, item))
# Python float arithmetic done exactly the same on float64 tensors (IEEE double).
def float_op(frame, fn, args):
    """Arithmetic on floats that change between calls: computed in the graph where it can be
    (``changing_floats.arithmetic``), else folded, specialising them (guards their values)."""
    fn = changing_floats.NOT_IN_PLACE.get(fn, fn)
    result = changing_floats.arithmetic(frame, fn, args)
    return result if result is not None else constant_fold(frame, fn, args, getattr(fn, "__name__", "operator"))


def unary(frame: RunningFrame, fn: Callable, v: Value, own_methods: bool = True) -> Value:
    if numpy_calls.involves_arrays(v):
        return numpy_calls.unary(frame, fn, v)
    if isinstance(v, TensorValue):
        name = _UNARY_NAMES.get(fn)
        own = tensor_special_method(frame, v, None, name, None, f"operator {name}") if name and own_methods else None
        if own is not None:
            return own
        if _overridable(frame, v):
            overridden = ops.function_subclass_binary(frame, fn, v, None)   # a __torch_function__ class's
            if overridden is not None:
                return overridden
        return graph_op(frame, fn, [v])
    if isinstance(v, FloatTensorValue):
        return float_op(frame, fn, [v])
    if isinstance(v, SymValue):
        return _sym_op(frame, fn, [v])
    return constant_fold(frame, fn, [v], fn.__name__)


DATA_DEPENDENT_BRANCH = ("make the condition static (decide on shapes, Python values or flags, not on a tensor's "
                         "contents), or compute both sides and choose with torch.where(cond, a, b); "
                         "torch.cond is not traced by bytegraph yet")


def truth(frame: RunningFrame, v: Value) -> bool:
    if isinstance(v, ConstantValue):
        return bool(v.value)
    if isinstance(v, FloatTensorValue):
        if v.decide is not None:
            outcome = v.example != 0      # bool(x) of a float, NaN included
            v.decide("!=", 0.0, outcome)
            return outcome
        return bool(v.specialize())
    if isinstance(v, SymValue):
        # (raises GuardOnDataDependentSymNode for a number only the graph knows: a break)
        return bool(v.sym) if isinstance(v.sym, torch.SymBool) else bool(v.sym != 0)
    if isinstance(v, TensorValue):
        raise Unsupported("branching on a tensor's value (data-dependent control flow)", hint=DATA_DEPENDENT_BRANCH)
    if numpy_calls.involves_arrays(v):
        numpy_calls.truth(v)
    if isinstance(v, (TupleValue, ListValue, DictValue)):
        return bool(v.items)
    for name in ("__bool__", "__len__"):
        if protocols.has_special_method(v, name):
            return truth(frame, protocols.call_special_method(frame, v, name, []))
        if isinstance(v, (ObjectValue, UserObjectValue)) and getattr(python_type(v), name, None) is not None:
            break
    v = protocols.dict_part(v)
    if isinstance(v, ObjectValue):
        obj = v.obj
        cls = type(obj)
        if isinstance(obj, torch.nn.Module):
            return len(obj) > 0 if hasattr(cls, "__len__") else True
        if getattr(cls, "__bool__", None) is None and getattr(cls, "__len__", None) is None:
            return True
        if cls.__module__ in ("builtins", "torch") or isinstance(obj, type):
            return bool(obj)
        raise Unsupported(f"truth value of {attrs.describe(v)} (defines __bool__/__len__) is not supported yet")
    if isinstance(v, (FunctionValue, BoundMethodValue, TensorMethodValue, MethodOfValue,
                      IteratorValue, ContextManagerValue)):
        return True
    if isinstance(v, DictViewValue):
        return bool(v.dict_value.items)
    if isinstance(v, (GeneratorValue, LazyIteratorValue)):
        return True
    if isinstance(v, ExceptionValue) and getattr(v.cls, "__bool__", None) is None \
            and getattr(v.cls, "__len__", None) is None:
        return True
    if isinstance(v, UserObjectValue):
        if getattr(v.cls, "__bool__", None) is None and getattr(v.cls, "__len__", None) is None:
            return True
        raise Unsupported(f"truth value of a {v.cls.__qualname__} object (defines __bool__/__len__) is not supported yet")
    raise Unsupported(f"truth value of {attrs.describe(v)} is not supported yet")


def python_type(v):
    if isinstance(v, ObjectValue):
        return type(v.obj)
    return v.python_type()


def length(frame, v):
    if numpy_calls.involves_arrays(v):
        return numpy_calls.length(v)
    if protocols.has_special_method(v, "__len__"):
        n = protocols.call_special_method(frame, v, "__len__", [])
        if isinstance(n, SymValue):
            return n.sym
        return as_constant(n)
    v = protocols.dict_part(v)
    if isinstance(v, (TupleValue, ListValue, DictValue)):
        return len(v.items)
    if attrs.is_existing_dict(v, "__len__"):
        return len(attrs.guarded_dict_keys(frame, v))
    if isinstance(v, ConstantValue):
        return len(v.value)
    if isinstance(v, TensorValue):
        if v.fake.dim() == 0:
            raise Unsupported("len() of a 0-d tensor")
        return v.fake.shape[0]
    if isinstance(v, DictViewValue):
        return len(v.dict_value.items)
    if isinstance(v, ObjectValue) and isinstance(v.obj, torch.nn.Module) and hasattr(type(v.obj), "__len__"):
        return len(v.obj)
    if isinstance(v, ObjectValue) and isinstance(v.obj, enum.EnumMeta):
        return len(v.obj)   # an enum's members are fixed when its class is made
    if attrs.is_mapping_proxy(v):
        return len(attrs.proxy_keys(frame, v))
    raise Unsupported(f"len() of {attrs.describe(v)} is not supported yet")


def make_slice(start, stop, step):
    if all(isinstance(p, ConstantValue) for p in (start, stop, step)):
        return ConstantValue(slice(start.value, stop.value, step.value))
    return SliceValue(start, stop, step)


def getitem(frame: RunningFrame, obj: Value, index: Value, own_methods: bool = True) -> Value:
    if numpy_calls.involves_arrays(obj, index):
        return numpy_calls.getitem(frame, obj, index)
    if isinstance(obj, TensorValue):
        own = tensor_special_method(frame, obj, None, "__getitem__", None, "a subscript", [index]) \
            if own_methods else None
        if own is not None:
            return own
        if _overridable(frame, obj, index):
            overridden = ops.function_subclass_binary(frame, operator.getitem, obj, index)   # a __torch_function__ class's
            if overridden is not None:
                return overridden
        return graph_op(frame, operator.getitem, [obj, index])
    if isinstance(obj, (TupleValue, ListValue)):
        i = as_constant(index)
        try:
            picked = obj.items[i]
        except (IndexError, TypeError) as e:
            raise PythonError(f"indexing raised {type(e).__name__}: {e}", e) from e
        if isinstance(i, slice):
            if isinstance(obj, ListValue):
                return ListValue(picked)
            return TupleValue(picked, cls=obj.cls if obj.cls is torch.Size else tuple)
        return picked
    if isinstance(obj, DictValue):
        k = key_of(index)
        if k not in obj.items:
            if isinstance(obj, DefaultDictValue) and not is_none(obj.factory):
                new = ops.call(frame, obj.factory, [], {})
                frame.tx.effects.mark_mutated(obj, "a missing key of")
                obj.items[k] = new
                return new
            raise PythonError(f"KeyError: {k!r}", KeyError(k))
        return obj.items[k]
    if isinstance(obj, ConstantValue):
        return constant_fold(frame, operator.getitem, [obj, index], "indexing")
    if isinstance(obj, ObjectValue) and isinstance(obj.obj, torch.nn.Module):
        return _module_item(frame, obj, as_constant(index))
    if attrs.is_mapping_proxy(obj):
        return attrs.proxy_item(frame, obj, key_of(index))
    if isinstance(obj, ObjectValue) and _makes_annotations(obj.obj) \
            and isinstance(index, (ObjectValue, ConstantValue, TupleValue)):
        # A type annotation such as list[Tensor] or typing.List[Tensor] (typing.cast's and
        # torch.jit.annotate's first argument): made at once (typing's own code for it looks
        # at the caller's frame).
        try:
            return ObjectValue(obj.obj[_annotation_arg(index)])
        except Unsupported:
            pass
    if protocols.has_special_method(obj, "__getitem__"):
        return protocols.call_special_method(frame, obj, "__getitem__", [index])
    if protocols.dict_part(obj) is not obj:
        return getitem(frame, protocols.dict_part(obj), index)
    raise Unsupported(f"indexing {attrs.describe(obj)} is not supported yet")


def _makes_annotations(obj):
    """Is ``obj[...]`` a type annotation: a generic class, or one of typing's special forms and
    aliases (``List``, ``Optional``, ``Union``, ``Callable``...)?"""
    if isinstance(obj, type):
        return hasattr(obj, "__class_getitem__")
    return type(obj).__module__ in ("typing", "typing_extensions")


def _annotation_arg(index):
    if isinstance(index, TupleValue):
        return tuple(_annotation_arg(i) for i in index.items)
    if isinstance(index, ObjectValue):
        return index.obj
    return as_constant(index)


def _module_item(frame, mv, index):
    m = mv.obj
    if isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential)) and isinstance(index, int):
        sub = m[index]
        key = next(k for k, v in m._modules.items() if v is sub)
        return wrap(frame.tx, sub, ModuleEntrySource(mv.source, "_modules", key) if mv.source else None)
    if isinstance(m, torch.nn.ModuleDict):
        return wrap(frame.tx, m[index], ModuleEntrySource(mv.source, "_modules", index) if mv.source else None)
    if isinstance(m, (torch.nn.ParameterList, torch.nn.ParameterDict)):
        key = str(index if index >= 0 else len(m) + index) if isinstance(index, int) else index
        return wrap(frame.tx, m[index], ModuleEntrySource(mv.source, "_parameters", key) if mv.source else None)
    if isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential)) and isinstance(index, slice):
        # A new container of the same submodules: read each through its own source first,
        # so the memo gives them sources when the new container is used.
        for key, sub in m._modules.items():
            wrap(frame.tx, sub, ModuleEntrySource(mv.source, "_modules", key) if mv.source else None)
        return ObjectValue(m[index])
    getitem_fn = getattr(type(m), "__getitem__", None)
    if getitem_fn is not None:
        return ops.call(frame, wrap(frame.tx, getitem_fn, None), [mv, ConstantValue(index)], {})
    raise Unsupported(f"indexing {type(m).__name__} is not supported")


def setitem(frame: RunningFrame, obj: Value, index: Value, value: Value, own_methods: bool = True) -> None:
    if numpy_calls.involves_arrays(obj, index, value):
        numpy_calls.setitem(frame, obj, index, value)
        return
    if isinstance(obj, TensorValue):
        if own_methods and tensor_special_method(frame, obj, None, "__setitem__", None, "a subscript store",
                                                 [index, value]) is not None:
            return
        if _overridable(frame, obj, index, value) \
                and ops.function_subclass_setitem(frame, obj, index, value) is not None:
            return    # a __torch_function__ class's override
        graph_op(frame, operator.setitem, [obj, index, value])
        return
    if protocols.has_special_method(obj, "__setitem__"):
        protocols.call_special_method(frame, obj, "__setitem__", [index, value])
        return
    obj = protocols.dict_part(obj)
    if isinstance(obj, ListValue):
        i = as_constant(index)
        if isinstance(i, slice):
            new = ops.iterate(frame, value)
            frame.tx.effects.mark_mutated(obj, "slice assignment on")
            try:
                obj.items[i] = new
            except ValueError as e:
                raise Unsupported(f"slice assignment raised ValueError: {e}") from e
            return
        if not isinstance(i, int) or not -len(obj.items) <= i < len(obj.items):
            raise PythonError("list assignment index out of range", IndexError("list assignment index out of range"))
        frame.tx.effects.mark_mutated(obj, "item assignment on")
        obj.items[i] = value
        return
    if isinstance(obj, DictValue):
        frame.tx.effects.mark_mutated(obj, "item assignment on")
        obj.items[key_of(index)] = value
        return
    if is_frame_mutable_constant(obj):
        _on_real(operator.setitem, obj, index, value, "item assignment")
        return
    raise Unsupported(f"item assignment on {attrs.describe(obj)} (a side effect on an existing object) "
                      "is not supported yet")


def delitem(frame, obj, index):
    if protocols.has_special_method(obj, "__delitem__"):
        protocols.call_special_method(frame, obj, "__delitem__", [index])
        return
    obj = protocols.dict_part(obj)
    if isinstance(obj, (ListValue, DictValue)):
        k = as_constant(index) if isinstance(obj, ListValue) else key_of(index)
        try:
            obj.items[k]
        except (KeyError, IndexError, TypeError) as e:
            raise PythonError(f"del raised {type(e).__name__}: {e}", e) from e
        frame.tx.effects.mark_mutated(obj, "del on")
        del obj.items[k]
        return
    if is_frame_mutable_constant(obj):
        _on_real(operator.delitem, obj, index, None, "del")
        return
    raise Unsupported(f"del on {attrs.describe(obj)} is not supported yet")


def is_frame_mutable_constant(v):
    """A set/deque/Counter made in the frame, kept as a real object of Python values."""
    return isinstance(v, ConstantValue) and v.source is None and isinstance(v._value, MUTABLE_CONSTANT_TYPES)


def _on_real(fn, obj, index, value, what):
    args = [obj.value, as_constant(index)] + ([] if value is None else [as_constant(value)])
    try:
        fn(*args)
    except Exception as e:
        raise Unsupported(f"{what} raised {type(e).__name__}: {e}") from e


# --- str(), repr(), format() ----------------------------------------------------------------

_TEXT_METHODS = {str: "__str__", repr: "__repr__"}


def lazy_text(frame, parts):
    """A FormattedTextValue; from here on an in-place op on a tensor it shows breaks the graph
    (the text must show the tensor as it is now)."""
    for part in parts:
        if not isinstance(part, str) and isinstance(part[0], TensorValue):
            frame.tx.graph.keep_unchanged(part[0], (
                "a tensor was formatted into a string earlier in this graph and its text is made after "
                "the graph; this in-place op would change it first, so the graph breaks here"))
    return FormattedTextValue(parts)


def _text_from_args(cls):
    """Whether str() and repr() of an exception of class ``cls`` are made from its class and
    ``args`` alone (BaseException's, or KeyError's quoting of a single key)."""
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        return False
    return class_lookup(cls, "__repr__")[0] is BaseException.__repr__ and \
        class_lookup(cls, "__str__")[0] in (BaseException.__str__, KeyError.__str__)


def _exception_text(frame, v, fn):
    """``str()``/``repr()`` of an exception object from outside the trace (one a native step
    raised into a handler): made from its class and its ``args``, both guarded."""
    frame.tx.guards.add(TYPE_MATCH, v.source, type(v.obj))
    args = wrap(frame.tx, v.obj.args, AttrSource(v.source, "args"))
    if not is_constant(args) or holds_values(as_constant(args)):
        raise Unsupported(f"{fn.__name__}() of {attrs.describe(v)} whose args are not constants is not supported yet")
    return ConstantValue(fn(v.obj))


def text_of(frame, v, fn):
    """``str(v)``, ``repr(v)`` or ``ascii(v)``: a ``__str__``/``__repr__`` written in Python runs
    traced (as Python looks it up: on the type; ``str`` falls back to ``repr``); containers
    of such objects are spelled as Python spells them; constants are folded."""
    if isinstance(v, ExceptionValue) and fn is not ascii:
        return to_str(frame, v, fn)
    if isinstance(v, TensorValue):
        return lazy_text(frame, [(v, fn, "")])
    if isinstance(v, FormattedTextValue):
        return v if fn is str else lazy_text(frame, [(v, fn, "")])
    if fn is ascii and not is_constant(v):
        text = as_constant(text_of(frame, v, repr))
        return ConstantValue(text.encode("ascii", "backslashreplace").decode("ascii"))
    if is_constant(v) and not isinstance(v, SymValue):
        if holds_values(as_constant(v)):
            raise Unsupported(f"{fn.__name__}() of a container holding tensors or objects is not supported yet")
        return constant_fold(frame, fn, [v], f"{fn.__name__}()")
    cls = python_type(v) if isinstance(v, (UserObjectValue, ObjectValue)) else None
    if cls is not None and _text_from_args(cls) and isinstance(v, ObjectValue) and v.source is not None:
        return _exception_text(frame, v, fn)
    if cls is not None:
        for name in ((_TEXT_METHODS[fn], "__repr__") if fn is str else ("__repr__",)):
            method = protocols.python_special_method(v, name)
            if method is not None:
                return _checked_text(frame, protocols.call_special_method(frame, v, name, []), name)
            if class_lookup(cls, name)[0] is not getattr(object, name):
                break   # a C method other than object's: not known here
        raise Unsupported(f"{fn.__name__}() of {attrs.describe(v)} (no __str__/__repr__ written in Python; "
                          "the default one shows its address) is not supported yet")
    if isinstance(v, (ListValue, TupleValue, DictValue)) and v.source is None and \
            python_type(v) in (list, tuple, dict):
        return ConstantValue(_container_repr(frame, v))
    raise Unsupported(f"{fn.__name__}() on non-constant arguments ({attrs.describe(v)}) is not supported yet")


def _checked_text(frame, result, name):
    if not isinstance(result, ConstantValue) or not isinstance(result.value, str):
        if isinstance(result, ConstantValue):
            raise_new(TypeError, f"{name} returned non-string (type {type(result.value).__name__})")
        raise Unsupported(f"{name} returned {attrs.describe(result)}, not a string known while tracing")
    return result


def _container_repr(frame, v):
    def item(x):
        return as_constant(text_of(frame, x, repr))
    if isinstance(v, ListValue):
        return "[" + ", ".join(item(x) for x in v.items) + "]"
    if isinstance(v, TupleValue):
        parts = [item(x) for x in v.items]
        return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
    return "{" + ", ".join(f"{k!r}: {item(x)}" for k, x in v.items.items()) + "}"


def format_of(frame, v, spec):
    """``format(v, spec)`` (f-strings): a ``__format__`` written in Python runs traced;
    ``object.__format__`` is ``str(v)`` for an empty spec; a tensor's text is made later."""
    if isinstance(v, (TensorValue, FormattedTextValue)) and is_constant(spec):
        if isinstance(v, FormattedTextValue) and not as_constant(spec):
            return v
        return lazy_text(frame, [(v, None, as_constant(spec))])
    if is_constant(v) and not isinstance(v, SymValue):
        return constant_fold(frame, format, [v, spec], "f-string formatting")
    method = protocols.python_special_method(v, "__format__")
    if method is not None:
        return _checked_text(frame, protocols.call_special_method(frame, v, "__format__", [spec]), "__format__")
    cls = python_type(v) if isinstance(v, (UserObjectValue, ObjectValue, ExceptionValue)) else None
    if cls is not None and class_lookup(cls, "__format__")[0] is object.__format__:
        text = as_constant(spec)
        if text:
            raise_new(TypeError, f"unsupported format string passed to {cls.__name__}.__format__")
        return text_of(frame, v, str)
    if isinstance(v, (ListValue, TupleValue, DictValue)) and not as_constant(spec):
        return text_of(frame, v, str)
    return constant_fold(frame, format, [v, spec], "f-string formatting")
