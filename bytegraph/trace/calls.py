"""Calls while tracing: inline Python, put torch in the graph, fold the rest.

``call(frame, fn, args, kwargs)`` decides, from what ``fn`` is, whether the
call is inlined (user functions, methods, ``nn.Module.forward``), becomes a
graph node (torch functions, tensor methods), is folded to a constant (pure
builtins on constants), or is unsupported.
"""
import abc
import collections
import contextlib
import copy
import enum
import functools
import inspect
import itertools
import operator
import types
from collections import OrderedDict

import torch

from ..errors import Unsupported
from ..guards.sources import AttrSource, DefaultSource, ItemSource, ModuleEntrySource
from ..values.base import (MUTABLE_CONSTANT_TYPES, BoundMethodValue, CellValue, ConstantValue,
                           DefaultDictValue, DictValue, DictViewValue, ExceptionValue, ExitValue,
                           FunctionValue, IteratorValue, ListValue, MethodOfValue, ObjectValue,
                           PartialValue, PrivateObjectValue, RealCell, SuperValue, SymValue,
                           TensorMethodValue, TensorValue, TracedId, TracerCallableValue, TupleValue,
                           UserObjectValue)
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
    if isinstance(fn, PartialValue):
        return call(frame, fn.func, fn.args + list(args), {**fn.kwargs, **kwargs})
    if isinstance(fn, ExitValue):
        exit_context(frame, fn.manager)
        return ConstantValue(None)
    if isinstance(fn, TracerCallableValue):
        return fn.impl(frame, list(args), kwargs)
    if isinstance(fn, ObjectValue):
        return _call_object(frame, fn, list(args), kwargs)
    if isinstance(fn, ConstantValue) and callable(fn.value):
        return _call_object(frame, ObjectValue(fn.value), list(args), kwargs)
    if isinstance(fn, UserObjectValue):
        from . import protocols
        if protocols.has_special_method(fn, "__call__"):
            return protocols.call_special_method(frame, fn, "__call__", list(args), kwargs)
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
    stdlib = _call_stdlib_object(frame, fv, args, kwargs)
    if stdlib is not None:
        return stdlib
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
    if isinstance(obj, enum.EnumMeta):
        # Looking a member up by value: members are fixed once the class is guarded.
        return fold(frame, obj, args, kwargs, what=f"{obj.__qualname__}()")
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
    """``module(*args)``: inline its forward, and its forward hooks if it has any (trace/hooks.py)."""
    m = mv.obj
    if has_hooks(m):
        from .hooks import call_with_hooks
        return call_with_hooks(frame, mv, args, kwargs, lambda a, k: _call_forward(frame, mv, a, k))
    if mv.source is not None:
        from ..guards.builder import NO_HOOKS
        frame.tx.guards.add(NO_HOOKS, mv.source, None)
    return _call_forward(frame, mv, args, kwargs)


def _call_forward(frame, mv, args, kwargs):
    m = mv.obj
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
    dict_base = _dict_base(cls)
    native_bases = [b for b in cls.__mro__[1:-1] if b.__module__ == "builtins" or b is OrderedDict]
    if type(cls) not in (type, abc.ABCMeta) or cls.__new__ not in (object.__new__, dict.__new__) \
            or any(b not in (dict, OrderedDict) for b in native_bases) \
            or issubclass(cls, torch.nn.Module) \
            or not _python_or(cls.__setattr__, object.__setattr__) \
            or cls.__getattribute__ not in (object.__getattribute__, dict.__getattribute__) \
            or not (cls.__delattr__ in (object.__delattr__, dict.__delattr__)
                    or isinstance(cls.__delattr__, types.FunctionType)):
        raise Unsupported(f"creating {cls.__qualname__} objects inside the compiled function is not supported yet")
    obj = UserObjectValue(cls, dict_items=DictValue({}) if dict_base is not None else None)
    init = cls.__init__
    if dict_base is not None and init in (dict.__init__, OrderedDict.__init__):
        call(frame, attrs.dict_method(frame, obj, "__init__"), list(args), kwargs)
        return obj
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


def _call_memoized(frame, fv, args, kwargs):
    """A ``functools.lru_cache``d function on constant (or guarded-object) arguments, called now.

    The cache promises one result per arguments, so the call is made while tracing (where
    eager would make it on its first call) and its result taken as a constant.
    """
    def real(v):
        return v.obj if isinstance(v, ObjectValue) else operators.as_constant(v)
    result = fv.obj(*[real(a) for a in args], **{k: real(v) for k, v in kwargs.items()})
    from ..values.builder import CONSTANT_TYPES
    if isinstance(result, CONSTANT_TYPES) or (type(result) is tuple and all(
            isinstance(x, CONSTANT_TYPES) for x in result)):
        return ConstantValue(result)
    raise Unsupported(f"{fv.obj.__qualname__}() (an lru_cache'd function) returned a "
                      f"{type(result).__name__}; only constant results are supported yet")


def _is_memo_argument(v):
    """Can ``v`` be handed, as the real object, to an lru_cache'd function called while tracing?"""
    if isinstance(v, ObjectValue):
        return not isinstance(v, PrivateObjectValue)
    return operators.is_constant(v) and not operators.is_frame_mutable_constant(v)


def _dict_base(cls):
    """``dict`` or ``OrderedDict`` when ``cls`` subclasses one of them, else None."""
    for b in cls.__mro__:
        if b in (dict, OrderedDict):
            return b
    return None


def _python_or(attr, native):
    """True if a class's slot is ``native`` itself or written in Python (and so traced)."""
    return attr is native or isinstance(attr, types.FunctionType)


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
    iterators = []   # (value, real iterator handed to fn, items it had)
    try:
        cargs = [_fold_arg(a, iterators) for a in args]
        ckwargs = {k: _fold_arg(v, iterators) for k, v in kwargs.items()}
    except Unsupported:
        # Some operator.* functions are graph operations on tensors.
        if getattr(fn, "__module__", None) in ("_operator", "operator") and _has_tensor(args):
            return operators.graph_op(frame, fn, args, kwargs)
        raise Unsupported(f"{name}() on non-constant arguments ({', '.join(attrs.describe(a) for a in args)})")
    try:
        result = fn(*cargs, **ckwargs)
    except Exception as e:
        raise PythonError(f"{name}() raised {type(e).__name__}: {e}", e) from e
    for value, real, n in iterators:
        # The iterator value advances by as many items as fn took.
        value.pos += n - operator.length_hint(real)
    return operators.constant_value(result)


def _fold_arg(v, iterators):
    """The real argument for a folded call; an iterator becomes a real iterator over its constants."""
    if isinstance(v, IteratorValue):
        rest = [operators.as_constant(i) for i in v.items[v.pos:]]
        real = iter(rest)
        iterators.append((v, real, len(rest)))
        return real
    return operators.as_constant(v)


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
        if _builtin_lacks_attr(obj, name):
            return args[2]
        try:
            return attrs.get_attr(frame, obj, name)
        except attrs.MissingAttribute:
            return args[2]
        except TracedRaise as e:
            if not issubclass(e.value.cls, AttributeError):
                raise
            return args[2]
    return attrs.get_attr(frame, obj, name)


def _builtin_lacks_attr(v, name):
    """True if ``v`` is a list/dict/tuple/set value (no instance attributes) whose type lacks ``name``."""
    if isinstance(v, (ListValue, DictValue, TupleValue, DictViewValue)):
        return not hasattr(operators.python_type(v), name)
    return False


@builtin(hasattr)
def _hasattr(frame, args, kwargs):
    obj, name = args[0], operators.as_constant(args[1])
    if _builtin_lacks_attr(obj, name):
        return ConstantValue(False)
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


def iterated_containers(values):
    """The lists/dicts an iterator over ``values`` reads lazily in eager (see FOR_ITER)."""
    from ..values.base import DictViewValue
    out = []
    for v in values:
        if isinstance(v, DictViewValue):
            v = v.dict_value
        if isinstance(v, (ListValue, DictValue)):
            out.append(v)
    return out


@builtin(enumerate)
def _enumerate(frame, args, kwargs):
    if not isinstance(args[0], (TupleValue, ListValue, IteratorValue, DictValue, ConstantValue)):
        return generators.lazy_enumerate(frame, args, kwargs)
    start = operators.as_constant(kwargs.get("start", args[1] if len(args) > 1 else ConstantValue(0)))
    items = iterate(frame, args[0])
    return IteratorValue([TupleValue([ConstantValue(i + start), v]) for i, v in enumerate(items)],
                         origins=iterated_containers(args[:1]),
                         remake=(enumerate, [args[0], ConstantValue(start)]))


@builtin(zip)
def _zip(frame, args, kwargs):
    if not all(isinstance(a, (TupleValue, ListValue, IteratorValue, DictValue, ConstantValue)) for a in args):
        return generators.lazy_zip(frame, args, kwargs)
    strict = operators.as_constant(kwargs.get("strict", ConstantValue(False)))
    seqs = [a.items[a.pos:] if isinstance(a, IteratorValue) else iterate(frame, a) for a in args]
    if strict and len({len(s) for s in seqs}) > 1:
        raise Unsupported("zip(strict=True) on sequences of different lengths raises")
    n = min((len(s) for s in seqs), default=0)
    first_short = next((i for i, s in enumerate(seqs) if len(s) == n), len(seqs))
    for i, a in enumerate(args):
        if isinstance(a, IteratorValue):
            # Like zip: each round takes from every argument in order, the last round stops at
            # the first exhausted one, so the iterators before it gave one item more.
            a.pos += n + (1 if i < first_short else 0)
    if kwargs:
        return IteratorValue([TupleValue(list(t)) for t in zip(*seqs)])
    return IteratorValue([TupleValue(list(t)) for t in zip(*seqs)], origins=iterated_containers(args),
                         remake=(zip, list(args)))


@builtin(reversed)
def _reversed(frame, args, kwargs):
    return IteratorValue(list(reversed(iterate(frame, args[0]))), origins=iterated_containers(args[:1]),
                         remake=(reversed, args[:1]))


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
    from .containers import check_unchanged
    check_unchanged(it)
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
        kwargs = dict(kwargs)
        key = kwargs.pop("key", None)
        has_default = "default" in kwargs
        default = kwargs.pop("default", None)
        if kwargs:
            raise Unsupported(f"{fn.__name__}() got unexpected keyword arguments {sorted(kwargs)}")
        items = iterate(frame, args[0]) if len(args) == 1 else list(args)
        if key is None or operators.is_none(key):
            if any(isinstance(i, TensorValue) for i in items):
                if len(items) == 2:
                    target = torch.minimum if fn is min else torch.maximum
                    a, b = items
                    if isinstance(a, TensorValue) and isinstance(b, TensorValue):
                        return frame.tx.graph.call("call_function", target, [a, b], {})
                raise Unsupported(f"{fn.__name__}() over tensors is not supported yet",
                                  hint=f"use torch.{'minimum' if fn is min else 'maximum'}")
        if not items:
            if has_default:
                return default
            raise Unsupported(f"{fn.__name__}() of an empty sequence raises ValueError")
        keys = _sort_keys(frame, items, key, fn.__name__)
        try:
            return items[fn(range(len(items)), key=keys.__getitem__)]
        except TypeError as e:
            raise Unsupported(f"{fn.__name__}() raised TypeError: {e}") from e
    return h


def _sort_keys(frame, items, key, what):
    """The constant sort keys of ``items``: the items themselves, or ``key(item)`` traced."""
    if key is None or operators.is_none(key):
        values = items
    else:
        values = [call(frame, key, [i], {}) for i in items]
    return [_sort_key(v) for v in values]


class _Unordered:
    """A tuple item that is not a Python value (a tensor): fine until the sort has to compare it."""

    __slots__ = ()

    def _refuse(self, other):
        raise Unsupported("sorting compared values that are not known while tracing (tensors)",
                          hint="sort by a key that is a Python value (a size, an index, a name)")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _refuse
    __hash__ = None


def _sort_key(v):
    if isinstance(v, TupleValue) and v.cls is tuple:
        # (name, tensor) pairs sort by name; tuples compare items only until they differ.
        return tuple(_sort_key(i) for i in v.items)
    if isinstance(v, SymValue) or operators.is_constant(v):
        return operators.as_constant(v)   # a symbolic size is specialised, as everywhere else
    return _Unordered()


def sort_values(frame, items, key=None, reverse=False):
    """``sorted(items, key=key, reverse=reverse)`` on values; stable like Python's."""
    keys = _sort_keys(frame, items, key, "sorted")
    try:
        if not isinstance(reverse, bool):
            reverse = bool(operators.as_constant(reverse))
        order = sorted(range(len(items)), key=keys.__getitem__, reverse=reverse)
    except TypeError as e:
        raise Unsupported(f"sorted() raised TypeError: {e}") from e
    return [items[i] for i in order]


BUILTIN_HANDLERS[min] = _min_max(min)
BUILTIN_HANDLERS[max] = _min_max(max)


@builtin(sorted)
def _sorted(frame, args, kwargs):
    unexpected = set(kwargs) - {"key", "reverse"}
    if len(args) != 1 or unexpected:
        raise Unsupported("sorted() takes one iterable and the keywords key= and reverse=")
    return ListValue(sort_values(frame, iterate(frame, args[0]), kwargs.get("key"),
                                 kwargs.get("reverse", False)))


@builtin(sum)
def _sum(frame, args, kwargs):
    items = iterate(frame, args[0])
    total = args[1] if len(args) > 1 else kwargs.get("start", ConstantValue(0))
    for item in items:
        total = operators.binary(frame, "+", total, item)
    return total


def _any_all(fn):
    decisive = fn is any     # any() stops at the first true item, all() at the first false one

    def h(frame, args, kwargs):
        if generators.is_lazy(args[0]) or isinstance(args[0], (UserObjectValue, ObjectValue)):
            return generators.any_all(frame, fn, generators.get_iter(frame, args[0]))
        v = args[0]
        it = v if isinstance(v, IteratorValue) else IteratorValue(iterate(frame, v))
        while it.pos < len(it.items):
            it.pos += 1
            if operators.truth(frame, it.items[it.pos - 1]) == decisive:
                return ConstantValue(decisive)
        return ConstantValue(not decisive)
    return h


BUILTIN_HANDLERS[any] = _any_all(any)
BUILTIN_HANDLERS[all] = _any_all(all)


@builtin(abs)
def _abs(frame, args, kwargs):
    return operators.unary(frame, operator.abs, args[0])


@builtin(copy.deepcopy)
def _deepcopy(frame, args, kwargs):
    """A deep copy: of constants, a constant; of a guarded plain-data object, a private copy."""
    if len(args) != 1 or kwargs:
        raise Unsupported("copy.deepcopy() with a memo is not supported yet")
    v = args[0]
    if isinstance(v, PrivateObjectValue):
        return PrivateObjectValue(copy.deepcopy(v.obj))
    if isinstance(v, ObjectValue) and v.source is not None and not isinstance(
            v.obj, (type, types.FunctionType, types.ModuleType, torch.nn.Module, torch.Tensor)):
        state = getattr(v.obj, "__dict__", None)
        snapshot = copy.deepcopy(state) if type(state) is dict else None
        try:
            plain = snapshot is not None and _has_no_tensors(snapshot) and state == snapshot
        except Exception:
            plain = False
        if not plain:
            raise Unsupported(f"copy.deepcopy() of {attrs.describe(v)}: its state is not plain data",
                              hint="copy it outside the compiled function")
        from ..guards import builder as g
        frame.tx.guards.add(g.STATE_MATCH, v.source, snapshot)
        return PrivateObjectValue(copy.deepcopy(v.obj))
    if operators.is_constant(v):
        return operators.constant_value(copy.deepcopy(operators.as_constant(v)))
    raise Unsupported(f"copy.deepcopy() of {attrs.describe(v)} is not supported yet")


def _has_no_tensors(x, depth=0):
    if isinstance(x, torch.Tensor) or depth > 20:
        return False
    if isinstance(x, dict):
        return all(_has_no_tensors(v, depth + 1) for v in x.values())
    if isinstance(x, (list, tuple, set, frozenset)):
        return all(_has_no_tensors(v, depth + 1) for v in x)
    state = getattr(x, "__dict__", None)
    if isinstance(state, dict) and not isinstance(x, type):
        return _has_no_tensors(state, depth + 1)
    return True


@builtin(object.__getattribute__)
def _object_getattribute(frame, args, kwargs):
    obj, name = args[0], operators.as_constant(args[1])
    if isinstance(obj, PrivateObjectValue):
        try:
            value = object.__getattribute__(obj.obj, name)
        except AttributeError:
            raise attrs.MissingAttribute(f"{type(obj.obj).__name__!r} object has no attribute {name!r}") from None
        return attrs.private_value(frame, value, obj)
    raise Unsupported(f"object.__getattribute__ on {attrs.describe(obj)} is not supported yet")


@builtin(inspect.signature)
def _signature(frame, args, kwargs):
    """The signature of a function whose code and defaults are fixed by its guards."""
    if len(args) != 1 or kwargs:
        raise Unsupported("inspect.signature() with options is not supported yet")
    v = args[0]
    drop_first = isinstance(v, BoundMethodValue)
    fn = v.func if drop_first else v
    if not isinstance(fn, ObjectValue) or not isinstance(fn.obj, (types.FunctionType, types.MethodType)):
        raise Unsupported(f"inspect.signature() of {attrs.describe(v)} is not supported yet")
    target = fn.obj.__func__ if isinstance(fn.obj, types.MethodType) else fn.obj
    if "<locals>" in target.__qualname__ and (target.__defaults__ or target.__kwdefaults__):
        # Such a function is guarded by its code only; its defaults may differ between calls.
        raise Unsupported("inspect.signature() of a nested function with defaults is not supported yet")
    sig = inspect.signature(fn.obj)
    if drop_first:
        sig = sig.replace(parameters=list(sig.parameters.values())[1:])
    return ConstantValue(sig)


@builtin(print)
def _print(frame, args, kwargs):
    raise Unsupported("print() cannot be put in a graph",
                      hint="remove the print, or accept a graph break here")


@builtin(id)
def _id(frame, args, kwargs):
    v = args[0]
    if isinstance(v, ObjectValue):
        _guard_ids_distinct(frame, v)
        return ConstantValue(TracedId(("object", id(v.obj))))
    if isinstance(v, ConstantValue):
        c = v.value
        if c is None or c is Ellipsis or isinstance(c, (bool, type)) or operators.is_frame_mutable_constant(v):
            return ConstantValue(TracedId(("object", id(c))))   # singletons, or one real object per trace
        # Equal constants may or may not be one object in Python (small ints, interned strings).
        raise Unsupported(f"id() of {attrs.describe(v)} depends on how Python shares constants")
    if isinstance(v, (TensorValue, SymValue)):
        raise Unsupported("id() of a tensor made or read while tracing is not supported yet",
                          hint="compare tensors with `is`, or key by a Python value")
    _guard_ids_distinct(frame, v)
    return ConstantValue(TracedId(("value", id(v))))


def _guard_ids_distinct(frame, v):
    """Ids of objects from outside may be compared later: guard that they stay distinct."""
    if v.source is None:
        return
    taken = frame.tx.__dict__.setdefault("_id_sources", [])
    for other in taken:
        operators.guard_distinct(frame, v, other)
    if all(other is not v for other in taken):
        taken.append(v)


def _make_fold(fn):
    def h(frame, args, kwargs):
        if fn is bool and len(args) == 1:
            return ConstantValue(operators.truth(frame, args[0]))
        if fn is pow and len(args) == 2 and not kwargs and _has_tensor(args):
            return operators.binary(frame, "**", args[0], args[1])
        if fn in (int, float) and len(args) == 1 and isinstance(args[0], TensorValue):
            raise Unsupported(f"{fn.__name__}(tensor) needs the tensor's data, which is unknown while tracing")
        if fn in (str, repr) and len(args) == 1 and isinstance(args[0], ExceptionValue):
            return to_str(frame, args[0], fn)
        return fold(frame, fn, args, kwargs)
    return h


for _fn in (int, float, bool, complex, str, bytes, repr, round, divmod, pow, hash, ord, chr, format, ascii,
            bin, hex, oct):
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


@builtin(object.__setattr__, setattr)
def _object_setattr(frame, args, kwargs):
    obj, name, value = args
    attrs.set_attr(frame, obj, operators.as_constant(name), value, plain=True)
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


# --- functools, itertools, operator, collections -------------------------------------
# Iterators are finite lists of values, made at once (like generators, see frame.py).

def _call_stdlib_object(frame, fv, args, kwargs):
    """Calls of stdlib callable objects: partials, lru_cache wrappers, operator getters,
    and methods of sets/deques/Counters made in the frame (kept as real constants)."""
    obj = fv.obj
    src = fv.source
    if isinstance(obj, functools.partial):
        func = wrap(frame.tx, obj.func, AttrSource(src, "func") if src else None)
        pargs = [wrap(frame.tx, a, ItemSource(AttrSource(src, "args"), i) if src else None)
                 for i, a in enumerate(obj.args)]
        pkw = {k: wrap(frame.tx, a, ItemSource(AttrSource(src, "keywords"), k) if src else None)
               for k, a in obj.keywords.items()}
        return call(frame, func, pargs + list(args), {**pkw, **kwargs})
    if isinstance(obj, functools._lru_cache_wrapper):
        if all(_is_memo_argument(a) for a in list(args) + list(kwargs.values())):
            return _call_memoized(frame, fv, args, kwargs)
        # On other arguments the cache only saves work: the wrapped function gives the same values.
        return call(frame, wrap(frame.tx, obj.__wrapped__, AttrSource(src, "__wrapped__") if src else None),
                    args, kwargs)
    if type(obj) in (operator.itemgetter, operator.attrgetter, operator.methodcaller):
        if src is not None:
            from ..guards.builder import ID_MATCH
            frame.tx.guards.add(ID_MATCH, src, obj)   # what it gets is fixed when it is made
        return _call_getter(frame, obj, args, kwargs)
    if isinstance(obj, (types.MethodDescriptorType, types.WrapperDescriptorType)) and args:
        # ``list.append(xs, v)``, ``set.union(*sets)``, ``str.upper(s)``: a method called through its class.
        owner_type, self_value = obj.__objclass__, args[0]
        if isinstance(self_value, (ListValue, DictValue, TupleValue)) \
                and issubclass(operators.python_type(self_value), owner_type):
            from .containers import call_method
            return call_method(frame, self_value, obj.__name__, list(args[1:]), kwargs)
        if owner_type in _FOLDABLE_METHOD_OWNERS and isinstance(self_value, ConstantValue):
            return fold(frame, obj, args, kwargs)
        return None
    if not isinstance(obj, (types.BuiltinMethodType, types.MethodType)):
        return None
    owner = obj.__self__
    if isinstance(owner, MUTABLE_CONSTANT_TYPES) and src is None and frame.tx.memo.get(id(owner)) is None:
        # A method of a set/deque/Counter made in the frame: run it on the real object.
        return fold(frame, obj, args, kwargs)
    return None


# Classes whose methods are pure on constants, or mutate only a set/deque/Counter made in the frame.
_FOLDABLE_METHOD_OWNERS = (str, bytes, int, float, complex, bool, tuple, frozenset, range) + MUTABLE_CONSTANT_TYPES


def _call_getter(frame, getter, args, kwargs):
    if len(args) != 1 or kwargs:
        raise Unsupported(f"{type(getter).__name__} takes exactly one argument")
    (target,) = args
    reduced = getter.__reduce__()
    if isinstance(getter, operator.methodcaller):
        ctor, margs = reduced
        if isinstance(ctor, functools.partial):     # methodcaller(name, *args, **kwargs)
            name, margs, mkw = ctor.args[0], margs, ctor.keywords
        else:
            name, margs, mkw = margs[0], margs[1:], {}
        method = attrs.get_attr(frame, target, name)
        return call(frame, method, [operators.constant_value(a) for a in margs],
                    {k: operators.constant_value(a) for k, a in mkw.items()})
    keys = reduced[1]
    if isinstance(getter, operator.itemgetter):
        picked = [operators.getitem(frame, target, ConstantValue(k)) for k in keys]
    else:
        picked = []
        for dotted in keys:
            v = target
            for part in dotted.split("."):
                v = attrs.get_attr(frame, v, part)
            picked.append(v)
    return picked[0] if len(picked) == 1 else TupleValue(picked)


def _const(v, what):
    try:
        return operators.as_constant(v)
    except Unsupported:
        raise Unsupported(f"{what} of {attrs.describe(v)}: only Python values (not tensors) are supported yet") from None


def _consts(frame, iterable, what):
    return [_const(i, what) for i in iterate(frame, iterable)]


@builtin(set)
def _set(frame, args, kwargs):
    return ConstantValue(set(_consts(frame, args[0], "set()")) if args else set())


@builtin(frozenset)
def _frozenset(frame, args, kwargs):
    return ConstantValue(frozenset(_consts(frame, args[0], "frozenset()")) if args else frozenset())


@builtin(collections.Counter)
def _counter(frame, args, kwargs):
    if len(args) > 1:
        raise Unsupported("Counter() takes at most one positional argument")
    counts = collections.Counter()
    if args:
        source = args[0]
        if isinstance(source, DictValue):
            counts.update({k: _const(v, "Counter()") for k, v in source.items.items()})
        else:
            counts.update(_consts(frame, source, "Counter()"))
    counts.update({k: _const(v, "Counter()") for k, v in kwargs.items()})
    return ConstantValue(counts)


@builtin(collections.deque)
def _deque(frame, args, kwargs):
    maxlen = kwargs.get("maxlen", args[1] if len(args) > 1 else ConstantValue(None))
    items = _consts(frame, args[0], "deque()") if args else []
    return ConstantValue(collections.deque(items, _const(maxlen, "deque()")))


@builtin(collections.OrderedDict)
def _ordered_dict(frame, args, kwargs):
    from .containers import call_method
    out = DictValue({}, cls=collections.OrderedDict)
    call_method(frame, out, "update", list(args), kwargs)
    return out


@builtin(collections.defaultdict)
def _defaultdict(frame, args, kwargs):
    from .containers import call_method
    factory = args[0] if args else ConstantValue(None)
    out = DefaultDictValue({}, factory)
    call_method(frame, out, "update", list(args[1:]), kwargs)
    return out


@builtin(dict.fromkeys)
def _dict_fromkeys(frame, args, kwargs):
    value = args[1] if len(args) > 1 else ConstantValue(None)
    return DictValue({operators.key_of(k): value for k in iterate(frame, args[0])})


@builtin(functools.reduce)
def _reduce(frame, args, kwargs):
    fn, items = args[0], iterate(frame, args[1])
    if len(args) > 2:
        acc = args[2]
    elif items:
        acc, items = items[0], items[1:]
    else:
        raise Unsupported("reduce() of an empty iterable with no initial value raises TypeError")
    for item in items:
        acc = call(frame, fn, [acc, item], {})
    return acc


@builtin(functools.partial)
def _partial(frame, args, kwargs):
    fn = args[0]
    if isinstance(fn, PartialValue):
        return PartialValue(fn.func, fn.args + list(args[1:]), {**fn.kwargs, **kwargs})
    return PartialValue(fn, args[1:], kwargs)


def _make_getter(cls):
    def h(frame, args, kwargs):
        cargs = [_const(a, cls.__name__) for a in args]
        ckwargs = {k: _const(v, cls.__name__) for k, v in kwargs.items()}
        return ObjectValue(cls(*cargs, **ckwargs))
    return h


for _cls in (operator.itemgetter, operator.attrgetter, operator.methodcaller):
    BUILTIN_HANDLERS[_cls] = _make_getter(_cls)


def _iterator_builtin(fn, what, const_kwargs=()):
    """An itertools function run on lists of values; tuples it yields become tuple values."""
    def h(frame, args, kwargs):
        lists = [iterate(frame, a) for a in args]
        ckw = {}
        for k, v in kwargs.items():
            ckw[k] = _const(v, what) if k in const_kwargs else v
        out = [TupleValue(list(x)) if isinstance(x, tuple) else x for x in fn(*lists, **ckw)]
        return IteratorValue(out)
    return h


BUILTIN_HANDLERS[itertools.chain] = _iterator_builtin(itertools.chain, "chain()")
BUILTIN_HANDLERS[itertools.chain.from_iterable] = lambda frame, args, kwargs: IteratorValue(
    [x for part in iterate(frame, args[0]) for x in iterate(frame, part)])
BUILTIN_HANDLERS[itertools.product] = _iterator_builtin(itertools.product, "product()", ("repeat",))
BUILTIN_HANDLERS[itertools.zip_longest] = _iterator_builtin(itertools.zip_longest, "zip_longest()")
BUILTIN_HANDLERS[itertools.pairwise] = _iterator_builtin(itertools.pairwise, "pairwise()")


def _with_constant_tail(fn, what):
    """fn(iterable, *constants): the first argument iterated, the rest Python values."""
    def h(frame, args, kwargs):
        items = iterate(frame, args[0])
        tail = [_const(a, what) for a in args[1:]]
        ckw = {k: _const(v, what) for k, v in kwargs.items()}
        out = [TupleValue(list(x)) if isinstance(x, tuple) else x for x in fn(items, *tail, **ckw)]
        return IteratorValue(out)
    return h


# islice (and count, map, filter, zip, enumerate) are lazy: trace/generators.py.
for _fn in (itertools.combinations, itertools.permutations, itertools.combinations_with_replacement):
    BUILTIN_HANDLERS[_fn] = _with_constant_tail(_fn, f"{_fn.__name__}()")


@builtin(itertools.repeat)
def _repeat(frame, args, kwargs):
    times = kwargs.get("times", args[1] if len(args) > 1 else None)
    if times is None:
        raise Unsupported("itertools.repeat() without a count is infinite",
                          hint="pass times=, or use [x] * n")
    return IteratorValue([args[0]] * _const(times, "repeat()"))


@builtin(itertools.cycle)
def _infinite(frame, args, kwargs):
    raise Unsupported("itertools.cycle() is not supported yet",
                      hint="use range() or zip() with a finite sequence")


@builtin(itertools.accumulate)
def _accumulate(frame, args, kwargs):
    items = iterate(frame, args[0])
    fn = kwargs.get("func", args[1] if len(args) > 1 else None)
    initial = kwargs.get("initial")
    out = []
    acc = None
    if initial is not None and not operators.is_none(initial):
        acc = initial
        out.append(acc)
    for item in items:
        if acc is None:
            acc = item
        elif fn is None or operators.is_none(fn):
            acc = operators.binary(frame, "+", acc, item)
        else:
            acc = call(frame, fn, [acc, item], {})
        out.append(acc)
    return IteratorValue(out)


@builtin(itertools.starmap)
def _starmap(frame, args, kwargs):
    return IteratorValue([call(frame, args[0], iterate(frame, t), {}) for t in iterate(frame, args[1])])


def _take_drop_while(take):
    def h(frame, args, kwargs):
        pred, items = args[0], iterate(frame, args[1])
        n = 0
        while n < len(items) and operators.truth(frame, call(frame, pred, [items[n]], {})):
            n += 1
        return IteratorValue(items[:n] if take else items[n:])
    return h


BUILTIN_HANDLERS[itertools.takewhile] = _take_drop_while(True)
BUILTIN_HANDLERS[itertools.dropwhile] = _take_drop_while(False)


@builtin(itertools.compress)
def _compress(frame, args, kwargs):
    items, flags = iterate(frame, args[0]), iterate(frame, args[1])
    return IteratorValue([i for i, f in zip(items, flags) if operators.truth(frame, f)])


@builtin(copy.copy)
def _copy(frame, args, kwargs):
    (v,) = args
    if isinstance(v, ListValue):
        return ListValue(v.items)
    if isinstance(v, DefaultDictValue):
        return DefaultDictValue(v.items, v.factory)
    if isinstance(v, DictValue):
        return DictValue(v.items, cls=v.cls)
    if isinstance(v, TupleValue) or (isinstance(v, ConstantValue) and not operators.is_frame_mutable_constant(v)):
        return v
    if operators.is_frame_mutable_constant(v):
        return ConstantValue(copy.copy(v.value))
    raise Unsupported(f"copy.copy() of {attrs.describe(v)} is not supported yet")


# --- nn.Module enumeration: parameters(), named_modules(), children()... ------------------
# The real module tree is walked while tracing; every dict the walk reads is guarded by its
# keys (and None entries by identity), every member is read through its own source.

def _module_walk(frame, mv, remove_duplicate=True):
    """[(prefix, module, source)] like ``named_modules()``, guarding each ``_modules`` dict."""
    if mv.source is None:
        raise Unsupported(f"enumerating the members of {attrs.describe(mv)} that has no source")
    out, seen = [], set()

    def visit(prefix, m, src):
        if remove_duplicate and id(m) in seen:
            return
        seen.add(id(m))
        out.append((prefix, m, src))
        _guard_table(frame, m, src, "_modules")
        for name, sub in m._modules.items():
            if sub is not None:
                visit(prefix + ("." if prefix else "") + name, sub, ModuleEntrySource(src, "_modules", name))

    visit("", mv.obj, mv.source)
    return out


def _guard_table(frame, m, src, table):
    from ..guards import builder as g
    entries = m.__dict__[table]
    frame.tx.guards.add(g.DICT_KEYS, AttrSource(src, table), list(entries))
    for k, v in entries.items():
        if v is None:
            frame.tx.guards.add(g.ID_MATCH, ModuleEntrySource(src, table, k), None)


def _module_members(table, named):
    def h(frame, args, kwargs):
        mv = args[0]
        recurse = operators.as_constant(kwargs.get("recurse", args[1] if len(args) > 1 else ConstantValue(True)))
        if len(args) > 2 or set(kwargs) - {"recurse"}:
            raise Unsupported(f"Module.{'named_' if named else ''}{table[1:]}() with prefix/remove_duplicate")
        modules = _module_walk(frame, mv) if recurse else [("", mv.obj, mv.source)]
        out, seen = [], set()
        for prefix, m, src in modules:
            _guard_table(frame, m, src, table)
            for k, v in m.__dict__[table].items():
                if v is None or id(v) in seen:
                    continue
                seen.add(id(v))
                value = wrap(frame.tx, v, ModuleEntrySource(src, table, k))
                name = prefix + ("." if prefix else "") + k
                out.append(TupleValue([ConstantValue(name), value]) if named else value)
        return IteratorValue(out)
    return h


def _module_tree(children, named):
    def h(frame, args, kwargs):
        mv = args[0]
        if len(args) > 1 or kwargs:
            raise Unsupported("Module.named_modules() with memo/prefix/remove_duplicate")
        if children:
            if mv.source is None:
                raise Unsupported(f"enumerating the members of {attrs.describe(mv)} that has no source")
            _guard_table(frame, mv.obj, mv.source, "_modules")
            found, seen = [], set()
            for k, sub in mv.obj._modules.items():
                if sub is not None and id(sub) not in seen:
                    seen.add(id(sub))
                    found.append((k, sub, ModuleEntrySource(mv.source, "_modules", k)))
        else:
            found = _module_walk(frame, mv)
        out = []
        for name, m, src in found:
            value = mv if m is mv.obj else wrap(frame.tx, m, src)
            out.append(TupleValue([ConstantValue(name), value]) if named else value)
        return IteratorValue(out)
    return h


BUILTIN_HANDLERS[torch.nn.Module.parameters] = _module_members("_parameters", named=False)
BUILTIN_HANDLERS[torch.nn.Module.named_parameters] = _module_members("_parameters", named=True)
BUILTIN_HANDLERS[torch.nn.Module.buffers] = _module_members("_buffers", named=False)
BUILTIN_HANDLERS[torch.nn.Module.named_buffers] = _module_members("_buffers", named=True)
BUILTIN_HANDLERS[torch.nn.Module.children] = _module_tree(children=True, named=False)
BUILTIN_HANDLERS[torch.nn.Module.named_children] = _module_tree(children=True, named=True)
BUILTIN_HANDLERS[torch.nn.Module.modules] = _module_tree(children=False, named=False)
BUILTIN_HANDLERS[torch.nn.Module.named_modules] = _module_tree(children=False, named=True)
