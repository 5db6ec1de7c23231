"""``__torch_function__`` subclasses in a trace: the override runs while tracing, as in eager.

A plain subclass of ``torch.Tensor`` (no ``__torch_dispatch__``, no flatten/unflatten) changes
what torch's Python API does through its ``__torch_function__``: eager calls
``cls.__torch_function__(func, types, args, kwargs)`` for every torch function, tensor method,
operator and property read that involves one. Here, where a traced value of such a class reaches

* a torch function (``torch.sin(x)``: ``func`` is the function),
* a tensor method (``x.sin()``: ``torch.Tensor.sin``),
* an operator with the function torch hands for it (``x + y``: ``Tensor.add``; ``2 - x``:
  ``Tensor.__rsub__(x, 2)``; ``x += y``: ``Tensor.add_``; ``_OPERATORS``), ``-x``, ``~x``, ``abs(x)``,
  a subscript (``x[i]``: ``Tensor.__getitem__``) or a store into one (``Tensor.__setitem__``), a
  comparison (``x > 0``: ``Tensor.gt``),
* a tensor property (``x.shape``: the property's ``__get__``),

the class's ``__torch_function__`` is traced with those arguments (guarded by identity on the
class). ``torch.Tensor.__torch_function__`` (``super().__torch_function__(...)``, or a class not
defining one) runs ``func`` with subclass dispatch off, then gives tensor results the class
(``as_subclass``), as torch does. Graph inputs of such a class are plain tensors in the graph
(which runs with subclass dispatch off, as under torch.compile); outputs get their class back
outside it.

Anything else that would reach a graph operation with such a value breaks (``GraphBuilder``
refuses it): more than one overriding class in one call, ``__torch_function__`` that is not a
Python classmethod, special methods called by name and protocols not listed above
(``x.__rsub__(1)``). A TorchFunctionMode on the stack is asked before the class
(``function_modes.py``).
"""
import inspect
import operator
import types

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass_type

from ...errors import Unsupported
from ...guards.builder import ID_MATCH
from ...guards.sources import AttrSource, ObjectSource
from ...values.base import ConstantValue, DictValue, ListValue, ObjectValue, SymValue, TensorValue, TupleValue
from ...values.builder import wrap
from ..core import ops
from ..core.handlers import builtin
from ..python import attrs, operators
from . import function_modes

_BASE = torch.Tensor.__torch_function__.__func__


def is_function_subclass(cls):
    """A tensor class whose torch calls go through ``__torch_function__`` (a plain subclass of
    torch.Tensor); not Parameter (its override is off) nor a traceable wrapper subclass."""
    return isinstance(cls, type) and issubclass(cls, torch.Tensor) \
        and cls not in (torch.Tensor, torch.nn.Parameter) \
        and not issubclass(cls, torch.nn.Parameter) and not is_traceable_wrapper_subclass_type(cls) \
        and getattr(cls, "__torch_dispatch__", torch.Tensor.__torch_dispatch__) is torch.Tensor.__torch_dispatch__


def _classes(obj, found):
    if isinstance(obj, TensorValue):
        if is_function_subclass(obj.cls) and obj.cls not in found:
            found.append(obj.cls)
    elif isinstance(obj, (TupleValue, ListValue)):
        for item in obj.items:
            _classes(item, found)
    elif isinstance(obj, DictValue):
        for item in obj.items.values():
            _classes(item, found)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            _classes(item, found)
    elif isinstance(obj, dict):
        for item in obj.values():
            _classes(item, found)
    return found


def dispatch(frame, func, args, kwargs, what=None):
    """``func(*args, **kwargs)`` as torch dispatches it when a tensor argument's class overrides
    ``__torch_function__``: the override traced; None when no argument has such a class (or
    subclass dispatch is off here)."""
    tx = frame.tx
    classes = _classes([list(args), dict(kwargs)], [])
    name = what or getattr(func, "__qualname__", None) or repr(func)
    if tx.graph.function_modes and not tx.graph.function_modes_off and function_modes.reaches_modes(func):
        # A TorchFunctionMode comes first (subclass dispatch off or not, as in eager).
        return function_modes.call_mode(frame, func, classes, args, kwargs, name)
    if tx.graph.function_subclass_off or not classes:
        return None
    if len(classes) > 1:
        raise Unsupported(f"{name} on tensors of several __torch_function__ classes "
                          f"({', '.join(c.__qualname__ for c in classes)}) is not supported yet",
                          hint="without fullgraph=True it runs eagerly")
    cls = classes[0]
    if torch._C._len_torch_function_stack() > 0:
        # A mode left on the stack (a device context) is asked before the class in eager; the
        # graph's ops would reach it at run time.
        raise Unsupported(f"{name} on a {cls.__qualname__} under a TorchFunctionMode is not supported yet",
                          hint="without fullgraph=True it runs eagerly")
    override = inspect.getattr_static(cls, "__torch_function__", None)
    if not isinstance(override, classmethod) or not isinstance(override.__func__, types.FunctionType):
        raise Unsupported(f"{cls.__qualname__}.__torch_function__ is not a Python classmethod: it cannot be traced",
                          hint="without fullgraph=True it runs eagerly")
    # Guard that the class still finds this override (set on the class or a base later: another trace).
    tx.guards.add(ID_MATCH, AttrSource(AttrSource(ObjectSource(cls, cls.__qualname__), "__torch_function__"),
                                       "__func__"), override.__func__)
    cls_value = wrap(tx, cls, ObjectSource(cls, cls.__qualname__))
    func_value = wrap(tx, func, None)
    types_value = TupleValue([cls_value])
    args_value = TupleValue(list(args))
    kwargs_value = DictValue(dict(kwargs))
    if override.__func__ is _BASE:
        result = base(frame, cls, func, list(args), dict(kwargs))
    else:
        result = ops.call(frame, wrap(tx, override.__func__, None),
                          [cls_value, func_value, types_value, args_value, kwargs_value], {})
    if isinstance(result, ConstantValue) and result.value is NotImplemented:
        raise Unsupported(f"{cls.__qualname__}.__torch_function__ returned NotImplemented for {name} "
                          "(eager raises TypeError)")
    return result


@builtin(_BASE)
def _tensor_torch_function(frame, args, kwargs):
    """``torch.Tensor.__torch_function__(cls, func, types, args=(), kwargs=None)``."""
    names = ("cls", "func", "types", "args", "kwargs")
    bound = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names or k in bound:
            raise Unsupported(f"Tensor.__torch_function__() got an unexpected argument {k!r}")
        bound[k] = v
    if not {"cls", "func", "types"} <= set(bound):
        raise Unsupported("Tensor.__torch_function__() without cls, func and types")
    cls, func, types_v = bound["cls"], bound["func"], bound["types"]
    call_args, call_kwargs = bound.get("args", TupleValue([])), bound.get("kwargs", ConstantValue(None))
    if not (isinstance(cls, ObjectValue) and isinstance(cls.obj, type) and isinstance(func, ObjectValue)
            and isinstance(types_v, (TupleValue, ListValue))
            and all(isinstance(t, ObjectValue) and isinstance(t.obj, type) for t in types_v.items)
            and isinstance(call_args, (TupleValue, ListValue))
            and (isinstance(call_kwargs, DictValue) or isinstance(call_kwargs, ConstantValue)
                 and call_kwargs.value is None)):
        raise Unsupported("Tensor.__torch_function__() with arguments other than a class, a function, a tuple "
                          "of types, a tuple of arguments and a dict is not supported yet")
    if not all(issubclass(cls.obj, t.obj) for t in types_v.items):
        return ConstantValue(NotImplemented)
    return base(frame, cls.obj, func.obj, list(call_args.items),
                dict(call_kwargs.items) if isinstance(call_kwargs, DictValue) else {})


def base(frame, cls, func, args, kwargs):
    """What torch.Tensor.__torch_function__ does: ``func`` with subclass dispatch off, tensor
    results given ``cls`` (but for torch's no-wrap functions)."""
    tx = frame.tx
    tx.graph.function_subclass_off += 1
    try:
        getter = _property_name(func)
        if func is torch._C.TensorBase.__getitem__ and len(args) == 2 and not kwargs:
            result = operators.getitem(frame, args[0], args[1], own_methods=False)
        elif func in _OPERATOR_OF and len(args) == 2 and not kwargs:
            result = operators.compare(frame, _OPERATOR_OF[func], args[0], args[1], own_methods=False)
        elif func in _OPERATOR_RUN and len(args) == 2 and not kwargs:
            op, swapped = _OPERATOR_RUN[func]
            result = operators.binary(frame, op, *(args[::-1] if swapped else args), own_methods=False)
        elif func is torch.Tensor.__len__ and len(args) == 1 and not kwargs and isinstance(args[0], TensorValue):
            if args[0].fake.dim() == 0:
                raise Unsupported("len() of a 0-d tensor")
            result = tx.graph.size_value(args[0], 0)
        elif func is _TB.__invert__ and len(args) == 1 and not kwargs:
            result = operators.unary(frame, operator.invert, args[0], own_methods=False)
        elif func is _TB.__setitem__ and len(args) == 3 and not kwargs:
            operators.setitem(frame, *args, own_methods=False)
            result = ConstantValue(None)
        elif getter is not None:
            if len(args) != 1 or kwargs:
                raise Unsupported(f"Tensor.{getter}.__get__ with unexpected arguments")
            with torch._C.DisableTorchFunctionSubclass():   # a read of the real input (x.grad): no override
                result = attrs.get_attr(frame, args[0], getter)
        else:
            result = ops.call(frame, wrap(tx, func, None), args, kwargs)
    finally:
        tx.graph.function_subclass_off -= 1
    if func in torch.overrides.get_default_nowrap_functions():
        return result
    return _convert(result, cls)


def _property_name(func):
    """The name of the tensor property whose ``__get__`` ``func`` is, else None."""
    owner = getattr(func, "__self__", None)
    if getattr(func, "__name__", None) == "__get__" and isinstance(owner, (types.GetSetDescriptorType, property)):
        name = getattr(owner, "__name__", None) or getattr(getattr(owner, "fget", None), "__name__", None)
        if name is not None and inspect.getattr_static(torch.Tensor, name, None) is owner:
            return name
    return None


def _convert(value, cls):
    if isinstance(value, TensorValue):
        if issubclass(value.cls, cls):
            return value
        return TensorValue(value.node, value.fake, None, cls=cls)
    if isinstance(value, TupleValue):
        return TupleValue([_convert(v, cls) for v in value.items], cls=value.cls)
    if isinstance(value, ListValue):
        return ListValue([_convert(v, cls) for v in value.items])
    return value


# --- entry points that route here -------------------------------------------------------------

_TB = torch._C.TensorBase
# What torch hands __torch_function__ for each operator (as eager does; in-place forms included:
# x += y hands add_): (operator string, function for a tensor on the left, function for a
# number on the left with the tensor's arguments swapped, or None where Python has no reflection).
_OPERATORS = [
    ("+", _TB.add, _TB.add), ("-", _TB.sub, torch.Tensor.__rsub__), ("*", _TB.mul, _TB.mul),
    ("/", _TB.div, torch.Tensor.__rdiv__), ("//", torch.Tensor.__floordiv__, torch.Tensor.__rfloordiv__),
    ("%", _TB.remainder, torch.Tensor.__rmod__), ("**", _TB.pow, torch.Tensor.__rpow__), ("@", _TB.matmul, None),
    ("&", _TB.__and__, _TB.bitwise_and), ("|", _TB.__or__, _TB.bitwise_or), ("^", _TB.__xor__, _TB.bitwise_xor),
    ("<<", _TB.__lshift__, torch.Tensor.__rlshift__), (">>", _TB.__rshift__, torch.Tensor.__rrshift__),
    ("+=", _TB.add_, None), ("-=", _TB.sub_, None), ("*=", _TB.mul_, None), ("/=", _TB.div_, None),
    ("//=", _TB.floor_divide_, None), ("%=", _TB.remainder_, None), ("**=", _TB.pow_, None),
    ("@=", _TB.matmul, None),   # no __imatmul__: x @= y is x = x @ y
    ("&=", _TB.__iand__, None), ("|=", _TB.__ior__, None), ("^=", _TB.__ixor__, None),
    ("<<=", _TB.__ilshift__, None), (">>=", _TB.__irshift__, None),
]
_BINARY_OF = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
              "//": operator.floordiv, "%": operator.mod, "**": operator.pow, "@": operator.matmul,
              "&": operator.and_, "|": operator.or_, "^": operator.xor, "<<": operator.lshift, ">>": operator.rshift}
_BINARY_OF.update({op + "=": getattr(operator, "i" + fn.__name__.rstrip("_")) for op, fn in list(_BINARY_OF.items())})
LEFT_FUNCS = {_BINARY_OF[op]: left for op, left, _ in _OPERATORS}
REFLECTED_FUNCS = {_BINARY_OF[op]: right for op, _, right in _OPERATORS if right is not None}
# Functions handed to an override that the base handler runs as the operator (reflected ones with
# their operands back in Python's order): (operator string, swapped).
_OPERATOR_RUN = {left: (op, False) for op, left, _ in _OPERATORS
                 if left not in (_TB.add, _TB.sub, _TB.mul, _TB.div, _TB.remainder, _TB.pow, _TB.matmul)}
_OPERATOR_RUN.update({right: (op, True) for op, _, right in _OPERATORS
                      if right is not None and right not in (_TB.add, _TB.mul, _TB.bitwise_and, _TB.bitwise_or,
                                                             _TB.bitwise_xor)})
# x.__iadd__(1) called by name: torch hands the in-place method, as for x += 1.
DUNDER_FUNCS = {f"__i{name}__": LEFT_FUNCS[_BINARY_OF[op + "="]]
                for op, name in (("+", "add"), ("-", "sub"), ("*", "mul"), ("/", "truediv"), ("//", "floordiv"),
                                 ("%", "mod"), ("**", "pow"))}

UNARY_FUNCS = {operator.neg: _TB.neg, operator.abs: _TB.abs, operator.pos: _TB.positive,
               operator.invert: _TB.__invert__}
# Comparisons: what torch hands (x == y: Tensor.__eq__), the operator, and its reflection (Python
# asks the right operand first when its class derives from the left one's: y < x is x > y).
COMPARE_FUNCS = {operator.gt: ("gt", ">", operator.lt), operator.ge: ("ge", ">=", operator.le),
                 operator.lt: ("lt", "<", operator.gt), operator.le: ("le", "<=", operator.ge),
                 operator.ne: ("ne", "!=", operator.ne), operator.eq: ("__eq__", "==", operator.eq)}
_OPERATOR_OF = {getattr(torch._C.TensorBase, name): op for name, op, _ in COMPARE_FUNCS.values()}


def binary(frame, fn, a, b):
    """``a <op> b`` (``b`` None: ``<op> a``; ``operator.getitem``: ``a[b]``) with an operand of a
    __torch_function__ class: the override traced with the func and arguments torch hands it;
    None when no operand has one or torch's order is not known here (the graph then refuses)."""
    if fn is operator.getitem and isinstance(a, TensorValue):
        return dispatch(frame, _TB.__getitem__, [a, b], {}, what="Tensor.__getitem__")
    if b is None:
        func = UNARY_FUNCS.get(fn)
        return dispatch(frame, func, [a], {}, what=f"Tensor.{func.__name__}") \
            if func is not None and isinstance(a, TensorValue) else None
    if fn in COMPARE_FUNCS:
        return _compare(frame, fn, a, b)
    if isinstance(a, TensorValue):
        func = LEFT_FUNCS.get(fn)
        return None if func is None else dispatch(frame, func, [a, b], {}, what=f"Tensor.{func.__name__}")
    if isinstance(b, TensorValue) and _is_number(a):
        # 2 - x: Python asks x.__rsub__(2); torch hands it with the tensor first.
        func = REFLECTED_FUNCS.get(fn)
        return None if func is None else dispatch(frame, func, [b, a], {}, what=f"Tensor.{func.__name__}")
    return None


def setitem(frame, obj, index, value):
    """``obj[index] = value`` with a __torch_function__ class among them: the override traced with
    ``Tensor.__setitem__``; None when none applies."""
    return dispatch(frame, _TB.__setitem__, [obj, index, value], {}, what="Tensor.__setitem__")


def _is_number(v):
    return isinstance(v, SymValue) or isinstance(v, ConstantValue) and isinstance(v.value, (bool, int, float, complex))


def _compare(frame, fn, a, b):
    name, _, reflected = COMPARE_FUNCS[fn]
    if isinstance(b, TensorValue) and is_function_subclass(b.cls) \
            and (not isinstance(a, TensorValue) or a.cls is not b.cls and issubclass(b.cls, a.cls)):
        name = COMPARE_FUNCS[reflected][0]
        a, b = b, a
    if not isinstance(a, TensorValue):
        return None
    func = getattr(torch._C.TensorBase, name)
    return dispatch(frame, func, [a, b], {}, what=f"Tensor.{name}")


def tensor_property(frame, v, name):
    """``x.name`` for a property of torch.Tensor on a __torch_function__ class: the override
    traced with the property's ``__get__``; None otherwise."""
    if name.startswith("__"):
        return None    # __class__, __dict__: Python's own, read without the override
    descriptor = torch.Tensor.__dict__.get(name, torch._C.TensorBase.__dict__.get(name))
    if not isinstance(descriptor, (types.GetSetDescriptorType, property)):
        return None
    return dispatch(frame, descriptor.__get__, [v], {}, what=f"Tensor.{name}")


__all__ = ["is_function_subclass", "dispatch", "binary", "setitem", "tensor_property", "base", "DUNDER_FUNCS"]
