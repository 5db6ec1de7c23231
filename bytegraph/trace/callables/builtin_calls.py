"""Builtins while tracing: ``len``, ``isinstance``, ``zip``, ``sorted``, ``getattr``, ``super``...

Each handler registers into ``core.handlers.BUILTIN_HANDLERS`` (callable -> ``handler(frame,
args, kwargs) -> value``), which ``trace.callables.calls`` consults first. Most handlers compute
on values (iterate, compare, fold constants) and trace the functions they are given (``key=``,
``map``'s function) through ``call``. The standard library is ``stdlib_calls``, nn.Module
enumeration ``nn.module_enumeration``.
"""
import abc
import copy
import inspect
import operator
import types

import torch

from ... import control
from ...datamodel import class_attr, is_callable_type
from ...errors import Unsupported
from ...guards import builder as g
from ...values.base import (BoundMethodValue, CellValue, ConstantValue, ContextManagerValue, DictValue, DictViewValue,
                           IteratorValue, ListValue, ObjectValue, PrivateObjectValue, SuperValue, SymValue, TensorValue, TracedId, TupleValue, UserObjectValue, holds_values)
from ...values.arrays import NdarrayValue
from ...values.builder import wrap
from ..core import ops
from ..numpy_api import numpy_calls
from ..python import attrs, generators, lookup, operators, protocols
from ..torch_api import checks, distributed, torch_function
from .calls import TENSOR_DATA_HINT, call, fold, has_tensor
from ..core.basics import no_attr_name
from ..python.exceptions import TracedRaise
from ..python.generators import check_unchanged, iterated_containers
from ..core.handlers import BUILTIN_HANDLERS, builtin
from ..python.iteration import iterate
from ..python.protocols import guard_class_method


# --- builtins --------------------------------------------------------------------------

def _const_args(args, what):
    try:
        return [operators.as_constant(a) for a in args]
    except Unsupported:
        raise Unsupported(f"{what}() on non-constant arguments is not supported yet") from None


@builtin(len)
def _len(frame, args, kwargs):
    (v,) = args
    if isinstance(v, TensorValue):
        if protocols.has_special_method(v, "__len__"):    # its class's own, in Python
            return protocols.call_special_method(frame, v, "__len__", [])
        if v.cls not in (torch.Tensor, torch.nn.Parameter) or frame.tx.graph.function_modes:
            overridden = torch_function.dispatch(frame, torch.Tensor.__len__, [v], {}, what="Tensor.__len__")
            if overridden is not None:     # Tensor.__len__ asks the class's or a mode's override
                return overridden
        if v.fake.dim() == 0:
            raise Unsupported("len() of a 0-d tensor")
        return frame.tx.graph.size_value(v, 0)
    if isinstance(v, NdarrayValue):
        return numpy_calls.len_value(frame, v)
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
    return ConstantValue(_is_instance(frame, v, cls))


def _is_instance(frame, v, cls):
    """``isinstance(v, cls)`` as CPython decides it: the exact type, each class of a tuple, then
    the metaclass's ``__instancecheck__`` (traced when it is user Python code, which may look
    at the object itself), else the subclass relation of the object's type."""
    t = operators.python_type(v)
    if t is cls:
        return True
    if isinstance(cls, tuple):
        return any(_is_instance(frame, v, c) for c in cls)
    if not isinstance(cls, type):
        raise Unsupported(f"isinstance() arg 2 must be a type, a tuple of types or a union, not {type(cls).__name__}")
    meta = type(cls)
    check = class_attr(meta, "__instancecheck__")
    module = (meta.__module__ or "").split(".")[0]
    try:
        nominal = issubclass(t, cls)
    except TypeError as e:
        raise Unsupported(f"isinstance(): {e}") from e
    if meta is type or isinstance(meta, abc.ABCMeta) and check is abc.ABCMeta.__instancecheck__ \
            or module in ("torch", "builtins", "abc"):
        # type's check and ABCMeta's (registered and __subclasshook__ classes included) come to
        # the subclass relation; torch's metaclasses are taken as that too.
        return nominal
    if module == "typing":
        if nominal:
            return True
        raise Unsupported(f"isinstance() against {cls.__qualname__} (a typing.Protocol) checks the object's "
                          "own attributes, which is not traced yet")
    if not isinstance(check, types.FunctionType):
        raise Unsupported(f"isinstance() through {meta.__qualname__}.__instancecheck__ (not Python code) "
                          "is not supported yet")
    src = guard_class_method(frame.tx, meta, "__instancecheck__", check)
    answer = call(frame, wrap(frame.tx, check, src), [wrap(frame.tx, cls, None), v], {})
    return operators.truth(frame, answer)


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
    if isinstance(obj, ObjectValue) and obj.source is not None and (id(obj.obj), name) not in frame.tx.effects.attr_stores:
        # The value read is dropped, so nothing else guards that it is still there (unless the
        # trace set it itself).
        frame.tx.guards.add(g.HAS_ATTR, obj.source, name)
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
    return IteratorValue([TupleValue([ConstantValue(i + start), v]) for i, v in enumerate(items)],
                         origins=iterated_containers(args[:1]),
                         remake=(enumerate, [args[0], ConstantValue(start)]), cls=enumerate)


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
        return IteratorValue([TupleValue(list(t)) for t in zip(*seqs)], cls=zip)
    return IteratorValue([TupleValue(list(t)) for t in zip(*seqs)], origins=iterated_containers(args),
                         remake=(zip, list(args)), cls=zip)


def _reversible(value):
    """Does ``reversed()`` take this constant (a tuple, a torch.Size, a string, a range...; not a set)?"""
    try:
        reversed(value)
    except TypeError:
        return False
    return True


@builtin(reversed)
def _reversed(frame, args, kwargs):
    seq = args[0]
    if protocols.has_special_method(seq, "__reversed__"):
        return protocols.call_special_method(frame, seq, "__reversed__", [])
    if isinstance(seq, TensorValue):
        # torch.Tensor.__reversed__: the tensor flipped along dim 0 (a 0-d tensor itself), not an iterator.
        if seq.fake.dim() == 0:
            return seq
        return call(frame, attrs.get_attr(frame, seq, "flip"), [ConstantValue(0)], {})
    if not (isinstance(seq, (TupleValue, ListValue, DictValue, DictViewValue))
            or isinstance(seq, ConstantValue) and _reversible(seq.value)):
        # A set, an iterator, an object without __reversed__ or the sequence protocol: eager
        # raises TypeError ("not reversible") or walks __len__/__getitem__.
        raise Unsupported(f"reversed() of {attrs.describe(seq)} is not supported yet")
    return IteratorValue(list(reversed(iterate(frame, args[0]))), origins=iterated_containers(args[:1]),
                         remake=(reversed, args[:1]), cls=generators.result_class(reversed, args[0]))


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
    out = DictValue({})
    ops.call_method(frame, out, "update", list(args), kwargs)
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
    """``callable(v)``: whether ``type(v)`` has ``__call__``, as CPython asks it."""
    v = args[0]
    if isinstance(v, ObjectValue):
        return ConstantValue(callable(v.obj))
    if isinstance(v, ConstantValue):
        return ConstantValue(callable(v.value))
    if isinstance(v, ContextManagerValue):
        raise Unsupported("callable() of a torch context manager made in the compiled function is not supported yet")
    return ConstantValue(is_callable_type(operators.python_type(v)))


def _min_max(fn):
    def h(frame, args, kwargs):
        kwargs = dict(kwargs)
        key = kwargs.pop("key", None)
        has_default = "default" in kwargs
        default = kwargs.pop("default", None)
        if kwargs:
            raise Unsupported(f"{fn.__name__}() got unexpected keyword arguments {sorted(kwargs)}")
        items = iterate(frame, args[0]) if len(args) == 1 else list(args)
        if not items:
            if has_default:
                return default
            raise Unsupported(f"{fn.__name__}() of an empty sequence raises ValueError")
        if (key is None or operators.is_none(key)) and any(isinstance(i, SymValue) for i in items) \
                and all(_plain_size(i) or (operators.is_constant(i) and type(operators.as_constant(i)) is int)
                        for i in items):
            # Symbolic sizes stay symbolic: torch.sym_max/sym_min in the graph, no guard on the order.
            # Only plain sizes (a symbol, plus or times a constant): max/min of expressions built in
            # a loop grow without bound, and the ShapeEnv's simplification with them.
            sym_fn = torch.sym_min if fn is min else torch.sym_max
            result = items[0]
            for item in items[1:]:
                result = frame.tx.graph.sym_call(sym_fn, [result, item])
            return result
        if key is None or operators.is_none(key):
            key_values = items
        else:
            key_values = [call(frame, key, [i], {}) for i in items]
        if any(isinstance(k, TensorValue) for k in key_values):
            return _select_by_tensors(frame, fn, items, key_values)
        keys = [_sort_key(v) for v in key_values]
        try:
            return items[fn(range(len(items)), key=keys.__getitem__)]
        except TypeError as e:
            raise Unsupported(f"{fn.__name__}() raised TypeError: {e}") from e
    return h


def _plain_size(v):
    """A symbolic int whose expression is a symbol with at most a constant added or multiplied."""
    if not isinstance(v, SymValue):
        return False
    expr = v.sym.node.expr
    return len(expr.free_symbols) == 1 and expr.count_ops() <= 2


def _select_by_tensors(frame, fn, items, keys):
    """``max``/``min`` whose comparisons are between tensors: Python keeps the first item and
    replaces it by each later one whose key compares greater (``>``; ``<`` for min), which needs
    ``bool()`` of a one-element tensor. When every item is a tensor of one shape, dtype and
    device that does not need grad, and every key has one element, that choice is
    ``torch.where(key > best, item, best)`` (the same values as picking the object); otherwise
    the comparison's truth value is data-dependent and the graph breaks.

    The graph's pick is a new tensor where eager has one of the items itself, so the result
    remembers the comparisons (``TensorValue.selected``): where it leaves the graph it is the
    chosen item again; asking whether it is some object breaks (operators.is_same), as does an
    in-place change of it or of an item later in the graph (the change would show through the
    other in eager)."""
    first = items[0]
    # Items that need grad would all be connected to the result (eager leaves the others' .grad
    # None), so those keep Python's bool() at a break.
    same_kind = all(isinstance(i, TensorValue) and not i.fake.requires_grad for i in items) and all(
        i.fake.shape == first.fake.shape and i.fake.dtype == first.fake.dtype and i.fake.device == first.fake.device
        for i in items)
    one_element = all(isinstance(k, TensorValue) and not isinstance(k.fake.numel(), torch.SymInt)
                      and k.fake.numel() == 1 and k.fake.shape == keys[0].fake.shape
                      and k.fake.dtype == keys[0].fake.dtype for k in keys)
    if not (same_kind and one_element):
        raise Unsupported(f"{fn.__name__}() compares tensors: Python needs bool() of each comparison, which "
                          "depends on the tensors' data", hint=TENSOR_DATA_HINT)
    graph = frame.tx.graph
    compare = operator.gt if fn is max else operator.lt
    best, best_key = first, keys[0]
    picks = []
    for item, key in zip(items[1:], keys[1:]):
        cond = graph.call("call_function", compare, [key, best_key], {})
        if cond.fake.dim() != 0:
            cond = graph.call("call_method", "reshape", [cond, ConstantValue(())], {})
        picks.append((cond, item))
        best = graph.call("call_function", torch.where, [cond, item, best], {})
        best_key = graph.call("call_function", torch.where, [cond, key, best_key], {}) if key is not item \
            else best
    best.selected = (first, picks)
    reason = (f"an in-place change of a tensor {fn.__name__}() chose between: eager's result is one of them, "
              "so the change shows through the other")
    for v in [best] + items:
        graph.keep_unchanged(v, reason)
    return best


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
        if _changed_by_trace(frame.tx, v.obj):
            # The copy is taken now, of the object as it was: changes the trace has yet to make
            # (to it, or to what it holds) would be missing from it.
            raise Unsupported(f"copy.deepcopy() of {attrs.describe(v)} after the compiled function changed "
                              "objects that exist outside it", hint="copy it before making the changes")
        frame.tx.guards.add(g.STATE_MATCH, v.source, snapshot)
        return PrivateObjectValue(copy.deepcopy(v.obj))
    if operators.is_constant(v) and not holds_values(operators.as_constant(v)):
        return operators.constant_value(copy.deepcopy(operators.as_constant(v)))
    raise Unsupported(f"copy.deepcopy() of {attrs.describe(v)} is not supported yet")


def _changed_by_trace(tx, obj):
    """Does the trace have changes pending to ``obj`` or to anything its state holds?"""
    changed = {key[0] for key in tx.effects.attr_stores} | {key[0] for key in tx.effects.item_stores}
    changed.update(id(tx.guards.objects[v.source]) for v in tx.effects.mutated.values() if v.source in tx.guards.objects)
    if not changed:
        return False
    seen = set()

    def visit(x, depth):
        if id(x) in seen or depth > 20:
            return False
        seen.add(id(x))
        if id(x) in changed:
            return True
        if isinstance(x, dict):
            return any(visit(v, depth + 1) for v in x.values())
        if isinstance(x, (list, tuple, set, frozenset)):
            return any(visit(v, depth + 1) for v in x)
        state = getattr(x, "__dict__", None)
        return isinstance(state, dict) and not isinstance(x, type) and visit(state, depth + 1)
    return visit(obj, 0)


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
            raise attrs.MissingAttribute(f"{no_attr_name(type(obj.obj))} object has no attribute {name!r}") from None
        return attrs.private_value(frame, value, obj)
    if isinstance(obj, ObjectValue) and obj.source is not None and not isinstance(obj.obj, torch.nn.Module):
        # Past the class's own __getattribute__ (super().__getattribute__ inside it): the generic
        # order, with the object's own state read (and guarded) the same way.
        try:
            return lookup.generic_attr(frame, lookup.ExistingInstance(obj, raw=True), name)
        except attrs.MissingAttribute:
            if (id(obj.obj), name) not in frame.tx.effects.attr_stores:   # (not when the trace deleted it)
                frame.tx.guards.add(g.MISSING_ATTR, obj.source, name)
            raise
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
                      hint="print() runs eagerly, so the graph is split here (fullgraph=True refuses it); "
                           "remove it, or print outside the compiled function")


# Builtins that must not run while tracing: what running them does, which a graph cannot.
_EAGER_BUILTINS = {input: "reads from standard input", breakpoint: "stops in the debugger",
                   exec: "runs code given as a string", eval: "runs code given as a string",
                   globals: "reads the running frame's globals", locals: "reads the running frame's locals",
                   vars: "reads the running frame's locals", dir: "reads the running frame's local names"}


def _eager_builtin(fn):
    def h(frame, args, kwargs):
        if fn is vars and len(args) == 1 and not kwargs and not operators.is_constant(args[0]):
            return attrs.get_attr(frame, args[0], "__dict__")
        if fn in (vars, dir) and (args or kwargs):
            return fold(frame, fn, args, kwargs)
        name = f"{fn.__name__}()"
        if fn in (input, breakpoint):
            hint = f"{name} runs eagerly at a graph break (fullgraph=True refuses it); move it out of the " \
                   "compiled function to keep one graph"
        elif fn in (exec, eval):
            hint = f"the function calling {name} runs eagerly (fullgraph=True refuses it); write the code " \
                   "out instead of running a string to have it compiled"
        else:
            hint = f"the function calling {name} runs eagerly (fullgraph=True refuses it); use the names " \
                   f"directly instead of reading them through {name} to have it compiled"
        err = Unsupported(f"builtin {name} cannot run inside a graph: it {_EAGER_BUILTINS[fn]}", hint=hint)
        # exec/eval/locals... read the frame that calls them, so that frame runs eagerly as a
        # whole (its callers still resume after the call to it, which then runs natively).
        err.eager_frame = frame.parent is None and fn not in (input, breakpoint)
        raise err
    return h


for _fn in _EAGER_BUILTINS:
    BUILTIN_HANDLERS[_fn] = _eager_builtin(_fn)


@builtin(id)
def _id(frame, args, kwargs):
    v = args[0]
    real = _real_object(frame, v)
    if real is not None:
        # An object from outside: its id is a number the code may store (GradScaler keys its
        # per-optimizer state by id(optimizer)) or find among keys stored earlier; it holds
        # while the source names this very object.
        frame.tx.guards.add(g.ID_MATCH, v.source, real[0])
        return ConstantValue(id(real[0]))
    if isinstance(v, ObjectValue):
        return ConstantValue(TracedId(("object", id(v.obj)), v))
    if isinstance(v, ConstantValue):
        c = v.value
        if c is None or c is Ellipsis or isinstance(c, (bool, type)) or operators.is_frame_mutable_constant(v):
            return ConstantValue(TracedId(("object", id(c)), v))   # singletons, or one real object per trace
        # Equal constants may or may not be one object in Python (small ints, interned strings).
        raise Unsupported(f"id() of {attrs.describe(v)} depends on how Python shares constants")
    if isinstance(v, (TensorValue, SymValue)):
        raise Unsupported("id() of a tensor made or read while tracing is not supported yet",
                          hint="compare tensors with `is`, or key by a Python value")
    _guard_ids_distinct(frame, v)
    return ConstantValue(TracedId(("value", id(v)), v))


def _real_object(frame, v):
    """(the real object,) that ``v``, a value read from outside through a source, stands for;
    None for a value made in the frame or a constant (equal constants may or may not be one
    object)."""
    if v.source is None or isinstance(v, (ConstantValue, TensorValue, SymValue)):
        return None
    if isinstance(v, ObjectValue):
        return (v.obj,)
    for obj, value in frame.tx.memo.values():     # lists, dicts... wrapped from a real container
        if value is v:
            return (obj,)
    return None


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
        if fn is pow and len(args) == 2 and not kwargs and has_tensor(args):
            return operators.binary(frame, "**", args[0], args[1])
        if fn in (int, float) and len(args) == 1 and not kwargs:
            converted = checks.convert_unbacked(frame, fn, args[0])     # capture_scalar_outputs
            if converted is not None:
                return converted
        if fn in (int, float) and len(args) == 1 and isinstance(args[0], TensorValue):
            raise Unsupported(f"{fn.__name__}(tensor) needs the tensor's data, which is unknown while tracing",
                              hint=TENSOR_DATA_HINT)
        if fn in (int, float, complex, str, repr, hash) and len(args) == 1 and numpy_calls.involves_arrays(args[0]):
            raise Unsupported(f"{fn.__name__}() of a NumPy array needs its data, which is unknown while tracing",
                              hint=numpy_calls.DATA_HINT)
        if fn in (str, repr, ascii) and len(args) == 1 and not kwargs:
            return operators.text_of(frame, args[0], fn)
        if fn is format and 1 <= len(args) <= 2 and not kwargs:
            return operators.format_of(frame, args[0], args[1] if len(args) > 1 else ConstantValue(""))
        return fold(frame, fn, args, kwargs)
    return h


for _fn in (int, float, bool, complex, str, bytes, repr, round, divmod, pow, hash, ord, chr, format, ascii,
            bin, hex, oct):
    BUILTIN_HANDLERS[_fn] = _make_fold(_fn)


BUILTIN_HANDLERS[control.arrays_from_tensors] = numpy_calls.arrays_from_tensors
BUILTIN_HANDLERS[control.tensors_from_arrays] = numpy_calls.tensors_from_arrays
BUILTIN_HANDLERS[map] = generators.lazy_map
BUILTIN_HANDLERS[filter] = generators.lazy_filter
BUILTIN_HANDLERS.update(generators.LAZY_BUILTINS)
BUILTIN_HANDLERS.update(distributed.DIST_HANDLERS)   # ranks, collectives (trace/torch_api/distributed.py)


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
    attrs.set_attr(frame, obj, operators.as_constant(name), value, plain=True)
    return ConstantValue(None)


@builtin(setattr)
def _setattr(frame, args, kwargs):
    # Like `obj.name = value`: through the class's own __setattr__.
    obj, name, value = args
    attrs.set_attr(frame, obj, operators.as_constant(name), value)
    return ConstantValue(None)


@builtin(delattr)
def _delattr(frame, args, kwargs):
    obj, name = args
    attrs.del_attr(frame, obj, operators.as_constant(name))
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


@builtin(torch.is_inference_mode_enabled)
def _is_inference_mode_enabled(frame, args, kwargs):
    # The state on entry is guarded; inside a block the trace entered, the block's.
    return ConstantValue(torch.is_inference_mode_enabled())


@builtin(torch.get_default_dtype)
def _get_default_dtype(frame, args, kwargs):
    return ConstantValue(torch.get_default_dtype())
