"""A region's later layers stamped out by a walk over the layer's objects, one guard for the layer.

The second call of a region (``higher_order_regions._stamp``) is stamped out the general way:
the record is moved under the call's sources and checked read by read (``blocks.Template._plan``),
the reads are done again through ``wrap``, each guard is added. While it runs, every guard it
asks for is noted (``GuardSet.tap``). When all of that happened under the layer's own source
(the module passed as the region's ``self``), the call is summed up as a ``Walk``:

* the objects it read under the layer, as steps from the layer (attribute, table entry, item),
  each with the kind of object found there and, for an attribute, whether it was the object's
  own (what ``guards.coverage`` asks);
* the guards it asked for under the layer (``guards.layers.LayerShape``), each either an
  identity guard on the object at its own source (then the next layer's guard expects the
  object found there) or a check made on the object found there;
* which of those objects are the lifted parameters and buffers.

A later call of the region on another layer walks the same steps from its module, checks each
object is equivalent to the one the general stamp saw (``blocks._equivalent``, the check
``_plan`` makes) and that each guard that is not an identity holds (the kind's own ``holds``),
that none of the objects is known to the trace yet (the general stamp's reads were all first
reads, so ``wrap`` added every guard it would), then adds the parameters' ``get_attr`` nodes
and one ``LAYER_MATCH`` guard for the layer (``GuardSet.add_layer``: the same guards, kept as one
entry). A module forward being recorded around the call (``blocks.Recorder``) is not kept then:
its record would lack the layer's reads. Anything else (``functional_call``'s overrides, a reassigned buffer,
a step that fails, a check that does not hold) gives None: the call is stamped the general way.
"""
from __future__ import annotations

import operator

import torch

from ...guards import builder as g
from ...guards.kinds import CONSTANT_MATCH, ID_MATCH, LENGTH_MATCH, NOT_OWN_ATTR, TYPE_MATCH
from ...guards.layers import LayerFacts, LayerShape, rebase
from ...guards.sources import AttrSource, ItemSource, ModuleEntrySource, Source, _plain
from ...values import builder as values_builder
from ...values.base import ObjectValue
from ...values.builder import CONSTANT_TYPES
from .blocks import _equivalent, _same_tables

try:
    from torch._C._dynamo.guards import TensorGuards    # a checker only (as guards.tensor_batch)
except ImportError:
    TensorGuards = None

_STEPS = (AttrSource, ModuleEntrySource, ItemSource)


class Walk:
    def __init__(self, root, steps, first_objects, wrapped, shape, checks, operands):
        self.root = root                    # the general stamp's layer source
        self.steps = steps                  # per object after the layer: (parent index, step, key, own)
        self.first_objects = first_objects  # the general stamp's objects (0: its layer module)
        self.wrapped = wrapped              # indices of the objects read through wrap (not constants)
        self.shape = shape                  # guards.layers.LayerShape
        self.operands = operands            # per lifted input: (object index, its source under the root, is a
                                            # parameter, its name after the root's) or None
        self.same = Sameness(first_objects)  # is a later layer's walk equivalent to this one's objects
        # (object index, kind, expected) of the guards that are not identities, less those
        # the equivalence check implies
        self.checks = self.same.unimplied(checks)


def layer_of(key_leaves):
    """The one module among a call's arguments read through a source, or None."""
    found = [v for v in key_leaves if isinstance(v, ObjectValue) and isinstance(v.obj, torch.nn.Module)]
    others = [v for v in key_leaves if isinstance(v, ObjectValue)]
    if len(found) != 1 or len(others) != 1 or found[0].source is None:
        return None
    return found[0]


def fresh_reads(tx, steps, root):
    """Were all of a general stamp's reads under ``root`` first reads (``_plan``'s steps, before
    they are done)?"""
    seen = set()
    memo = {}
    for step in steps:
        if step[0] != "wrap":
            continue
        _, obj, source, _value = step
        if isinstance(obj, CONSTANT_TYPES) or rebase(source, root, root, memo) is None:
            continue
        known = tx.memo.get(id(obj))
        if (known is not None and known[0] is obj) or id(obj) in seen:
            return False
        seen.add(id(obj))
    return True


def build(tx, layer, steps, tapped, values, origins):
    """A ``Walk`` from a general stamp on ``layer`` (its ``_plan`` steps, the guards it asked for,
    the values its reads gave, the region's lifted inputs' origins), or None."""
    root = layer.source
    memo = {}
    index = {root: 0}
    objects = [layer.obj]
    walk_steps = []

    def place(source):
        i = index.get(source)
        if i is not None:
            return i
        if not isinstance(source, _STEPS) or rebase(source, root, root, memo) is None:
            return None
        parent = place(source.base)
        if parent is None:
            return None
        base = objects[parent]
        try:
            if isinstance(source, AttrSource):
                obj, step, key = getattr(base, source.attr), "attr", source.attr
                own = source.attr in getattr(base, "__dict__", ())
            elif isinstance(source, ModuleEntrySource):
                obj, step, key, own = base.__dict__[source.table][source.key], source.table, source.key, True
            else:
                if type(source.index) is not int:
                    return None
                obj, step, key, own = base[source.index], "item", source.index, True
        except Exception:
            return None
        index[source] = len(objects)
        objects.append(obj)
        walk_steps.append((parent, step, key, own))
        return index[source]

    wrapped = []
    by_value = {}
    for step in steps:
        if step[0] != "wrap":
            continue
        _, obj, source, value_t = step
        if rebase(source, root, root, memo) is None:
            continue            # read from outside the layer: the same read for every layer
        i = place(source)
        if i is None or objects[i] is not obj:
            return None
        if not isinstance(obj, CONSTANT_TYPES):
            wrapped.append(i)
        by_value[id(value_t)] = (i, source)
    parts, identity, checks = [], [], []
    for kind, source, expected, detail, dims in tapped:
        if isinstance(expected, Source):
            return None         # ALIAS, NOT_ALIAS: between two places
        if source is None or rebase(source, root, root, memo) is None:
            continue            # outside the layer (a class's function, global hooks): the same guard, already here
        i = place(source)
        if i is None:
            return None
        if kind is ID_MATCH and expected is objects[i]:
            ident = i
        else:
            if kind.holds(objects[i], expected) is not True:
                return None     # a kind checked with more than its object (ALIAS...)
            ident = None
            checks.append((i, kind, expected))
        parts.append(g.Guard(kind, source, expected, detail, tuple(dims)))
        identity.append(ident)
    operands = []
    for kind, origin in origins:
        if kind == "leaf":
            operands.append(None)
            continue
        found = by_value.get(id(origin))
        if found is None:
            return None
        i, source = found
        value = values[id(origin)]
        if not isinstance(source, ModuleEntrySource) or source.table not in ("_parameters", "_buffers") \
                or type(objects[i]) not in (torch.Tensor, torch.nn.Parameter) or value.node.op != "get_attr":
            return None
        # Its name under another layer: that layer's name and the same steps (as Source.name
        # writes a path whose bases are attribute, table and item steps).
        name, root_name = source.name(), root.name()
        suffix = name[len(root_name):] if name.startswith(root_name) and root_name == _plain(root) else None
        operands.append((i, source, source.table == "_parameters", suffix))
    # Deduplicate the parts the way the guard set does (a guard asked for twice is one guard).
    seen, kept, kept_identity = set(), [], []
    for part, ident in zip(parts, identity):
        key = (part.kind, part.source, part.detail, part.expected if part.kind.per_expected else None)
        if key in seen:
            continue
        seen.add(key)
        kept.append(part)
        kept_identity.append(ident)
    shape = LayerShape(root, kept, kept_identity, objects)
    return Walk(root, walk_steps, objects, wrapped, shape, checks, operands)


def stamp(tx, walk, layer):
    """(operand values, per lifted input) for the call on ``layer`` as a copy of the walk, its
    guards added as one entry; None (nothing changed) when the walk does not apply."""
    if tx.state_overrides:
        return None
    objects = [layer.obj]
    first = walk.first_objects
    if type(layer.obj) is not type(first[0]):
        return None
    append = objects.append
    for parent, step, key, own in walk.steps:
        base = objects[parent]
        try:
            if step == "attr":
                obj = getattr(base, key)
                if (key in getattr(base, "__dict__", ())) != own:
                    return None
            elif step == "item":
                obj = base[key]
            else:
                obj = base.__dict__[step][key]
        except Exception:
            return None
        append(obj)
    same = walk.same
    if not same.holds(objects):
        return None
    reassigned = values_builder._reassigned_buffers
    if reassigned and any(isinstance(o, torch.nn.Module) and o in reassigned for o in objects):
        return None     # a buffer of the layer gets a new tensor each call: read as an input, not stamped
    for i, kind, expected in walk.checks:
        if kind.holds(objects[i], expected) is not True:
            return None
    memo = tx.memo
    seen = set()
    for i in walk.wrapped:
        obj = objects[i]
        known = memo.get(id(obj))
        if (known is not None and known[0] is obj) or id(obj) in seen:
            return None
        seen.add(id(obj))
    for r in tx.guards.recorders:
        # A module forward around the call is being recorded (trace/blocks.py): this layer's
        # reads and guards do not go through wrap and GuardSet.add, so a copy of that record
        # would lack them; it is not kept (a model's body around its layers is called once).
        r.ok = False
    root = layer.source
    root_name = None
    sources = [root] + [None] * len(walk.steps)     # per object, its source under this layer (when asked)
    graph = tx.graph
    guards = tx.guards
    entries = []
    for operand in walk.operands:
        if operand is None:
            continue
        i, source, is_parameter, suffix = operand
        source_r = _source_at(walk.steps, sources, i)
        if suffix is not None and root_name is None:
            root_name = root.name()
        entries.append((objects[i], source_r, is_parameter, root_name + suffix if suffix is not None else None))
    values = iter(graph.add_layer_state(entries))
    lifted = []
    for operand in walk.operands:
        if operand is None:
            lifted.append(None)
            continue
        value = next(values)
        tensor = objects[operand[0]]
        memo[id(tensor)] = (tensor, value)
        guards.objects[value.source] = tensor
        lifted.append(value)
    metas = same.metas(objects, [walk.shape.identity[i] for i in walk.shape.tensor_parts])
    guards.add_layer(root, LayerFacts(walk.shape, objects, metas))
    return lifted


class Sameness:
    """Is a later layer's walk equivalent, object by object, to the general stamp's
    (``blocks._equivalent``)? Its tensors are compared with a snapshot taken when the walk
    is built (the objects the general stamp saw, checked then): the plain ones all at once by
    torch's C++ tensor checker (class, dispatch keys, dtype, device, requires_grad, sizes,
    strides; storage offset and layout apart), and a layer that matches has the snapshot's
    ``TensorMeta``s (they are made of what was compared). Modules compare their class, instance
    ``forward`` and table names and empty entries (``blocks._same_tables``: as one list of
    names and lengths, and no entry None where the walk's module had none); anything else by
    ``_equivalent``."""

    def __init__(self, first):
        self.first = first
        tensors = [i for i, o in enumerate(first) if type(o) in _PLAIN_TENSORS and o.layout is torch.strided
                   and o.device.type in ("cpu", "cuda") and not o.dtype.is_complex] if TensorGuards else []
        self.tensors = tensors
        self.checker = None
        self._metas = {}
        self.offsets = self.layouts = ()
        if tensors:
            ts = [first[i] for i in tensors]
            try:
                self.checker = TensorGuards(*ts, dynamic_dims_sizes=[list(t.shape) for t in ts],
                                            dynamic_dims_strides=[list(t.stride()) for t in ts])
            except Exception:
                tensors = self.tensors = []
            else:
                self.pick = operator.itemgetter(*tensors) if len(tensors) > 1 else (lambda objects: (objects[tensors[0]],))
                self.offsets = [t.storage_offset() for t in ts]
                self.layouts = [torch.strided] * len(ts)
                self._metas = {i: g.TensorMeta(t) for i, t in zip(tensors, ts)}
        apart = set(tensors)
        self.modules = []
        for i, o in enumerate(first):
            if i not in apart and isinstance(o, torch.nn.Module):
                d = o.__dict__
                m, p, b = d.get("_modules", _EMPTY), d.get("_parameters", _EMPTY), d.get("_buffers", _EMPTY)
                if not (isinstance(m, dict) and isinstance(p, dict) and isinstance(b, dict)):
                    continue        # (compared by _equivalent)
                # (no entry None: then a later layer's tables need only their names and no None)
                plain = _NONE not in map(type, [*m.values(), *p.values(), *b.values()])
                self.modules.append((i, o, d.get("forward", _ABSENT), [len(m), *m, len(p), *p, len(b), *b], plain))
        apart.update(m[0] for m in self.modules)
        self.others = [(i, o) for i, o in enumerate(first) if i not in apart]

    def holds(self, objects):
        """Is each of ``objects`` (a later layer's walk) equivalent to the general stamp's?"""
        if self.tensors:
            ts = self.pick(objects)
            if not self.checker.check(*ts) or list(map(_storage_offset, ts)) != self.offsets \
                    or list(map(_layout, ts)) != self.layouts:
                return False
        for i, a, forward, names, plain in self.modules:
            o = objects[i]
            if a is o:
                continue
            d = o.__dict__
            if type(o) is not type(a) or d.get("forward", _ABSENT) is not forward:
                return False
            m, p, b = d.get("_modules", _EMPTY), d.get("_parameters", _EMPTY), d.get("_buffers", _EMPTY)
            if [len(m), *m, len(p), *p, len(b), *b] != names:
                return False
            if plain:
                if _NONE in map(type, [*m.values(), *p.values(), *b.values()]):
                    return False
            elif not _same_tables(a, o):
                return False
        for i, a in self.others:
            b = objects[i]
            if a is not b and not _equivalent(a, b):
                return False
        return True

    def unimplied(self, checks):
        """``checks`` less those ``holds`` implies: a CONSTANT_MATCH expecting the walk's own
        int, bool, str or float (not a NaN) at its place, which ``_equivalent`` compares by type
        and value (a float by its repr: a zero's sign too); a TYPE_MATCH expecting the walk's
        object's class (every object is compared by its exact class); a LENGTH_MATCH of the
        walk's own tuple (``_equivalent`` compares lengths); a NOT_OWN_ATTR of ``forward`` on a
        module that had none of its own (compared as absent)."""
        others = {i for i, _ in self.others}
        no_forward = {m[0] for m in self.modules if m[2] is _ABSENT}
        first = self.first

        def implied(i, kind, expected):
            if kind is CONSTANT_MATCH:
                return i in others and expected is first[i] and type(expected) in _PLAIN_CONSTANTS \
                    and expected == expected
            if kind is TYPE_MATCH:
                return type(first[i]) is expected
            if kind is LENGTH_MATCH:
                return i in others and type(first[i]) is tuple and len(first[i]) == expected
            if kind is NOT_OWN_ATTR:
                return i in no_forward and expected == "forward"
            return False

        return [(i, kind, expected) for i, kind, expected in checks if not implied(i, kind, expected)]

    def metas(self, objects, indices):
        """The ``TensorMeta`` of each of ``objects[i]`` for ``i`` in ``indices`` (after ``holds``)."""
        found = self._metas
        return [found.get(i) or g.TensorMeta(objects[i]) for i in indices]


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
_storage_offset = torch.Tensor.storage_offset
_layout = operator.attrgetter("layout")
_PLAIN_CONSTANTS = (int, bool, str, float)
_NONE = type(None)
_EMPTY = {}
_ABSENT = object()


def _source_at(steps, sources, i):
    """The source of the walk's ``i``-th object under this layer, made from its parent's (what
    ``rebase`` of the general stamp's source gives, without comparing and hashing its bases)."""
    source = sources[i]
    if source is None:
        parent, step, key, _own = steps[i - 1]
        base = _source_at(steps, sources, parent)
        if step == "attr":
            source = AttrSource(base, key)
        elif step == "item":
            source = ItemSource(base, key)
        else:
            source = ModuleEntrySource(base, step, key)
        sources[i] = source
    return source


__all__ = ["Walk", "build", "fresh_reads", "layer_of", "stamp"]
