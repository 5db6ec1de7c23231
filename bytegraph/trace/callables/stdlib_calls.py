"""The standard library while tracing: functools, itertools, operator, collections, copy.

Handlers register into ``core.handlers.BUILTIN_HANDLERS``; ``call_stdlib_object``
handles callable *objects* of the standard library (partials, ``lru_cache``
wrappers, operator getters, methods of sets/deques/Counters made in the frame).
"""
from __future__ import annotations

import collections
import copy
import functools
import gc
import itertools
import logging
import operator
import sys
import types
import warnings

from ...errors import Unsupported
from ...guards.builder import DICT_KEYS, GLOBAL_STATE, ID_MATCH, LENGTH_MATCH, TYPE_MATCH
from ...residual import warning_action, warning_place
from ...stacks import frame_summary
from ...guards.sources import AttrSource, ItemSource
from ...values.base import (MUTABLE_CONSTANT_TYPES, BoundMethodValue, ConstantValue, DefaultDictValue, DictValue,
                           ExceptionValue, FunctionValue, IteratorValue, ListValue, ObjectValue, PartialValue,
                           PrivateObjectValue,
                           TupleValue, holds_values)
from ...values.builder import CONSTANT_TYPES, wrap
from ..python import attrs, operators
from ..core.basics import deque_item, held_item
from .calls import call, call_python_function, fold
from ..python.iteration import iterate
from ..core.handlers import BUILTIN_HANDLERS, builtin
from .containers import call_method
from ...values.base import Value
from ..core.context import RunningFrame


# --- functools, itertools, operator, collections -------------------------------------

def _call_memoized(frame, fv, args, kwargs):
    """A ``functools.lru_cache``d function on constant (or guarded-object) arguments, called now.

    The cache promises one result per arguments, so the call is made while tracing (where
    eager would make it on its first call) and its result taken as a constant.
    """
    def real(v):
        return v.obj if isinstance(v, ObjectValue) else operators.as_constant(v)
    frame.tx.process_local += 1    # the cache's promise holds in this process only
    result = fv.obj(*[real(a) for a in args], **{k: real(v) for k, v in kwargs.items()})
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


# Iterators are finite lists of values, made at once (like generators, see frame.py).

def call_stdlib_object(frame: RunningFrame, fv: ObjectValue, args: list[Value], kwargs: dict[str, Value]) -> Value | None:
    """Calls of stdlib callable objects: partials, lru_cache wrappers, operator getters,
    and methods of sets/deques/Counters made in the frame (kept as real constants)."""
    obj = fv.obj
    src = fv.source
    if isinstance(obj, functools.partial):
        if src is not None:
            # Its identity is not guarded (values.builder): how many arguments it holds is.
            frame.tx.guards.add(LENGTH_MATCH, AttrSource(src, "args"), len(obj.args))
            frame.tx.guards.add(DICT_KEYS, AttrSource(src, "keywords"), list(obj.keywords))
        func = wrap(frame.tx, obj.func, AttrSource(src, "func") if src else None)
        pargs = [wrap(frame.tx, a, ItemSource(AttrSource(src, "args"), i) if src else None)
                 for i, a in enumerate(obj.args)]
        pkw = {k: wrap(frame.tx, a, ItemSource(AttrSource(src, "keywords"), k) if src else None)
               for k, a in obj.keywords.items()}
        return call(frame, func, pargs + list(args), {**pkw, **kwargs})
    if isinstance(obj, functools._lru_cache_wrapper):
        if all(_is_memo_argument(a) for a in list(args) + list(kwargs.values())):
            try:
                return _call_memoized(frame, fv, args, kwargs)
            except Exception:   # noqa: BLE001 - an lru_cache does not keep exceptions
                pass            # trace the function instead: the exception is raised in the trace
        # On other arguments the cache only saves work: the wrapped function gives the same values.
        return call(frame, wrap(frame.tx, obj.__wrapped__, AttrSource(src, "__wrapped__") if src else None),
                    args, kwargs)
    if type(obj) in (operator.itemgetter, operator.attrgetter, operator.methodcaller):
        if src is not None:
            frame.tx.guards.add(ID_MATCH, src, obj)   # what it gets is fixed when it is made
        return _call_getter(frame, obj, args, kwargs)
    if isinstance(obj, (types.MethodDescriptorType, types.WrapperDescriptorType)) and args:
        # ``list.append(xs, v)``, ``set.union(*sets)``, ``str.upper(s)``: a method called through its class.
        owner_type, self_value = obj.__objclass__, args[0]
        if isinstance(self_value, (ListValue, DictValue, TupleValue)) \
                and issubclass(operators.python_type(self_value), owner_type):
            return call_method(frame, self_value, obj.__name__, list(args[1:]), kwargs)
        if owner_type in _FOLDABLE_METHOD_OWNERS and isinstance(self_value, ConstantValue):
            return fold(frame, obj, args, kwargs)
        return None
    if not isinstance(obj, (types.BuiltinMethodType, types.MethodType)):
        return None
    owner = obj.__self__
    if isinstance(owner, MUTABLE_CONSTANT_TYPES) and src is None and frame.tx.memo.get(id(owner)) is None:
        # A method of a set/deque/Counter made in the frame: run it on the real object; a
        # deque may hold tensors and other values (as HeldValues).
        if not isinstance(owner, collections.deque):
            return fold(frame, obj, args, kwargs)
        if obj.__name__ in ("extend", "extendleft") and len(args) == 1:
            args = [ConstantValue([deque_item(x) for x in iterate(frame, args[0])])]
        elif obj.__name__ in ("index", "count", "remove", "__contains__") and holds_values(owner):
            raise Unsupported(f"deque.{obj.__name__}() comparing values the trace cannot know (tensors) "
                              "is not supported yet")
        return fold(frame, obj, args, kwargs, hold=deque_item)
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
    return ConstantValue({held_item(x) for x in iterate(frame, args[0])} if args else set())


@builtin(frozenset)
def _frozenset(frame, args, kwargs):
    return ConstantValue(frozenset(held_item(x) for x in iterate(frame, args[0])) if args else frozenset())


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
    items = [deque_item(x) for x in iterate(frame, args[0])] if args else []
    return ConstantValue(collections.deque(items, _const(maxlen, "deque()")))


@builtin(collections.OrderedDict)
def _ordered_dict(frame, args, kwargs):
    out = DictValue({}, cls=collections.OrderedDict)
    call_method(frame, out, "update", list(args), kwargs)
    return out


@builtin(collections.defaultdict)
def _defaultdict(frame, args, kwargs):
    factory = args[0] if args else ConstantValue(None)
    out = DefaultDictValue({}, factory)
    call_method(frame, out, "update", list(args[1:]), kwargs)
    return out


def _fromkeys(cls):
    """``cls.fromkeys(keys, value=None)`` for dict, OrderedDict and defaultdict (no factory):
    every key maps to the one ``value`` object, as in eager."""
    def h(frame, args, kwargs):
        if kwargs or not 1 <= len(args) <= 2:
            raise Unsupported(f"{cls.__name__}.fromkeys() with these arguments is not supported yet")
        value = args[1] if len(args) > 1 else ConstantValue(None)
        items = {operators.key_of(k): value for k in iterate(frame, args[0])}
        if cls is collections.defaultdict:
            return DefaultDictValue(items, ConstantValue(None))
        return DictValue(items, cls=cls)
    return h


for _cls in (dict, collections.OrderedDict, collections.defaultdict):
    BUILTIN_HANDLERS[_cls.fromkeys] = _fromkeys(_cls)


@builtin(collections.namedtuple)
def _namedtuple(frame, args, kwargs):
    """A namedtuple class made in the frame: made now (its definition is constant); named after
    the calling module, as ``namedtuple`` names it after its caller."""
    kwargs = dict(kwargs)
    if "module" not in kwargs:
        kwargs["module"] = ConstantValue(frame.globals.get("__name__", "__main__"))
    return fold(frame, collections.namedtuple, args, kwargs, what="namedtuple()")


@builtin(tuple.__new__)
def _tuple_new(frame, args, kwargs):
    """``tuple.__new__(cls, iterable)``: what a namedtuple's ``__new__`` and ``_make`` call."""
    if kwargs or not args or not isinstance(args[0], ObjectValue) or not isinstance(args[0].obj, type):
        raise Unsupported("tuple.__new__() with these arguments is not supported yet")
    cls = args[0].obj
    if not (issubclass(cls, tuple) and (cls is tuple or hasattr(cls, "_fields"))):
        raise Unsupported(f"tuple.__new__({cls.__qualname__}) is not supported yet")
    items = iterate(frame, args[1]) if len(args) > 1 else []
    return TupleValue(items, cls=cls)


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


def _has_instance_dict(p):
    """Whether the partial ``p`` has made its ``__dict__``, read without making it: CPython
    flattens a partial of a partial only while that dict was never made, and reading
    ``p.__dict__`` makes it (so a trace that read it changed what eager does from then on).
    The dict shows among the objects the partial references, next to its keywords dict."""
    keywords = p.keywords
    return any(type(r) is dict and r is not keywords for r in gc.get_referents(p))


@builtin(functools.partial)
def _partial(frame, args, kwargs):
    fn = args[0]
    if isinstance(fn, PartialValue):
        return PartialValue(fn.func, fn.args + list(args[1:]), {**fn.kwargs, **kwargs})
    if isinstance(fn, ObjectValue) and type(fn.obj) is functools.partial and not _has_instance_dict(fn.obj):
        # CPython flattens a partial of a plain partial: one function, the arguments joined.
        inner, src = fn.obj, fn.source
        func = wrap(frame.tx, inner.func, AttrSource(src, "func") if src else None)
        pargs = [wrap(frame.tx, a, ItemSource(AttrSource(src, "args"), i) if src else None)
                 for i, a in enumerate(inner.args)]
        pkw = {k: wrap(frame.tx, a, ItemSource(AttrSource(src, "keywords"), k) if src else None)
               for k, a in inner.keywords.items()}
        return PartialValue(func, pargs + list(args[1:]), {**pkw, **kwargs})
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
        return IteratorValue(out, cls=fn)
    return h


BUILTIN_HANDLERS[itertools.chain] = _iterator_builtin(itertools.chain, "chain()")
BUILTIN_HANDLERS[itertools.chain.from_iterable] = lambda frame, args, kwargs: IteratorValue(
    [x for part in iterate(frame, args[0]) for x in iterate(frame, part)], cls=itertools.chain)
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
        return IteratorValue(out, cls=fn)
    return h


# islice (and count, map, filter, zip, enumerate) are lazy: trace/python/generators.py.
for _fn in (itertools.combinations, itertools.permutations, itertools.combinations_with_replacement):
    BUILTIN_HANDLERS[_fn] = _with_constant_tail(_fn, f"{_fn.__name__}()")


@builtin(itertools.repeat)
def _repeat(frame, args, kwargs):
    times = kwargs.get("times", args[1] if len(args) > 1 else None)
    if times is None:
        raise Unsupported("itertools.repeat() without a count is infinite",
                          hint="pass times=, or use [x] * n")
    return IteratorValue([args[0]] * _const(times, "repeat()"), cls=itertools.repeat)


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
    return IteratorValue(out, cls=itertools.accumulate)


@builtin(itertools.starmap)
def _starmap(frame, args, kwargs):
    return IteratorValue([call(frame, args[0], iterate(frame, t), {}) for t in iterate(frame, args[1])],
                         cls=itertools.starmap)


def _take_drop_while(take):
    def h(frame, args, kwargs):
        pred, items = args[0], iterate(frame, args[1])
        n = 0
        while n < len(items) and operators.truth(frame, call(frame, pred, [items[n]], {})):
            n += 1
        return IteratorValue(items[:n] if take else items[n:],
                             cls=itertools.takewhile if take else itertools.dropwhile)
    return h


BUILTIN_HANDLERS[itertools.takewhile] = _take_drop_while(True)
BUILTIN_HANDLERS[itertools.dropwhile] = _take_drop_while(False)


@builtin(itertools.compress)
def _compress(frame, args, kwargs):
    items, flags = iterate(frame, args[0]), iterate(frame, args[1])
    return IteratorValue([i for i, f in zip(items, flags) if operators.truth(frame, f)], cls=itertools.compress)


def _handled(frame, what):
    """The exception the code is handling where the trace knows it (inside a handler the trace
    entered, or one a resume function entered again); else a graph break (what the caller of
    the compiled function handles is not known to the trace)."""
    exc = frame.tx.handled_exception
    if isinstance(exc, ExceptionValue) or (isinstance(exc, ObjectValue) and isinstance(exc.obj, BaseException)):
        return exc
    raise Unsupported(f"{what} outside an exception handler of the compiled function is not supported yet")


@builtin(sys.exception)
def _exception(frame, args, kwargs):
    return _handled(frame, "sys.exception()")


@builtin(sys.exc_info)
def _exc_info(frame, args, kwargs):
    exc = _handled(frame, "sys.exc_info()")
    if isinstance(exc, ExceptionValue):
        raise Unsupported("sys.exc_info() of an exception raised in the compiled function: its traceback "
                          "is made only where it is raised natively", hint="sys.exception() gives the exception")
    if exc.source is None:
        raise Unsupported("sys.exc_info() of an exception the trace cannot read again is not supported yet")
    # (a bare `except:` matched no class: the class answered here is guarded)
    frame.tx.guards.add(TYPE_MATCH, exc.source, type(exc.obj))
    cls = wrap(frame.tx, type(exc.obj), None)
    source = AttrSource(exc.source, "__traceback__")
    return TupleValue([cls, exc, wrap(frame.tx, exc.obj.__traceback__, source)])


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


# --- logging and warnings -------------------------------------------------------------

_LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "warn": logging.WARNING,
               "error": logging.ERROR, "exception": logging.ERROR, "critical": logging.CRITICAL,
               "fatal": logging.CRITICAL, "log": None}


def _logger_method(name):
    method = getattr(logging.Logger, name)

    def h(frame, args, kwargs):
        logger = getattr(args[0], "obj", None) if args else None
        level = _LOG_LEVELS[name]
        if level is None and len(args) > 1 and operators.is_constant(args[1]):
            level = operators.as_constant(args[1])
        if isinstance(logger, logging.Logger) and isinstance(level, int) and not logger.isEnabledFor(level):
            # Nothing is written: traced, reading the logger's level cache (guarded: a changed level
            # clears it and compiles again), filled here for every level the trace may read (its
            # first read keeps what it holds then).
            for known in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL):
                logger.isEnabledFor(known)
            return call_python_function(frame, wrap(frame.tx, method, None), args, kwargs)
        raise Unsupported(f"logger.{name}() writes a log record, which a graph cannot",
                          hint="it runs natively at a graph break (fullgraph=True refuses it); log outside the "
                               "compiled function, or at a level the logger does not write, to keep one graph")
    return h


for _name in _LOG_LEVELS:
    BUILTIN_HANDLERS[getattr(logging.Logger, _name)] = _logger_method(_name)


_WARN_HINT = ("it runs natively at a graph break (fullgraph=True refuses it); warn outside the compiled function "
              "to keep one graph")


@builtin(warnings.warn_explicit)
def _warn_explicit(frame, args, kwargs):
    raise Unsupported("warnings.warn_explicit() is not traced", hint=_WARN_HINT)


@builtin(warnings.warn)
def _warn(frame, args, kwargs):
    """``warnings.warn(message, category, stacklevel)``: shown after the graph, from the place it names
    (``residual.replay_warning``: the filters and the once-per-place registry decide there, as in
    eager). A warning the filters turn into an error at trace time breaks the graph, and a guard
    compiles again when they come to."""
    names = ("message", "category", "stacklevel", "source", "skip_file_prefixes")
    bound = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names or k in bound:
            raise Unsupported(f"warnings.warn() with argument {k!r}", hint=_WARN_HINT)
        bound[k] = v
    try:
        message = _warning_message(bound["message"])
        category = operators.as_constant(bound.get("category", ConstantValue(None)))
        stacklevel = operators.as_constant(bound.get("stacklevel", ConstantValue(1)))
        source = operators.as_constant(bound.get("source", ConstantValue(None)))
        skip = operators.as_constant(bound.get("skip_file_prefixes", ConstantValue(())))
    except (Unsupported, KeyError):
        raise Unsupported("warnings.warn() with a message or arguments not known while tracing",
                          hint=_WARN_HINT) from None
    if isinstance(message, Warning):
        category = type(message)
    if category is None:
        category = UserWarning
    if not isinstance(message, str) and not isinstance(message, Warning) or not isinstance(category, type) \
            or not issubclass(category, Warning) or type(stacklevel) is not int or source is not None or skip:
        raise Unsupported("warnings.warn() with arguments it is not traced with", hint=_WARN_HINT)
    tx = frame.tx
    target = _warning_frame(tx, frame, stacklevel)
    filename = target.code.co_filename
    lineno = frame_summary(target.code, target.current).lineno
    module = target.globals.get("__name__", "<string>")
    text = str(message)
    if warning_action(text, category, module, lineno) == "error":
        raise Unsupported(f"warnings.warn() of a {category.__name__} that the warning filters turn into an error",
                          hint="the error is raised natively at a graph break")
    index = warning_place(text, category, module, lineno)
    tx.guards.add(GLOBAL_STATE, None, (f"_warning_is_error({index})", False),
                  f"warning filters for {category.__name__} at {filename}:{lineno}")
    tx.effects.record_warning(message, category, filename, lineno, module, target.globals)
    return ConstantValue(None)


def _warning_message(v):
    """The message of a warning: a constant, or a Warning made in the trace from constants (made
    for real here: it is shown after the graph)."""
    if isinstance(v, ExceptionValue) and issubclass(v.cls, Warning) and not v.attrs and v.cause is None:
        return v.cls(*[operators.as_constant(a) for a in v.args])
    return operators.as_constant(v)


def _warning_frame(tx, frame, stacklevel):
    """The traced frame ``stacklevel`` levels up from ``frame``, as Python's stack has it: each step
    up must be a plain call of a Python function (a module call or a decorator has frames of its
    own in eager that the trace does not)."""
    frames = tx.frames
    i = len(frames) - 1
    while i >= 0 and frames[i] is not frame:
        i -= 1
    for _ in range(max(stacklevel, 1) - 1):
        child = frames[i]
        if i == 0:
            raise Unsupported("warnings.warn() names a place outside the compiled function (stacklevel)",
                              hint=_WARN_HINT)
        parent = frames[i - 1]
        if child.parent is not parent or _code_of(parent.callee) is not child.code:
            raise Unsupported("warnings.warn() names a frame the trace cannot place (stacklevel over a call "
                              "that is not a plain function call)", hint=_WARN_HINT)
        i -= 1
    return frames[i]


def _code_of(callee):
    """The code object a plain call of ``callee`` runs in a frame of its own, or None."""
    if isinstance(callee, BoundMethodValue):
        callee = callee.func
    if isinstance(callee, FunctionValue):
        return callee.code
    obj = getattr(callee, "obj", None)
    if isinstance(obj, types.MethodType):
        obj = obj.__func__
    return obj.__code__ if isinstance(obj, types.FunctionType) else None
