"""Calls while tracing: inline Python, put torch in the graph, fold the rest.

``call(frame, fn, args, kwargs)`` decides, from what ``fn`` is, whether the
call is inlined (user functions, methods, ``nn.Module.forward``), becomes a
graph node (torch functions, tensor methods), is folded to a constant (pure
builtins on constants), or is unsupported.
"""
from __future__ import annotations

import enum
import operator
import types
import weakref
from collections import OrderedDict

import numpy as np
import torch

from ... import config, control
from ...errors import BytegraphError, Unsupported
from ...guards.builder import DICT_KEYS, ID_MATCH
from ...guards.sources import AttrSource, DefaultSource, ItemSource, MappingGetSource, WeakRefCallSource
from ...values.base import (BoundMethodValue, ConstantValue, ContextManagerValue, DictValue, ExitValue, FunctionValue,
                           IteratorValue, ListValue, MethodOfValue, ObjectValue, PartialValue,
                           PrivateObjectValue, RealCell, TensorMethodValue, TensorValue, TracerCallableValue,
                           TupleValue, UserObjectValue)
from ...values.builder import CONSTANT_TYPES, TRUSTED_MODULE_PREFIXES, wrap
from ...values.arrays import NdarrayMethodValue
from ..core import ops
from ..numpy_api import numpy_calls
from ..python import attrs, generators, operators, protocols, tensor_attrs
from ..torch_api import distributed, dtensor, function_modes, higher_order, subclasses, torch_function, torch_wrappers
from ..core.basics import note_process_local, refuse_traced_ids
from ..python.exceptions import PythonError, make_exception, raise_new
from ..core.basics import type_name
from ..core.handlers import BUILTIN_HANDLERS
from ..nn.module_calls import call_module, make_module
from ..core.state import is_compiling
from ..torch_api.torch_calls import apply_state, call_torch_class, current_state, decorate, is_graph_function, torch_call
from typing import Callable
from ...values.base import Value
from ..core.context import RunningFrame


def call(frame: RunningFrame, fn: Value, args: list[Value], kwargs: dict[str, Value]) -> Value:
    if isinstance(fn, TensorMethodValue):
        return tensor_method(frame, fn.tensor, fn.name, args, kwargs)
    if isinstance(fn, NdarrayMethodValue):
        return numpy_calls.call_array_method(frame, fn.array, fn.name, list(args), kwargs)
    if isinstance(fn, BoundMethodValue):
        if isinstance(fn.self_value, ObjectValue):
            torch_wrappers.check_method(fn.self_value.obj, fn.func.name if isinstance(fn.func, FunctionValue)
                                        else getattr(getattr(fn.func, "obj", None), "__name__", None))
        return call(frame, fn.func, [fn.self_value] + list(args), kwargs)
    if isinstance(fn, FunctionValue):
        return ops.inline_call(frame, fn.code, fn.globals, fn.name, fn.defaults, fn.kwdefaults,
                           fn.closure, list(args), kwargs)
    if isinstance(fn, MethodOfValue):
        return ops.call_method(frame, fn.owner, fn.name, list(args), kwargs)
    if isinstance(fn, PartialValue):
        return call(frame, fn.func, fn.args + list(args), {**fn.kwargs, **kwargs})
    if isinstance(fn, ExitValue):
        exit_context(frame, fn.manager)
        return ConstantValue(None)
    if isinstance(fn, TracerCallableValue):
        return fn.impl(frame, list(args), kwargs)
    if isinstance(fn, ContextManagerValue):
        return decorate(frame, fn, list(args), kwargs)
    if isinstance(fn, ObjectValue):
        return _call_object(frame, fn, list(args), kwargs)
    if isinstance(fn, ConstantValue) and callable(fn.value):
        return _call_object(frame, ObjectValue(fn.value), list(args), kwargs)
    if isinstance(fn, UserObjectValue):
        if protocols.has_special_method(fn, "__call__"):
            return protocols.call_special_method(frame, fn, "__call__", list(args), kwargs)
    if isinstance(fn, ConstantValue) or (isinstance(fn, UserObjectValue) and not hasattr(fn.cls, "__call__")):
        # ``torch.float32(1)``, ``3()``: eager raises TypeError.
        raise_new(TypeError, f"'{type_name(fn.python_type())}' object is not callable")
    raise Unsupported(f"calling {attrs.describe(fn)} is not supported yet")


def _call_object(frame, fv, args, kwargs):
    """``obj(*args, **kwargs)`` for a real callable: the first of the registries that claims it
    (``_CLAIMS``, in order), else the handler of its kind (``_BY_KIND``), else a fold of a pure
    builtin, a traced ``__call__`` written in Python, or Unsupported."""
    for claim in _CLAIMS:
        result = claim(frame, fv, args, kwargs)
        if result is not None:
            return result
    obj = fv.obj
    by_kind = _handler_of_kind(type(obj))
    if by_kind is not None:
        result = by_kind(frame, fv, args, kwargs)
        if result is not None:
            return result
    if _is_foldable(obj):
        return fold(frame, obj, args, kwargs)
    tx = frame.tx
    call_attr = getattr(type(obj), "__call__", None)
    if isinstance(call_attr, types.FunctionType):
        src = protocols.guard_class_method(tx, type(obj), "__call__", call_attr)
        return call(frame, wrap(tx, call_attr, src), [fv] + args, kwargs)
    if isinstance(obj, (types.BuiltinFunctionType, types.BuiltinMethodType)):
        hint = ("bytegraph does not know what this builtin does; without fullgraph=True it runs eagerly at "
                "a graph break; move the call out of the compiled function to keep one graph")
    else:
        hint = ("if it only computes on tensors, wrap it with bytegraph.allow_in_graph; otherwise call it "
                "outside the compiled function (without fullgraph=True it runs eagerly at a graph break)")
    raise Unsupported(f"calling {attrs.describe(fv)} is not supported yet", hint=hint)


# --- registries that may claim any callable, in the order they are asked ----------------------

def _claim_control(frame, fv, args, kwargs):
    return _control_call(frame, fv.obj, args, kwargs)


def _claim_property_getter(frame, fv, args, kwargs):
    return function_modes.call_property_getter(frame, fv.obj, args, kwargs)


def _claim_torch_wrapper(frame, fv, args, kwargs):
    return torch_wrappers.call(frame, fv.obj, args, kwargs)


def _claim_higher_order(frame, fv, args, kwargs):
    return higher_order.call(frame, fv, args, kwargs)


def _claim_numpy(frame, fv, args, kwargs):
    if numpy_calls.is_numpy_callable(fv.obj):
        return numpy_calls.call_numpy(frame, fv, args, kwargs)
    return None


def _claim_builtin_handler(frame, fv, args, kwargs):
    handler = BUILTIN_HANDLERS.get(_key(fv.obj))
    return handler(frame, args, kwargs) if handler is not None else None


def _claim_distributed(frame, fv, args, kwargs):
    return distributed.call_native(frame, fv, args, kwargs)


def _claim_dtensor(frame, fv, args, kwargs):
    return dtensor.call(frame, fv, args, kwargs)


def _claim_stdlib(frame, fv, args, kwargs):
    return ops.call_stdlib_object(frame, fv, args, kwargs)


def _claim_module(frame, fv, args, kwargs):
    return call_module(frame, fv, args, kwargs) if isinstance(fv.obj, torch.nn.Module) else None


def _claim_numpy_on_numbers(frame, fv, args, kwargs):
    obj = fv.obj
    if not (_is_numpy_callable(obj) and all(_is_python_numbers(a) for a in list(args) + list(kwargs.values()))):
        return None
    # NumPy on Python numbers (np.lcm(4, 6), np.prod((2, 3))): a pure function of constants,
    # folded when the result is a NumPy or Python scalar (an array is mutable: not a constant).
    result = fold(frame, obj, args, kwargs, what=f"numpy.{getattr(obj, '__name__', '?')}")
    if isinstance(result, ConstantValue) and isinstance(result.value, (np.generic, int, float, bool, complex)):
        return result
    raise Unsupported(f"numpy.{getattr(obj, '__name__', '?')}() makes a NumPy array, which is not supported "
                      "in a graph yet", hint="compute it with torch, or outside the compiled function")


_CLAIMS = (_claim_control, _claim_property_getter, _claim_torch_wrapper, _claim_higher_order, _claim_numpy, _claim_builtin_handler,
           _claim_distributed, _claim_dtensor, _claim_stdlib, _claim_module, _claim_numpy_on_numbers)


# --- callables by kind (the type of the real object, or its nearest base listed) --------------

def _call_function_object(frame, fv, args, kwargs):
    obj = fv.obj
    if is_graph_function(obj):
        return torch_call(frame, obj, args, kwargs)
    if control.torch_wrap_numpy_target(obj) is not None:
        return numpy_calls.call_torch_wrap_numpy(frame, fv, args, kwargs)
    wrapped = torch_wrappers.unwrap(obj)
    if wrapped is not None:
        # torch._disable_dynamo(f): trace f (torch_wrappers.py says why).
        return call(frame, wrap(frame.tx, wrapped, AttrSource(fv.source, "__wrapped__") if fv.source else None),
                    args, kwargs)
    return call_python_function(frame, fv, args, kwargs)


def _call_method_object(frame, fv, args, kwargs):
    obj = fv.obj
    if isinstance(obj.__self__, torch.inference_mode) and obj.__name__ == "__exit__":
        raise Unsupported("leaving a torch.inference_mode() block: it is left natively at a graph break",
                          hint=INFERENCE_MODE_HINT)
    self_value = wrap(frame.tx, obj.__self__, AttrSource(fv.source, "__self__") if fv.source else None)
    func = wrap(frame.tx, obj.__func__, None)
    return call(frame, func, [self_value] + args, kwargs)


def _call_graph_function(frame, fv, args, kwargs):
    return torch_call(frame, fv.obj, args, kwargs) if is_graph_function(fv.obj) else None


def _call_builtin(frame, fv, args, kwargs):
    obj = fv.obj
    if is_graph_function(obj):
        return torch_call(frame, obj, args, kwargs)
    if type(obj.__self__) in (dict, list) and fv.source is not None:
        # A container from outside the trace that could not be read as a value (keys other
        # than str/int): lookups are guarded one by one; anything else would need its contents.
        if type(obj.__self__) is dict and obj.__name__ in _DICT_LOOKUPS:
            return _existing_dict_lookup(frame, fv, args, kwargs)
        raise Unsupported(f"{type(obj.__self__).__name__}.{obj.__name__}() on {attrs.describe(fv)} "
                          "is not supported yet")
    return None


def _call_enum_class(frame, fv, args, kwargs):
    # Looking a member up by value: members are fixed once the class is guarded.
    return fold(frame, fv.obj, args, kwargs, what=f"{fv.obj.__qualname__}()")


def _call_type(frame, fv, args, kwargs):
    obj = fv.obj
    if subclasses.is_wrapper_subclass_type(obj):
        return subclasses.make_wrapper_subclass(frame, obj, args, kwargs)
    if obj.__module__.startswith("torch"):
        made = call_torch_class(frame, obj, args, kwargs)
        if made is not None:
            return made
    return _call_class(frame, obj, args, kwargs)


def _call_weakref(frame, fv, args, kwargs):
    if type(fv.obj) is weakref.ReferenceType and fv.source is not None and not args and not kwargs:
        # A weak reference kept from outside (nn.LSTM's to its weights): what it refers to now.
        return wrap(frame.tx, fv.obj(), WeakRefCallSource(fv.source))
    return None


_BY_KIND = {
    types.FunctionType: _call_function_object,
    types.MethodType: _call_method_object,
    types.BuiltinFunctionType: _call_builtin,          # also types.BuiltinMethodType: the same type
    types.MethodDescriptorType: _call_graph_function,
    types.WrapperDescriptorType: _call_graph_function,
    torch._ops.OpOverloadPacket: _call_graph_function,
    torch._ops.OpOverload: _call_graph_function,
    enum.EnumMeta: _call_enum_class,
    type: _call_type,
    weakref.ReferenceType: _call_weakref,
}
_KIND_OF_TYPE = {}


def _handler_of_kind(cls):
    try:
        return _KIND_OF_TYPE[cls]
    except KeyError:
        handler = next((_BY_KIND[c] for c in cls.__mro__ if c in _BY_KIND), None)
        _KIND_OF_TYPE[cls] = handler
        return handler


_DICT_LOOKUPS = ("get", "__getitem__", "__contains__")


def _existing_dict_lookup(frame, fv, args, kwargs):
    """``d.get(k)`` / ``d[k]`` / ``k in d`` on a dict from outside the trace whose keys need not be
    str/int (a table keyed by types): guarded on its keys and on the item read."""
    method = fv.obj
    d = method.__self__
    owner = AttrSource(fv.source, "__self__")
    try:
        key = operators.as_constant(args[0])
        hash(key)
    except (Unsupported, TypeError, IndexError):
        raise Unsupported(f"dict.{method.__name__}() with a key not known while tracing") from None
    frame.tx.guards.add(DICT_KEYS, owner, list(d))
    if key not in d:
        if method.__name__ == "__contains__":
            return ConstantValue(False)
        if method.__name__ == "get":
            return args[1] if len(args) > 1 else kwargs.get("default", ConstantValue(None))
        raise PythonError(f"KeyError: {key!r}", KeyError(key))
    if method.__name__ == "__contains__":
        return ConstantValue(True)
    return wrap(frame.tx, d[key], MappingGetSource(owner, key))


def _control_call(frame, obj, args, kwargs):
    """Calls governed by bytegraph.disable / allow_in_graph / disallow_in_graph / graph_break."""
    if obj is is_compiling or (getattr(obj, "__name__", None) == "is_compiling"
                               and (getattr(obj, "__module__", None) or "").startswith("torch")):
        return ConstantValue(True)
    if control.is_forbidden(obj):
        # Changing the stance or marking dims mid-compile has no meaning; torch.compile refuses too.
        raise BytegraphError(f"{_callable_name(obj)} cannot be called inside a compiled function; call it "
                             "before calling the compiled function (as under torch.compile)")
    if control.assumed_constant(obj) and all(isinstance(a, ConstantValue) for a in [*args, *kwargs.values()]):
        return fold(frame, obj, args, kwargs)   # torch._dynamo.assume_constant_result: its value, unguarded
    substitute = control.torch_substitute(obj)
    if substitute is not None:     # torch.compiler.substitute_in_graph: trace the substitute instead
        return call(frame, wrap(frame.tx, substitute, None), args, kwargs)
    try:
        if obj is control.graph_break:
            raise Unsupported("bytegraph.graph_break() called", hint="remove the call to keep one graph")
        if getattr(obj, "_bytegraph_disabled", False):
            raise Unsupported(f"{_callable_name(obj)} is marked bytegraph.disable",
                              hint="it runs eagerly at a graph break; remove bytegraph.disable to trace it")
        if obj in control.disallowed_in_graph:
            raise Unsupported(f"{_callable_name(obj)} is marked bytegraph.disallow_in_graph",
                              hint="it runs eagerly at a graph break; remove it from bytegraph.disallow_in_graph "
                                   "to keep it in the graph")
        if obj in control.allowed_in_graph:
            return frame.tx.graph.call("call_function", obj, args, kwargs)
    except TypeError:   # unhashable callables are never in those sets
        return None
    return None


def _callable_name(obj):
    """``torch.sin``, ``mymodule.helper``: how the user names a callable."""
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if name is None:
        return repr(obj)
    if name.startswith("_VariableFunctionsClass."):
        name = name.split(".", 1)[1]
    module = getattr(obj, "__module__", None)
    return f"{module}.{name}" if module and module not in ("builtins", "__main__") else name


def _key(obj):
    try:
        hash(obj)
    except TypeError:
        return None
    return obj


# torch._higher_order_ops code traced as it is: associative_scan's wrapper is plain torch code,
# and the operator it reaches under a compiler is understood (trace/torch_api/higher_order.py); the helper
# it goes through calls its function directly when a compiler is tracing.
_TRACED_HOP_MODULES = {"torch._higher_order_ops.associative_scan"}
_TRACED_HOP_FUNCTIONS = {("torch._higher_order_ops.utils", "_maybe_compile_and_run_fn")}


def _traced_hop_code(fn):
    module = fn.__module__ or ""
    return module in _TRACED_HOP_MODULES or (module, fn.__qualname__) in _TRACED_HOP_FUNCTIONS


def call_python_function(frame: RunningFrame, fv: ObjectValue, args: list[Value], kwargs: dict[str, Value]) -> Value:
    fn = fv.obj
    if args and isinstance(args[0], PrivateObjectValue) and isinstance(args[0].obj, torch.nn.Module) \
            and (fn.__module__ or "").startswith("torch.") \
            and all(operators.is_constant(a) for a in list(args[1:]) + list(kwargs.values())):
        # torch's own bookkeeping on a module made in the trace (nn.Module.__init__, also as
        # wrapped by torch._dynamo once torch.compile has run): runs for real on it.
        result = fn(args[0].obj, *[operators.as_constant(a) for a in args[1:]],
                    **{k: operators.as_constant(v) for k, v in kwargs.items()})
        if result is args[0].obj:
            return args[0]
        if result is None or type(result) in CONSTANT_TYPES:
            return ConstantValue(result)
        raise Unsupported(f"{fn.__qualname__}() on a module made in the trace returned {type(result).__name__}")
    if (fn.__module__ or "").startswith("torch._higher_order_ops.") and not _traced_hop_code(fn):
        # torch's higher-order ops (scan, while_loop, map...) expect TorchDynamo to capture their
        # function arguments as subgraphs; their eager code cannot be traced.
        raise Unsupported(f"torch higher-order op {fn.__module__.rsplit('.', 1)[-1]}.{fn.__qualname__} "
                          "is not supported yet",
                          hint="it runs eagerly at a graph break (fullgraph=True refuses it); library code often "
                               "takes such a path only under a compiler (torch.compiler.is_compiling())")
    torch_wrappers.make_optimizer_state(frame, fn, args, kwargs)
    tx = frame.tx
    src = fv.source
    if src is not None and "<locals>" not in fn.__qualname__ \
            and (fn.__module__ or "").split(".")[0] not in TRUSTED_MODULE_PREFIXES:
        # The same function with other code (`f.__code__ = g.__code__`, as IPython's autoreload
        # does on an edit) must not run the traced code. Nested functions have this guard already.
        tx.guards.add(ID_MATCH, AttrSource(src, "__code__"), fn.__code__)
    defaults = [wrap(tx, d, DefaultSource(src, i) if src else None)
                for i, d in enumerate(fn.__defaults__ or ())]
    kwdefaults = {k: wrap(tx, d, DefaultSource(src, k, kw=True) if src else None)
                  for k, d in (fn.__kwdefaults__ or {}).items()}
    closure = []
    for i, cell in enumerate(fn.__closure__ or ()):
        csrc = AttrSource(ItemSource(AttrSource(src, "__closure__"), i), "cell_contents") if src else None
        closure.append(RealCell(cell, csrc))
    return ops.inline_call(frame, fn.__code__, fn.__globals__, fn.__name__, defaults, kwdefaults,
                       closure, args, kwargs)


def _call_class(frame, cls, args, kwargs):
    """``C(...)`` for a user class: a new object whose ``__init__`` is traced."""
    tx = frame.tx
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return _make_namedtuple(frame, cls, args, kwargs)
    if issubclass(cls, BaseException):
        return make_exception(frame, cls, args, kwargs)
    if issubclass(cls, torch.nn.Module):
        return make_module(frame, cls, args, kwargs)
    dict_base = _dict_base(cls)
    native_bases = [b for b in cls.__mro__[1:-1] if b.__module__ == "builtins" or b is OrderedDict]
    # A metaclass that does not define __call__ (ABCMeta, a metaclass that only customises class
    # attributes) makes instances exactly as type does.
    if type(cls).__call__ is not type.__call__ or getattr(cls, "__abstractmethods__", None) \
            or cls.__new__ not in (object.__new__, dict.__new__) \
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

def _is_numpy_callable(obj):
    if isinstance(obj, np.ufunc):
        return True
    if isinstance(obj, type):
        return issubclass(obj, np.generic)   # np.float32(2.5), np.int64(3)
    return callable(obj) and (getattr(obj, "__module__", None) or "").split(".")[0] == "numpy"


def _is_python_numbers(v):
    """A Python number, or a tuple/list of them, known while tracing (no array, no tensor)."""
    if isinstance(v, (TupleValue, ListValue)):
        return all(_is_python_numbers(i) for i in v.items)
    if not operators.is_constant(v):
        return False
    c = operators.as_constant(v)
    if isinstance(c, (tuple, list)):
        return all(type(i) in (int, float, bool, complex) for i in c)
    return type(c) in (int, float, bool, complex) or c is None or isinstance(c, str)


# Methods of dict and list that only read.
READ_ONLY_METHODS = frozenset({"get", "keys", "values", "items", "copy", "count", "index", "__getitem__",
                               "__contains__", "__len__"})
_FOLDABLE_MODULES = {"math", "operator", "builtins", "_operator", "cmath"}


def _is_foldable(obj):
    if isinstance(obj, (types.BuiltinFunctionType, types.BuiltinMethodType)):
        owner = getattr(obj, "__self__", None)
        if owner is None or isinstance(owner, types.ModuleType):
            return (getattr(obj, "__module__", None) or getattr(owner, "__name__", "")) in _FOLDABLE_MODULES
        if type(owner) in (dict, list) and obj.__name__ in READ_ONLY_METHODS:
            # A read-only container held by a private object (PrivateObjectValue), reached as a
            # constant: a container from outside the trace has a source and is guarded instead.
            return True
        return isinstance(owner, CONSTANT_TYPES + (tuple, frozenset))
    if isinstance(obj, types.MethodWrapperType):
        return isinstance(obj.__self__, CONSTANT_TYPES + (tuple, frozenset))
    return False


def fold(frame: RunningFrame, fn: Callable, args: list[Value], kwargs: dict[str, Value], what: str | None = None,
         hold=None) -> Value:
    """Call a pure function on constant arguments at trace time.

    ``hold``: for a method of a container made in the frame that may hold values the trace
    cannot know (a deque of tensors), how to turn such an argument into what it holds."""
    name = what or getattr(fn, "__qualname__", None) or getattr(fn, "__name__", repr(fn))
    args = generators.materialize_args(frame, fn, args)
    iterators = []   # (value, real iterator handed to fn, items it had)
    try:
        cargs = [_fold_arg(a, iterators, hold) for a in args]
        ckwargs = {k: _fold_arg(v, iterators, hold) for k, v in kwargs.items()}
    except Unsupported:
        # Some operator.* functions are graph operations on tensors.
        if getattr(fn, "__module__", None) in ("_operator", "operator") and has_tensor(args):
            return operators.graph_op(frame, fn, args, kwargs)
        raise Unsupported(f"{name}() on non-constant arguments ({', '.join(attrs.describe(a) for a in args)})")
    refuse_traced_ids(fn, list(cargs) + list(ckwargs.values()), f"{name}()")
    if fn is hash or fn is id:
        frame.tx.process_local += 1
    for a in cargs:
        note_process_local(frame.tx, a)
    try:
        result = fn(*cargs, **ckwargs)
    except Exception as e:
        raise PythonError(f"{name}() raised {type(e).__name__}: {e}", e) from e
    for value, real, n in iterators:
        # The iterator value advances by as many items as fn took.
        value.pos += n - operator.length_hint(real)
    return operators.constant_value(result)


def _fold_arg(v, iterators, hold=None):
    """The real argument for a folded call; an iterator becomes a real iterator over its constants."""
    if isinstance(v, IteratorValue):
        rest = [(hold or operators.as_constant)(i) for i in v.items[v.pos:]]
        real = iter(rest)
        iterators.append((v, real, len(rest)))
        return real
    if hold is not None and not operators.is_frame_mutable_constant(v):
        return hold(v)
    return operators.as_constant(v)


def has_tensor(args):
    return any(isinstance(a, TensorValue) for a in args)


# --- tensor methods --------------------------------------------------------------

# Methods that turn tensor data into Python values: the trace cannot know them.
_DATA_DEPENDENT = {"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__",
                   "data_ptr", "nonzero_static", "__array__", "cpu_numpy"}
_UNSUPPORTED_METHODS = {"backward", "register_hook", "retain_grad", "share_memory_",
                        "pin_memory", "record_stream", "storage", "untyped_storage", "set_", "resize_"}


TENSOR_DATA_HINT = ("keep the value a tensor (e.g. x.sum() instead of x.sum().item(), torch.where instead of "
                    "an if), or move this call out of the compiled function; without fullgraph=True it runs eagerly at a graph break")


def tensor_method(frame: RunningFrame, tensor: TensorValue, name: str, args: list[Value], kwargs: dict[str, Value]) -> Value:
    # (x.__iadd__(1): torch hands the override add_, not __iadd__; other dunders are left to the graph's refusal)
    method = getattr(torch.Tensor, name, None) if not name.startswith("__") else torch_function.DUNDER_FUNCS.get(name)
    if method is not None and (tensor.cls not in (torch.Tensor, torch.nn.Parameter) or frame.tx.graph.function_modes):
        overridden = torch_function.dispatch(frame, method, [tensor] + list(args), kwargs, what=f"Tensor.{name}")
        if overridden is not None:    # a __torch_function__ class's
            return overridden
    if name == "numpy":
        return numpy_calls.tensor_method_to_array(frame, tensor, name, args, kwargs)
    if name == "requires_grad_" and not tensor.fake.requires_grad and not kwargs \
            and args and operators.is_constant(args[0]) and not operators.as_constant(args[0]):
        return tensor    # requires_grad_(False) on a tensor that needs no grad (guarded): nothing to do
    if name == "item" and not args and not kwargs and config.capture_scalar_outputs:
        # An unbacked SymInt/SymFloat/SymBool computed in the graph (graph.unbacked).
        return frame.tx.graph.call("call_method", "item", [tensor], {})
    if name in _DATA_DEPENDENT:
        raise Unsupported(f"Tensor.{name}() needs the tensor's data, which is unknown while tracing",
                          hint=TENSOR_DATA_HINT)
    if name in _UNSUPPORTED_METHODS:
        raise Unsupported(f"Tensor.{name}() is not supported in a graph yet")
    if name == "as_subclass":
        target = getattr(args[0], "obj", None) if len(args) == 1 and not kwargs else None
        if torch_function.is_function_subclass(target) \
                and (tensor.cls is torch.Tensor or torch_function.is_function_subclass(tensor.cls)):
            # The same tensor seen as a __torch_function__ class: its ops now go through the
            # override (torch_function.py); outside the graph it is that class again.
            return TensorValue(tensor.node, tensor.fake, None, cls=target)
        if target is not torch.Tensor:
            raise Unsupported("Tensor.as_subclass() to a tensor subclass other than a plain __torch_function__ "
                              "subclass is not supported in a graph yet",
                              hint="without fullgraph=True the code from there runs eagerly")
    if name in ("size", "stride") and not kwargs:
        shape = tensor.fake.shape if name == "size" else tensor.fake.stride()
        symbolic = any(isinstance(s, torch.SymInt) for s in shape)
        if not args:
            if not symbolic:
                return ConstantValue(torch.Size(shape) if name == "size" else tuple(shape))
            if name == "size":
                return tensor_attrs.shape_value(frame, tensor)
        else:
            d = operators.as_constant(args[0])
            if name == "size":
                return frame.tx.graph.size_value(tensor, d)
            if not isinstance(shape[d], torch.SymInt):
                return ConstantValue(shape[d])
    if name == "requires_grad_":
        flag = kwargs.get("requires_grad", args[0] if args else ConstantValue(True))
        return tensor_attrs.set_requires_grad(frame, tensor, operators.as_constant(flag))
    if name in ("dim", "ndimension"):
        return ConstantValue(tensor.fake.dim())
    if name in ("numel", "nelement") and not isinstance(tensor.fake.numel(), torch.SymInt):
        return ConstantValue(tensor.fake.numel())
    if name == "__len__":
        return frame.tx.graph.size_value(tensor, 0)
    if name == "__setitem__" and len(args) == 2 and not kwargs:
        # (a store: its node has no result the graph would keep it for)
        operators.setitem(frame, tensor, args[0], args[1], own_methods=False)
        return ConstantValue(None)
    return frame.tx.graph.call("call_method", name, [tensor] + list(args), kwargs)


# --- with-blocks over torch global state --------------------------------------------

INFERENCE_MODE_HINT = ("a graph break inside the block entered it again natively, so it is left natively too "
                       "(no change needed; without the break inside, the whole block is in the graph)")


def enter_context(frame, mgr):
    if mgr.kind == "set_grad":
        # set_grad_enabled took effect when it was made; entering does nothing more.
        return
    mgr.saved = current_state(mgr)
    apply_state(frame, mgr, entering=True)


def exit_context(frame, mgr):
    apply_state(frame, mgr, entering=False)
