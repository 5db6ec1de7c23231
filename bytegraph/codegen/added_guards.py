"""The guards code generation adds: facts that only the finished graph or the generated code
show, which the tracer could not guard as it read values.

* ``guard_finished_graph``: a graph that writes its inputs in place was traced for one way its
  tensor inputs share storage and its arrays lie in memory, and the containers the trace
  changed were distinct from the others it read (``finish_graph`` calls it once per graph);
* ``guard_reread_constant``: a constant passed along unguarded and re-read from its source by
  the generated code must still be readable there (``Rebuilder``).

The guards are requested here, by the two functions above, and nowhere else in codegen.
"""
from __future__ import annotations

import torch

from ..errors import Unsupported
from ..graph_facts import mutates_inputs
from ..guards.builder import ARRAYS_APART, HAS_ATTR, NOT_ALIAS, STORAGE_GROUPS, TYPE_MATCH
from ..guards.probes import memory_apart, storage_groups
from ..guards.sources import AttrSource, RawAttrSource
from ..values.base import ConstantValue


def guard_finished_graph(tx, gm) -> None:
    """Guard what the finished graph ``gm`` of trace ``tx`` relies on beyond the trace's own
    guards: how its inputs alias (when it writes them) and that the containers the trace
    changed are not passed twice."""
    guard_input_aliasing(tx, gm)
    guard_container_aliasing(tx)


def guard_reread_constant(guards, source, value) -> None:
    """A constant passed along unguarded (its guard pending) is re-read from ``source`` by the
    generated code: whatever its value now, it must still be there (``del obj.attr`` between
    calls)."""
    if isinstance(source, AttrSource):
        guards.add(HAS_ATTR, source.base, source.attr)
    elif isinstance(source, RawAttrSource):
        # (hasattr would ask the class's __getattr__): a read that fails misses.
        guards.add(TYPE_MATCH, source, type(value))


def guard_input_aliasing(tx, gm):
    """A graph that mutates tensor inputs was traced for one aliasing of its tensor inputs (the same
    tensor twice, views of one storage, or none): guard that later calls alias them the same way,
    as a backend that functionalizes the graph (AOTAutograd) relies on it. Graphs that mutate no
    input (an optimizer's, whose parameters and state are module state) need no such guard; the
    check is one pass over the inputs' storages (``storage_groups``), not one per pair."""
    tensors = [i for i in tx.graph.inputs if isinstance(i.example, torch.Tensor) and not i.scalar]
    if len(tensors) < 2 or not mutates_inputs(gm, [i.node for i in tensors]):
        return
    guard_array_overlap(tx)
    tensors = [i for i in tensors if i.array_mode is None]
    if len(tensors) >= 2:
        groups = storage_groups([i.example for i in tensors])
        tx.guards.add(STORAGE_GROUPS, None, ([i.source for i in tensors], groups), detail="input storage")


def guard_array_overlap(tx):
    """An np.ndarray input of a graph that mutates must not overlap another array or tensor input in
    memory (each is its own tensor in the graph, so the graph could not see one change through the
    other): guard that they do not; inputs that overlap now run eagerly."""
    inputs = tx.graph.inputs
    for i, a in enumerate(inputs):
        for b in inputs[i + 1:]:
            if a.array_mode is None and b.array_mode is None:
                continue
            x = a.array if a.array_mode is not None else a.example
            y = b.array if b.array_mode is not None else b.example
            if not memory_apart(x, y):
                raise Unsupported(f"{a.source.name()} and {b.source.name()} overlap in memory and the graph changes "
                                  "arrays in place; that is not traced")
            tx.guards.add(ARRAYS_APART, a.source, b.source, detail=b.source.name())


def guard_container_aliasing(tx):
    """A container the trace changed was distinct from every other container it read: guard
    that later calls do not pass the same list (say) through two sources."""
    for m in tx.effects.mutated.values():
        for other in tx.effects.existing_containers.values():
            if other is not m and other.source is not None and _kind(other) is _kind(m):
                tx.guards.add(NOT_ALIAS, m.source, other.source, detail=other.source.name())


def _kind(container):
    # Without reading a constant's value (that would guard it).
    return type(container._value) if isinstance(container, ConstantValue) else type(container)
