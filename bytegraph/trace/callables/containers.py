"""Methods of symbolic containers: lists, dicts, sets and tuples made or read while tracing.

A container that exists outside the traced code (it has a source) is changed
on its symbolic copy, so later reads in the trace see the change, and recorded
in ``TraceContext.effects.mutated``: the transformed function updates the real object
in place after the graph (``codegen.transformed.replay_side_effects``).
"""
from __future__ import annotations

import collections

from ...errors import Unsupported
from ...values.base import (ConstantValue, ContextManagerValue, DefaultDictValue, DictValue,
                           DictViewValue, IteratorValue, ListValue, ObjectValue, TupleValue, UserObjectValue,
                           holds_values)
from ...values.builder import constant
from ..core import ops
from ..python import attrs, generators, operators
from ..core.basics import constant_value, held_item
from ..python.exceptions import PythonError
from .builtin_calls import sort_values
from .calls import enter_context, exit_context
from ..python.iteration import iterate
from ...values.base import Value
from ..core.context import RunningFrame

_MUTATING = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse",
             "update", "setdefault", "popitem", "__setitem__", "__delitem__", "add", "discard",
             "difference_update", "intersection_update", "symmetric_difference_update",
             "__iadd__", "move_to_end", "__ior__"}


def call_method(frame: RunningFrame, owner: Value, name: str, args: list[Value], kwargs: dict[str, Value]) -> Value:
    if isinstance(owner, ContextManagerValue):
        if name == "__enter__":
            enter_context(frame, owner)
        else:
            exit_context(frame, owner)
        return ConstantValue(None)
    if name in _MUTATING and isinstance(owner, (ListValue, DictValue, ConstantValue)):
        frame.tx.effects.mark_mutated(owner, f"{owner.python_type().__name__}.{name}() on")
    try:
        if isinstance(owner, ConstantValue) and isinstance(owner.value, set):
            return _set_method(frame, owner, name, args, kwargs)
        if isinstance(owner, ListValue):
            return _list_method(frame, owner, name, args, kwargs)
        if isinstance(owner, DictValue):
            return _dict_method(frame, owner, name, args, kwargs)
    except (IndexError, KeyError, TypeError, ValueError) as e:
        # What eager would raise here: the frame breaks before the call, which runs natively.
        raise Unsupported(f"{owner.python_type().__name__}.{name}() raised {type(e).__name__}: {e}") from e
    if isinstance(owner, TupleValue):
        if name in ("_replace", "_asdict") and hasattr(owner.cls, "_fields"):
            return _namedtuple_method(frame, owner, name, args, kwargs)
        return _sequence_query(frame, owner, name, args)
    raise Unsupported(f"method {name} of {type(owner).__name__} is not supported yet")


def _list_method(frame, lst, name, args, kwargs):
    items = lst.items
    if name == "append":
        items.append(args[0])
    elif name in ("extend", "__iadd__"):
        if generators.is_lazy(args[0]):
            generators.extend_from(frame, items, args[0])   # appended as pulled, like list.extend
        else:
            items.extend(iterate(frame, args[0]))
        if name == "__iadd__":
            return lst
    elif name == "insert":
        items.insert(operators.as_constant(args[0]), args[1])
    elif name == "pop":
        index = operators.as_constant(args[0]) if args else -1
        try:
            return items.pop(index)
        except (IndexError, TypeError) as e:
            raise PythonError(f"{type(e).__name__}: {e}", e) from None
    elif name == "clear":
        items.clear()
    elif name == "reverse":
        items.reverse()
    elif name == "copy":
        return ListValue(items)
    elif name in ("index", "count"):
        return _sequence_query(frame, lst, name, args)
    elif name == "remove":
        for i, x in enumerate(list(items)):
            if operators.element_equal(frame, x, args[0]):
                del items[i]
                break
        else:
            _not_found(lst, "remove", args[0])
    elif name == "sort":
        unexpected = set(kwargs) - {"key", "reverse"}
        if args or unexpected:
            raise Unsupported("list.sort() takes only the keywords key= and reverse=")
        lst.items = sort_values(frame, items, kwargs.get("key"), kwargs.get("reverse", False))
    else:
        raise Unsupported(f"list.{name}() is not supported yet")
    return ConstantValue(None)


def _sequence_query(frame, seq, name, args):
    """``seq.index(x[, start[, stop]])`` / ``seq.count(x)``, comparing as CPython does
    (identity first, then ``==``)."""
    items = list(seq.items)
    if name == "count":
        if len(args) != 1:
            raise Unsupported("count() takes exactly one argument")
        return ConstantValue(sum(operators.element_equal(frame, x, args[0]) for x in items))
    if name == "index":
        start = operators.as_constant(args[1]) if len(args) > 1 else 0
        stop = operators.as_constant(args[2]) if len(args) > 2 else len(items)
        start, stop, _ = slice(start, stop).indices(len(items))
        for i in range(start, stop):
            if operators.element_equal(frame, items[i], args[0]):
                return ConstantValue(i)
        _not_found(seq, "index", args[0])
    raise Unsupported(f"tuple.{name}() is not supported yet")


def _not_found(seq, name, item):
    """Raise the ValueError Python raises when ``item`` is not in ``seq``."""
    if not operators.is_constant(item):
        raise Unsupported(f"{name}(): the item is not in the {seq.python_type().__name__} "
                          "(eager raises ValueError naming it)")
    empty = [] if isinstance(seq, ListValue) else ()
    try:
        getattr(empty, name)(operators.as_constant(item))
    except ValueError as e:
        raise PythonError(str(e), e) from None
    raise AssertionError(name)
def _has_attr(frame, v, name):
    try:
        attrs.get_attr(frame, v, name)
    except attrs.MissingAttribute:
        return False
    return True


def _dict_method(frame, d, name, args, kwargs):
    part = _DICT_PARTS.get(name)
    if part is None:
        raise Unsupported(f"dict.{name}() is not supported yet")
    return part(frame, d, name, args, kwargs)


def _dict_read(frame, d, name, args, kwargs):
    """Methods that read a dict: views, lookups, copies, length, iteration."""
    items = d.items
    if name in ("keys", "values", "items"):
        return DictViewValue(d, name)
    if name == "get":
        k = operators.key_of(args[0])
        return items.get(k, args[1] if len(args) > 1 else ConstantValue(None))
    if name == "__getitem__":
        return operators.getitem(frame, d, args[0])
    if name == "__contains__":
        return ConstantValue(operators.key_of(args[0]) in items)
    if name == "copy":
        return _new_like(d, items)
    if name == "__len__":
        return ConstantValue(len(items))
    return IteratorValue(iterate(frame, d), cls=generators.result_class(iter, d))   # __iter__


def _dict_update(frame, d, name, args, kwargs):
    """``d.update(other, **kwargs)`` from a dict, a Counter, a mapping or pairs, as CPython reads each."""
    items = d.items
    if args:
        other = args[0]
        if isinstance(other, DictValue):
            items.update(other.items)
        elif isinstance(other, ConstantValue) and isinstance(other.value, dict):
            # A Counter made in the frame (kept as a real object of Python values).
            items.update({k: constant(v) for k, v in other.value.items()})
        elif isinstance(other, UserObjectValue) and other.dict_items is not None \
                and other.cls.__iter__ is dict.__iter__:
            items.update(other.dict_items.items)   # CPython copies a dict subclass's own items
        elif isinstance(other, (UserObjectValue, ObjectValue)) and _has_attr(frame, other, "keys"):
            # A mapping (an OrderedDict subclass such as ModelOutput): keys(), then self[k].
            for k in iterate(frame, ops.call(frame, attrs.get_attr(frame, other, "keys"), [], {})):
                items[operators.key_of(k)] = operators.getitem(frame, other, k)
        else:
            for pair in iterate(frame, other):
                k, v = iterate(frame, pair)
                items[operators.key_of(k)] = v
    items.update(kwargs)
    return ConstantValue(None)


def _dict_remove(frame, d, name, args, kwargs):
    """Methods that take items out: ``pop``, ``popitem``, ``del d[k]``, ``clear``."""
    items = d.items
    if name == "pop":
        k = operators.key_of(args[0])
        if k in items:
            return items.pop(k)
        if len(args) > 1:
            return args[1]
        raise PythonError(f"KeyError: {k!r}", KeyError(k))
    if name == "__delitem__":
        k = operators.key_of(args[0])
        if k not in items:
            raise PythonError(f"KeyError: {k!r}", KeyError(k))
        del items[k]
        return ConstantValue(None)
    if name == "popitem":
        if not items:
            raise PythonError("KeyError: 'popitem(): dictionary is empty'", KeyError("popitem(): dictionary is empty"))
        last = True
        if (args or kwargs) and issubclass(d.cls, collections.OrderedDict):
            last = operators.as_constant(kwargs.get("last", args[0] if args else ConstantValue(True)))
        elif args or kwargs:
            raise Unsupported("dict.popitem() with arguments")
        if last:
            k, v = items.popitem()
        else:   # OrderedDict.popitem(last=False): the first item
            k = next(iter(items))
            v = items.pop(k)
        return TupleValue([ConstantValue(k) if isinstance(k, (str, int)) else ObjectValue(k), v])
    items.clear()   # clear
    return ConstantValue(None)


def _dict_write(frame, d, name, args, kwargs):
    """Methods that put items in or reorder them: ``setdefault``, ``d[k] = v``, ``move_to_end``, ``|``, ``|=``."""
    items = d.items
    if name == "setdefault":
        k = operators.key_of(args[0])
        if k not in items:
            items[k] = args[1] if len(args) > 1 else ConstantValue(None)
        return items[k]
    if name == "__setitem__":
        items[operators.key_of(args[0])] = args[1]
        return ConstantValue(None)
    if name == "move_to_end":
        if d.cls is not collections.OrderedDict:
            raise Unsupported(f"dict.{name}() is not supported yet")
        k = operators.key_of(args[0])
        last = kwargs.get("last", args[1] if len(args) > 1 else ConstantValue(True))
        if k not in items:
            raise PythonError(f"KeyError: {k!r}", KeyError(k))
        v = items.pop(k)
        if operators.as_constant(last):
            items[k] = v
        else:
            d.items = {k: v, **items}
        return ConstantValue(None)
    other = args[0]   # __or__, __ior__
    if not isinstance(other, DictValue):
        raise Unsupported(f"dict | {type(other).__name__.replace('Value', '').lower()}")
    if name == "__ior__":
        items.update(other.items)
        return d
    return _new_like(d, {**items, **other.items})


# dict method name -> the part of _dict_method that does it.
_DICT_PARTS = {
    **dict.fromkeys(("keys", "values", "items", "get", "__getitem__", "__contains__", "copy", "__len__", "__iter__"),
                    _dict_read),
    "update": _dict_update,
    **dict.fromkeys(("pop", "popitem", "__delitem__", "clear"), _dict_remove),
    **dict.fromkeys(("setdefault", "__setitem__", "move_to_end", "__or__", "__ior__"), _dict_write),
}


_SET_QUERIES = {"__contains__", "__len__", "issubset", "issuperset", "isdisjoint", "union",
                "intersection", "difference", "symmetric_difference", "copy"}


def _set_method(frame, s, name, args, kwargs):
    """Methods of a set kept as a constant (sets hold only constants)."""
    if kwargs:
        raise Unsupported(f"set.{name}() with keyword arguments")
    target = s.value
    if name in ("add", "discard", "remove", "__contains__"):
        x = held_item(args[0])
        if name == "remove" and x not in target:
            if holds_values(x):
                raise Unsupported("set.remove(x) of a missing item raises KeyError")
            raise PythonError(f"KeyError: {x!r}", KeyError(x))
        return constant_value(getattr(target, name)(x))
    if name in ("update", "difference_update", "intersection_update", "symmetric_difference_update"):
        others = [{held_item(x) for x in iterate(frame, a)} for a in args]
        getattr(target, name)(*others)
        return ConstantValue(None)
    if name == "clear":
        target.clear()
        return ConstantValue(None)
    if name == "pop":
        raise Unsupported("set.pop() removes an arbitrary element; not supported")
    if name in _SET_QUERIES:
        others = [{held_item(x) for x in iterate(frame, a)} for a in args]
        return operators.constant_value(getattr(target, name)(*others))
    raise Unsupported(f"set.{name}() is not supported yet")


_SET_INPLACE = {"|=": "update", "&=": "intersection_update", "-=": "difference_update",
                "^=": "symmetric_difference_update"}


def inplace_operator(frame: RunningFrame, op: str, a: Value, b: Value) -> Value | None:
    """``a op= b`` that changes the container ``a`` itself (as CPython does), or None."""
    if isinstance(a, ListValue) and op == "+=":
        items = iterate(frame, b)
        frame.tx.effects.mark_mutated(a, "+= on")
        a.items.extend(items)
        return a
    if isinstance(a, ListValue) and op == "*=":
        n = operators.as_constant(b)
        if not isinstance(n, int):
            return None
        frame.tx.effects.mark_mutated(a, "*= on")
        a.items *= n
        return a
    if isinstance(a, DictValue) and op == "|=":
        call_method(frame, a, "update", [b], {})
        return a
    if isinstance(a, ConstantValue) and type(a.value) is set and op in _SET_INPLACE:
        call_method(frame, a, _SET_INPLACE[op], [b], {})
        return a
    return None


def _new_like(d, items):
    """A new dict value of the same kind as ``d`` (a defaultdict keeps its factory)."""
    if isinstance(d, DefaultDictValue):
        return DefaultDictValue(items, d.factory)
    if d.cls is collections.defaultdict:
        raise Unsupported("copying a defaultdict that exists outside the compiled function is not supported yet")
    return DictValue(items, cls=d.cls)


def _namedtuple_method(frame, tup, name, args, kwargs):
    fields = tup.cls._fields
    if name == "_asdict":
        return DictValue(dict(zip(fields, tup.items)))
    unknown = set(kwargs) - set(fields)
    if args or unknown:
        raise Unsupported(f"{tup.cls.__name__}._replace() got unexpected field names {sorted(unknown)}")
    return TupleValue([kwargs.get(f, v) for f, v in zip(fields, tup.items)], cls=tup.cls)
