"""Methods of symbolic containers: lists, dicts, sets and tuples made or read while tracing.

A container that exists outside the traced code (it has a source) is changed
on its symbolic copy, so later reads in the trace see the change, and recorded
in ``TraceContext.mutated``: the transformed function updates the real object
in place after the graph (``codegen.transformed.replay_side_effects``).
"""
import collections

from ..errors import Unsupported
from ..values.base import (ConstantValue, ContextManagerValue, DefaultDictValue, DictValue, DictViewValue,
                           IteratorValue, ListValue, ObjectValue, TupleValue, UserObjectValue)
from ..values.builder import constant
from . import attrs, generators, operators, ops
from .builtin_calls import sort_values
from .calls import enter_context, exit_context
from .iteration import iterate

_MUTATING = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse",
             "update", "setdefault", "popitem", "__setitem__", "__delitem__", "add", "discard",
             "difference_update", "intersection_update", "symmetric_difference_update",
             "__iadd__", "move_to_end", "__ior__"}


def call_method(frame, owner, name, args, kwargs):
    if isinstance(owner, ContextManagerValue):
        if name == "__enter__":
            enter_context(frame, owner)
        else:
            exit_context(frame, owner)
        return ConstantValue(None)
    if name in _MUTATING and isinstance(owner, (ListValue, DictValue, ConstantValue)):
        frame.tx.mark_mutated(owner, f"{owner.python_type().__name__}.{name}() on")
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
        if not items:
            raise Unsupported("list.pop() on an empty list raises IndexError")
        return items.pop(operators.as_constant(args[0]) if args else -1)
    elif name == "clear":
        items.clear()
    elif name == "reverse":
        items.reverse()
    elif name == "copy":
        return ListValue(items)
    elif name in ("index", "count"):
        return _sequence_query(frame, lst, name, args)
    elif name == "remove":
        for i, x in enumerate(items):
            if operators.is_same(x, args[0]) or (operators.is_constant(x) and operators.is_constant(args[0])
                                                  and operators.as_constant(x) == operators.as_constant(args[0])):
                del items[i]
                break
        else:
            raise Unsupported("list.remove(x): x not in list")
    elif name == "sort":
        unexpected = set(kwargs) - {"key", "reverse"}
        if args or unexpected:
            raise Unsupported("list.sort() takes only the keywords key= and reverse=")
        lst.items = sort_values(frame, items, kwargs.get("key"), kwargs.get("reverse", False))
    else:
        raise Unsupported(f"list.{name}() is not supported yet")
    return ConstantValue(None)


def _sequence_query(frame, seq, name, args):
    if name in ("index", "count"):
        consts = [operators.as_constant(x) for x in seq.items]
        target = operators.as_constant(args[0])
        try:
            return ConstantValue(getattr(consts, name)(target))
        except ValueError as e:
            raise Unsupported(f"{name}() raised ValueError: {e}") from e
    raise Unsupported(f"tuple.{name}() is not supported yet")


def _has_attr(frame, v, name):
    try:
        attrs.get_attr(frame, v, name)
    except attrs.MissingAttribute:
        return False
    return True


def _dict_method(frame, d, name, args, kwargs):
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
    if name == "update":
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
    if name == "pop":
        k = operators.key_of(args[0])
        if k in items:
            return items.pop(k)
        if len(args) > 1:
            return args[1]
        raise Unsupported(f"dict.pop(): KeyError {k!r}")
    if name == "setdefault":
        k = operators.key_of(args[0])
        if k not in items:
            items[k] = args[1] if len(args) > 1 else ConstantValue(None)
        return items[k]
    if name == "__setitem__":
        items[operators.key_of(args[0])] = args[1]
        return ConstantValue(None)
    if name == "__delitem__":
        k = operators.key_of(args[0])
        if k not in items:
            raise Unsupported(f"del on a dict: KeyError {k!r}")
        del items[k]
        return ConstantValue(None)
    if name == "popitem":
        if not items:
            raise Unsupported("dict.popitem() on an empty dict raises KeyError")
        k, v = items.popitem()
        return TupleValue([ConstantValue(k) if isinstance(k, (str, int)) else ObjectValue(k), v])
    if name == "clear":
        items.clear()
        return ConstantValue(None)
    if name == "__len__":
        return ConstantValue(len(items))
    if name == "__iter__":
        return IteratorValue(iterate(frame, d))
    if name == "move_to_end" and d.cls is collections.OrderedDict:
        k = operators.key_of(args[0])
        last = kwargs.get("last", args[1] if len(args) > 1 else ConstantValue(True))
        if k not in items:
            raise Unsupported(f"OrderedDict.move_to_end(): KeyError {k!r}")
        v = items.pop(k)
        if operators.as_constant(last):
            items[k] = v
        else:
            d.items = {k: v, **items}
        return ConstantValue(None)
    if name == "__or__" or name == "__ior__":
        other = args[0]
        if not isinstance(other, DictValue):
            raise Unsupported(f"dict | {type(other).__name__.replace('Value', '').lower()}")
        if name == "__ior__":
            items.update(other.items)
            return d
        return _new_like(d, {**items, **other.items})
    raise Unsupported(f"dict.{name}() is not supported yet")


_SET_QUERIES = {"__contains__", "__len__", "issubset", "issuperset", "isdisjoint", "union",
                "intersection", "difference", "symmetric_difference", "copy"}


def _set_method(frame, s, name, args, kwargs):
    """Methods of a set kept as a constant (sets hold only constants)."""
    if kwargs:
        raise Unsupported(f"set.{name}() with keyword arguments")
    target = s.value
    if name in ("add", "discard", "remove"):
        x = operators.as_constant(args[0])
        if name == "remove" and x not in target:
            raise Unsupported(f"set.remove(x): KeyError {x!r}")
        getattr(target, name)(x)
        return ConstantValue(None)
    if name in ("update", "difference_update", "intersection_update", "symmetric_difference_update"):
        others = [{operators.as_constant(x) for x in iterate(frame, a)} for a in args]
        getattr(target, name)(*others)
        return ConstantValue(None)
    if name == "clear":
        target.clear()
        return ConstantValue(None)
    if name == "pop":
        raise Unsupported("set.pop() removes an arbitrary element; not supported")
    if name in _SET_QUERIES:
        others = [{operators.as_constant(x) for x in iterate(frame, a)} for a in args]
        return operators.constant_value(getattr(target, name)(*others))
    raise Unsupported(f"set.{name}() is not supported yet")


_SET_INPLACE = {"|=": "update", "&=": "intersection_update", "-=": "difference_update",
                "^=": "symmetric_difference_update"}


def inplace_operator(frame, op, a, b):
    """``a op= b`` that changes the container ``a`` itself (as CPython does), or None."""
    if isinstance(a, ListValue) and op == "+=":
        items = iterate(frame, b)
        frame.tx.mark_mutated(a, "+= on")
        a.items.extend(items)
        return a
    if isinstance(a, ListValue) and op == "*=":
        n = operators.as_constant(b)
        if not isinstance(n, int):
            return None
        frame.tx.mark_mutated(a, "*= on")
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
