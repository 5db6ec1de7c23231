"""Trace a repeated block once: a module's forward traced again as a copy of an earlier trace.

Transformers call the same block class 12 to 100 times (a ``ModuleList`` loop, an
``nn.Sequential``). Interpreting each block's bytecode again costs time linear in depth; the
result differs only in which parameters, submodules and attribute values it reads. So when a
module's ``forward`` is traced, everything it did to the trace is recorded (``Recorder``):

* each read of the world through a source (``values.builder.wrap``: the object, its source,
  the value it became, whether it was already known to the trace),
* each guard it added outside those reads (hooks, missing attributes, identity checks...),
* the graph nodes it created, in order, between those reads,
* the value it returned.

A later call of a module of the same class with arguments of the same kind (tensors of the
same metadata, equal constants, objects of the same type read through sources) replays the
record (``Template.replay``): every source under the first module is moved under the new one
(``self.h[0].attn.c_attn.weight`` -> ``self.h[5].attn.c_attn.weight``), every read is done
again through ``wrap`` on the object found there now (so guards, get_attr nodes and aliasing
come out exactly as a trace would make them), every other guard is added again, and the
nodes are copied with their arguments mapped, their fake results computed again.

Why the copy is the trace: a trace's decisions depend only on what it read through sources
(which the guards describe), on its arguments, and on things fixed for a class (its methods,
class attributes, trusted modules). Replay first checks, without changing anything, that
every object the record read is *equivalent* at the new place (equal constants, the same
functions, modules of the same class, tensors of the same metadata, containers of equivalent
items, the same memo hits), and that every recorded guard holds for the new module; only then
does it change the trace. A block whose record is not a pure function of those (it changed
state outside the trace, entered a grad/autocast block, read a tensor input of its own, read
per-instance state without a source, returned something a copy cannot make) is never
recorded, and anything a check refuses is traced normally. ``config.reuse_traced_blocks``
(``BYTEGRAPH_REUSE_BLOCKS=0``) turns this off; the graphs and guards are the same either way.
"""
from __future__ import annotations

import types

import torch

from ...config import config
from ...residual import enter_inference_mode, exit_inference_mode, set_autocast_state
from ...guards.builder import value_holds
from ...guards.sources import AttrSource, DefaultSource, ItemSource, ModuleEntrySource, Source
from ...values.base import (ConstantValue, DictValue, ListValue, ObjectValue, SymValue, TensorValue,
                           TupleValue)
from ...values.builder import CONSTANT_TYPES, wrap
from typing import Callable
from ...values.base import Value
from ..core.context import RunningFrame

MAX_TEMPLATES_PER_CLASS = 4
# node.meta key: the (template id, instance) of each copied or recorded block a node is in, outermost first
REGION = "bytegraph_region"
_EDGE_SOURCES = (AttrSource, ModuleEntrySource, ItemSource, DefaultSource)


class ReplayError(Exception):
    """A replay failed after it began changing the trace: the frame is traced again without
    block reuse (runtime.compile_frame)."""


# --- argument keys ---------------------------------------------------------------------------

def _constant_key(v):
    if type(v) is float:
        return ("float", repr(v))
    if isinstance(v, (set, list, dict)):
        raise _NoKey
    hash(v)
    return (type(v), v)


class _NoKey(Exception):
    pass


def _leaf_key(v, leaves, ids):
    """Key of one argument value; appends the leaf values (in order) to ``leaves``."""
    if id(v) in ids:
        return ("same", ids[id(v)])
    if isinstance(v, TensorValue):
        f = v.fake
        if type(f).__name__ != "FakeTensor" or f.layout != torch.strided:
            raise _NoKey
        key = ("T", v.cls, f.dtype, f.device, tuple(str(s) for s in f.shape), tuple(str(s) for s in f.stride()),
               str(f.storage_offset()), f.requires_grad, f.grad_fn is None, v.source is not None)
    elif isinstance(v, SymValue):
        key = ("S", str(v.sym), v.source is not None)
    elif isinstance(v, ConstantValue):
        # The guard a sourced constant installs when looked at: pending or already installed.
        key = ("C", _constant_key(v._value), v.source is not None, v._pending_guard is not None)
    elif isinstance(v, (TupleValue, ListValue)) and v.source is None:
        key = (type(v).__name__, getattr(v, "cls", list),
               tuple(_leaf_key(i, leaves, ids) for i in v.items))
        ids[id(v)] = len(leaves)
        leaves.append(v)
        return key
    elif isinstance(v, DictValue) and v.source is None and type(v) is DictValue:
        key = ("D", v.cls, tuple((k, _leaf_key(i, leaves, ids)) for k, i in v.items.items()))
        ids[id(v)] = len(leaves)
        leaves.append(v)
        return key
    elif isinstance(v, ObjectValue) and type(v) is ObjectValue and v.source is not None:
        key = ("O", type(v.obj))
    else:
        raise _NoKey
    ids[id(v)] = len(leaves)
    leaves.append(v)
    return key


def arguments_key(mv, args, kwargs):
    """(key, leaf values) for a call of module value ``mv``, or (None, None) if unsupported."""
    leaves, ids = [mv], {id(mv): 0}
    try:
        key = (type(mv.obj), tuple(_leaf_key(a, leaves, ids) for a in args),
               tuple((k, _leaf_key(v, leaves, ids)) for k, v in sorted(kwargs.items())),
               torch.is_grad_enabled(), torch.is_inference_mode_enabled(), torch.get_default_dtype(),
               torch.is_autocast_enabled("cpu"), torch.is_autocast_enabled("cuda"),
               torch.get_autocast_dtype("cpu"), torch.get_autocast_dtype("cuda"))
        hash(key)
    except (_NoKey, TypeError):
        return None, None
    return key, leaves


# --- the record --------------------------------------------------------------------------------

class Recorder:
    """Listens to one forward's trace (guards.builder.GuardSet.add, values.builder.wrap)."""

    def __init__(self, tx):
        self.graph = tx.graph.graph
        self.events = []
        self.mark = self.graph._root.prev
        self.ok = True

    def _flush_nodes(self):
        mark = self.mark
        if getattr(mark, "_erased", False):
            self.ok = False
            return
        root = self.graph._root
        nodes = []
        n = mark.next
        while n is not root:
            nodes.append(n)
            n = n.next
        if nodes:
            self.events.append(("nodes", nodes))
        self.mark = root.prev

    def before_wrap(self):
        self._flush_nodes()

    def after_wrap(self, obj, source, value, hit):
        self.events.append(("wrap", source, obj, value, hit))
        self.mark = self.graph._root.prev   # nodes the read made (get_attr) come with it

    def gave_source(self):
        # A value made without a source got one: later reads through it (its closure cells,
        # attributes) now take paths this trace did not, so a copy of it would not be exact.
        # (The next call of the class is recorded instead.)
        self.ok = False

    def on_guard(self, kind, source, expected, detail, dynamic_dims):
        self._flush_nodes()
        self.events.append(("guard", kind, source, expected, detail, dynamic_dims))

    def finish(self):
        self._flush_nodes()


# Nodes that change grad mode or autocast: their fake results depend on state a copy does not set.
_STATE_TARGETS = {torch._C._set_grad_enabled, torch.amp._enter_autocast, torch.amp._exit_autocast,
                  set_autocast_state, enter_inference_mode, exit_inference_mode}


class Template:
    def __init__(self, key, leaves, events, result):
        self.uid = None             # set when its nodes are first tagged as a region
        self.instances = 0          # regions tagged with it so far
        self.key = key
        self.leaves = leaves        # the template call's argument values (leaves[0]: the module)
        self.events = _without_repeated_global_guards(events)
        self.result = result

    # -- building -----------------------------------------------------------------------------

    @classmethod
    def build(cls, key, leaves, rec, result):
        """A template from a finished record, or None if replaying it could not be exact."""
        if not rec.ok:
            return None
        known_nodes = set()
        for v in leaves:
            if isinstance(v, (TensorValue, SymValue)):
                known_nodes.add(v.node)
        state_targets = _STATE_TARGETS
        for ev in rec.events:
            if ev[0] == "wrap":
                value = ev[3]
                if isinstance(value, (TensorValue, SymValue)):
                    known_nodes.add(value.node)
            elif ev[0] == "nodes":
                for n in ev[1]:
                    if n.op not in ("call_function", "call_method") or n.target in state_targets:
                        return None
                    for a in n.all_input_nodes:
                        if a not in known_nodes or "example_value" not in a.meta:
                            return None
                    known_nodes.add(n)
            elif ev[0] == "guard":
                kind = ev[1]
                if kind in ("STATE_MATCH", "TENSOR_MATCH", "SHAPE_ENV", "STORAGE_SHARED"):
                    return None
        if not _result_mappable(result, known_nodes, rec, leaves):
            return None
        return cls(key, leaves, rec.events, result)

    # -- replaying ----------------------------------------------------------------------------

    def replay(self, frame, leaves):
        """The forward's result for the call whose argument values are ``leaves``, or None when
        this template does not apply to it (nothing changed then)."""
        tx = frame.tx
        plan = self._plan(tx, leaves)
        if plan is None:
            return None
        try:
            return self._apply(tx, leaves, plan)
        except Exception as e:
            raise ReplayError(f"replaying the trace of {type(leaves[0].obj).__name__}.forward failed: "
                              f"{type(e).__name__}: {e}") from e

    def _plan(self, tx, leaves):
        """Check, changing nothing, that the record applies at the new place; return the real
        objects and sources each read and guard will use."""
        smap = {}      # template source -> replay source (prefix rewriting)
        objmap = {}    # replay source -> real object there now
        known = tx.guards.objects
        for t, r in zip(self.leaves, leaves):
            if t.source is not None:
                if r.source is None:
                    return None
                if r.source != t.source:
                    smap[t.source] = r.source
                if isinstance(r, ObjectValue):
                    objmap[r.source] = r.obj
                    if not _equivalent(t.obj, r.obj):
                        return None
        memo_seen = {}   # id(real object) -> source it got earlier in this replay
        steps = []
        append = steps.append
        for ev in self.events:
            tag = ev[0]
            if tag == "wrap":
                _, src_t, obj_t, value_t, hit_t = ev
                src_r = _map_source(src_t, smap)
                if src_r is None:
                    return None
                if src_r is src_t or src_r == src_t:
                    obj_r = obj_t          # read from outside the block: the same object
                    objmap[src_r] = obj_r
                else:
                    found, obj_r = _resolve(src_r, objmap, known)
                    if not found or not _equivalent(obj_t, obj_r):
                        return None
                    objmap[src_r] = obj_r
                if isinstance(obj_r, CONSTANT_TYPES):
                    hit_r = first_source = None
                else:
                    hit_r, first_source = _memo_lookup(tx, obj_r, memo_seen)
                    if not hit_r:
                        memo_seen[id(obj_r)] = src_r
                if hit_t and not hit_r:
                    return None
                if value_t.source is not None:
                    # Reads through this value go where a trace would send them: to the source
                    # the value has (its first), even when that is the template's own.
                    smap[value_t.source] = first_source if hit_r and first_source is not None else src_r
                append(("wrap", obj_r, src_r, value_t))
            elif tag == "guard":
                _, kind, src_t, expected, detail, dyn = ev
                src_r = _map_source(src_t, smap) if src_t is not None else None
                if src_t is not None and src_r is None:
                    return None
                if isinstance(expected, Source):
                    expected_r = _map_source(expected, smap)
                    if expected_r is None:
                        return None
                    moved = expected_r is not expected and expected_r != expected
                else:
                    expected_r = expected
                    moved = False
                moved = moved or (src_r is not src_t and src_r != src_t)
                if src_r is not None and moved and not _guard_holds(kind, src_r, expected_r, objmap, known):
                    return None
                append(("guard", kind, src_r, expected_r, detail, dyn))
            else:
                append(ev)
        return steps

    def _apply(self, tx, leaves, steps):
        nmap = {}
        vmap = {}
        for t, r in zip(self.leaves, leaves):
            vmap[id(t)] = r
            if isinstance(t, (TensorValue, SymValue)):
                nmap[t.node] = r.node
        graph = tx.graph
        for st in steps:
            kind = st[0]
            if kind == "wrap":
                _, obj_r, src_r, value_t = st
                value_r = wrap(tx, obj_r, src_r)
                vmap[id(value_t)] = value_r
                if isinstance(value_t, (TensorValue, SymValue)):
                    nmap[value_t.node] = value_r.node
            elif kind == "guard":
                _, gkind, src_r, expected_r, detail, dyn = st
                tx.guards.add(gkind, src_r, expected_r, detail, dyn)
            else:
                for n in st[1]:
                    nmap[n] = graph.replay_node(n, nmap)
        return _map_result(self.result, vmap, nmap, {})


def _without_repeated_global_guards(events):
    """``events`` less each guard of no source (global state, global hooks: one per module call)
    equal to an earlier one: adding it again to the same trace changes nothing."""
    seen = set()
    out = []
    for ev in events:
        if ev[0] == "guard" and ev[2] is None:
            try:
                key = (ev[1], ev[3], ev[4], ev[5])
                if key in seen:
                    continue
                seen.add(key)
            except TypeError:
                pass
        out.append(ev)
    return out


# --- sources and objects -----------------------------------------------------------------------

def _map_source(source, smap):
    """``source`` with its longest mapped prefix replaced; unchanged if no prefix is mapped."""
    out = smap.get(source, _UNMAPPED)
    if out is not _UNMAPPED:
        return out
    if isinstance(source, _EDGE_SOURCES):
        base = _map_source(source.base, smap)
        if base is None:
            return None
        if base is source.base:
            return source
        if isinstance(source, AttrSource):
            return AttrSource(base, source.attr)
        if isinstance(source, ModuleEntrySource):
            return ModuleEntrySource(base, source.table, source.key)
        if isinstance(source, ItemSource):
            return ItemSource(base, source.index)
        return DefaultSource(base, source.index, source.kw)
    base = source.base_source
    while base is not None:
        if smap.get(base, base) != base:
            return None    # under a moved source, through a kind of source this does not know how to move
        base = base.base_source
    return source      # read from outside the block: stays where it is


_UNMAPPED = object()


def _resolve(source, objmap, known=None):
    """(found, the real object at ``source`` now), reading from a base already resolved;
    ``known``: objects the trace read before (the world does not change while tracing)."""
    obj = objmap.get(source, _UNMAPPED)
    if obj is not _UNMAPPED:
        return True, obj
    if known is not None:
        obj = known.get(source, _UNMAPPED)
        if obj is not _UNMAPPED:
            return True, obj
    if not isinstance(source, _EDGE_SOURCES):
        return False, None
    found, base = _resolve(source.base, objmap, known)
    if not found:
        return False, None
    try:
        if isinstance(source, AttrSource):
            obj = getattr(base, source.attr)
        elif isinstance(source, ModuleEntrySource):
            obj = base.__dict__[source.table][source.key]
        elif isinstance(source, ItemSource):
            obj = base[source.index]
        elif source.kw:
            obj = base.__kwdefaults__[source.index]
        else:
            obj = base.__defaults__[source.index]
    except Exception:
        return False, None
    objmap[source] = obj
    return True, obj


def _memo_lookup(tx, obj, memo_seen):
    """(would wrap find ``obj`` already known, the source of the value it would return)."""
    if isinstance(obj, CONSTANT_TYPES):
        return False, None
    memo = tx.memo.get(id(obj))
    if memo is not None and memo[0] is obj:
        return True, memo[1].source
    if id(obj) in memo_seen:
        return True, memo_seen[id(obj)]
    return False, None


_IDENTITY = (types.BuiltinFunctionType, types.ModuleType, type, types.MethodDescriptorType,
             types.WrapperDescriptorType, types.MethodWrapperType, types.BuiltinMethodType,
             types.ClassMethodDescriptorType, types.CodeType)


def _equivalent(a, b, depth=0):
    """Would a trace reading ``b`` where the record read ``a`` make the same decisions, given
    that what it reads *from* them is checked separately?"""
    if a is b:
        return True
    ta = type(a)
    if ta is not type(b) or depth > 20:
        return False
    if isinstance(a, torch.Tensor):
        return (a.dtype == b.dtype and a.device == b.device and a.shape == b.shape and a.stride() == b.stride()
                and a.requires_grad == b.requires_grad and a.layout == b.layout
                and a.storage_offset() == b.storage_offset())
    if ta is float:
        return repr(a) == repr(b)
    if isinstance(a, CONSTANT_TYPES):
        return a == b
    if isinstance(a, torch.nn.Module):
        # Same class (above): same methods. What the trace reads of it is checked read by read,
        # except the names in its tables: iterating an nn.Sequential or indexing a ModuleList
        # from the end visits what is there without a read of the table itself (torchvision's
        # Conv2dNormActivation is one class with an activation after the conv or without).
        return a.__dict__.get("forward") is b.__dict__.get("forward") and _same_tables(a, b)
    if ta in (tuple, list) or (isinstance(a, tuple) and hasattr(ta, "_fields")):
        return len(a) == len(b) and all(_equivalent(x, y, depth + 1) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_equivalent(a[k], b[k], depth + 1) for k in a)
    if isinstance(a, (set, frozenset)):
        return a == b
    if ta is types.FunctionType:
        return a.__code__ is b.__code__ and "<locals>" in a.__qualname__
    if ta is types.MethodType:
        return a.__func__ is b.__func__ and _equivalent(a.__self__, b.__self__, depth + 1)
    if isinstance(a, _IDENTITY) or callable(a) or isinstance(a, (torch.dtype, torch.device)):
        return False
    if getattr(ta, "_bytegraph_compiled_module", False):
        return False
    # Another user object: the type is what its value is guarded by; its attributes are
    # reads of their own.
    return True


def _tables(m):
    """The names in a module's tables, and which entries are empty."""
    return tuple(tuple((k, v is None) for k, v in m.__dict__.get(t, {}).items())
                 for t in ("_modules", "_parameters", "_buffers"))


def _same_tables(a, b):
    """``_tables(a) == _tables(b)``, without building them (a stamped layer compares ~25 modules)."""
    da, db = a.__dict__, b.__dict__
    for table in ("_modules", "_parameters", "_buffers"):
        ta, tb = da.get(table, {}), db.get(table, {})
        if len(ta) != len(tb):
            return False
        for (ka, va), (kb, vb) in zip(ta.items(), tb.items()):
            if ka != kb or (va is None) != (vb is None):
                return False
    return True


def _guard_holds(kind, source, expected, objmap, known):
    found, obj = _resolve(source, objmap, known)
    if not found:
        return False
    if kind == "ID_MATCH":
        return obj is expected
    if kind == "TYPE_MATCH":
        return type(obj) is expected
    holds = value_holds(kind, obj, expected)
    if holds is not None:
        return holds
    if kind in ("ALIAS", "NOT_ALIAS"):
        found, other = _resolve(expected, objmap, known)
        return found and ((obj is other) == (kind == "ALIAS"))
    return False


def _result_mappable(v, known_nodes, rec, leaves, depth=0):
    if depth > 20:
        return False
    if any(v is leaf for leaf in leaves):
        return True
    if isinstance(v, (TensorValue, SymValue)):
        return v.node in known_nodes and v.source is None
    if isinstance(v, ConstantValue):
        return v.source is None and not isinstance(v._value, (set, list, dict))
    if isinstance(v, (TupleValue, ListValue)) and v.source is None:
        return all(_result_mappable(i, known_nodes, rec, leaves, depth + 1) for i in v.items)
    if isinstance(v, DictValue) and v.source is None and type(v) is DictValue:
        return all(_result_mappable(i, known_nodes, rec, leaves, depth + 1) for i in v.items.values())
    return any(ev[0] == "wrap" and ev[3] is v for ev in rec.events)


def _map_result(v, vmap, nmap, made):
    if id(v) in vmap:
        return vmap[id(v)]
    if id(v) in made:
        return made[id(v)]
    if isinstance(v, TensorValue):
        node = nmap[v.node]
        out = TensorValue(node, node.meta["example_value"], cls=v.cls)
    elif isinstance(v, SymValue):
        node = nmap[v.node]
        out = SymValue(node, node.meta["example_value"])
    elif isinstance(v, ConstantValue):
        out = ConstantValue(v._value)
    elif isinstance(v, TupleValue):
        out = TupleValue([_map_result(i, vmap, nmap, made) for i in v.items], cls=v.cls)
    elif isinstance(v, ListValue):
        out = ListValue([_map_result(i, vmap, nmap, made) for i in v.items])
    elif isinstance(v, DictValue):
        out = DictValue({k: _map_result(i, vmap, nmap, made) for k, i in v.items.items()}, cls=v.cls)
    else:
        raise ReplayError(f"cannot copy a returned {type(v).__name__}")
    made[id(v)] = out
    return out


# --- the entry point ---------------------------------------------------------------------------

def call_forward(frame: RunningFrame, mv: ObjectValue, args: list[Value], kwargs: dict[str, Value],
                 trace_forward: Callable[[], Value]) -> Value:
    """``trace_forward()`` traces ``mv``'s forward on ``args``/``kwargs``; this replays an earlier
    trace of the same class instead when one applies, and records this one otherwise."""
    tx = frame.tx
    m = mv.obj
    if not config.reuse_traced_blocks or not tx.reuse_blocks or mv.source is None or "forward" in m.__dict__ \
            or tx.handled_exception is not None or tx.outer_handled:
        return trace_forward()   # (inside an except block the forward could read sys.exc_info())
    key, leaves = arguments_key(mv, args, kwargs)
    if key is None:
        return trace_forward()
    # Modules of one class built with other submodules never share a template (_equivalent):
    # each build keeps its own (torchvision's Conv2dNormActivation with and without a ReLU).
    templates = tx.block_templates.setdefault((type(m), _tables(m)), [])
    graph = tx.graph.graph
    start = graph._root.prev
    for template in templates:
        if template.key == key:
            out = template.replay(frame, leaves)
            if out is not None:
                tx.blocks_replayed += 1
                _mark_region(graph, start, template)
                return out
    if len(templates) >= MAX_TEMPLATES_PER_CLASS:
        return trace_forward()
    rec = Recorder(tx)
    guards = tx.guards
    # (tensors kept unchanged: a copy would not keep them so; f-strings, max() over tensors)
    before = (tx.effects.count(), len(tx.graph.inputs), len(tx.state_changes), tx.unguarded_reads,
              tx.handled_exception, len(tx.graph.no_mutation))
    guards.recorders.append(rec)
    try:
        result = trace_forward()
    finally:
        guards.recorders.remove(rec)
    rec.finish()
    after = (tx.effects.count(), len(tx.graph.inputs), len(tx.state_changes), tx.unguarded_reads,
             tx.handled_exception, len(tx.graph.no_mutation))
    if before == after:
        template = Template.build(key, leaves, rec, result)
        if template is not None:
            templates.append(template)
            _mark_region(graph, start, template)
    return result


_template_ids = [0]


def _mark_region(graph, start, template):
    """Tag the nodes made since ``start`` as one instance of ``template``'s block: backends
    compile repeated regions once (backends/regions.py). Blocks nest (a model's forward traced
    as a block around its layers): a node's tags run from the outermost block to the innermost,
    and the backend picks the outermost level that repeats."""
    if getattr(start, "_erased", False):
        return
    if template.uid is None:
        _template_ids[0] += 1
        template.uid = _template_ids[0]
    tag = (template.uid, template.instances)
    template.instances += 1
    n = start.next
    while n is not graph._root:
        n.meta[REGION] = (tag,) + n.meta.get(REGION, ())
        n = n.next


__all__ = ["call_forward", "ReplayError"]
