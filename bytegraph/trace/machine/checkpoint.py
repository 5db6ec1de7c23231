"""Stopping at a break without tracing the frame again (issue 40, capture time).

A graph break met while the root frame runs instruction ``i`` splits the frame before ``i``:
the graph, stack and locals must be exactly the state before ``i``. Tracing the frame again with
``stop_before=i`` gives that state, at the cost of a second trace of everything before ``i``.
Instead, the root frame keeps a ``Checkpoint`` of what it had before each instruction it starts:
its stack, and the marks of everything an instruction may change (graph nodes, side effects,
grad mode / autocast / TorchFunctionModes entered, the contents of every container it can reach). When the break is
met, ``stop_at`` gives the root frame back the state before ``i`` if the instruction (and every
call it inlined) changed nothing but what can be taken back: new graph nodes that mutate nothing
(erased) and grad-mode / autocast / mode-stack changes (undone). Anything else (a side effect, a container or
iterator changed, an in-place op, a new symbol or shape guard...) and the caller traces again.
Guards the instruction added are kept: they hold for the values they were read from, so they
only make the entry more specific.
"""
from __future__ import annotations

import copy

import torch

from ...graph.call_values import _mutates
from ...null import NULL
from ...values.base import (BoundMethodValue, CellValue, ConstantValue, DictValue, DictViewValue, ExitValue,
                            FloatTensorValue, FormattedTextValue, FunctionValue, IteratorValue, LazyIteratorValue,
                            ListValue, MethodOfValue, ObjectValue, PartialValue, RealCell, SliceValue, SubgraphValue,
                            SuperValue, SymValue, TensorMethodValue, TensorValue, TupleValue, UserObjectValue,
                            Value)

# Values with nothing inside that an instruction can change, or whose changes the trace records
# as side effects (a real object's attribute stores, a real cell's stores).
_OPAQUE = (TensorValue, SymValue, FloatTensorValue, SubgraphValue, ObjectValue, ExitValue, RealCell)
_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes, type(Ellipsis), type(NotImplemented), type,
              torch.dtype, torch.device, torch.layout, torch.memory_format, torch.Size, range, slice, frozenset)


# Rows that never break: no checkpoint before them (a break there would trace again).
PLAIN = frozenset({"NOP", "RESUME", "CACHE", "EXTENDED_ARG", "LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR",
                   "LOAD_CONST", "STORE_FAST", "POP_TOP", "PUSH_NULL", "COPY", "SWAP", "LOAD_CLOSURE", "MAKE_CELL",
                   "COPY_FREE_VARS", "JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP",
                   "JUMP_NO_INTERRUPT", "KW_NAMES", "PRECALL", "END_FOR", "POP_EXCEPT", "RETURN_VALUE",
                   "RETURN_CONST", "LOAD_SMALL_INT"})


class _Unsafe(Exception):
    """A value whose changes a checkpoint cannot see: no checkpoint."""


def _contents(values):
    """(value, copy of its mutable contents) of every container reachable from ``values``.
    Raises _Unsafe on a value of a kind not known here."""
    seen, out = set(), []
    todo = list(values)
    while todo:
        v = todo.pop()
        if v is None or id(v) in seen:
            continue
        seen.add(id(v))
        if isinstance(v, _OPAQUE):
            continue
        if isinstance(v, ConstantValue):
            if not _immutable(v._value):   # (not .value: reading it installs its pending guard)
                raise _Unsafe
        elif isinstance(v, TupleValue):
            todo.extend(v.items)
        elif isinstance(v, ListValue):
            out.append((v, list(v.items)))
            todo.extend(v.items)
        elif isinstance(v, DictValue):
            out.append((v, dict(v.items)))
            todo.extend(v.items.values())
        elif isinstance(v, UserObjectValue):
            out.append((v, dict(v.attrs)))
            todo.extend(v.attrs.values())
            todo.append(v.dict_items)
        elif isinstance(v, CellValue):
            out.append((v, v.contents))
            todo.append(v.contents)
        elif isinstance(v, IteratorValue):
            out.append((v, (v.pos, list(v.items))))
            todo.extend(v.items)
        elif isinstance(v, LazyIteratorValue):
            out.append((v, (v.done, list(v.parts), {k: copy.copy(s) for k, s in v.state.items()})))
            todo.extend(v.parts)
            todo.extend(s for s in v.state.values() if isinstance(s, Value))
        elif isinstance(v, FunctionValue):
            todo.extend(v.closure)
            todo.extend(v.defaults)
            todo.extend(v.kwdefaults.values())
        elif isinstance(v, PartialValue):
            todo.append(v.func)
            todo.extend(v.args)
            todo.extend(v.kwargs.values())
        elif isinstance(v, BoundMethodValue):
            todo.extend((v.func, v.self_value))
        elif isinstance(v, TensorMethodValue):
            todo.append(v.tensor)
        elif isinstance(v, MethodOfValue):
            todo.append(v.owner)
        elif isinstance(v, SuperValue):
            todo.append(v.obj)
        elif isinstance(v, DictViewValue):
            todo.append(v.dict_value)
        elif isinstance(v, SliceValue):
            todo.extend((v.start, v.stop, v.step))
        elif isinstance(v, FormattedTextValue):
            todo.extend(p for p in v.parts if not isinstance(p, str))
        elif v is NULL:
            continue
        else:   # a generator, an exception, a tracer-made callable (closing over its own state)...
            raise _Unsafe
    return out


def _immutable(x):
    if isinstance(x, tuple):
        return all(_immutable(i) for i in x)
    return isinstance(x, _IMMUTABLE) or callable(x) and not isinstance(x, (list, dict, set, bytearray))


def _unchanged(contents):
    for v, before in contents:
        if isinstance(v, (ListValue, DictValue)):
            now = v.items
        elif isinstance(v, UserObjectValue):
            now = v.attrs
        elif isinstance(v, CellValue):
            if v.contents is not before:
                return False
            continue
        elif isinstance(v, IteratorValue):
            if v.pos != before[0] or not _same_items(v.items, before[1]):
                return False
            continue
        else:   # LazyIteratorValue
            done, parts, state = before
            if v.done != done or not _same_items(v.parts, parts) or v.state.keys() != state.keys() \
                    or any(not _same_state(v.state[k], state[k]) for k in state):
                return False
            continue
        if isinstance(before, list):
            if not _same_items(now, before):
                return False
        elif now.keys() != before.keys() or any(now[k] is not before[k] for k in before):
            return False
    return True


def _same_items(now, before):
    return len(now) == len(before) and all(a is b for a, b in zip(now, before))


def _same_state(now, before):
    if isinstance(before, (list, dict)):
        return type(now) is type(before) and now == before
    return now is before or (isinstance(before, (int, float, str)) and now == before)


class Checkpoint:
    """The root frame's state before the instruction at ``index``."""
    __slots__ = ("index", "stack", "locals", "kw_names", "contents", "last_node", "marks", "state_changes",
                 "grad_mode", "handled", "modes")

    def __init__(self, frame, index):
        tx = frame.tx
        self.index = index
        self.stack = list(frame.stack)
        self.locals = dict(frame.locals)
        self.kw_names = frame.kw_names
        # What the instruction can reach: the stack, the cells of the frame, and what the trace
        # stored into outside state (a fresh list stored on a module is read back from there);
        # a local only reaches it through one of these.
        self.contents = _contents(self.stack + list(frame.cells.values()) + tx.effects.stored_values())
        self.last_node = tx.graph.graph._root.prev
        self.marks = _marks(tx)
        self.state_changes = len(tx.state_changes)
        self.grad_mode = torch.is_grad_enabled()
        self.handled = tx.handled_exception
        # TorchFunctionModes entered by a call that breaks are left by going back (the code after
        # the graph sets the real stack to this one: codegen.transformed.mode_stack_lines).
        self.modes = list(tx.graph.function_modes)


def take(frame, index, seen):
    """A checkpoint before the root frame runs row ``index``, or None where it cannot see what
    that row may change, or the row ran before (``seen``: rows checkpointed so far). A split
    stops the first time the frame reaches the row that broke, as a trace with ``stop_before``
    does; a row of a loop broken on a later pass is traced again."""
    if index in seen:
        return None
    seen.add(index)
    try:
        return Checkpoint(frame, index)
    except _Unsafe:
        return None


def _marks(tx):
    g = tx.graph
    env = g.shapes.env
    e = tx.effects
    return (id(g), e.count(), len(e.mutated), len(e.attr_stores), len(e.item_stores), len(e.warnings),
            len(g.frozen), len(g.no_mutation), len(g.data_written), len(g.shapes.unbacked), len(g.shapes.origins),
            len(env.guards), len(_backed(env)), len(env.pending_fresh_unbacked_symbols),
            len(tx.guards.recorders), tx.guards.in_wrap)


def _writes(node):
    """Does ``node`` write a tensor argument in place (``graph.call_values._writes_call``)?"""
    if node.op not in ("call_function", "call_method"):
        return False
    return _mutates(node.target) or "out" in node.kwargs or node.kwargs.get("inplace") is True


def _example(arg):
    """The fake tensors (in lists and tuples) a node argument stands for."""
    if isinstance(arg, (list, tuple)):
        return [_example(a) for a in arg]
    return arg.meta.get("example_value") if isinstance(arg, torch.fx.Node) else None


def _storages(values):
    """Storage ids of the tensors in ``values`` (nested lists and tuples); None where one has no
    plain storage to tell by."""
    out = set()
    todo = list(values)
    while todo:
        v = todo.pop()
        if isinstance(v, (list, tuple)):
            todo.extend(v)
        elif isinstance(v, torch.Tensor):
            try:
                out.add(v.untyped_storage()._cdata)
            except Exception:   # noqa: BLE001 - sparse, nested, a subclass without storage
                return None
    return out


def _backed(env):
    backed = getattr(env, "backed_var_to_val", None)   # torch >= 2.12 (var_to_val deprecated)
    return env.var_to_val if backed is None else backed


def stop_at(frame, checkpoint) -> bool:
    """Give ``frame`` (the root frame, left by a break) the state of ``checkpoint`` and mark it
    stopped before that row. False (nothing changed) where that state cannot be had back."""
    tx = frame.tx
    if checkpoint is None or tx.handled_exception is not checkpoint.handled or tx.frames \
            or _marks(tx) != checkpoint.marks or not _unchanged(checkpoint.contents):
        return False
    graph = tx.graph.graph
    added = []
    node = graph._root.prev
    while node is not checkpoint.last_node:
        if node is graph._root:    # the checkpoint's last node is gone
            return False
        added.append(node)
        node = node.prev
    # (A placeholder made meanwhile stays: an input nothing uses is dropped when the graph is made.)
    added = [n for n in added if n.op != "placeholder"]
    erased = set(added)
    kept = None
    for node in added:
        if "unbacked_bindings" in node.meta or any(u not in erased for u in node.users):
            return False
        if _writes(node):
            # Fine on a tensor the instruction made itself (a fresh buffer filled in place); not
            # on one the frame had before it, or a view of one: the native step writes it again.
            if kept is None:
                kept = _storages(n.meta.get("example_value") for n in graph.nodes if n not in erased)
                if kept is None:
                    return False
            written = _storages(_example(a) for a in (node.args[0] if node.args else None, node.kwargs.get("out")))
            if written is None or written & kept:
                return False
    for node in added:    # newest first: users before what they use
        graph.erase_node(node)
    tx.undo_state_changes(checkpoint.state_changes)
    if torch.is_grad_enabled() != checkpoint.grad_mode:
        torch._C._set_grad_enabled(checkpoint.grad_mode)
    if isinstance(tx.graph.function_modes, list):
        tx.graph.function_modes[:] = checkpoint.modes
    frame.stack = list(checkpoint.stack)
    frame.locals = dict(checkpoint.locals)
    frame.kw_names = checkpoint.kw_names
    frame.ip = checkpoint.index
    frame.stopped = True
    return True
