"""Which guards the module stamp covers: checked only after ``stamps.EPOCH`` moved.

A guard is *covered* when what it checks can only change through a change to a watched
module's own state, which bumps the epoch (``stamps``). That holds when:

* its source is **fixed**: every step from a pinned object to the value reads a watched
  module's own state (``m._modules[k]``, ``m._parameters[k]``, ``m._buffers[k]``, or an
  attribute in ``m.__dict__`` with no data descriptor of that name on the class), and the
  first module of that chain is pinned by an identity guard (a root like ``self`` is checked
  on every call; a module reached through fixed steps is pinned by the chain);
* and what it checks of that value cannot change in place: its identity (ID_MATCH, ALIAS,
  NOT_ALIAS between fixed sources), the value of an immutable constant (CONSTANT_MATCH), the
  type of a module or of an instance of a builtin type (TYPE_MATCH), the keys of a stamped
  table (DICT_KEYS on ``_modules``/``_parameters``/``_buffers``), the hooks of a module whose
  hook tables are stamped (NO_HOOKS), the presence of a module's own attribute (HAS_ATTR) or its absence
  from the instance (NOT_OWN_ATTR).

Each kind's rule is its ``covered`` method (``kinds``). Anything else (tensors' metadata, contents of plain lists/dicts held by modules, attributes of
plain objects, globals, closure cells, arguments, shapes, global state) is checked on every
call as before.
"""
import torch

from ..datamodel import class_lookup, is_data_descriptor
from . import stamps
from .sources import AttrSource, ItemSource, ModuleEntrySource

IMMUTABLE_CONSTANTS = (int, float, bool, str, bytes, complex, type(None), type(Ellipsis),
                       type(NotImplemented), torch.dtype, torch.device, torch.layout, torch.memory_format,
                       slice, range, torch.Size, tuple, frozenset)


def _data_descriptor(cls, name):
    attr, found = class_lookup(cls, name)
    return found and is_data_descriptor(attr)


def own_attribute(m, name) -> bool:
    """Is ``name`` one of module ``m``'s own attributes, parameters, buffers or submodules?"""
    d = m.__dict__
    if name in d:
        return not _data_descriptor(type(m), name)
    return any(name in d.get(table, ()) for table in ("_parameters", "_buffers", "_modules"))


_UNSEEN = object()


class Coverage:
    """Decides, for one GuardSet, which guards the stamp covers; watches the modules it needs."""

    def __init__(self, guards):
        self.objects = guards.objects           # source -> the object read there while tracing
        self.pinned = {g.source for g in guards.entries() if g.kind.pins and g.source is not None}
        self._owner = {}
        self._fixed = {}
        self._watchable = {}                    # id -> stamps.watchable of a module seen (it holds while partitioning)
        self._descriptors = {}                  # (class, name) -> is a data descriptor there
        self.modules = {}                       # id -> module watched by the covered guards
        self.layers = {}                        # root source -> a stamped layer's LAYER_MATCH entry

    def _class_descriptor(self, cls, name):
        # (a deep model asks the same few classes for the same names once per layer)
        key = (cls, name)
        found = self._descriptors.get(key)
        if found is None:
            found = self._descriptors[key] = _data_descriptor(cls, name)
        return found

    def _can_watch(self, m):
        ok = self._watchable.get(id(m))
        if ok is None:
            ok = self._watchable[id(m)] = stamps.watchable(m)
        return ok

    def owner(self, source):
        """The watchable module whose own state ``source``'s last step reads, else None."""
        m = self._owner.get(source, _UNSEEN)
        if m is not _UNSEEN:
            return m
        m = None
        if isinstance(source, (ModuleEntrySource, AttrSource)):
            base = self.objects.get(source.base)
            if isinstance(base, torch.nn.Module) and self._can_watch(base):
                if isinstance(source, ModuleEntrySource):
                    m = base
                elif source.attr in base.__dict__ and not self._class_descriptor(type(base), source.attr):
                    m = base
        self._owner[source] = m
        return m

    def fixed(self, source):
        """Is the object at ``source`` the same on every call whose other checks pass, as long
        as the epoch does not move?"""
        ok = self._fixed.get(source)
        if ok is not None:
            return ok
        self._fixed[source] = False   # no cycles through a source
        if isinstance(source, ItemSource):
            # An item of a fixed tuple (a layer's normalized_shape, kernel_size...).
            ok = isinstance(self.objects.get(source.base, None), tuple) and self.fixed(source.base)
            self._fixed[source] = ok
            return ok
        m = self.owner(source)
        ok = m is not None and self.stable(source.base)
        if ok:
            self._watch(m)
        self._fixed[source] = ok
        return ok

    def stable(self, source):
        """Fixed, or pinned by an identity guard of its own (a stamped layer's among them)."""
        return source in self.pinned or self.fixed(source) or (bool(self.layers) and self._layer_pinned(source))

    def _layer_pinned(self, source):
        # A stamped layer's identity guards pin sources under its root: asked for the few
        # sources queried rather than made for every layer (guards.layers).
        base = source
        while base is not None:
            layer = self.layers.get(base)
            if layer is not None:
                return layer.expected.pins_source(source, base)
            base = base.base_source
        return False

    def _watch(self, m):
        if id(m) not in self.modules:
            stamps.watch(m, known_watchable=True)     # (callers asked _can_watch)
            self.modules[id(m)] = m

    def watch_if(self, m):
        """Is ``m`` watched (now, if it can be)?"""
        if id(m) in self.modules:
            return True
        if not self._can_watch(m):
            return False
        self._watch(m)
        return True

    def watch_hooks(self, m):
        """``watch_if(m)`` and then ``stamps.hooks_watched(m)`` (once for each module of each
        stamped layer): None when ``m`` cannot be watched, else whether its hook tables are stamped."""
        if id(m) in self.modules:
            return stamps.hooks_watched(m)
        if self._watchable.get(id(m)) is False:
            return None
        hooks = stamps.watch_module(m)
        self._watchable[id(m)] = hooks is not None
        if hooks is not None:
            self.modules[id(m)] = m
        return hooks

    def covers(self, g):
        """Does the stamp cover ``g``? What each kind asks is its own (``kinds``, ``covered``)."""
        if g.source is None:
            return False
        return g.kind.covered(self, g, self.objects.get(g.source))


_LAYER_MATCH = "LAYER_MATCH"   # guards.layers' kind (a kind equals its name; layers imports kinds, which imports this)
_HEAPTYPE = 1 << 9    # Py_TPFLAGS_HEAPTYPE (no Python module names it)


def is_heap_type(cls) -> bool:
    """A class made by a class statement (its ``__class__`` can be assigned), not a builtin type."""
    return bool(cls.__flags__ & _HEAPTYPE)


def partition(guards):
    """(guards checked on every call, guards checked when the epoch moved, watched modules).
    A stamped layer's entry (``layers.LAYER_MATCH``) goes whole where all its parts go, else its
    parts go one by one."""
    entries = guards.entries()
    cov = Coverage(guards)
    if guards.layers:
        cov.layers = {g.source: g for g in entries if g.kind == _LAYER_MATCH}
    every, covered = [], []
    for g in entries:
        if g.kind == _LAYER_MATCH:
            if _layer_covered(cov, g):
                covered.append(g)
                continue
            for p in g.parts():
                (covered if cov.covers(p) else every).append(p)
            continue
        (covered if cov.covers(g) else every).append(g)
    return every, covered, list(cov.modules.values())


def _layer_covered(cov, g):
    """Are all of a stamped layer's guards covered, as each would be on its own? Decided once
    per shape over its first layer's guards, anchored only at that layer's root (so the answer
    is the layer's own, not borrowed from identity guards elsewhere), then per layer: its root
    is stable, and the modules the shape watches are watchable here, their hooks stamped alike."""
    facts = g.expected
    shape = facts.shape
    if shape.mask is None:
        first = Coverage.__new__(Coverage)
        first.__dict__.update(cov.__dict__)
        first.pinned = {shape.root} | {p.source for p in shape.parts if p.kind.pins and p.source is not None}
        first._owner, first._fixed, first.modules, first.layers = {}, {}, {}, {}
        first_objects = facts.shape.first_objects
        shape.mask = all(first.covers(p) for p in shape.parts)
        index = {id(o): i for i, o in enumerate(first_objects)}
        shape.watched = [index.get(id(m)) for m in first.modules.values()]
        if None in shape.watched:
            shape.mask = False
        shape.hooks = [stamps.hooks_watched(first_objects[i]) for i in shape.watched] if shape.mask else []
    if not shape.mask or not cov.stable(g.source):
        return False
    objects = facts.objects
    watch_hooks = cov.watch_hooks
    for i, hooks in zip(shape.watched, shape.hooks):
        if watch_hooks(objects[i]) is not hooks:
            return False
    return True
