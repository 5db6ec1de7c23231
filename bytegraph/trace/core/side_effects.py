"""Side effects of one trace on state that exists before the call: ``TraceContext.effects``.

The trace works on symbolic copies, so later reads in the trace see each change; the
transformed function does the changes for real after the graph, and at a graph break before
the native step (``codegen.transformed.replay_side_effects``). One object holds every kind:

* ``mutated``: containers read through a source (lists, dicts, sets) and changed in place;
* ``attr_stores``: ``obj.name = value`` / ``del obj.name`` on objects and tensors from outside;
* ``global_stores``, ``cell_stores``: ``STORE_GLOBAL``/``DELETE_GLOBAL``, ``STORE_DEREF`` on a
  real closure cell;
* ``item_stores``: ``mapping[key] = value`` on a mapping whose own ``__setitem__`` is replayed
  (``os.environ``);
* ``warnings``: ``warnings.warn`` calls, shown after the graph as Python's filters say
  (``callables/stdlib_calls.py``);
* ``iterators``: tuple and range iterators from outside (``values.builder``); the items the
  trace took from one are taken from the real iterator.

``stored_values`` is the one list of the values those stores put into outside state.
"""
import torch

from ...errors import Unsupported
from ...guards import stamps
from ...guards.sources import AttrSource, ItemSource, RawAttrSource

# The value of a name, attribute or item the trace deleted (``del``).
DELETED = object()


class Stores(dict):
    """Pending stores keyed by what they change; ``made`` counts every store put in, so code
    that stores again to an attribute, global or cell stored earlier in the trace still shows
    as having changed something (``SideEffects.count``)."""

    def __init__(self):
        super().__init__()
        self.made = 0

    def __setitem__(self, key, value):
        self.made += 1
        super().__setitem__(key, value)

    def pop(self, *args):
        self.made += 1
        return super().pop(*args)


class SideEffects:
    """What the trace changed outside itself, by kind, in program order within each kind."""

    def __init__(self, objects: dict):
        self.objects = objects         # source -> object read there (the trace's GuardSet.objects)
        self.attr_stores = Stores()    # (id(obj), name) -> (ObjectValue, name, value or DELETED)
        self.mutated = {}              # id(value) -> List/Dict/ConstantValue(set) read from a source and changed
        self.existing_containers = {}  # id(value) -> value: containers wrapped from real objects
        self.global_stores = Stores()  # (id(globals dict), name) -> (target source, value or DELETED)
        self.cell_stores = Stores()    # id(real cell) -> (RealCell, value)
        self.item_stores = {}          # (id(mapping), key) -> (ObjectValue, key, value or DELETED)
        # (message, category, filename, lineno, module, module globals) of the place each warning names
        self.warnings = []
        self.iterators = {}            # id(value) -> IteratorValue read through a source (its pos: items taken)
        self.recorded = 0              # changes recorded so far (every kind but attribute stores)

    def count(self) -> int:
        """How many side effects the trace has recorded so far (to tell whether code made any)."""
        return self.attr_stores.made + self.global_stores.made + self.cell_stores.made + self.recorded \
            + sum(it.pos for it in self.iterators.values())

    def has_any(self) -> bool:
        return bool(self.attr_stores or self.mutated or self.global_stores or self.cell_stores
                    or self.item_stores or self.warnings or self.advanced_iterators())

    def advanced_iterators(self) -> list:
        """The iterators from outside that the trace took items from."""
        return [it for it in self.iterators.values() if it.pos]

    def stored_values(self) -> list:
        """The values the stores put into outside state (attributes, globals, cells, items), in
        that order; deletions store nothing."""
        out = [value for _, _, value in self.attr_stores.values()]
        out += [value for _, value in self.global_stores.values()]
        out += [value for _, value in self.cell_stores.values()]
        out += [value for _, _, value in self.item_stores.values()]
        return [v for v in out if v is not DELETED]

    def mark_mutated(self, value, what="changing"):
        """``value`` is changed in place by the trace; a real container is updated after the graph."""
        if value.source is not None:
            _refuse_object_tables(value.source, self.objects, what)
            self.mutated.setdefault(id(value), value)
            self.recorded += 1
        elif id(value) in self.existing_containers:
            raise Unsupported(f"{what} a {value.python_type().__name__} that exists outside the compiled "
                              "function but cannot be re-read on later calls (no source)")
        return value

    def store_global(self, key, source, value):
        """``STORE_GLOBAL``/``DELETE_GLOBAL`` (``value`` DELETED) of ``key`` = (id(globals), name)."""
        self.global_stores.pop(key, None)   # keep program order: the latest store goes last
        self.global_stores[key] = (source, value)
        self.recorded += 1

    def record_warning(self, message, category, filename, lineno, module, module_globals):
        """``warnings.warn(...)`` whose place (``filename``, ``lineno``, ``module``) the trace worked out."""
        self.warnings.append((message, category, filename, lineno, module, module_globals))
        self.recorded += 1

    def store_cell(self, cell, value):
        """``STORE_DEREF`` on a real closure cell (``RealCell``)."""
        self.cell_stores.pop(id(cell.cell), None)
        self.cell_stores[id(cell.cell)] = (cell, value)
        self.recorded += 1

    def record_item_store(self, mapping, key, value):
        """``mapping[key] = value`` (``DELETED``: ``del``) on a real mapping read through a source
        whose own ``__setitem__`` is replayed after the graph (``os.environ``)."""
        _refuse_object_tables(mapping.source, self.objects, "changing")
        self.item_stores.pop((id(mapping.obj), key), None)   # keep program order
        self.item_stores[(id(mapping.obj), key)] = (mapping, key, value)
        self.recorded += 1


def _refuse_object_tables(source, objects, what):
    """Changing an existing object's ``__dict__``, or one of ``nn.Module``'s tables (``_buffers``,
    ``_forward_hooks``...) of a module that exists outside the compiled function, is not traced:
    replayed after the graph, it would leave the trace reading the object as it was (a buffer
    registered in forward, then read)."""
    if isinstance(source, (AttrSource, RawAttrSource)) and source.attr == "__dict__":
        # Attribute reads go to the object's real __dict__ while tracing: keep them true.
        raise Unsupported(f"{what} the __dict__ of an object that exists outside the compiled function",
                          hint="set the attribute with obj.name = value instead")
    if isinstance(source, AttrSource):
        owner, table = source.base, source.attr               # module._buffers
    elif isinstance(source, ItemSource) and isinstance(source.base, AttrSource) \
            and source.base.attr == "__dict__":
        owner, table = source.base.base, source.index         # module.__dict__['_buffers']
    else:
        return
    if table in stamps.TABLES and isinstance(objects.get(owner), torch.nn.Module):
        raise Unsupported(f"{what} {table} of a module that exists outside the compiled function "
                          "(registering a parameter, buffer, submodule or hook) changes the module's "
                          "structure", hint="register it in __init__, or before calling the compiled function")
