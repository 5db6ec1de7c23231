"""One guard over a stamped-out layer: the guards of a layer built like an earlier one, kept as
one entry until someone asks for them one by one.

A compile region called on many layers of one build (``self.h[0]`` .. ``self.h[31]``) adds, per
layer, the same ~75 guards moved under the layer's source: identities of its parameters and
submodules, its constants, its tables and classes, no hooks. ``LAYER_MATCH`` is those guards as
one entry of the ``GuardSet``: a ``LayerShape`` (the guards the first stamped layer added, with
its source as the root) and, per layer, its root source and the objects its identity guards
expect. Nothing about what is checked changes:

* iterating a ``GuardSet`` (cache entries, ``explain``, logs, the persistent cache) gives the
  guards one by one, exactly those a stamp adds (``LayerFacts.expand``);
* the generated check writes each part's own lines (the same failure messages);
* ``coverage.partition`` sorts the parts into per-call and covered ones as it would sort them
  one by one: the shape's answer (computed once, over the first layer's parts, with the root as
  the only anchor from outside the layer) holds for a layer whose root is stable and whose
  modules are watched the same way (``LayerShape.split``).

What saves time is only that a layer's guards are not made, hashed and sorted one by one
while tracing and compiling the check.
"""
from __future__ import annotations

import torch

from .kinds import ID_MATCH, GuardKind, KINDS
from .sources import AttrSource, DefaultSource, ItemSource, ModuleEntrySource

_EDGES = (AttrSource, ModuleEntrySource, ItemSource, DefaultSource)


def rebase(source, old_root, new_root, memo):
    """``source`` (under ``old_root`` through attribute, table and item steps) under ``new_root``;
    None if it is not under ``old_root`` that way."""
    if source is old_root:
        return new_root
    out = memo.get(source)
    if out is not None:
        return out
    if type(source) is type(old_root) and source == old_root:
        return new_root
    if not isinstance(source, _EDGES):
        return None
    base = rebase(source.base, old_root, new_root, memo)
    if base is None:
        return None
    if isinstance(source, AttrSource):
        out = AttrSource(base, source.attr)
    elif isinstance(source, ModuleEntrySource):
        out = ModuleEntrySource(base, source.table, source.key)
    elif isinstance(source, ItemSource):
        out = ItemSource(base, source.index)
    else:
        out = DefaultSource(base, source.index, source.kw)
    memo[source] = out
    return out


class LayerShape:
    """The guards one stamp of a region adds, relative to the layer's root source."""

    def __init__(self, root, parts, identity, first_objects):
        self.root = root            # the first stamped layer's source
        self.parts = parts          # its guards (builder.Guard), in the order they were added
        self.identity = identity    # per part: index into the layer's objects its ID_MATCH expects, or None
        self.first_objects = first_objects   # the first stamped layer's objects, in the walk's order
        self.pins = [i for i, p in enumerate(parts) if p.kind.pins and p.source is not None]
        self.pinned = None          # their sources (coverage asks whether one of them is pinned)
        # Identity guards on tensors: their metadata is taken when the layer is stamped (as
        # GuardSet.add takes it), not when the guards are made (the deep check is written later).
        self.tensor_parts = [i for i, (p, ident) in enumerate(zip(parts, identity))
                             if ident is not None and p.kind is ID_MATCH and isinstance(first_objects[ident], torch.Tensor)]
        self.observed = [i for i, p in enumerate(parts) if p.kind.observation(p) is not None]
        self.mask = None            # per part: covered (coverage.partition, computed once)
        self.watched = None         # indices (into the layer's objects) of the modules the covered parts watch
        self.hooks = None           # per watched module: were its hook tables stamped


class LayerFacts:
    """``expected`` of a LAYER_MATCH guard: one layer stamped like ``shape``'s."""

    def __init__(self, shape, objects, metas):
        self.shape = shape
        self.objects = objects      # the layer's objects, in the walk's order (0: the layer module)
        self.metas = dict(zip(shape.tensor_parts, metas))   # part index -> builder.TensorMeta taken at the stamp
        self._parts = None

    def expand(self, root, make_guard):
        """The layer's guards, one by one (``make_guard(kind, source, expected, detail, dims)``)."""
        if self._parts is None:
            shape = self.shape
            memo = {}
            out = []
            for i, (part, ident) in enumerate(zip(shape.parts, shape.identity)):
                src = rebase(part.source, shape.root, root, memo) if part.source is not None else None
                expected = self.objects[ident] if ident is not None else part.expected
                out.append(make_guard(part.kind, src, expected, part.detail, part.dynamic_dims, self.metas.get(i)))
            self._parts = out
        return self._parts

    def part(self, i, root, make_guard):
        """The layer's ``i``-th guard alone."""
        if self._parts is not None:
            return self._parts[i]
        part, ident = self.shape.parts[i], self.shape.identity[i]
        src = rebase(part.source, self.shape.root, root, {}) if part.source is not None else None
        expected = self.objects[ident] if ident is not None else part.expected
        return make_guard(part.kind, src, expected, part.detail, part.dynamic_dims, self.metas.get(i))

    def pins_source(self, source, root):
        """Does one of the layer's identity guards pin ``source`` (under ``root``, its source)?"""
        shape = self.shape
        if shape.pinned is None:
            shape.pinned = {shape.parts[i].source for i in shape.pins}
        return rebase(source, root, shape.root, {}) in shape.pinned

    def __repr__(self):
        return f"<layer of {len(self.shape.parts)} guards>"


class LayerMatch(GuardKind):
    """A stamped-out layer's guards as one entry (``LayerFacts``); checked part by part."""
    order = 1

    def lines(self, g, em):
        check, explain = [], []
        for part in g.parts():
            before = len(em.assignments)
            c, e = part.kind.lines(part, em)
            new = em.assignments[before:]
            del em.assignments[before:]
            check += new + c
            explain += new + e
        return check, explain

    def describe(self, g):
        return f"{g.source.name()}: LAYER_MATCH ({len(g.expected.shape.parts)} guards)"

    def covered(self, cov, g, value):
        return False    # coverage.partition splits it into its parts' answers

    def observation(self, g):
        return None


LAYER_MATCH = LayerMatch("LAYER_MATCH")

__all__ = ["LAYER_MATCH", "LayerFacts", "LayerShape", "rebase", "KINDS", "ID_MATCH"]
