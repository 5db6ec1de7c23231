"""Lazy generators and lazy iterators.

A generator function called in the trace gives a ``GeneratorValue`` holding a
suspended ``Frame``; each ``next()`` / FOR_ITER / ``send()`` resumes that frame
until its next YIELD_VALUE (which suspends it again) or its return, so the
generator's effects interleave with the consumer's exactly as in Python.
``zip``/``enumerate``/``map``/``filter``/``itertools.islice``/``itertools.count``
over such iterators are ``LazyIteratorValue``s that pull items one at a time
in CPython's order. ``next_item`` is the one way to advance any iterator value.
"""
from __future__ import annotations

import itertools

import torch

from ...bytecode.analysis import inside_user_handler
from ...bytecode.versions import CLOSE_RETURNS_VALUE
from ...errors import Unsupported
from ...values.base import (BoundMethodValue, CellValue, ConstantValue, DictValue, DictViewValue, ExceptionValue,
                           FunctionValue, GeneratorValue, IteratorValue, LazyIteratorValue, ListValue,
                           MethodOfValue, ObjectValue, PartialValue, TensorValue, TracerCallableValue, TupleValue,
                           UserObjectValue, Value, held_values)
from . import attrs, protocols
from ..core import ops
from ..numpy_api import numpy_calls
from ..core.basics import as_constant
from .exceptions import TracedRaise, new, raise_new, to_exception, unwind
from .operators import element_equal, truth
from ..core.context import RunningFrame

EXHAUSTED = object()   # next_item's answer when the iterator is done


def make_generator(frame, name):
    gen = GeneratorValue(frame, name)
    frame.generator = gen
    root = frame.tx.frames[0] if frame.tx.frames else None
    # Remember where the compiled frame was when the generator was made: if it cannot be
    # finished in the trace, the frame breaks there and the generator is made natively.
    root_index = root.current.index if root is not None and root.current is not None else None
    frame.made_at_root_index = root_index
    frame.tx.__dict__.setdefault("generators", []).append((gen, root_index))
    return gen


def is_lazy(v):
    """An iterator value whose items are computed as it is advanced (see ``next_item``)."""
    return isinstance(v, (GeneratorValue, LazyIteratorValue))


# --- running a generator's frame -----------------------------------------------------------

def resume(gen, sent=None, thrown=None):
    """Run ``gen`` to its next yield: ("yield", value) or ("return", value); raises TracedRaise."""
    frame = gen.frame
    if gen.state == "running":
        raise_new(ValueError, "generator already executing")
    if gen.state == "done":
        if thrown is not None:
            raise TracedRaise(thrown)
        return "return", ConstantValue(None)
    if gen.state == "created":
        if thrown is not None:
            gen.state = "done"
            raise TracedRaise(thrown)
        if sent is not None and not (isinstance(sent, ConstantValue) and sent.value is None):
            raise_new(TypeError, "can't send non-None value to a just-started generator")
    elif thrown is not None:
        if frame.yield_from:
            raise Unsupported("throw() into a generator suspended in `yield from` is not supported yet")
        if not unwind(frame, thrown, frame.yield_index):
            gen.state = "done"
            raise TracedRaise(thrown)
    else:
        frame.push(sent if sent is not None else ConstantValue(None))
    gen.state = "running"
    frame.done = False
    frame.suspended = False
    # The generator's own handled exception stacks on the caller's (CPython's exc_info chain).
    tx = frame.tx
    tx.outer_handled.append(tx.handled_exception)
    tx.handled_exception = frame.own_handled
    try:
        result = frame.run()
    except TracedRaise as e:
        gen.state = "done"
        if e.value.root_index is None:
            # If it escapes the compiled frame, replay from where the generator was made
            # (the consumer's stack holds the generator, which cannot be rebuilt).
            e.value.root_index = getattr(frame, "made_at_root_index", None)
        if issubclass(e.value.cls, StopIteration):
            err = new(RuntimeError, "generator raised StopIteration")
            err.cause = err.context = e.value
            err.suppress_context = True
            raise TracedRaise(err) from None
        raise
    except BaseException:
        gen.state = "done"
        raise
    finally:
        frame.own_handled = tx.handled_exception
        tx.handled_exception = tx.outer_handled.pop()
    if frame.suspended:
        gen.state = "suspended"
        return "yield", frame.yielded
    gen.state = "done"
    return "return", result


def check_finished_generators(tx, live=()):
    """At the end of the trace (or at a break): a generator left suspended inside try/with would
    run its handlers when Python closes it; that cannot be traced, so such frames run eagerly.
    Generators reachable from ``live`` (returned, stored, or live at the break) are rebuilt
    suspended instead, and closed by Python whenever that happens."""
    made = tx.__dict__.get("generators", ())
    if not any(gen.state == "suspended" for gen, _ in made):
        return
    escaping = reachable_generators(list(live) + stored_values(tx))
    for gen, root_index in made:
        if gen.state != "suspended" or id(gen) in escaping:
            continue
        frame = gen.frame
        if inside_user_handler(frame.code, frame.instructions[frame.yield_index].offset) \
                and not _closes_quietly(tx, gen):
            err = Unsupported(f"generator {gen.name}() left suspended inside try/with "
                              "(closing it would run its handlers)")
            err.root_index = root_index
            raise err


def stored_values(tx):
    """Values the trace's side effects store into state that outlives it."""
    out = tx.effects.stored_values() + list(tx.effects.mutated.values())
    return [v for v in out if isinstance(v, Value)]


def reachable_generators(values):
    """ids of the generator values reachable from ``values`` (through containers, objects,
    functions, iterators and the frames of other generators)."""
    found, seen = set(), set()
    todo = list(values)
    while todo:
        v = todo.pop()
        if not isinstance(v, Value) or id(v) in seen:
            continue
        seen.add(id(v))
        if isinstance(v, GeneratorValue):
            found.add(id(v))
            f = v.frame
            todo += f.stack + list(f.locals.values())
            todo += [c.contents for c in f.cells.values() if isinstance(c, CellValue)]
        elif isinstance(v, (TupleValue, ListValue, IteratorValue)):
            todo += v.items
        elif isinstance(v, DictValue):
            todo += list(v.items.values())
        elif isinstance(v, UserObjectValue):
            todo += list(v.attrs.values())
            if v.dict_items is not None:
                todo.append(v.dict_items)
        elif isinstance(v, LazyIteratorValue):
            todo += v.parts + [x for x in v.state.values() if isinstance(x, Value)]
        elif isinstance(v, FunctionValue):
            todo += list(v.defaults) + list(v.kwdefaults.values()) + list(v.attrs.values())
            todo += [c.contents for c in v.closure if isinstance(c, CellValue)]
        elif isinstance(v, PartialValue):
            todo += [v.func] + v.args + list(v.kwargs.values())
        elif isinstance(v, BoundMethodValue):
            todo += [v.func, v.self_value]
        elif isinstance(v, (MethodOfValue, DictViewValue)):
            todo.append(v.owner if isinstance(v, MethodOfValue) else v.dict_value)
        elif isinstance(v, ExceptionValue):
            todo += list(v.args) + list(v.attrs.values())
        elif isinstance(v, ConstantValue):
            todo += held_values(v._value)
    return found


def _closes_quietly(tx, gen):
    """Close ``gen`` in the trace (GeneratorExit at its yield): True if its handlers let the
    exception through without doing anything observable (e.g. ``except IndexError:``), so
    when Python closes it does not matter."""
    nodes = len(tx.graph.graph.nodes)
    effects = tx.effects.count()
    try:
        resume(gen, thrown=new(GeneratorExit))
    except TracedRaise as e:
        return issubclass(e.value.cls, GeneratorExit) and len(tx.graph.graph.nodes) == nodes \
            and tx.effects.count() == effects
    except Unsupported:
        return False
    return False   # it yielded again or returned: Python would raise or run code


# --- advancing iterator values -------------------------------------------------------------

def next_item(frame, it):
    """The next item of an iterator value, or EXHAUSTED."""
    if isinstance(it, IteratorValue):
        if it.pos < len(it.items):
            it.pos += 1
            return it.items[it.pos - 1]
        return EXHAUSTED
    if isinstance(it, GeneratorValue):
        kind, value = resume(it)
        return value if kind == "yield" else EXHAUSTED
    if isinstance(it, LazyIteratorValue):
        if it.done:
            return EXHAUSTED
        item = _LAZY_NEXT[it.kind](frame, it)
        if item is EXHAUSTED:
            it.done = True
        return item
    if has_python_next(it):
        return _python_next(frame, it)
    raise Unsupported(f"next() on {attrs.describe(it)} is not supported yet")


def drain(frame, it):
    items = []
    while True:
        item = next_item(frame, it)
        if item is EXHAUSTED:
            return items
        items.append(item)


def extend_from(frame, items, it):
    """Append the items of ``it`` to the list ``items`` one at a time (an exception keeps those so far)."""
    while True:
        item = next_item(frame, it)
        if item is EXHAUSTED:
            return
        items.append(item)


def take(frame, it, n):
    """Up to ``n`` next items of an iterator value."""
    items = []
    while len(items) < n:
        item = next_item(frame, it)
        if item is EXHAUSTED:
            break
        items.append(item)
    return items


def _zip_next(frame, it):
    items = []
    for part in it.parts:
        item = next_item(frame, part)
        if item is EXHAUSTED:
            if it.state.get("strict") and (items or any(next_item(frame, p) is not EXHAUSTED for p in it.parts[1:])):
                raise Unsupported("zip(strict=True) on iterators of different lengths raises")
            return EXHAUSTED
        items.append(item)
    return TupleValue(items)


def _enumerate_next(frame, it):
    item = next_item(frame, it.parts[0])
    if item is EXHAUSTED:
        return EXHAUSTED
    n = it.state["count"]
    it.state["count"] = n + 1
    return TupleValue([ConstantValue(n), item])


def _map_next(frame, it):
    args = []
    for part in it.parts:
        item = next_item(frame, part)
        if item is EXHAUSTED:
            return EXHAUSTED
        args.append(item)
    return ops.call(frame, it.state["fn"], args, {})


def _filter_next(frame, it):
    fn = it.state["fn"]
    while True:
        item = next_item(frame, it.parts[0])
        if item is EXHAUSTED:
            return EXHAUSTED
        keep = item if fn is None else ops.call(frame, fn, [item], {})
        if truth(frame, keep):
            return item


def _islice_next(frame, it):
    # CPython's islice_next, step for step: which items are pulled matters.
    s = it.state
    stop = s["stop"]
    while s["cnt"] < s["next"]:
        if next_item(frame, it.parts[0]) is EXHAUSTED:
            return EXHAUSTED
        s["cnt"] += 1
    if stop is not None and s["cnt"] >= stop:
        return EXHAUSTED
    item = next_item(frame, it.parts[0])
    if item is EXHAUSTED:
        return EXHAUSTED
    s["cnt"] += 1
    old = s["next"]
    s["next"] += s["step"]
    if s["next"] < old or (stop is not None and s["next"] > stop):
        s["next"] = stop
    return item


def _count_next(frame, it):
    n = it.state["n"]
    it.state["n"] = n + it.state["step"]
    return ConstantValue(n)


def has_python_next(obj):
    """True for an object of a user class whose ``__next__`` is Python code (a user iterator)."""
    return protocols.has_special_method(obj, "__next__")


def _python_next(frame, obj):
    try:
        return user_dunder(frame, obj, "__next__", [])
    except TracedRaise as e:
        if issubclass(e.value.cls, StopIteration):
            return EXHAUSTED
        raise


def _sequence_next(frame, it):
    # Old-style iteration: __getitem__(0), (1), ... until IndexError or StopIteration.
    i = it.state["i"]
    try:
        item = ops.call(frame, it.state["getitem"], [ConstantValue(i)], {})
    except TracedRaise as e:
        if issubclass(e.value.cls, (IndexError, StopIteration)):
            return EXHAUSTED
        raise
    it.state["i"] = i + 1
    return item


_NOTHING = object()   # groupby: no current value / key yet


def _groupby_step(frame, it):
    """Take the next value of the grouped iterator and its key; False when it is exhausted."""
    s = it.state
    value = next_item(frame, it.parts[0])
    if value is EXHAUSTED:
        return False
    s["currkey"] = value if s["key"] is None else ops.call(frame, s["key"], [value], {})
    s["currvalue"] = value
    return True


def _groupby_next(frame, it):
    # CPython's groupby_next, step for step: which items are pulled, and when, matters.
    s = it.state
    s["grouper"] = None
    while True:
        if s["currkey"] is _NOTHING:
            pass
        elif s["tgtkey"] is _NOTHING or not element_equal(frame, s["tgtkey"], s["currkey"]):
            break
        if not _groupby_step(frame, it):
            return EXHAUSTED
    s["tgtkey"] = s["currkey"]
    grouper = LazyIteratorValue("grouper", [], {"parent": it, "tgtkey": s["tgtkey"]})
    s["grouper"] = grouper
    return TupleValue([s["currkey"], grouper])


def _grouper_next(frame, it):
    parent = it.state["parent"]
    s = parent.state
    if s["grouper"] is not it:
        return EXHAUSTED   # the groupby moved on: this group is over
    if s["currvalue"] is _NOTHING and not _groupby_step(frame, parent):
        return EXHAUSTED
    if not element_equal(frame, it.state["tgtkey"], s["currkey"]):
        return EXHAUSTED
    value = s["currvalue"]
    s["currvalue"] = s["currkey"] = _NOTHING
    return value


def groupby(frame, args, kwargs):
    if len(args) > 2 or set(kwargs) - {"iterable", "key"}:
        raise_new(TypeError, "groupby() takes at most 2 arguments")
    source = kwargs.get("iterable", args[0] if args else None)
    key = kwargs.get("key", args[1] if len(args) > 1 else None)
    if key is not None and isinstance(key, ConstantValue) and key.value is None:
        key = None
    return LazyIteratorValue("groupby", [get_iter(frame, source)],
                             {"key": key, "tgtkey": _NOTHING, "currkey": _NOTHING, "currvalue": _NOTHING,
                              "grouper": None})


_LAZY_NEXT = {"groupby": _groupby_next, "grouper": _grouper_next, "zip": _zip_next, "enumerate": _enumerate_next, "map": _map_next,
              "filter": _filter_next, "islice": _islice_next, "count": _count_next,
              "sequence": _sequence_next}


# --- iter() and the iteration protocol of user objects ----------------------------------------

def get_iter(frame, v):
    """``iter(v)``: iterators are their own iterators; user classes run ``__iter__``."""
    if isinstance(v, (IteratorValue, GeneratorValue, LazyIteratorValue)):
        return v
    if numpy_calls.involves_arrays(v):
        return IteratorValue(numpy_calls.iterate(frame, v))
    user = user_iterator(frame, v)
    if user is not None:
        return user
    return IteratorValue(ops.iterate(frame, v), origins=iterated_containers([v]), remake=(iter, [v]),
                         cls=result_class(iter, v))


def result_class(fn, v):
    """The class of ``fn(v)`` in Python (``iter``, ``reversed``: which iterator class), asked of
    a stand-in of ``v``'s kind (its value where it is a constant: a string's iterator depends
    on its characters), or None where the trace cannot say."""
    try:
        if isinstance(v, ConstantValue):
            sample = v.value
        elif isinstance(v, DictViewValue):
            sample = getattr(v.dict_value.python_type()(), v.kind)()
        elif isinstance(v, (TupleValue, ListValue, DictValue)):
            sample = v.python_type()()
        elif isinstance(v, TensorValue):
            sample = _TENSOR_SAMPLE
        else:
            return None
        return type(fn(sample))
    except Exception:      # noqa: BLE001 - a class that cannot be made empty: not known
        return None


_TENSOR_SAMPLE = torch.empty(1)


def user_iterator(frame, v):
    """The iterator of an object of a user class (``__iter__`` or ``__getitem__``), or None."""
    if protocols.has_special_method(v, "__iter__"):
        it = protocols.call_special_method(frame, v, "__iter__", [])
        if isinstance(it, (IteratorValue, GeneratorValue, LazyIteratorValue)) or has_python_next(it):
            return it
        raise Unsupported(f"__iter__ of {attrs.describe(v)} returned {attrs.describe(it)}")
    if protocols.has_special_method(v, "__getitem__") and getattr(
            type(v.obj) if isinstance(v, ObjectValue) else v.python_type(), "__iter__", None) is None:
        # The old sequence protocol: v[0], v[1]... until IndexError.
        return LazyIteratorValue("sequence", [v], {"i": 0, "getitem": attrs.get_attr(frame, v, "__getitem__")})
    return None


# --- the containers an iterator reads -------------------------------------------------------

def iterated_containers(values):
    """The lists/dicts an iterator over ``values`` reads lazily in eager (see FOR_ITER)."""
    out = []
    for v in values:
        if isinstance(v, DictViewValue):
            v = v.dict_value
        if isinstance(v, (ListValue, DictValue)):
            out.append(v)
    return out


def check_unchanged(it):
    """Before taking the next item of an iterator value: the containers it reads are unchanged."""
    for origin, then in it.origins:
        now = origin.items
        same = list(now) == then if isinstance(now, dict) else (
            len(now) == len(then) and all(a is b for a, b in zip(now, then)))
        if not same:
            raise Unsupported(f"the {origin.python_type().__name__} being iterated over was changed "
                              "while iterating; this is not supported")


# --- builtins over lazy iterators (hooks from trace/callables/calls.py) -----------------------------------

def lazy_zip(frame, args, kwargs):
    strict = as_constant(kwargs.get("strict", ConstantValue(False)))
    return LazyIteratorValue("zip", [get_iter(frame, a) for a in args], {"strict": strict})


def lazy_enumerate(frame, args, kwargs):
    start = as_constant(kwargs.get("start", args[1] if len(args) > 1 else ConstantValue(0)))
    return LazyIteratorValue("enumerate", [get_iter(frame, args[0])], {"count": start})


def lazy_map(frame, args, kwargs):
    if kwargs or len(args) < 2:
        raise Unsupported("map() with keyword arguments or no iterable")
    return LazyIteratorValue("map", [get_iter(frame, a) for a in args[1:]], {"fn": args[0]})


def lazy_filter(frame, args, kwargs):
    fn = args[0]
    if isinstance(fn, ConstantValue) and fn.value is None:
        fn = None
    return LazyIteratorValue("filter", [get_iter(frame, args[1])], {"fn": fn})


def islice(frame, args, kwargs):
    if kwargs:
        raise_new(TypeError, "islice() takes no keyword arguments")
    bounds = [as_constant(a) for a in args[1:]]
    if len(bounds) == 1:
        start, stop, step = 0, bounds[0], 1
    else:
        start, stop, step = (bounds + [None])[:3]
        start = 0 if start is None else start
        step = 1 if step is None else step
    for b in (start, stop, step):
        if b is not None and (not isinstance(b, int) or b < 0):
            raise Unsupported("islice() bounds that are not non-negative ints raise ValueError")
    if step == 0:
        raise Unsupported("islice() with step 0 raises ValueError")
    return LazyIteratorValue("islice", [get_iter(frame, args[0])],
                             {"next": start, "stop": stop, "step": step, "cnt": 0})


def count(frame, args, kwargs):
    start = as_constant(kwargs.get("start", args[0] if args else ConstantValue(0)))
    step = as_constant(kwargs.get("step", args[1] if len(args) > 1 else ConstantValue(1)))
    return LazyIteratorValue("count", [], {"n": start, "step": step})


def builtin_next(frame, args, kwargs):
    it = args[0]
    if has_python_next(it) and len(args) == 1:
        return user_dunder(frame, it, "__next__", [])
    if not (isinstance(it, (IteratorValue, GeneratorValue, LazyIteratorValue)) or has_python_next(it)):
        raise Unsupported(f"next() on {attrs.describe(it)} is not supported yet")
    if isinstance(it, GeneratorValue):
        kind, value = resume(it)
        if kind == "yield":
            return value
        if len(args) > 1:
            return args[1]
        raise_new(StopIteration, value.value) if isinstance(value, ConstantValue) else _stop(value)
    item = next_item(frame, it)
    if item is EXHAUSTED:
        if len(args) > 1:
            return args[1]
        raise_new(StopIteration)
    return item


def _stop(value):
    exc = new(StopIteration)
    exc.args = [value]
    exc.attrs["value"] = value
    raise TracedRaise(exc)


def is_iterated_for_contains(v):
    """``x in v`` goes through iteration: an iterator, or a user iterable without ``__contains__``."""
    if isinstance(v, IteratorValue) or is_lazy(v) or has_python_next(v):
        return True
    return not protocols.has_special_method(v, "__contains__") and (
        protocols.has_special_method(v, "__iter__") or protocols.has_special_method(v, "__getitem__"))


def contains_by_iteration(frame, v, item):
    """``item in v`` by iterating: stops at the first equal item (the rest stays unconsumed)."""
    it = get_iter(frame, v)
    while True:
        element = next_item(frame, it)
        if element is EXHAUSTED:
            return False
        if element_equal(frame, element, item):
            return True


def any_all(frame, fn, it):
    while True:
        item = next_item(frame, it)
        if item is EXHAUSTED:
            return ConstantValue(fn is all)
        if truth(frame, item) == (fn is any):
            return ConstantValue(fn is any)


# --- generator methods: send, throw, close ------------------------------------------------------

def get_attr(frame: RunningFrame, gen: Value, name: str) -> Value:

    def send(f, args, kwargs):
        kind, value = resume(gen, sent=args[0])
        if kind == "yield":
            return value
        _stop(value) if not (isinstance(value, ConstantValue) and value.value is None) else raise_new(StopIteration)

    def next_(f, args, kwargs):
        return builtin_next(f, [gen], {})

    def throw(f, args, kwargs):
        exc = to_exception(f, args[0])
        kind, value = resume(gen, thrown=exc)
        if kind == "yield":
            return value
        _stop(value) if not (isinstance(value, ConstantValue) and value.value is None) else raise_new(StopIteration)

    def close(f, args, kwargs):
        if gen.state != "suspended":
            gen.state = "done"
            return ConstantValue(None)
        # GeneratorExit at the yield: its finally blocks and handlers run (traced).
        try:
            kind, value = resume(gen, thrown=new(GeneratorExit))
        except TracedRaise as e:
            if issubclass(e.value.cls, (GeneratorExit, StopIteration)):
                return ConstantValue(None)
            raise
        if kind == "yield":
            raise_new(RuntimeError, "generator ignored GeneratorExit")
        return value if CLOSE_RETURNS_VALUE else ConstantValue(None)

    methods = {"send": send, "__next__": next_, "throw": throw, "close": close}
    if name in methods:
        return TracerCallableValue(f"generator.{name}", methods[name])
    if name == "__name__":
        return ConstantValue(gen.name)
    raise Unsupported(f"attribute {name!r} of a generator is not supported yet")


# Builtins folded on constants that consume a whole iterable argument before returning:
# a lazy iterator passed to them can be drained into a list first.
_CONSUMERS = {sorted, min, max, set, frozenset, str.join, bytes.join}


def materialize_args(frame, fn, args):
    consumes = fn in _CONSUMERS or getattr(fn, "__name__", None) == "join" and isinstance(
        getattr(fn, "__self__", None), (str, bytes))
    if not consumes or not any(is_lazy(a) for a in args):
        return args
    return [ListValue(drain(frame, a)) if is_lazy(a) else a for a in args]


def user_dunder(frame, obj, name, args):
    """``type(obj).<name>(obj, *args)`` for a special method written in Python, or None."""
    if not protocols.has_special_method(obj, name):
        return None
    return protocols.call_special_method(frame, obj, name, args)


LAZY_BUILTINS = {itertools.islice: islice, itertools.count: count, itertools.groupby: groupby}
