"""Methods of symbolic containers: lists, dicts and tuples made or read while tracing.

Containers that exist outside the traced code (they have a source) are read
only; mutating them is a side effect the core tracer does not replay yet.
"""
import collections

from ..errors import Unsupported
from ..values.base import (ConstantValue, ContextManagerValue, DefaultDictValue, DictValue,
                           DictViewValue, ListValue, TupleValue)
from ..values.builder import constant
from . import operators
from .iteration import iterate

_MUTATING = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse",
             "update", "setdefault", "popitem", "__setitem__", "__delitem__", "move_to_end", "__ior__"}


def call_method(frame, owner, name, args, kwargs):
    if isinstance(owner, ContextManagerValue):
        from .calls import enter_context, exit_context
        if name == "__enter__":
            enter_context(frame, owner)
        else:
            exit_context(frame, owner)
        return ConstantValue(None)
    if name in _MUTATING and owner.source is not None:
        raise Unsupported(f"{type(owner).__name__.replace('Value', '').lower()}.{name}() on an object that exists "
                          "outside the compiled function (a side effect) is not supported yet")
    if isinstance(owner, ListValue):
        return _list_method(frame, owner, name, args, kwargs)
    if isinstance(owner, DictValue):
        return _dict_method(frame, owner, name, args, kwargs)
    if isinstance(owner, TupleValue):
        if name in ("_replace", "_asdict") and hasattr(owner.cls, "_fields"):
            return _namedtuple_method(frame, owner, name, args, kwargs)
        return _sequence_query(frame, owner, name, args)
    raise Unsupported(f"method {name} of {type(owner).__name__} is not supported yet")


def _list_method(frame, lst, name, args, kwargs):
    items = lst.items
    if name == "append":
        items.append(args[0])
    elif name == "extend":
        items.extend(iterate(frame, args[0]))
    elif name == "insert":
        items.insert(operators.as_constant(args[0]), args[1])
    elif name == "pop":
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
        from .calls import sort_values
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
    if name == "clear":
        items.clear()
        return ConstantValue(None)
    if name == "popitem":
        if not items:
            raise Unsupported("dict.popitem(): the dict is empty (KeyError)")
        last = kwargs.get("last", args[0] if args else ConstantValue(True))
        if operators.as_constant(last):
            k = next(reversed(items))
        else:
            k = next(iter(items))
        return TupleValue([constant(k), items.pop(k)])
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
