"""Python source that rebuilds traced values at run time.

Shared by the transformed function (rebuilding what a frame returns) and the
code at a graph break (rebuilding the live stack and locals). Tensors and
symbolic ints come from the graph's outputs or are re-read from their sources;
each symbolic container is built once, so identity between uses is kept.
"""
import collections
import copy
import dis
import functools
import itertools
import types

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ..bytecode import analysis
from ..bytecode.resume import NULL_SLOT, resume_code
from ..errors import Unsupported
from ..bytecode.resume import CLOSURE_PARAM
from ..null import NULL
from ..datamodel import class_attr
from ..guards.sources import AttrSource, ClosureSource, ObjectSource
from ..trace.python.exceptions import rebuild_expr, values_inside
from ..trace.machine.frame import PendingLocal
from ..values import arrays
from ..values.arrays import NdarrayMethodValue, NdarrayValue
from ..values.base import (MUTABLE_CONSTANT_TYPES, BoundMethodValue, CellValue, ConstantValue, ContextManagerValue,
                           DefaultDictValue, DictValue, DictViewValue, ExceptionValue, FloatTensorValue,
                           FormattedTextValue, FunctionValue, GeneratorValue, HeldValue, IteratorValue,
                           LazyIteratorValue, ListValue, MethodOfValue, ObjectValue, PartialValue,
                           PrivateObjectValue, RealCell, SymValue, TensorMethodValue, TensorValue, TracedId,
                           TupleValue, UserObjectValue, Value, held_values, holds_values, reaches)
from .added_guards import guard_reread_constant
from ..residual import as_function_subclass


class Namespace:
    """Names the generated code refers to, with their objects."""

    def __init__(self, fn_globals):
        self.ns = {"G": fn_globals, "torch": torch}
        self._ids = {}

    def ref(self, obj, hint="c"):
        key = id(obj)
        if key not in self._ids:
            name = f"__{hint}{len(self._ids)}"
            self._ids[key] = name
            self.ns[name] = obj
        return self._ids[key]

    def source(self, source):
        def render(s):
            if isinstance(s, ObjectSource):
                self.ns[s.expr()] = s.obj
            return s.expr_over(render)
        return render(source)


class Rebuilder:
    """Emits Python that rebuilds values, each symbolic container exactly once."""

    def __init__(self, ns, tensor_exprs, guards=None):
        self.ns = ns
        self.tensor_exprs = tensor_exprs
        self.guards = guards   # where a value re-read through its source adds what that read needs
        self._mutable_copies = {}   # id(real set/deque/Counter) -> its copy, made once
        self.lines = []
        self._done = {}
        self._temps = 0

    def cell(self, c):
        """A real cell for the cell value ``c``: one per trace cell (every function rebuilt over
        it, and the code resuming its frame, share it), or the real cell it was read from."""
        if isinstance(c, CellValue):
            if id(c) not in self._done:
                contents = "" if c.contents is None else self.expr(c.contents)
                self.ns.ns["__CellType"] = types.CellType
                self._done[id(c)] = self.temp(f"__CellType({contents})")
            return self._done[id(c)]
        if isinstance(c, RealCell) and isinstance(c.source, AttrSource) and c.source.attr == "cell_contents":
            return self.ns.source(c.source.base)
        if isinstance(c, RealCell) and isinstance(c.source, ClosureSource):
            return f"{CLOSURE_PARAM}[{c.source.index}]"
        raise Unsupported("cannot rebuild a closure over this cell yet")

    def _cells(self, closure):
        """Expressions for the cell objects of a closure."""
        self.ns.ns["__make_function"] = make_function
        return [self.cell(c) for c in closure]

    def _function(self, v):
        cells = self._cells(v.closure)
        defaults = f"({', '.join(self.expr(d) for d in v.defaults)}{',' if len(v.defaults) == 1 else ''})"
        kwdefaults = "{" + ", ".join(f"{k!r}: {self.expr(d)}" for k, d in v.kwdefaults.items()) + "}"
        closure = f"({', '.join(cells)}{',' if len(cells) == 1 else ''})"
        fn = self.temp(f"__make_function({self.ns.ref(v.code, 'code')}, {self.ns.ref(v.globals, 'g')}, "
                       f"{v.name!r}, {defaults}, {kwdefaults}, {closure})")
        self._done[id(v)] = fn   # an attribute may refer to the function itself
        if v.qualname != v.code.co_qualname:
            self.lines.append(f"{fn}.__qualname__ = {v.qualname!r}")
        for name, value in v.attrs.items():
            self.lines.append(f"{fn}.{name} = {self.expr(value)}")
        return fn

    def _negative_stride_view(self, v):
        """Eager NumPy's negative-stride view, made again from its base (the trace held a copy)."""
        if v.view_of is arrays.UNREBUILDABLE:
            raise Unsupported("a view of a negative-stride NumPy view (traced as a copy) outlives the graph; "
                              "it cannot be made again as NumPy's view")
        fn, args, kwargs = v.view_of
        parts = [self.expr(a) for a in args] + [f"{k}={self.expr(x)}" for k, x in kwargs.items()]
        return self.temp(f"{self.ns.ref(fn, 'view')}({', '.join(parts)})")

    def temp(self, expr):
        name = f"__v{self._temps}"
        self._temps += 1
        self.lines.append(f"{name} = {expr}")
        return name

    def bind(self, v):
        """Compute ``v`` now, into a name later uses refer to (no re-read after effects)."""
        if isinstance(v, PendingLocal):
            return self.ns.source(v.source)
        out = self.expr(v)
        # A plain name (a temp, a local, a namespace reference) cannot change under an effect.
        if not out.isidentifier() and not _is_literal(out):
            out = self.temp(out)
            self._done[id(v)] = out
        return out

    def expr(self, v):
        if isinstance(v, PendingLocal):
            return self.ns.source(v.source)
        if id(v) in self._done:
            done = self._done[id(v)]
            if done is None:
                raise Unsupported(f"cannot rebuild a {type(v).__name__} whose state refers to itself yet")
            return done
        out = self._expr(v)
        self._done[id(v)] = out
        return out

    def _expr(self, v):
        build = _builder_for(type(v))
        if build is None:
            raise Unsupported(f"cannot rebuild a {type(v).__name__} outside the graph yet")
        return build(self, v)

    # What each kind of value is rebuilt as (``_BUILDERS``, by value class).

    def _graph_value(self, v):
        """A tensor, symbolic int or float of the graph: its output, or its source re-read."""
        return self.tensor_exprs[id(v)]

    def _tensor(self, v):
        if v.selected is not None:
            # The object max()/min() chose in eager, picked again by the graph's comparisons.
            first, picks = v.selected
            out = self.expr(first)
            for cond, item in picks:
                out = f"({self.expr(item)} if {self.expr(cond)} else {out})"
            return self.temp(out)
        return self.tensor_exprs[id(v)]

    def _ndarray(self, v):
        if v.view_of is not None:
            return self._negative_stride_view(v)
        expr = self.tensor_exprs[id(v)]
        if isinstance(expr, ArrayExpr):
            return expr.text
        # Each array value is converted once: one object, however often it is used.
        convert = arrays.tensor_to_scalar if v.scalar else arrays.tensor_to_array
        return self.temp(f"{self.ns.ref(convert, convert.__name__)}({expr})")

    def _ndarray_method(self, v):
        return f"{self.expr(v.array)}.{v.name}"

    def _constant(self, v):
        if v.source is not None:
            if v._pending_guard is not None and self.guards is not None:
                guard_reread_constant(self.guards, v.source, v._value)
            return self.ns.source(v.source)
        c = v.value
        if c is None or isinstance(c, (bool, str)) or type(c) is int:
            return repr(c)
        if reaches(c, FakeTensor):
            # A fake value of the trace made into a constant would be returned in place of
            # the real tensor (a last guard: the tracer should have refused it earlier).
            raise Unsupported(f"a {type(c).__name__} holding tensors computed while tracing would be frozen "
                              "into the compiled code")
        if isinstance(c, TracedId):
            return self.traced_id(c)
        if isinstance(c, (set, frozenset, collections.deque)) and holds_values(c):
            return self.temp(self._holding(c))
        if isinstance(c, MUTABLE_CONSTANT_TYPES):
            # A set/deque/Counter made in the frame: a new copy per call, never the trace's own.
            if id(c) not in self._mutable_copies:
                self.ns.ns["__copy"] = copy.copy
                self._mutable_copies[id(c)] = self.temp(f"__copy({self.ns.ref(c)})")
            return self._mutable_copies[id(c)]
        if type(c) in (list, dict):
            # A container read from an object private to the trace: each call gets its own.
            self.ns.ns["__deepcopy"] = copy.deepcopy
            return self.temp(f"__deepcopy({self.ns.ref(c)})")
        return self.ns.ref(c)

    def _private_object(self, v):
        raise Unsupported(f"a {type(v.obj).__qualname__} object deep-copied inside the compiled function "
                          "is returned or kept after it; that is not supported yet")

    def _object(self, v):
        return self.ns.source(v.source) if v.source is not None else self.ns.ref(v.obj, "obj")

    def _tuple(self, v):
        parts = [self.expr(i) for i in v.items]
        if v.cls is tuple:
            return f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"
        if v.cls is torch.Size:
            return f"torch.Size([{', '.join(parts)}])"
        cls = self.ns.ref(v.cls, "cls")
        if hasattr(v.cls, "n_fields"):
            return f"{cls}(({', '.join(parts)},))"
        return f"{cls}({', '.join(parts)})"

    def _list(self, v):
        if v.source is not None:
            return self.ns.source(v.source)
        return self.temp(f"[{', '.join(self.expr(i) for i in v.items)}]")

    def _dict(self, v):
        if v.source is not None:
            return self.ns.source(v.source)
        body = ", ".join(f"{self.key(k)}: {self.expr(i)}" for k, i in v.items.items())
        if isinstance(v, DefaultDictValue):
            return self.temp(f"{self.ns.ref(v.cls, 'cls')}({self.expr(v.factory)}, {{{body}}})")
        if v.cls is dict:
            return self.temp(f"{{{body}}}")
        return self.temp(f"{self.ns.ref(v.cls, 'cls')}({{{body}}})")

    def _method_of(self, v):
        owner = v.owner if isinstance(v, MethodOfValue) else v.tensor
        return f"{self.expr(owner)}.{v.name}"

    def _bound_method(self, v):
        self.ns.ns["__MethodType"] = types.MethodType
        return f"__MethodType({self.expr(v.func)}, {self.expr(v.self_value)})"

    def _user_object(self, v):
        # __slots__ members are set through their descriptors; the rest is the new object's
        # own __dict__ (set past any descriptor of the class, as the trace stored it).
        slots = {k for k in v.attrs if isinstance(class_attr(v.cls, k), types.MemberDescriptorType)}
        own = ", ".join(f"{k!r}: {self.expr(i)}" for k, i in v.attrs.items() if k not in slots)
        slot_values = ", ".join(f"{k!r}: {self.expr(i)}" for k, i in v.attrs.items() if k in slots)
        self.ns.ns["__new_object"] = new_object
        items = ", ".join(f"({self.key(k)}, {self.expr(i)})" for k, i in v.dict_items.items.items()) \
            if v.dict_items is not None else None
        extra = f", [{items}]" if items is not None else (", None" if slot_values else "")
        extra += f", {{{slot_values}}}" if slot_values else ""
        return self.temp(f"__new_object({self.ns.ref(v.cls, 'cls')}, {{{own}}}{extra})")

    def _partial(self, v):
        parts = [self.expr(v.func)] + [self.expr(a) for a in v.args] \
            + [f"{k}={self.expr(a)}" for k, a in v.kwargs.items()]
        return self.temp(f"{self.ns.ref(functools.partial, 'partial')}({', '.join(parts)})")

    def _iterator(self, v):
        if v.source is not None:
            # A real iterator from outside: the same object, past what the trace took from it
            # (the side effects take those items from it before this is used).
            return self.ns.source(v.source)
        if v.remake is not None:
            # Over containers the code after a break may still change: the same lazy
            # iterator over the (rebuilt or re-read) containers, moved past what was consumed.
            maker, args = v.remake
            self.ns.ns["__advanced"] = advanced
            parts = ", ".join(self.expr(a) for a in args)
            return self.temp(f"__advanced({self.ns.ref(maker, 'builtin')}({parts}), {v.pos})")
        rest = f"[{', '.join(self.expr(i) for i in v.items[v.pos:])}]"
        maker = ITERATOR_MAKERS.get(v.cls)
        if maker is None:
            # (a tuple or range iterator too: a resume function wrapping one of those would be
            # specialized to the number of items left)
            return self.temp(f"iter({rest})")
        return self.temp(f"{self.ns.ref(maker, 'iterator_of')}({rest})")

    def _lazy_iterator(self, v):
        if v.kind not in _LAZY_REMAKE:
            raise Unsupported(f"cannot rebuild a {v.kind} iterator outside the graph yet")
        # The same combinator over its (rebuilt) parts, each already advanced as far as the
        # trace took it: a break inside ``for i, m in enumerate(self.layers)`` resumes the loop.
        if v.done:
            return self.temp("iter(())")
        return self.temp(_LAZY_REMAKE[v.kind](self, v))

    def _dict_view(self, v):
        return f"{self.expr(v.dict_value)}.{v.kind}()"

    def _exception(self, v):
        return rebuild_expr(self, v)

    def _context_manager(self, v):
        if v.kind == "inference_mode":
            return f"torch.inference_mode({v.args[0]!r})"
        raise Unsupported(f"cannot rebuild a {type(v).__name__} outside the graph yet")

    def _formatted_text(self, v):
        pieces = []
        for part in v.parts:
            if isinstance(part, str):
                pieces.append(repr(part))
                continue
            value, conv, spec = part
            inner = self.expr(value)
            if conv is not None:
                inner = f"{conv.__name__}({inner})"
            pieces.append(f"format({inner}, {spec!r})")
        return self.temp(" + ".join(pieces) if pieces else "''")

    def traced_id(self, c):
        """``id()`` of the object an id taken while tracing was of, as it is at run time."""
        if c.value is None:
            raise Unsupported("an id() taken while tracing escapes the compiled code; its value is "
                              "known only at run time", hint="compare ids inside the function only")
        return f"id({self.expr(c.value)})"

    def key(self, k):
        """A dict key as code."""
        return self.traced_id(k) if isinstance(k, TracedId) else _key_expr(k, self.ns)

    def _held(self, x):
        """An element of a real container made in the frame (a HeldValue is its value rebuilt)."""
        if isinstance(x, HeldValue):
            return self.expr(x.value)
        if isinstance(x, TracedId):
            return self.traced_id(x)
        if type(x) is tuple:
            parts = [self._held(i) for i in x]
            return f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"
        if x is None or isinstance(x, (bool, str)) or type(x) is int:
            return repr(x)
        return self.ns.ref(x)

    def _holding(self, c):
        """A new set/frozenset/deque with the elements of ``c``, which holds traced values."""
        parts = ", ".join(self._held(x) for x in c)
        if isinstance(c, collections.deque):
            return f"{self.ns.ref(collections.deque, 'cls')}([{parts}], {c.maxlen!r})"
        return f"{{{parts}}}" if type(c) is set else f"frozenset({{{parts}}})"

    def _generator(self, v):
        """A real generator in the state the trace left ``v`` in (see ``generator_state``)."""
        code = v.frame.code
        self.ns.ns.update({"__exhausted_generator": exhausted_generator, "__primed": primed})
        self._done[id(v)] = None   # being built (a reference to itself cannot be rebuilt)
        if v.state == "done":
            return self.temp(f"__exhausted_generator({code.co_name!r}, {code.co_qualname!r})")
        offset, stack, live = generator_state(v)
        layout = tuple(NULL_SLOT if x is NULL else f"__stack{i}" for i, x in enumerate(stack))
        resumed, _ = resume_code(code, offset, layout, tuple(live), code.co_qualname)
        resumed = resumed.replace(co_qualname=code.co_qualname)
        frame = v.frame
        args = [self.expr(x) for x in stack if x is not NULL]
        args += [self.expr(frame.locals[n]) for n in live]
        # The copied code runs over real cells (bytecode.resume.closure_names): the generator's
        # own cells (made now when it has not started: MAKE_CELL of an argument wraps it), then
        # its closure.
        own = [frame.cells[n] if n in frame.cells else CellValue(frame.locals.get(n)) for n in code.co_cellvars]
        cells = self._cells(own + [frame.cells[n] for n in code.co_freevars])
        closure = f"({', '.join(cells)}{',' if len(cells) == 1 else ''})"
        fn = self.temp(f"__make_function({self.ns.ref(resumed, 'code')}, {self.ns.ref(frame.globals, 'g')}, "
                       f"{code.co_name!r}, (), {{}}, {closure})")
        made = f"{fn}({', '.join(args)})"
        # Suspended: the copy starts at the same yield, and one next() stops it there.
        return self.temp(f"__primed({made})" if v.state == "suspended" else made)


# How ``Rebuilder.expr`` rebuilds a value, by its class (a subclass not listed here is rebuilt
# as its nearest listed base is).
_BUILDERS = {
    TensorValue: Rebuilder._tensor,
    SymValue: Rebuilder._graph_value,
    FloatTensorValue: Rebuilder._graph_value,
    NdarrayValue: Rebuilder._ndarray,
    NdarrayMethodValue: Rebuilder._ndarray_method,
    ConstantValue: Rebuilder._constant,
    PrivateObjectValue: Rebuilder._private_object,
    ObjectValue: Rebuilder._object,
    TupleValue: Rebuilder._tuple,
    ListValue: Rebuilder._list,
    DictValue: Rebuilder._dict,
    MethodOfValue: Rebuilder._method_of,
    TensorMethodValue: Rebuilder._method_of,
    BoundMethodValue: Rebuilder._bound_method,
    FunctionValue: Rebuilder._function,
    UserObjectValue: Rebuilder._user_object,
    PartialValue: Rebuilder._partial,
    IteratorValue: Rebuilder._iterator,
    LazyIteratorValue: Rebuilder._lazy_iterator,
    DictViewValue: Rebuilder._dict_view,
    ExceptionValue: Rebuilder._exception,
    GeneratorValue: Rebuilder._generator,
    ContextManagerValue: Rebuilder._context_manager,
    FormattedTextValue: Rebuilder._formatted_text,
}
_builder_cache = {}


def _builder_for(cls):
    """The builder of ``cls`` or of its nearest base in ``_BUILDERS``; None: cannot be rebuilt."""
    try:
        return _builder_cache[cls]
    except KeyError:
        build = next((_BUILDERS[c] for c in cls.__mro__ if c in _BUILDERS), None)
        _builder_cache[cls] = build
        return build


def generator_state(v):
    """(offset to resume at, stack values, live local names) of a generator value made in the
    trace and not finished: a created one starts at its first instruction with its arguments; a
    suspended one re-runs the yield it stopped at (with a dummy on the stack)."""
    frame = v.frame
    code = frame.code
    if v.state == "created":
        raw = [i for i in dis.get_instructions(code) if i.opname not in ("CACHE", "EXTENDED_ARG")]
        first = next(k for k, i in enumerate(raw) if i.opname == "RESUME")
        offset, stack = raw[first + 1].offset, []
    elif v.state == "suspended":
        offset, stack = frame.instructions[frame.yield_index].offset, list(frame.stack) + [ConstantValue(None)]
    else:
        raise Unsupported(f"cannot rebuild a generator that is {v.state}")
    wanted = analysis.live_locals(code, offset)
    live = [n for n in code.co_varnames if n in frame.locals and n in wanted and n not in code.co_cellvars]
    return offset, stack, live


def primed(gen):
    """``gen`` after the one step that takes it to the yield it was rebuilt at."""
    next(gen)
    return gen


def exhausted_generator(name, qualname):
    """A finished generator named like the one the trace ran to its end."""
    def gen():
        return
        yield
    gen.__name__, gen.__qualname__ = name, qualname
    made = gen()
    for _ in made:
        pass
    return made


def _is_literal(text):
    return text in ("None", "True", "False") or text.lstrip("-").isdigit() or (
        text[:1] in "'\"" and text[-1:] == text[:1])


def tensors_in(values, out):
    for v in values:
        if isinstance(v, NdarrayValue) and v.view_of is not None and v.view_of is not arrays.UNREBUILDABLE:
            tensors_in(list(v.view_of[1]) + list(v.view_of[2].values()), out)
        elif isinstance(v, TensorValue) and v.selected is not None:
            first, picks = v.selected      # rebuilt from what was chosen between (Rebuilder._expr)
            tensors_in([first] + [x for pick in picks for x in pick], out)
        elif isinstance(v, (TensorValue, SymValue, NdarrayValue, FloatTensorValue)):
            out.append(v)
        elif isinstance(v, NdarrayMethodValue):
            out.append(v.array)
        elif isinstance(v, ConstantValue):
            # (a set or deque made in the frame; an id() rebuilt as id(<the object>))
            tensors_in(held_values(v._value), out)
        elif isinstance(v, (TupleValue, ListValue)):
            tensors_in(v.items, out)
        elif isinstance(v, DictValue):
            tensors_in(v.items.values(), out)
        elif isinstance(v, IteratorValue):
            tensors_in(v.remake[1] if v.remake is not None else v.items[v.pos:], out)
        elif isinstance(v, DictViewValue):
            tensors_in([v.dict_value], out)
        elif isinstance(v, LazyIteratorValue):
            tensors_in(v.parts + [x for x in v.state.values() if isinstance(x, Value)], out)
        elif isinstance(v, PartialValue):
            tensors_in([v.func] + v.args + list(v.kwargs.values()), out)
        elif isinstance(v, TensorMethodValue):
            tensors_in([v.tensor], out)
        elif isinstance(v, MethodOfValue):
            tensors_in([v.owner], out)
        elif isinstance(v, BoundMethodValue):
            tensors_in([v.self_value], out)
        elif isinstance(v, UserObjectValue):
            tensors_in(v.attrs.values(), out)
            if v.dict_items is not None:
                tensors_in(v.dict_items.items.values(), out)
        elif isinstance(v, ExceptionValue):
            tensors_in(values_inside(v), out)
        elif isinstance(v, FormattedTextValue):
            tensors_in([p[0] for p in v.parts if not isinstance(p, str)], out)
        elif isinstance(v, GeneratorValue):
            if v.state in ("created", "suspended"):
                try:
                    _, stack, live = generator_state(v)
                except Unsupported:
                    continue
                code = v.frame.code
                cells = [v.frame.cells[n] for n in code.co_cellvars + code.co_freevars if n in v.frame.cells]
                tensors_in([x for x in stack if x is not NULL] + [v.frame.locals[n] for n in live]
                           + [c.contents for c in cells if isinstance(c, CellValue) and c.contents is not None], out)
        elif isinstance(v, FunctionValue):
            tensors_in(list(v.defaults) + list(v.kwdefaults.values()) + list(v.attrs.values())
                       + [c.contents for c in v.closure if isinstance(c, CellValue) and c.contents is not None], out)
    return out


def _lazy_parts(rb, v):
    return ", ".join(rb.expr(p) for p in v.parts)


# LazyIteratorValue kinds rebuilt at a break: the combinator over its parts as they are now.
_LAZY_REMAKE = {
    "enumerate": lambda rb, v: f"enumerate({_lazy_parts(rb, v)}, {v.state['count']!r})",
    "zip": lambda rb, v: f"zip({_lazy_parts(rb, v)}{', strict=True' if v.state.get('strict') else ''})",
    "map": lambda rb, v: f"map({rb.expr(v.state['fn'])}, {_lazy_parts(rb, v)})",
    "filter": lambda rb, v: f"filter({rb.expr(v.state['fn']) if v.state['fn'] is not None else 'None'}, "
                            f"{_lazy_parts(rb, v)})",
    "count": lambda rb, v: f"{rb.ns.ref(itertools.count, 'count')}({v.state['n']!r}, {v.state['step']!r})",
}


def _key_expr(k, ns):
    if isinstance(k, (str, int, bool)) or k is None:
        return repr(k)
    return ns.ref(k)


def _as_generator(items):
    yield from items


def _always(_):
    return True


def _never(_):
    return False


def _second(_, b):
    return b


def _same(x):
    return x


# Iterator classes the trace gives its iterators (``IteratorValue.cls``) -> a function making an
# iterator of that class over given items: what escapes the graph is of the class Python made
# (``type()``, ``isinstance(it, types.GeneratorType)`` answer the same after the call).
ITERATOR_MAKERS = {
    types.GeneratorType: _as_generator,
    itertools.chain: lambda items: itertools.chain(items),
    itertools.takewhile: lambda items: itertools.takewhile(_always, items),
    itertools.dropwhile: lambda items: itertools.dropwhile(_never, items),
    itertools.accumulate: lambda items: itertools.accumulate(items, _second),
    itertools.compress: lambda items: itertools.compress(items, itertools.repeat(True)),
    itertools.starmap: lambda items: itertools.starmap(_same, zip(items)),
}


def advanced(iterator, n):
    """``iterator`` after ``n`` items were taken from it."""
    for _ in range(n):
        next(iterator)
    return iterator


def make_function(code, fn_globals, name, defaults, kwdefaults, closure):
    fn = types.FunctionType(code, fn_globals, name, defaults or None, closure or None)
    fn.__kwdefaults__ = kwdefaults or None
    fn.__qualname__ = code.co_qualname
    return fn


def new_object(cls, own, dict_items=None, slots=None):
    """An instance of ``cls`` with these entries in its ``__dict__`` (``own``), these ``__slots__``
    members and, for a dict subclass, these items, made without calling ``__init__`` or a
    ``__setitem__`` of the class again."""
    obj = cls.__new__(cls)
    if dict_items is not None:
        # The nearest native dict type's own store keeps an OrderedDict's order bookkeeping right.
        store = next(b for b in cls.__mro__ if b.__module__ in ("builtins", "collections")).__setitem__
        for key, value in dict_items:
            store(obj, key, value)
    if own:
        obj.__dict__.update(own)
    if slots:
        for name, value in slots.items():
            object.__setattr__(obj, name, value)
    return obj


class ArrayExpr:
    """The expression of an np.ndarray value that is already an array (an array argument itself)."""
    __slots__ = ("text",)

    def __init__(self, text):
        self.text = text


def array_input_name(inp):
    """The name the transformed function gives the tensor an array argument is traced as."""
    return f"__in_{inp.node.name}"


def _function_subclass(v):
    """Is ``v`` a tensor of a ``__torch_function__`` class (a plain tensor in the graph)?"""
    cls = getattr(v, "cls", torch.Tensor)
    return isinstance(v, TensorValue) and cls is not torch.Tensor and not issubclass(cls, torch.nn.Parameter) \
        and not hasattr(cls, "__tensor_flatten__")


def _function_subclass_input(inp, v):
    """A graph input of a __torch_function__ class seen here as another class."""
    cls = inp.node.meta.get("function_subclass")
    return cls is not None and isinstance(v, TensorValue) and v.cls is not cls


def graph_value_exprs(ns, values, graph_inputs, state_root, out_var="__out"):
    """id(value) -> expression for tensors/symbolic ints/arrays, and the values the graph must output.

    Graph inputs are re-read from their sources (an array argument seen as a tensor is the
    tensor made for the graph) and module state is referenced directly; everything else is an
    output of the graph. The expression of an array value is its tensor's, converted by the
    Rebuilder, or an ArrayExpr when it is the array argument itself.
    """
    by_node = {inp.node: inp for inp in graph_inputs}
    outputs, index, exprs = [], {}, {}
    for v in values:
        inp = by_node.get(v.node)
        if inp is not None:
            if inp.array_mode is None:
                exprs[id(v)] = ns.source(inp.source)
                if _function_subclass_input(inp, v) or _function_subclass(v) and type(inp.example) is not v.cls \
                        and inp.node.meta.get("function_subclass") is not v.cls:
                    # The input's tensor as another class (a __torch_function__ class's result).
                    exprs[id(v)] = f"{ns.ref(as_function_subclass, 'as_subclass')}({exprs[id(v)]}, " \
                                   f"{ns.ref(v.cls, 'cls')})"
            elif isinstance(v, NdarrayValue):
                exprs[id(v)] = ArrayExpr(ns.source(inp.source))
            else:
                exprs[id(v)] = array_input_name(inp)
        elif v.node.op == "get_attr":
            exprs[id(v)] = ns.ref(getattr(state_root, v.node.target), "state")
        else:
            if v.node not in index:
                index[v.node] = len(outputs)
                outputs.append(v)
            exprs[id(v)] = f"{out_var}[{index[v.node]}]"
            if _function_subclass(v):
                # A result of a __torch_function__ class's op: a plain tensor from the graph.
                exprs[id(v)] = f"{ns.ref(as_function_subclass, 'as_subclass')}({exprs[id(v)]}, {ns.ref(v.cls, 'cls')})"
            if isinstance(v, FloatTensorValue):
                exprs[id(v)] += ".item()"    # a Python float again outside the graph
    return exprs, outputs
