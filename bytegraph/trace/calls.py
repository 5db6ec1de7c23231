"""Calls while tracing: inline Python, put torch in the graph, fold the rest.

``call(frame, fn, args, kwargs)`` decides, from what ``fn`` is, whether the
call is inlined (user functions, methods, ``nn.Module.forward``), becomes a
graph node (torch functions, tensor methods), is folded to a constant (pure
builtins on constants), or is unsupported.
"""
import abc
import contextlib
import operator
import types

import torch

from ..errors import Unsupported
from ..guards.sources import AttrSource, DefaultSource, ItemSource
from ..values.base import (BoundMethodValue, CellValue, ConstantValue, DictValue, ExceptionValue,
                           ExitValue, FunctionValue, IteratorValue, ListValue, MethodOfValue,
                           ObjectValue, RealCell, SuperValue, TensorMethodValue, TensorValue,
                           TracerCallableValue, TupleValue, UserObjectValue)
from ..values.builder import wrap
from . import attrs, generators, operators, with_blocks
from .exceptions import PythonError, TracedRaise, make_exception, to_str
from .frame import inline_call
from .iteration import iterate


def call(frame, fn, args, kwargs):
    if isinstance(fn, TensorMethodValue):
        return tensor_method(frame, fn.tensor, fn.name, args, kwargs)
    if isinstance(fn, BoundMethodValue):
        return call(frame, fn.func, [fn.self_value] + list(args), kwargs)
    if isinstance(fn, FunctionValue):
        return inline_call(frame, fn.code, fn.globals, fn.name, fn.defaults, fn.kwdefaults,
                           fn.closure, list(args), kwargs)
    if isinstance(fn, MethodOfValue):
        from .containers import call_method
        return call_method(frame, fn.owner, fn.name, list(args), kwargs)
    if isinstance(fn, ExitValue):
        exit_context(frame, fn.manager)
        return ConstantValue(None)
    if isinstance(fn, TracerCallableValue):
        return fn.impl(frame, list(args), kwargs)
    if isinstance(fn, ObjectValue):
        return _call_object(frame, fn, list(args), kwargs)
    if isinstance(fn, ConstantValue) and callable(fn.value):
        return _call_object(frame, ObjectValue(fn.value), list(args), kwargs)
    raise Unsupported(f"calling {attrs.describe(fn)} is not supported yet")


def _call_object(frame, fv, args, kwargs):
    obj = fv.obj
    tx = frame.tx
    special = _control_call(frame, obj, args, kwargs)
    if special is not None:
        return special
    from .torch_calls import is_graph_function, torch_call, call_torch_class
    handler = BUILTIN_HANDLERS.get(_key(obj))
    if handler is not None:
        return handler(frame, args, kwargs)
    if isinstance(obj, torch.nn.Module):
        return call_module(frame, fv, args, kwargs)
    if isinstance(obj, types.FunctionType):
        if is_graph_function(obj):
            return torch_call(frame, obj, args, kwargs)
        return call_python_function(frame, fv, args, kwargs)
    if isinstance(obj, types.MethodType):
        self_value = wrap(tx, obj.__self__, AttrSource(fv.source, "__self__") if fv.source else None)
        func = wrap(tx, obj.__func__, None)
        return call(frame, func, [self_value] + args, kwargs)
    if is_graph_function(obj):
        return torch_call(frame, obj, args, kwargs)
    if isinstance(obj, type):
        return call_torch_class(frame, obj, args, kwargs) if obj.__module__.startswith("torch") \
            else _call_class(frame, obj, args, kwargs)
    if _is_foldable(obj):
        return fold(frame, obj, args, kwargs)
    call_attr = getattr(type(obj), "__call__", None)
    if isinstance(call_attr, types.FunctionType):
        return call(frame, wrap(tx, call_attr, None), [fv] + args, kwargs)
    raise Unsupported(f"calling {attrs.describe(fv)} is not supported yet",
                      hint="wrap it with bytegraph.allow_in_graph, or call it outside the compiled function")


def _control_call(frame, obj, args, kwargs):
    """Calls governed by bytegraph.disable / allow_in_graph / disallow_in_graph / graph_break."""
    from .. import control
    from ..api import is_compiling
    if obj is is_compiling or (getattr(obj, "__name__", None) == "is_compiling"
                               and (getattr(obj, "__module__", None) or "").startswith("torch")):
        return ConstantValue(True)
    try:
        if obj is control.graph_break:
            raise Unsupported("bytegraph.graph_break() called", hint="remove the call to keep one graph")
        if getattr(obj, "_bytegraph_disabled", False):
            raise Unsupported(f"{getattr(obj, '__qualname__', obj)} is marked bytegraph.disable",
                              hint="remove bytegraph.disable to trace it")
        if obj in control.disallowed_in_graph:
            raise Unsupported(f"{getattr(obj, '__qualname__', obj)} is marked bytegraph.disallow_in_graph")
        if obj in control.allowed_in_graph:
            return frame.tx.graph.call("call_function", obj, args, kwargs)
    except TypeError:   # unhashable callables are never in those sets
        return None
    return None


def _key(obj):
    try:
        hash(obj)
    except TypeError:
        return None
    return obj


def call_python_function(frame, fv, args, kwargs):
    fn = fv.obj
    tx = frame.tx
    src = fv.source
    defaults = [wrap(tx, d, DefaultSource(src, i) if src else None)
                for i, d in enumerate(fn.__defaults__ or ())]
    kwdefaults = {k: wrap(tx, d, DefaultSource(src, k, kw=True) if src else None)
                  for k, d in (fn.__kwdefaults__ or {}).items()}
    closure = []
    for i, cell in enumerate(fn.__closure__ or ()):
        csrc = AttrSource(ItemSource(AttrSource(src, "__closure__"), i), "cell_contents") if src else None
        closure.append(RealCell(cell, csrc))
    return inline_call(frame, fn.__code__, fn.__globals__, fn.__name__, defaults, kwdefaults,
                       closure, args, kwargs)


def has_hooks(m):
    """True if calling ``m`` would run hooks (its own or global ones)."""
    from torch.nn.modules import module as mm
    return bool(m._forward_hooks or m._forward_pre_hooks or mm._global_forward_hooks
                or mm._global_forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
                or mm._global_backward_hooks or mm._global_backward_pre_hooks)


def call_module(frame, mv, args, kwargs):
    """``module(*args)``: inline its forward (hooks are not traced yet)."""
    m = mv.obj
    if has_hooks(m):
        raise Unsupported(f"{type(m).__name__} has hooks; tracing module hooks is not supported yet")
    if mv.source is not None:
        from ..guards.builder import NO_HOOKS
        frame.tx.guards.add(NO_HOOKS, mv.source, None)
    forward = m.__dict__.get("forward")
    if forward is not None:
        return call(frame, wrap(frame.tx, forward, AttrSource(mv.source, "forward") if mv.source else None),
                    args, kwargs)
    fwd = type(m).forward
    if fwd is torch.nn.Module.forward:
        raise Unsupported(f"{type(m).__name__} has no forward()")
    return call(frame, wrap(frame.tx, fwd, None), [mv] + args, kwargs)


def _call_class(frame, cls, args, kwargs):
    """``C(...)`` for a user class: a new object whose ``__init__`` is traced."""
    tx = frame.tx
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return _make_namedtuple(frame, cls, args, kwargs)
    if issubclass(cls, BaseException):
        return make_exception(frame, cls, args, kwargs)
    if type(cls) not in (type, abc.ABCMeta) or cls.__new__ is not object.__new__ \
            or any(b.__module__ == "builtins" for b in cls.__mro__[1:-1]) \
            or issubclass(cls, torch.nn.Module) or cls.__setattr__ is not object.__setattr__ \
            or cls.__getattribute__ is not object.__getattribute__ or cls.__delattr__ is not object.__delattr__:
        raise Unsupported(f"creating {cls.__qualname__} objects inside the compiled function is not supported yet")
    obj = UserObjectValue(cls)
    init = cls.__init__
    if init is object.__init__:
        if args or kwargs:
            raise Unsupported(f"{cls.__qualname__}() takes no arguments")
        return obj
    if not isinstance(init, types.FunctionType):
        raise Unsupported(f"{cls.__qualname__}.__init__ is not Python code")
    result = call(frame, wrap(tx, init, None), [obj] + list(args), kwargs)
    if not operators.is_none(result):
        raise Unsupported(f"{cls.__qualname__}.__init__ returned a value")
    return obj


def _make_namedtuple(frame, cls, args, kwargs):
    fields = cls._fields
    values = dict(zip(fields, args))
    for k, v in kwargs.items():
        if k not in fields or k in values:
            raise Unsupported(f"{cls.__qualname__}() got an unexpected or repeated argument {k!r}")
        values[k] = v
    for k, default in getattr(cls, "_field_defaults", {}).items():
        values.setdefault(k, ConstantValue(default) if isinstance(default, (int, float, str, bool, type(None)))
                          else wrap(frame.tx, default, None))
    if set(values) != set(fields):
        raise Unsupported(f"{cls.__qualname__}() missing arguments {sorted(set(fields) - set(values))}")
    return TupleValue([values[f] for f in fields], cls=cls)


# --- folding ------------------------------------------------------------------

_FOLDABLE_MODULES = {"math", "operator", "builtins", "_operator", "cmath"}


def _is_foldable(obj):
    if isinstance(obj, (types.BuiltinFunctionType, types.BuiltinMethodType)):
        owner = getattr(obj, "__self__", None)
        if owner is None or isinstance(owner, types.ModuleType):
            return (getattr(obj, "__module__", None) or getattr(owner, "__name__", "")) in _FOLDABLE_MODULES
        from ..values.builder import CONSTANT_TYPES
        return isinstance(owner, CONSTANT_TYPES + (tuple, frozenset))
    if isinstance(obj, types.MethodWrapperType):
        from ..values.builder import CONSTANT_TYPES
        return isinstance(obj.__self__, CONSTANT_TYPES + (tuple, frozenset))
    return False


def fold(frame, fn, args, kwargs, what=None):
    """Call a pure function on constant arguments at trace time."""
    name = what or getattr(fn, "__qualname__", None) or getattr(fn, "__name__", repr(fn))
    args = generators.materialize_args(frame, fn, args)
    try:
        cargs = [operators.as_constant(a) for a in args]
        ckwargs = {k: operators.as_constant(v) for k, v in kwargs.items()}
    except Unsupported:
        # Some operator.* functions are graph operations on tensors.
        if getattr(fn, "__module__", None) in ("_operator", "operator") and _has_tensor(args):
            return operators.graph_op(frame, fn, args, kwargs)
        raise Unsupported(f"{name}() on non-constant arguments ({', '.join(attrs.describe(a) for a in args)})")
    try:
        result = fn(*cargs, **ckwargs)
    except Exception as e:
        raise PythonError(f"{name}() raised {type(e).__name__}: {e}", e) from e
    return operators.constant_value(result)


def _has_tensor(args):
    return any(isinstance(a, TensorValue) for a in args)


# --- tensor methods --------------------------------------------------------------

# Methods that turn tensor data into Python values: the trace cannot know them.
_DATA_DEPENDENT = {"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__",
                   "data_ptr", "nonzero_static", "__array__", "cpu_numpy"}
_UNSUPPORTED_METHODS = {"backward", "register_hook", "retain_grad", "requires_grad_", "share_memory_",
                        "pin_memory", "record_stream", "storage", "untyped_storage", "set_", "resize_"}


def tensor_method(frame, tensor, name, args, kwargs):
    if name in _DATA_DEPENDENT:
        raise Unsupported(f"Tensor.{name}() needs the tensor's data, which is unknown while tracing",
                          hint="keep the computation on tensors, or move this call out of the compiled function")
    if name in _UNSUPPORTED_METHODS:
        raise Unsupported(f"Tensor.{name}() is not supported in a graph yet")
    if name in ("size", "stride") and not kwargs:
        shape = tensor.fake.shape if name == "size" else tensor.fake.stride()
        symbolic = any(isinstance(s, torch.SymInt) for s in shape)
        if not args:
            if not symbolic:
                return ConstantValue(torch.Size(shape) if name == "size" else tuple(shape))
            if name == "size":
                return attrs._shape_value(frame, tensor)
        else:
            d = operators.as_constant(args[0])
            if name == "size":
                return frame.tx.graph.size_value(tensor, d)
            if not isinstance(shape[d], torch.SymInt):
                return ConstantValue(shape[d])
    if name in ("dim", "ndimension"):
        return ConstantValue(tensor.fake.dim())
    if name in ("numel", "nelement") and not isinstance(tensor.fake.numel(), torch.SymInt):
        return ConstantValue(tensor.fake.numel())
    if name == "__len__":
        return frame.tx.graph.size_value(tensor, 0)
    return frame.tx.graph.call("call_method", name, [tensor] + list(args), kwargs)


# --- with-blocks over torch global state --------------------------------------------

def enter_context(frame, mgr):
    from .torch_calls import apply_state, current_state
    if mgr.kind == "set_grad":
        # set_grad_enabled took effect when it was made; entering does nothing more.
        return
    mgr.saved = current_state(mgr)
    apply_state(frame, mgr, entering=True)


def exit_context(frame, mgr):
    from .torch_calls import apply_state
    apply_state(frame, mgr, entering=False)


# --- builtins --------------------------------------------------------------------------

BUILTIN_HANDLERS = {}


def builtin(*fns):
    def register(h):
        for fn in fns:
            BUILTIN_HANDLERS[fn] = h
        return h
    return register


def _const_args(args, what):
    try:
        return [operators.as_constant(a) for a in args]
    except Unsupported:
        raise Unsupported(f"{what}() on non-constant arguments is not supported yet") from None


@builtin(len)
def _len(frame, args, kwargs):
    (v,) = args
    if isinstance(v, TensorValue):
        if v.fake.dim() == 0:
            raise Unsupported("len() of a 0-d tensor")
        return frame.tx.graph.size_value(v, 0)
    if isinstance(v, (UserObjectValue, ObjectValue)):
        n = generators.user_dunder(frame, v, "__len__", [])
        if n is not None:
            return n
    return ConstantValue(operators.length(frame, v))


@builtin(isinstance)
def _isinstance(frame, args, kwargs):
    v, classes = args
    cls = operators.as_constant(classes) if not isinstance(classes, ObjectValue) else classes.obj
    if isinstance(classes, TupleValue):
        cls = tuple(c.obj if isinstance(c, ObjectValue) else operators.as_constant(c) for c in classes.items)
    t = operators.python_type(v)
    try:
        return ConstantValue(issubclass(t, cls))
    except TypeError as e:
        raise Unsupported(f"isinstance(): {e}") from e


@builtin(issubclass)
def _issubclass(frame, args, kwargs):
    a, b = args
    return fold(frame, issubclass, [_obj(a), _obj(b)], {})


def _obj(v):
    return ConstantValue(v.obj) if isinstance(v, ObjectValue) and isinstance(v.obj, (type, tuple)) else v


@builtin(type)
def _type(frame, args, kwargs):
    if len(args) != 1:
        raise Unsupported("type() with three arguments is not supported")
    return wrap(frame.tx, operators.python_type(args[0]), None)


@builtin(getattr)
def _getattr(frame, args, kwargs):
    obj, name = args[0], operators.as_constant(args[1])
    if len(args) == 3:
        try:
            return attrs.get_attr(frame, obj, name)
        except attrs.MissingAttribute:
            return args[2]
        except TracedRaise as e:
            if not issubclass(e.value.cls, AttributeError):
                raise
            return args[2]
    return attrs.get_attr(frame, obj, name)


@builtin(hasattr)
def _hasattr(frame, args, kwargs):
    obj, name = args[0], operators.as_constant(args[1])
    try:
        attrs.get_attr(frame, obj, name)
    except attrs.MissingAttribute:
        return ConstantValue(False)
    except TracedRaise as e:
        if not issubclass(e.value.cls, AttributeError):
            raise
        return ConstantValue(False)
    return ConstantValue(True)


@builtin(range)
def _range(frame, args, kwargs):
    return ConstantValue(range(*_const_args(args, "range")))


@builtin(enumerate)
def _enumerate(frame, args, kwargs):
    if not isinstance(args[0], (TupleValue, ListValue, IteratorValue, DictValue, ConstantValue)):
        return generators.lazy_enumerate(frame, args, kwargs)
    start = operators.as_constant(kwargs.get("start", args[1] if len(args) > 1 else ConstantValue(0)))
    items = iterate(frame, args[0])
    return IteratorValue([TupleValue([ConstantValue(i + start), v]) for i, v in enumerate(items)])


@builtin(zip)
def _zip(frame, args, kwargs):
    if not all(isinstance(a, (TupleValue, ListValue, IteratorValue, DictValue, ConstantValue)) for a in args):
        return generators.lazy_zip(frame, args, kwargs)
    strict = operators.as_constant(kwargs.get("strict", ConstantValue(False)))
    seqs = [iterate(frame, a) for a in args]
    if strict and len({len(s) for s in seqs}) > 1:
        raise Unsupported("zip(strict=True) on sequences of different lengths raises")
    return IteratorValue([TupleValue(list(t)) for t in zip(*seqs)])


@builtin(reversed)
def _reversed(frame, args, kwargs):
    return IteratorValue(list(reversed(iterate(frame, args[0]))))


@builtin(iter)
def _iter(frame, args, kwargs):
    if len(args) != 1:
        raise Unsupported("iter(callable, sentinel) is not supported yet")
    return generators.get_iter(frame, args[0])


@builtin(next)
def _next(frame, args, kwargs):
    it = args[0]
    if not isinstance(it, IteratorValue):
        return generators.builtin_next(frame, args, kwargs)
    if it.pos >= len(it.items):
        if len(args) > 1:
            return args[1]
        generators.raise_new(StopIteration)
    it.pos += 1
    return it.items[it.pos - 1]


@builtin(tuple)
def _tuple(frame, args, kwargs):
    return TupleValue(iterate(frame, args[0]) if args else [])


@builtin(list)
def _list(frame, args, kwargs):
    return ListValue(iterate(frame, args[0]) if args else [])


@builtin(dict)
def _dict(frame, args, kwargs):
    from .containers import call_method
    out = DictValue({})
    call_method(frame, out, "update", list(args), kwargs)
    return out


@builtin(torch.Size)
def _size(frame, args, kwargs):
    items = iterate(frame, args[0]) if args else []
    return ConstantValue(torch.Size([operators.as_constant(i) for i in items]))


@builtin(slice)
def _slice(frame, args, kwargs):
    parts = list(args) + [ConstantValue(None)] * (3 - len(args))
    if len(args) == 1:
        parts = [ConstantValue(None), args[0], ConstantValue(None)]
    return operators.make_slice(*parts)


@builtin(callable)
def _callable(frame, args, kwargs):
    v = args[0]
    if isinstance(v, (ObjectValue, ConstantValue)):
        return ConstantValue(callable(v.obj if isinstance(v, ObjectValue) else v.value))
    return ConstantValue(isinstance(v, (FunctionValue, BoundMethodValue, TensorMethodValue, MethodOfValue)))


def _min_max(fn):
    def h(frame, args, kwargs):
        items = iterate(frame, args[0]) if len(args) == 1 else list(args)
        if any(isinstance(i, TensorValue) for i in items):
            if len(items) == 2 and not kwargs:
                target = torch.minimum if fn is min else torch.maximum
                a, b = items
                if isinstance(a, TensorValue) and isinstance(b, TensorValue):
                    return frame.tx.graph.call("call_function", target, [a, b], {})
            raise Unsupported(f"{fn.__name__}() over tensors is not supported yet",
                              hint=f"use torch.{'minimum' if fn is min else 'maximum'}")
        return fold(frame, fn, [ListValue(items)], kwargs)
    return h


BUILTIN_HANDLERS[min] = _min_max(min)
BUILTIN_HANDLERS[max] = _min_max(max)


@builtin(sum)
def _sum(frame, args, kwargs):
    items = iterate(frame, args[0])
    total = args[1] if len(args) > 1 else kwargs.get("start", ConstantValue(0))
    for item in items:
        total = operators.binary(frame, "+", total, item)
    return total


def _any_all(fn):
    def h(frame, args, kwargs):
        if generators.is_lazy(args[0]) or isinstance(args[0], (UserObjectValue, ObjectValue)):
            return generators.any_all(frame, fn, generators.get_iter(frame, args[0]))
        items = iterate(frame, args[0])
        truths = [operators.truth(frame, i) for i in items]
        return ConstantValue(fn(truths))
    return h


BUILTIN_HANDLERS[any] = _any_all(any)
BUILTIN_HANDLERS[all] = _any_all(all)


@builtin(abs)
def _abs(frame, args, kwargs):
    return operators.unary(frame, operator.abs, args[0])


@builtin(print)
def _print(frame, args, kwargs):
    raise Unsupported("print() cannot be put in a graph",
                      hint="remove the print, or accept a graph break here")


@builtin(id)
def _id(frame, args, kwargs):
    v = args[0]
    if isinstance(v, ObjectValue):
        return ConstantValue(id(v.obj))
    raise Unsupported("id() of a value made while tracing is not supported")


def _make_fold(fn):
    def h(frame, args, kwargs):
        if fn is bool and len(args) == 1:
            return ConstantValue(operators.truth(frame, args[0]))
        if fn in (int, float) and len(args) == 1 and isinstance(args[0], TensorValue):
            raise Unsupported(f"{fn.__name__}(tensor) needs the tensor's data, which is unknown while tracing")
        if fn in (str, repr) and len(args) == 1 and isinstance(args[0], ExceptionValue):
            return to_str(frame, args[0], fn)
        if fn is sorted and args and not isinstance(args[0], ConstantValue):
            return fold(frame, fn, [ListValue(iterate(frame, args[0]))], kwargs)
        return fold(frame, fn, args, kwargs)
    return h


for _fn in (int, float, bool, str, repr, round, divmod, pow, hash, ord, chr, format, sorted):
    BUILTIN_HANDLERS[_fn] = _make_fold(_fn)


BUILTIN_HANDLERS[map] = generators.lazy_map
BUILTIN_HANDLERS[filter] = generators.lazy_filter
BUILTIN_HANDLERS.update(generators.LAZY_BUILTINS)
BUILTIN_HANDLERS[contextlib.contextmanager] = with_blocks.contextmanager_in_frame


@builtin(super)
def _super(frame, args, kwargs):
    if args:
        cls, obj = args
        if not isinstance(cls, ObjectValue) or not isinstance(cls.obj, type):
            raise Unsupported("super() with a non-class first argument")
        return SuperValue(cls.obj, obj)
    cell = frame.cells.get("__class__")
    if cell is None or not frame.code.co_varnames or frame.code.co_argcount == 0:
        raise Unsupported("super() outside a method")
    cls = cell.contents if isinstance(cell, CellValue) else wrap(frame.tx, cell.cell.cell_contents, None)
    first = frame.code.co_varnames[0]
    if first in frame.cells:
        self_value = frame.cells[first].contents
    else:
        self_value = frame.local(first)
    return SuperValue(cls.obj if isinstance(cls, ObjectValue) else operators.as_constant(cls), self_value)


@builtin(object.__setattr__)
def _object_setattr(frame, args, kwargs):
    obj, name, value = args
    attrs.set_attr(frame, obj, operators.as_constant(name), value)
    return ConstantValue(None)


@builtin(operator.getitem)
def _op_getitem(frame, args, kwargs):
    return operators.getitem(frame, args[0], args[1])


def _is_compiling(frame, args, kwargs):
    return ConstantValue(True)


for _fn in (torch.compiler.is_compiling, getattr(torch._utils, "is_compiling", None),
            getattr(torch.compiler, "is_dynamo_compiling", None)):
    if _fn is not None:
        BUILTIN_HANDLERS[_fn] = _is_compiling


@builtin(torch.is_tensor)
def _is_tensor(frame, args, kwargs):
    return ConstantValue(isinstance(args[0], TensorValue))


@builtin(torch.is_grad_enabled)
def _is_grad_enabled(frame, args, kwargs):
    return ConstantValue(torch.is_grad_enabled())


@builtin(torch.get_default_dtype)
def _get_default_dtype(frame, args, kwargs):
    return ConstantValue(torch.get_default_dtype())
