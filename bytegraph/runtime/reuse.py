"""A frame compiled again for other modules of the same structure, without tracing it again.

The frames of a layer loop's second layer (its ``forward``, the resume functions of its breaks)
miss the cache entries of the first layer's: their guards match the first layer's modules and
parameters by identity. Everything else the trace relied on is in the guards too (attributes as
constants, hooks, tensor metadata, global state), so a second trace would give the same graph
over the second layer's parameters and the same transformed function over its objects. That is
what this makes, from the first entry's **template**: the identity guards are read again on the
new call (a module there must be of the same class, a tensor of the same metadata, anything else
the same object), the guards rebuilt over the new objects must all hold on this call, the graph is
copied over the new parameters and buffers (read from their sources) and handed to the backend,
and the transformed function (and any step function) is made again over a namespace where each
old object is replaced by the new one. The persistent cache (``persist.py``) carries an entry to
another process by the same reading of module and parameter identities; here nothing needs to be
written out, so frames split at a break are carried too.

Not carried (the frame is traced as usual): number or array inputs, objects the
graph holds by reference, subgraphs, a trace that relied on unguarded reads, and any old object the
namespace holds where it cannot be replaced (inside a container, or one no identity guard names).
"""
from __future__ import annotations

import functools
import types

import torch
import torch.fx as fx
from torch.utils._pytree import tree_leaves

from .. import config
from ..debug import logs
from ..guards import coverage
from ..guards.builder import ID_MATCH, GuardSet, TensorMeta
from ..guards.sources import ObjectSource, Source
from ..guards.stamps import EPOCH
from .cache import _same_expected
from .persist import _Resolver, state_module

log = logs.get_logger("recompiles")

_MISSING = object()
_DROPPED = object()


class Template:
    """What a cache entry needs to be made again for other objects (``remake``)."""
    __slots__ = ("compiler", "guards", "objects", "gm", "state", "inputs", "run", "source",
                 "break_reason", "user_stack", "hint")

    def __init__(self, compiler, guards, objects, gm, state, inputs, run, source, break_reason, user_stack, hint):
        self.compiler = compiler
        self.guards = guards          # the entry's Guard records
        self.objects = objects        # source -> object the trace read there (GuardSet.objects)
        self.gm = gm                  # the graph handed to the backend, or None
        self.state = state            # get_attr name -> (source, is a parameter)
        self.inputs = inputs          # per placeholder: its source, or the fake it was traced with
        self.run = run                # the transformed function (its globals: the namespace)
        self.source = source
        self.break_reason = break_reason
        self.user_stack = user_stack
        self.hint = hint


def template_of(c, tx, run, source, gm, break_reason=None, user_stack=(), hint=None):
    """A Template of the entry just made from ``tx``, or None where it could not be carried."""
    if not isinstance(run, types.FunctionType) or not any(g.kind is ID_MATCH for g in tx.guards):
        return None
    if tx.process_local or tx.unguarded_reads:
        return None
    graph = tx.graph
    if graph.modes_around_call or graph.function_subclass_inputs:
        return None
    state, inputs = {}, []
    if gm is not None:
        if run.__globals__.get("__compiled_fn") is None:
            return None
        if any(i.array_mode is not None or i.scalar for i in graph.inputs):
            return None
        if any(n.op == "get_attr" and n.target not in graph.state_sources for n in gm.graph.nodes):
            return None    # an object held by reference, a subgraph
        state = {n.target: graph.state_sources[n.target] for n in gm.graph.nodes if n.op == "get_attr"}
        # With symbolic sizes the backend is handed the trace's fakes (the shape guards say they
        # hold for this call too); else the tensors now at the inputs' sources.
        inputs = [i.node.meta["example_value"] if graph.shapes.has_symbols else i.source for i in graph.inputs]
    # (tensors no identity guard names, such as the call's inputs, are not kept: read again when made)
    pinned = {id(g.expected) for g in tx.guards if g.kind is ID_MATCH}
    objects = {s: _DROPPED if isinstance(o, torch.Tensor) and id(o) not in pinned else o
               for s, o in tx.guards.objects.items()}
    return Template(c.compiler, list(tx.guards), objects, gm, state, inputs, run, source,
                    break_reason, list(user_stack), hint)


def remake(c, frame_args, values):
    """(guard set, run, source, graph, template) for this call from an entry of the same code made
    for other objects of the same structure, or None."""
    if not config.reuse_traced_blocks or c.cache is None or c.cache.auto_dynamic or c.cache.auto_dynamic_scalars:
        return None     # (sizes that changed are traced as symbolic now)
    for entry in c.cache.entries[:4]:
        t = getattr(entry, "template", None)
        if t is None or t.compiler is not c.compiler:
            continue
        try:
            made = _remake(c, t, frame_args, values)
        except Exception as e:   # noqa: BLE001 - the frame is traced as usual
            log.debug("%s not made again from another entry: %s: %s", c.name, type(e).__name__, e)
            made = None
        if made is not None:
            return made
    return None


def _remake(c, t, frame_args, values):
    resolve = _Resolver(c.fn, c.params, values)
    new_of = {}      # id(old object) -> the object at the same source now
    old_ids = set()  # ids of the old objects that differ now
    for g in t.guards:
        if g.kind is not ID_MATCH:
            continue
        old = g.expected
        new = resolve(g.source)
        if new is old:
            continue
        if isinstance(old, torch.nn.Module):
            if type(new) is not type(old):
                return None
        elif isinstance(old, torch.Tensor):
            if type(new) is not type(old) or g.meta is None or not _same_expected(TensorMeta(new), g.meta):
                return None
        else:
            return None     # a function, class, code or other object: must be the same one
        if new_of.get(id(old), new) is not new:
            return None     # one object then, two now
        new_of[id(old)] = new
        old_ids.add(id(old))
    if not new_of or len({id(v) for v in new_of.values()}) != len(new_of):
        return None         # the same objects (another guard failed), or two then and one now
    if not any(isinstance(v, torch.nn.Module) for v in new_of.values()):
        # Only tensors changed under the same modules (a buffer replaced each call): tracing
        # again makes such a tensor an input, kept from then on; made again here it would be
        # compiled again on every call.
        return None
    guards = GuardSet()
    for source, old in t.objects.items():
        now = new_of.get(id(old), _MISSING)
        if now is _MISSING:
            try:
                now = resolve(source)
            except Exception:   # noqa: BLE001 - a source that cannot be read now is left out
                continue
            if now is not old and old is not _DROPPED and not isinstance(now, (int, float, str, bool, type(None))):
                old_ids.add(id(old))
        guards.objects[source] = now
    held = [g.source for g in t.guards if g.source is not None] + [src for src, _ in t.state.values()]
    if any(id(obj) in old_ids for source in held for obj in _objects_named(source)):
        return None         # a guard or the graph's state reads the old object itself
    for g in t.guards:
        expected = new_of.get(id(g.expected), g.expected) if g.kind is ID_MATCH else g.expected
        guards.add(g.kind, g.source, expected, g.detail, g.dynamic_dims)
    ns = _namespace(t.run.__globals__, new_of, old_ids)
    if ns is None:
        return None
    gm = None
    if t.gm is not None:
        gm = _graph(t, resolve, new_of, old_ids)
        if gm is None:
            return None
    run = _function(t.run, ns, c.transformed_name())
    # The guards the module stamp covers are read here (compiled, they are checked only once the
    # stamp moves, and their text is written on first use); the others by the check itself.
    _, covered, _ = coverage.partition(guards)
    if not all(g.kind.evaluate(g, resolve) for g in covered):
        return None
    guards.epoch = EPOCH[0]
    check, _, _ = c.guards(guards, run)
    if check(*frame_args) is not run:
        return None
    if gm is not None:
        examples = [resolve(i) if isinstance(i, Source) else i for i in t.inputs]
        ns["__compiled_fn"] = c.compile_graph(gm, examples)
    return guards, run, t.source, gm, t


def _namespace(old_ns, new_of, old_ids):
    """A copy of the transformed function's namespace over the new objects; None if an old
    object stays in it (inside a container, or one no identity guard names)."""
    ns = dict(old_ns)
    functions = []
    for name, obj in old_ns.items():
        if name in ("G", "__builtins__"):
            continue
        new = new_of.get(id(obj), _MISSING)
        if new is not _MISSING:
            ns[name] = new
        elif id(obj) in old_ids or _holds_old(obj, old_ids, 3):
            return None
        elif isinstance(obj, types.FunctionType) and obj.__globals__ is old_ns:
            functions.append(name)      # a step function: made again over the new namespace
    for name in functions:
        ns[name] = _function(old_ns[name], ns, name)
    return ns


def _objects_named(source):
    """The objects a source's chain names directly (its ObjectSource roots)."""
    found = []

    def render(s):
        if isinstance(s, ObjectSource):
            found.append(s.obj)
        return s.expr_over(render)
    render(source)
    return found


def _holds_old(obj, old_ids, depth):
    if depth == 0:
        return False
    if isinstance(obj, (tuple, list, set, frozenset)):
        items = obj
    elif isinstance(obj, dict):
        items = list(obj.keys()) + list(obj.values())
    elif isinstance(obj, (types.MethodType, types.BuiltinMethodType)):
        items = (obj.__self__,)
    elif isinstance(obj, functools.partial):
        items = (obj.func, obj.args, obj.keywords)
    else:
        return False
    return any(id(x) in old_ids or _holds_old(x, old_ids, depth - 1) for x in items)


def _function(fn, ns, name):
    new = types.FunctionType(fn.__code__, ns, name, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__ = fn.__qualname__
    return new


def _graph(t, resolve, new_of, old_ids):
    """The template's graph over the parameters and buffers now at their sources."""
    state = {}
    for name, (source, is_param) in t.state.items():
        old = getattr(t.gm, name)
        tensor = resolve(source)
        if tensor is not old and new_of.get(id(old)) is not tensor:
            return None     # state no identity guard named
        state[name] = (tensor, is_param)
    root = state_module(state)
    graph = fx.Graph()
    env = {}
    out = graph.graph_copy(t.gm.graph, env)
    graph.output(out)
    for node in graph.nodes:
        if node.op == "get_attr" and "real_tensor" in node.meta:
            node.meta["real_tensor"] = getattr(root, node.target)
        if any(id(a) in old_ids for a in tree_leaves((node.args, node.kwargs))):
            return None
    return fx.GraphModule(root, graph)
