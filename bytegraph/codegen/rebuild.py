"""Python source that rebuilds traced values at run time.

Shared by the transformed function (rebuilding what a frame returns) and the
code at a graph break (rebuilding the live stack and locals). Tensors and
symbolic ints come from the graph's outputs or are re-read from their sources;
each symbolic container is built once, so identity between uses is kept.
"""
import copy
import functools
import types

import torch

from ..errors import Unsupported
from ..guards.sources import AttrSource, ObjectSource
from ..trace.exceptions import rebuild_expr, values_inside
from ..trace.frame import PendingLocal
from ..values.base import (BoundMethodValue, CellValue, ConstantValue, DefaultDictValue, DictValue, FloatTensorValue,
                           DictViewValue, ExceptionValue, FunctionValue, IteratorValue, ListValue,
                           PartialValue, PrivateObjectValue, RealCell,
                           MethodOfValue, ObjectValue, SymValue, TensorMethodValue, TensorValue,
                           MUTABLE_CONSTANT_TYPES, TracedId, TupleValue, UserObjectValue)


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

    def __init__(self, ns, tensor_exprs):
        self.ns = ns
        self.tensor_exprs = tensor_exprs
        self._mutable_copies = {}   # id(real set/deque/Counter) -> its copy, made once
        self.lines = []
        self._done = {}
        self._temps = 0

    def _function(self, v):
        cells = []
        for cell in v.closure:
            if isinstance(cell, CellValue):
                if id(cell) not in self._done:
                    contents = "" if cell.contents is None else self.expr(cell.contents)
                    self._done[id(cell)] = self.temp(f"__CellType({contents})")
                cells.append(self._done[id(cell)])
            elif isinstance(cell, RealCell) and isinstance(cell.source, AttrSource) \
                    and cell.source.attr == "cell_contents":
                cells.append(self.ns.source(cell.source.base))
            else:
                raise Unsupported("cannot rebuild a closure over this cell yet")
        self.ns.ns.update({"__make_function": make_function, "__CellType": types.CellType})
        defaults = f"({', '.join(self.expr(d) for d in v.defaults)}{',' if len(v.defaults) == 1 else ''})"
        kwdefaults = "{" + ", ".join(f"{k!r}: {self.expr(d)}" for k, d in v.kwdefaults.items()) + "}"
        closure = f"({', '.join(cells)}{',' if len(cells) == 1 else ''})"
        return self.temp(f"__make_function({self.ns.ref(v.code, 'code')}, {self.ns.ref(v.globals, 'g')}, "
                         f"{v.name!r}, {defaults}, {kwdefaults}, {closure})")

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
            return self._done[id(v)]
        out = self._expr(v)
        self._done[id(v)] = out
        return out

    def _expr(self, v):
        if isinstance(v, (TensorValue, SymValue, FloatTensorValue)):
            return self.tensor_exprs[id(v)]
        if isinstance(v, ConstantValue):
            if v.source is not None:
                return self.ns.source(v.source)
            c = v.value
            if c is None or isinstance(c, (bool, str)) or type(c) is int:
                return repr(c)
            if isinstance(c, TracedId):
                raise Unsupported("an id() taken while tracing escapes the compiled code; its value is "
                                  "known only at run time", hint="compare ids inside the function only")
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
        if isinstance(v, PrivateObjectValue):
            raise Unsupported(f"a {type(v.obj).__qualname__} object deep-copied inside the compiled function "
                              "is returned or kept after it; that is not supported yet")
        if isinstance(v, ObjectValue):
            return self.ns.source(v.source) if v.source is not None else self.ns.ref(v.obj, "obj")
        if isinstance(v, TupleValue):
            parts = [self.expr(i) for i in v.items]
            if v.cls is tuple:
                return f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"
            if v.cls is torch.Size:
                return f"torch.Size([{', '.join(parts)}])"
            cls = self.ns.ref(v.cls, "cls")
            if hasattr(v.cls, "n_fields"):
                return f"{cls}(({', '.join(parts)},))"
            return f"{cls}({', '.join(parts)})"
        if isinstance(v, ListValue):
            if v.source is not None:
                return self.ns.source(v.source)
            return self.temp(f"[{', '.join(self.expr(i) for i in v.items)}]")
        if isinstance(v, DictValue):
            if v.source is not None:
                return self.ns.source(v.source)
            body = ", ".join(f"{_key_expr(k, self.ns)}: {self.expr(i)}" for k, i in v.items.items())
            if isinstance(v, DefaultDictValue):
                return self.temp(f"{self.ns.ref(v.cls, 'cls')}({self.expr(v.factory)}, {{{body}}})")
            if v.cls is dict:
                return self.temp(f"{{{body}}}")
            return self.temp(f"{self.ns.ref(v.cls, 'cls')}({{{body}}})")
        if isinstance(v, (MethodOfValue, TensorMethodValue)):
            owner = v.owner if isinstance(v, MethodOfValue) else v.tensor
            return f"{self.expr(owner)}.{v.name}"
        if isinstance(v, BoundMethodValue):
            return f"__MethodType({self.expr(v.func)}, {self.expr(v.self_value)})"
        if isinstance(v, FunctionValue):
            return self._function(v)
        if isinstance(v, UserObjectValue):
            body = ", ".join(f"{k!r}: {self.expr(i)}" for k, i in v.attrs.items())
            self.ns.ns["__new_object"] = new_object
            if v.dict_items is None:
                return self.temp(f"__new_object({self.ns.ref(v.cls, 'cls')}, {{{body}}})")
            items = ", ".join(f"({_key_expr(k, self.ns)}, {self.expr(i)})" for k, i in v.dict_items.items.items())
            return self.temp(f"__new_object({self.ns.ref(v.cls, 'cls')}, {{{body}}}, [{items}])")
        if isinstance(v, PartialValue):
            parts = [self.expr(v.func)] + [self.expr(a) for a in v.args] \
                + [f"{k}={self.expr(a)}" for k, a in v.kwargs.items()]
            return self.temp(f"{self.ns.ref(functools.partial, 'partial')}({', '.join(parts)})")
        if isinstance(v, IteratorValue):
            if v.remake is not None:
                # Over containers the code after a break may still change: the same lazy
                # iterator over the (rebuilt or re-read) containers, moved past what was consumed.
                maker, args = v.remake
                self.ns.ns["__advanced"] = advanced
                parts = ", ".join(self.expr(a) for a in args)
                return self.temp(f"__advanced({self.ns.ref(maker, 'builtin')}({parts}), {v.pos})")
            rest = v.items[v.pos:]
            return self.temp(f"iter([{', '.join(self.expr(i) for i in rest)}])")
        if isinstance(v, DictViewValue):
            return f"{self.expr(v.dict_value)}.{v.kind}()"
        if isinstance(v, ExceptionValue):
            return rebuild_expr(self, v)
        raise Unsupported(f"cannot rebuild a {type(v).__name__} outside the graph yet")


def _is_literal(text):
    return text in ("None", "True", "False") or text.lstrip("-").isdigit() or (
        text[:1] in "'\"" and text[-1:] == text[:1])


def tensors_in(values, out):
    for v in values:
        if isinstance(v, (TensorValue, SymValue, FloatTensorValue)):
            out.append(v)
        elif isinstance(v, (TupleValue, ListValue)):
            tensors_in(v.items, out)
        elif isinstance(v, DictValue):
            tensors_in(v.items.values(), out)
        elif isinstance(v, IteratorValue):
            tensors_in(v.remake[1] if v.remake is not None else v.items[v.pos:], out)
        elif isinstance(v, DictViewValue):
            tensors_in([v.dict_value], out)
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
        elif isinstance(v, FunctionValue):
            tensors_in(list(v.defaults) + list(v.kwdefaults.values())
                       + [c.contents for c in v.closure if isinstance(c, CellValue) and c.contents is not None], out)
    return out


def _key_expr(k, ns):
    if isinstance(k, (str, int, bool)) or k is None:
        return repr(k)
    return ns.ref(k)


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


def new_object(cls, attrs, dict_items=None):
    """An instance of ``cls`` with these attributes (and, for a dict subclass, these items),
    made without calling ``__init__`` or a ``__setitem__`` of the class again."""
    obj = cls.__new__(cls)
    if dict_items is not None:
        # The nearest native dict type's own store keeps an OrderedDict's order bookkeeping right.
        store = next(b for b in cls.__mro__ if b.__module__ in ("builtins", "collections")).__setitem__
        for key, value in dict_items:
            store(obj, key, value)
    for name, value in attrs.items():
        object.__setattr__(obj, name, value)
    return obj


def graph_value_exprs(ns, values, graph_inputs, state_root, out_var="__out"):
    """id(value) -> expression for tensors/symbolic ints, and the values the graph must output.

    Graph inputs are re-read from their sources and module state is referenced
    directly; everything else is an output of the graph.
    """
    by_node = {inp.node: inp for inp in graph_inputs}
    outputs, index, exprs = [], {}, {}
    for v in values:
        inp = by_node.get(v.node)
        if inp is not None:
            exprs[id(v)] = ns.source(inp.source)
        elif v.node.op == "get_attr":
            exprs[id(v)] = ns.ref(getattr(state_root, v.node.target), "state")
        else:
            if v.node not in index:
                index[v.node] = len(outputs)
                outputs.append(v)
            exprs[id(v)] = f"{out_var}[{index[v.node]}]"
            if isinstance(v, FloatTensorValue):
                exprs[id(v)] += ".item()"    # a Python float again outside the graph
    return exprs, outputs
