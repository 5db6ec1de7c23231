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

Anything else (tensors' metadata, contents of plain lists/dicts held by modules, attributes of
plain objects, globals, closure cells, arguments, shapes, global state) is checked on every
call as before.
"""
import torch

from ..datamodel import class_lookup, is_data_descriptor
from . import stamps
from .sources import AttrSource, ItemSource, ModuleEntrySource

_IMMUTABLE_CONSTANTS = (int, float, bool, str, bytes, complex, type(None), type(Ellipsis),
                        type(NotImplemented), torch.dtype, torch.device, torch.layout, torch.memory_format,
                        slice, range, torch.Size, tuple, frozenset)


def _data_descriptor(cls, name):
    attr, found = class_lookup(cls, name)
    return found and is_data_descriptor(attr)


def _own_attribute(m, name):
    """Is ``name`` one of module ``m``'s own attributes, parameters, buffers or submodules?"""
    d = m.__dict__
    if name in d:
        return not _data_descriptor(type(m), name)
    return any(name in d.get(table, ()) for table in ("_parameters", "_buffers", "_modules"))


class Coverage:
    """Decides, for one GuardSet, which guards the stamp covers; watches the modules it needs."""

    def __init__(self, guards):
        self.objects = guards.objects           # source -> the object read there while tracing
        self.pinned = {g.source for g in guards if g.kind == "ID_MATCH" and g.source is not None}
        self._owner = {}
        self._fixed = {}
        self.modules = {}                       # id -> module watched by the covered guards

    def owner(self, source):
        """The watchable module whose own state ``source``'s last step reads, else None."""
        if source in self._owner:
            return self._owner[source]
        m = None
        if isinstance(source, (ModuleEntrySource, AttrSource)):
            base = self.objects.get(source.base)
            if isinstance(base, torch.nn.Module) and stamps.watchable(base):
                if isinstance(source, ModuleEntrySource):
                    m = base
                elif source.attr in base.__dict__ and not _data_descriptor(type(base), source.attr):
                    m = base
        self._owner[source] = m
        return m

    def fixed(self, source):
        """Is the object at ``source`` the same on every call whose other checks pass, as long
        as the epoch does not move?"""
        if source in self._fixed:
            return self._fixed[source]
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
        """Fixed, or pinned by an identity guard of its own."""
        return source in self.pinned or self.fixed(source)

    def _watch(self, m):
        if id(m) not in self.modules:
            stamps.watch(m)
            self.modules[id(m)] = m

    def _watch_if(self, m):
        if id(m) in self.modules:
            return True
        if not stamps.watchable(m):
            return False
        self._watch(m)
        return True

    def covers(self, g):
        kind, source = g.kind, g.source
        if source is None:
            return False
        value = self.objects.get(source)
        if kind == "NO_HOOKS":
            return isinstance(value, torch.nn.Module) and self.stable(source) and self._watch_if(value) \
                and stamps.hooks_watched(value)
        if kind == "TYPE_MATCH" and isinstance(value, torch.nn.Module):
            # ``m.__class__ = C`` goes through nn.Module.__setattr__.
            return self.stable(source) and self._watch_if(value)
        if not self.fixed(source):
            return False
        if kind == "ID_MATCH":
            return True
        if kind == "NOT_OWN_ATTR":
            # Setting it on a module goes through its (stamped) __setattr__.
            return isinstance(value, torch.nn.Module) and self._watch_if(value)
        if kind == "HAS_ATTR":
            # A module's own attribute goes away only through its (stamped) __delattr__.
            return isinstance(value, torch.nn.Module) and _own_attribute(value, g.expected) \
                and self._watch_if(value)
        if kind in ("ALIAS", "NOT_ALIAS"):
            return self.fixed(g.expected)
        if kind == "CONSTANT_MATCH":
            return isinstance(g.expected, _IMMUTABLE_CONSTANTS)
        if kind == "TYPE_MATCH":
            return not (g.expected.__flags__ & _HEAPTYPE)   # a builtin type: __class__ cannot change
        if kind in ("DICT_KEYS", "LENGTH_MATCH"):
            if isinstance(value, tuple):
                return True
            # Only a module's own tables, and only when stamped (hook tables are, while empty).
            m = self.owner(source)
            return isinstance(source, AttrSource) and source.attr in stamps.TABLES \
                and type(m.__dict__.get(source.attr)) in stamps.STAMPED
        return False


_HEAPTYPE = 1 << 9


def partition(guards):
    """(guards checked on every call, guards checked when the epoch moved, watched modules)."""
    cov = Coverage(guards)
    every, covered = [], []
    for g in guards:
        (covered if cov.covers(g) else every).append(g)
    return every, covered, list(cov.modules.values())
