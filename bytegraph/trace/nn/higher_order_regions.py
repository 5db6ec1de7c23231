"""Compile regions: a function marked ``torch.compiler.nested_compile_region`` (or the ``forward``
of a module class so marked) as one node per call, which is torch's ``invoke_subgraph`` operator
wherever the graph is traced further (``graph.higher_order.invoke_region``).

The region's body is traced into a graph of its own once per distinct input signature (the
kind of each argument: tensor metadata, constants, the module's class and tables, grad and
autocast state) and registered once on the enclosing graph; every call is one node::

    invoke_region(<get_attr of the region's graph>, "<its name>", *tensor arguments, *lifted)

where ``lifted`` are the tensors the body reads from around it: the module's parameters and
buffers (each call passes its own), tensors read through globals or closures. A later call
with the same signature is not traced again: what the first trace read through sources and the
guards it added are moved under the new call's arguments and checked there without changing
anything (``trace.blocks.Template._plan``: the same check that lets a repeated block's trace be
copied), then the reads are done again (guards, get_attr nodes, as a trace makes them) and the
call is stamped out with its own operands; its results' fake tensors are made from the first
call's (with an autograd edge to the operands each output depends on, for what reads those).
From the third call on, a call on a layer built like the second's is stamped by a walk over the
layer's objects, its guards one entry (``region_stamps``).
So capture time stops growing with depth the way a flat trace's does: graphs stay flat unless a
region is marked (``config.nest_repeated_blocks`` marks repeated blocks of a ``ModuleList``
or ``Sequential``).

A call that cannot be a region (a body that changes state outside itself or its inputs in
place, returns an input or something other than tensors and constants) breaks the graph and
runs natively: what ``nested_compile_region`` does in eager (nothing) with the body's effects.
"""
import operator
import types

import torch

from ...errors import Unsupported
from ...graph.call_values import new_fake
from ...graph.higher_order import invoke_region
from ...graph.subgraph import SubgraphBuilder
from ...guards.sources import AttrSource, ModuleEntrySource
from ...values.base import ConstantValue, ObjectValue, SubgraphValue, TensorValue, TupleValue
from ...values.builder import wrap
from . import blocks, region_stamps
from ..torch_api import higher_order
from ..core.basics import describe
from ..torch_api.higher_order import flatten, to_value, trace_body
from ..torch_api.higher_order_loops import fresh_like

_HINT = ("without fullgraph=True the call runs natively at a graph break; nested_compile_region does nothing "
         "in eager, so the result is the same")
MAX_TEMPLATES_PER_REGION = 8
_MARKER = "__marked_compile_region_fn__"


def call(frame, fv, args, kwargs):
    """The value of a call of a function marked ``nested_compile_region``, or None for any other."""
    obj = fv.obj
    if type(obj) is not types.FunctionType or not hasattr(obj, _MARKER):
        return None
    fn, source = obj, fv.source
    while hasattr(fn, _MARKER):
        fn, source = getattr(fn, _MARKER), AttrSource(source, _MARKER) if source is not None else None
    return call_region(frame, wrap(frame.tx, fn, source), fn, args, kwargs)


def is_region_module(m):
    """Is ``m``'s class ``forward`` marked a compile region (its calls are regions: no flat copy
    of its trace is kept, trace/blocks.py)?"""
    forward = type(m).__dict__.get("forward") if "forward" not in m.__dict__ else None
    return type(forward) is types.FunctionType and hasattr(forward, _MARKER)


def repeated_block(frame, mv, args, kwargs, forward):
    """``config.nest_repeated_blocks``: a module of a ``ModuleList``/``Sequential`` holding other
    modules of its class built alike is called as a region of its ``forward`` (value ``forward``
    already bound to the class's function); None where that does not apply."""
    source = mv.source
    if not isinstance(source, ModuleEntrySource) or source.table != "_modules":
        return None
    owner = frame.tx.guards.objects.get(source.base)
    if not isinstance(owner, (torch.nn.ModuleList, torch.nn.Sequential)):
        return None
    m = mv.obj
    tables = blocks._tables(m)
    if sum(1 for s in owner._modules.values() if type(s) is type(m) and blocks._tables(s) == tables) < 2:
        return None
    return call_region(frame, forward, forward.obj, [mv] + list(args), kwargs)


# --- one region call --------------------------------------------------------------------------

class _Region:
    """A region traced once for one input signature: its graph, registered on one graph builder,
    and what a later call needs to stand in for a trace (``blocks.Template`` over the reads and
    guards; where each lifted input came from; its outputs)."""

    def __init__(self, builder, name, template, origins, structure, out_metas, reach):
        self.builder = builder          # the graph builder the region's graph is registered on
        self.name = name                # the graph's attribute on the enclosing graph, and its identifier
        self.template = template        # blocks.Template of the first call's reads and guards (None: not reusable)
        self.origins = origins          # per lifted input: ("leaf", i) or ("wrap", the recorded value)
        self.structure = structure      # how the flat outputs regroup into what the function returned
        self.out_metas = out_metas      # (shape, stride, dtype, device) per output
        self.reach = reach              # per output: the operand positions its autograd history reaches
        self.walk = None                # region_stamps.Walk from the first stamped call (False: none applies;
                                        # a tuple: build's arguments, until a third call needs it)
        self.attr_node = None           # the get_attr node of the region's graph the calls share


def call_region(frame, fn_value, fn, args, kwargs):
    """``fn(*args, **kwargs)`` as one region node (``fn_value``: the function as a value)."""
    tx = frame.tx
    what = f"nested_compile_region {getattr(fn, '__qualname__', describe(fn_value))}"
    leaves, in_structures = [], []
    for a in list(args) + list(kwargs.values()):
        in_structures.append(_argument_structure(a, leaves, what))
    key, key_leaves = _key(fn, args, kwargs)
    regions = tx.__dict__.setdefault("regions", {})
    per_key = regions.setdefault((id(tx.graph), key), []) if key is not None else []
    for region in per_key:
        if region.template is not None and region.builder is tx.graph:
            out = _stamp(frame, region, key_leaves, leaves)
            if out is not None:
                return out
    return _trace(frame, fn_value, fn, args, kwargs, leaves, in_structures, key, key_leaves, per_key, what)


def _argument_structure(value, leaves, what):
    """Tensors (also in tuples, lists, dicts) are the region's inputs; constants and objects read
    through sources (a module) are part of its signature."""
    if isinstance(value, ObjectValue) and value.source is not None:
        return None
    return flatten(value, leaves, what)


def _key(fn, args, kwargs):
    """The input signature of a call (and the values read through sources among its arguments,
    for ``blocks.Template``). A tensor argument is a fresh input of the region's graph: only its
    metadata counts, not where it came from."""
    leaves, ids = [], {}
    try:
        key = (fn, tuple(_argument_key(a, leaves, ids) for a in args),
               tuple((k, _argument_key(v, leaves, ids)) for k, v in sorted(kwargs.items())),
               torch.is_grad_enabled(), torch.is_inference_mode_enabled(), torch.get_default_dtype(),
               torch.is_autocast_enabled("cpu"), torch.is_autocast_enabled("cuda"),
               torch.get_autocast_dtype("cpu"), torch.get_autocast_dtype("cuda"))
        hash(key)
    except (blocks._NoKey, TypeError):
        return None, None
    return key, leaves


def _argument_key(v, leaves, ids):
    if not isinstance(v, TensorValue):
        return blocks._leaf_key(v, leaves, ids)
    if id(v) in ids:
        return ("same", ids[id(v)])
    ids[id(v)] = ("tensor", len(ids))
    f = v.fake
    if type(f).__name__ != "FakeTensor" or f.layout != torch.strided:
        raise blocks._NoKey
    return ("T", v.cls, f.dtype, f.device, tuple(str(d) for d in f.shape), tuple(str(d) for d in f.stride()),
            str(f.storage_offset()), f.requires_grad)


def _trace(frame, fn_value, fn, args, kwargs, leaves, in_structures, key, key_leaves, per_key, what):
    tx = frame.tx
    graph = tx.graph
    for v in leaves:
        if not isinstance(v, TensorValue):
            raise Unsupported(f"{what}: an argument holds {describe(v)}; a region takes tensors, constants and "
                              "modules", hint=_HINT)
    sub = SubgraphBuilder(graph)
    fresh = [fresh_like(graph, v.fake) for v in leaves]
    explicit = iter([sub.placeholder(f, f"arg{i}") for i, f in enumerate(fresh)])
    body_args = []
    for a, structure in zip(list(args) + list(kwargs.values()), in_structures):
        if structure is None:
            body_args.append(a)
        else:
            body_args.append(to_value(structure.build(explicit)))
    body_kwargs = dict(zip(kwargs, body_args[len(args):]))
    rec = blocks.Recorder(tx) if key is not None and len(per_key) < MAX_TEMPLATES_PER_REGION else None
    before = _state(tx)
    if rec is not None:
        tx.guards.recorders.append(rec)
    try:
        result = trace_body(frame, sub, fn_value, body_args[:len(args)], body_kwargs, what)
    finally:
        if rec is not None:
            tx.guards.recorders.remove(rec)
    if rec is not None:
        rec.finish()
    outs = []
    structure = flatten(result, outs, what)
    if not all(isinstance(o, TensorValue) for o in outs):
        raise Unsupported(f"{what}: the function returns symbolic sizes", hint=_HINT)
    operands = leaves + list(sub.lifted_values)
    operand_storages = {f.untyped_storage()._cdata for f in fresh}
    operand_storages |= {v.fake.untyped_storage()._cdata for v in sub.lifted_values if isinstance(v, TensorValue)}
    for o in outs:
        if o.node.graph is not sub.graph or o.fake.untyped_storage()._cdata in operand_storages:
            raise Unsupported(f"{what}: the function returns one of its inputs (or a view of one)", hint=_HINT)
    if any(n.op == "call_function" and n.target in blocks._STATE_TARGETS for n in sub.graph.nodes):
        raise Unsupported(f"{what}: the function switches grad mode or autocast", hint=_HINT)
    reach = _reach(outs, fresh + [sub.lifted[v.node].meta["example_value"] for v in sub.lifted_values])
    gm = sub.finish(outs)
    get_attr = graph.add_subgraph(SubgraphValue(gm, f"region_{_identifier(fn)}"))
    name = get_attr.target
    region = _Region(graph, name, None, None, structure, [_meta(o.fake) for o in outs], reach)
    region.attr_node = get_attr
    if rec is not None:
        template = _template(key, key_leaves, rec, sub, leaves, before, _state(tx))
        if template is not None:
            region.template, region.origins = template
            per_key.append(region)
    items = _emit(graph, get_attr, name, operands, _fresh_results(graph, region, operands))
    return to_value(structure.build(items))


def _state(tx):
    # (A graph input the body read through a source, a global tensor, is read again by a stamped
    # call's replayed read, which finds it known: what the first call's record says it may.)
    return (tx.effects.count(), len(tx.state_changes), tx.unguarded_reads, tx.handled_exception,
            len(tx.graph.no_mutation))


def _template(key, key_leaves, rec, sub, leaves, before, after):
    """(blocks.Template of the reads and guards, origin of each lifted input), or None when a later
    call could not be stamped out from this one exactly."""
    if not rec.ok or before != after:
        return None
    events = []
    wrapped = {}
    for ev in rec.events:
        if ev[0] == "nodes":
            return None      # the enclosing graph got nodes of its own: not a read
        if ev[0] == "guard" and ev[1] in ("STATE_MATCH", "TENSOR_MATCH", "SHAPE_ENV", "STORAGE_SHARED"):
            return None
        if ev[0] == "wrap":
            wrapped.setdefault(id(ev[3]), ev[3])
        events.append(ev)
    origins = []
    for v in sub.lifted_values:
        if not isinstance(v, TensorValue):
            return None      # a symbolic size: its fake stand-in would need the size's node
        position = next((i for i, leaf in enumerate(key_leaves) if leaf is v), None)
        if position is not None:
            origins.append(("leaf", position))
        elif id(v) in wrapped:
            origins.append(("wrap", v))
        else:
            return None      # a tensor of the enclosing graph reached another way (a closure)
    return blocks.Template(key, key_leaves, events, None), origins


def _stamp(frame, region, key_leaves, leaves):
    """The call as a copy of ``region``'s first, or None when the record does not apply here."""
    tx = frame.tx
    walk = region.walk
    if type(walk) is tuple:
        # Summed up at the third call, not the second: a model of two layers never needs it.
        walk = region.walk = region_stamps.build(tx, *walk) or False
    if walk:
        layer = region_stamps.layer_of(key_leaves)
        lifted = region_stamps.stamp(tx, walk, layer) if layer is not None else None
        if lifted is not None:
            return _stamped(tx, region, leaves, [key_leaves[o] if k == "leaf" else v
                                                 for (k, o), v in zip(region.origins, lifted)])
    template = region.template
    steps = template._plan(tx, key_leaves)
    if steps is None:
        return None
    layer = region_stamps.layer_of(key_leaves) if walk is None else None
    tap = None
    if layer is not None and tx.guards.tap is None \
            and region_stamps.fresh_reads(tx, steps, layer.source):
        tap = tx.guards.tap = []
    try:
        values = _replay(tx, template, key_leaves, steps)
    finally:
        if tap is not None:
            tx.guards.tap = None
    if walk is None:
        region.walk = (layer, steps, tap, values, region.origins) if tap is not None else False
    lifted = []
    for kind, origin in region.origins:
        lifted.append(key_leaves[origin] if kind == "leaf" else values[id(origin)])
    return _stamped(tx, region, leaves, lifted)


def _replay(tx, template, key_leaves, steps):
    """Do a plan's reads and add its guards; the values read, by the recorded value's id."""
    values = {}
    for t, r in zip(template.leaves, key_leaves):
        values[id(t)] = r
    for step in steps:
        if step[0] == "wrap":
            _, obj, source, value_t = step
            if type(value_t) is ConstantValue and value_t.source is not None:
                # A constant read: nothing of it is an operand, it adds nothing to the trace (its
                # guards, installed when the trace looked at it, are the recorded guard steps).
                continue
            values[id(value_t)] = wrap(tx, obj, source)
        elif step[0] == "guard":
            _, kind, source, expected, detail, dims = step
            tx.guards.add(kind, source, expected, detail, dims)
    return values


def _stamped(tx, region, leaves, lifted):
    operands = leaves + lifted
    graph = tx.graph
    get_attr = region.attr_node
    if get_attr is None or get_attr.graph is not graph.graph or getattr(get_attr, "_erased", True):
        # (one get_attr node for all of a graph's calls of the region: a line less per layer
        # in the graph's code; a new one where that node is gone)
        get_attr = region.attr_node = graph.get_attr_node(region.name)
    items = _emit(graph, get_attr, region.name, operands, _fresh_results(graph, region, operands))
    tx.blocks_replayed += 1
    return to_value(region.structure.build(items))


# --- the node and its fake results ------------------------------------------------------------

def _emit(graph, get_attr, name, operands, fakes):
    """One ``invoke_subgraph`` node of ``graph``, its results the given fakes (no fake run)."""
    nodes = [graph.node_of(v) for v in operands]
    for n in nodes:
        if n in graph.frozen:
            raise graph.frozen_error(n)
    node = graph.graph.create_node("call_function", invoke_region, (get_attr, name, *nodes), {})
    node.meta["example_value"] = tuple(fakes)
    items = []
    for i, fake in enumerate(fakes):
        g = graph.graph.create_node("call_function", operator.getitem, (node, i), {})
        g.meta["example_value"] = fake
        items.append(TensorValue(g, fake))
    return items


def _meta(fake):
    return tuple(fake.shape), tuple(fake.stride()), fake.dtype, fake.device


def _reach(outs, inputs):
    """For each output, the positions of the body's inputs (fakes) its autograd history reaches
    (walked back from its ``grad_fn``, stopping at the inputs)."""
    by_node = {}
    for i, fake in enumerate(inputs):
        if not isinstance(fake, torch.Tensor) or not fake.requires_grad:
            continue
        key = fake.grad_fn if fake.grad_fn is not None else ("leaf", id(fake))
        by_node.setdefault(key, []).append(i)
    reach = []
    for o in outs:
        found = set()
        seen = set()
        todo = [o.fake.grad_fn] if o.fake.grad_fn is not None else []
        while todo:
            node = todo.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            hits = by_node.get(node)
            if hits is None and type(node).__name__ == "AccumulateGrad":
                hits = by_node.get(("leaf", id(node.variable)))
            if hits is not None:
                found.update(hits)
                continue
            todo.extend(n for n, _ in node.next_functions)
        reach.append(tuple(sorted(found)))
    return reach


class _Linked(torch.autograd.Function):
    """A fresh fake tensor whose autograd history reaches the given tensors (what grad_presence
    and the graph's later ops read of it); never differentiated (fakes only)."""

    @staticmethod
    def forward(ctx, meta, *inputs):
        shape, stride, dtype, device = meta
        return torch.empty_strided(shape, stride, dtype=dtype, device=device)

    @staticmethod
    def backward(ctx, grad):
        raise AssertionError("a region's stand-in fake is never differentiated")


def _fresh_results(graph, region, operands):
    grad = torch.is_grad_enabled()
    out = []
    for meta, reach in zip(region.out_metas, region.reach):
        if grad and (meta[2].is_floating_point or meta[2].is_complex) \
                and any(operands[i].fake.requires_grad for i in reach):
            with graph.fake_mode:
                out.append(_Linked.apply(meta, *[operands[i].fake for i in reach]))
            continue
        shape, stride, dtype, device = meta
        # Straight from a meta tensor (static sizes): a fake op costs ~10x more, once a layer.
        empty = _meta_empty(shape, stride, dtype)
        if empty is not None:
            out.append(new_fake(graph.fake_mode, empty, device))
        else:
            with graph.fake_mode:
                out.append(torch.empty_strided(shape, stride, dtype=dtype, device=device))
    return out


def _meta_empty(shape, stride, dtype):
    """An empty meta tensor of this layout, or None for symbolic sizes."""
    if not all(type(n) is int for n in shape) or not all(type(n) is int for n in stride):
        return None
    return torch.empty_strided(shape, stride, dtype=dtype, device="meta")


def _identifier(fn):
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", "fn")
    return "".join(c if c.isalnum() else "_" for c in name.replace(".<locals>", ""))


higher_order.register(call)

__all__ = ["call", "call_region", "repeated_block"]
