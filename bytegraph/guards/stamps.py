"""One counter for the state of every watched ``nn.Module``: guards flat in depth.

A trace through a model relies on many facts about its module tree: which submodule sits
at ``self.h[3].attn``, which ``Parameter`` at ``.c_attn.weight``, that ``ln_1`` has no hooks,
that ``dropout.training`` is False, that ``attn.n_head`` is 4. Checking each of them on every
call costs time linear in depth. Instead, every change to a watched module's own state bumps
one global counter, ``EPOCH``; a cache entry remembers the value it last validated at, and
checks those facts one by one only when the counter moved (then records the new value).

What bumps the counter, for a *watched* module (one that a compiled trace relied on):

* ``setattr``/``delattr`` (``nn.Module.__setattr__``/``__delattr__``, wrapped once): new or
  replaced attributes, parameters, buffers, submodules, ``training`` (``train()``/``eval()``),
  ``forward``, ``__class__``;
* every change to its ``_parameters``/``_buffers``/``_modules`` tables and to its (empty when
  watched) hook tables, which are swapped for dict subclasses that bump on every mutating
  method: ``register_parameter``, ``add_module``, ``ModuleList.insert``, ``del m._parameters[k]``,
  ``register_forward_hook`` and ``handle.remove()`` all go through them;
* ``nn.Module._apply`` (``.to()``, ``.half()``, ``.cuda()``...: parameters keep their identity
  but change dtype or device) and ``nn.Module.requires_grad_``.

A module is watchable when its class keeps ``nn.Module``'s ``__setattr__``, ``__delattr__`` and
``__getattribute__`` (or the torch ones known to call them) and its tables are plain
``dict``/``OrderedDict``; the guards of any other module are checked on every call.

Not seen (documented in docs/depth.md): writes that bypass all of the above, i.e.
``m.__dict__[k] = v``, ``object.__setattr__(m, k, v)``, ``dict.__setitem__(m._modules, ...)``,
changes to a module's class, and tensor-level changes to a parameter (``p.requires_grad_()``,
``p.data = t``). In-place changes of parameter data (optimizer steps, ``load_state_dict``)
change no fact a trace relies on and bump nothing.
"""
from collections import OrderedDict

import torch
from torch.nn.modules import module as _mm

EPOCH = [0]   # bumped on every change to a watched module; read by generated guards as EPOCH[0]

# Tables swapped for stamped dicts (their contents are read by traces or hold hooks).
STATE_TABLES = ("_parameters", "_buffers", "_modules")
HOOK_TABLES = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs",
               "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs",
               "_backward_hooks", "_backward_pre_hooks")
TABLES = STATE_TABLES + HOOK_TABLES


def _bump():
    EPOCH[0] += 1


class StampedDict(dict):
    """A module's table: every change bumps ``EPOCH``. Reads are dict's own."""
    __slots__ = ("__weakref__",)

    def __setitem__(self, key, value):
        dict.__setitem__(self, key, value)
        _bump()

    def __delitem__(self, key):
        dict.__delitem__(self, key)
        _bump()

    def pop(self, *args):
        try:
            return dict.pop(self, *args)
        finally:
            _bump()

    def popitem(self):
        try:
            return dict.popitem(self)
        finally:
            _bump()

    def clear(self):
        dict.clear(self)
        _bump()

    def update(self, *args, **kwargs):
        try:
            dict.update(self, *args, **kwargs)
        finally:
            _bump()

    def setdefault(self, key, default=None):
        try:
            return dict.setdefault(self, key, default)
        finally:
            _bump()

    def __ior__(self, other):
        try:
            return dict.__ior__(self, other)
        finally:
            _bump()

    def __reduce_ex__(self, protocol):
        # Copies and pickles are plain dicts: a copied module is not watched, and a saved
        # model loads without bytegraph.
        return (dict, (dict(self),))


class StampedOrderedDict(OrderedDict):
    """``StampedDict`` for tables that are ``OrderedDict``s (hook tables; weak-referenceable,
    as ``RemovableHandle`` needs)."""

    def __setitem__(self, key, value):
        OrderedDict.__setitem__(self, key, value)
        _bump()

    def __delitem__(self, key):
        OrderedDict.__delitem__(self, key)
        _bump()

    def pop(self, *args):
        try:
            return OrderedDict.pop(self, *args)
        finally:
            _bump()

    def popitem(self, last=True):
        try:
            return OrderedDict.popitem(self, last)
        finally:
            _bump()

    def clear(self):
        OrderedDict.clear(self)
        _bump()

    def update(self, *args, **kwargs):
        try:
            OrderedDict.update(self, *args, **kwargs)
        finally:
            _bump()

    def setdefault(self, key, default=None):
        try:
            return OrderedDict.setdefault(self, key, default)
        finally:
            _bump()

    def move_to_end(self, key, last=True):
        OrderedDict.move_to_end(self, key, last)
        _bump()

    def __ior__(self, other):
        try:
            return OrderedDict.__ior__(self, other)
        finally:
            _bump()

    def __reduce_ex__(self, protocol):
        return (OrderedDict, (list(self.items()),))


STAMPED = (StampedDict, StampedOrderedDict)
PLAIN = {StampedDict: dict, StampedOrderedDict: OrderedDict}
STAMPED_FOR = {dict: StampedDict, OrderedDict: StampedOrderedDict}


# --- the wrapped nn.Module methods ---------------------------------------------------------

_originals = {}


def _is_watched(module):
    return type(module.__dict__.get("_parameters")) is StampedDict


def _setattr(self, name, value):
    watched = type(self.__dict__.get("_parameters")) is StampedDict
    _originals["__setattr__"](self, name, value)
    if watched:
        EPOCH[0] += 1


def _delattr(self, name):
    watched = type(self.__dict__.get("_parameters")) is StampedDict
    _originals["__delattr__"](self, name)
    if watched:
        EPOCH[0] += 1


def _apply(self, *args, **kwargs):
    try:
        return _originals["_apply"](self, *args, **kwargs)
    finally:
        if _is_watched(self):
            _bump()


def _requires_grad_(self, *args, **kwargs):
    try:
        return _originals["requires_grad_"](self, *args, **kwargs)
    finally:
        if _is_watched(self):
            _bump()


_WRAPPERS = {"__setattr__": _setattr, "__delattr__": _delattr, "_apply": _apply,
             "requires_grad_": _requires_grad_}


def install():
    """Wrap nn.Module's methods (once, on the first module watched)."""
    if _originals:
        return
    for name, wrapper in _WRAPPERS.items():
        original = torch.nn.Module.__dict__[name]
        _originals[name] = original
        wrapper.__name__ = original.__name__
        wrapper.__qualname__ = original.__qualname__
        wrapper.__doc__ = original.__doc__
        wrapper.__wrapped__ = original
        setattr(torch.nn.Module, name, wrapper)


# torch classes whose own __setattr__ ends in nn.Module.__setattr__ for every store.
_KNOWN_SETATTR = ()


def _known_setattr():
    global _KNOWN_SETATTR
    if not _KNOWN_SETATTR:
        rnn = torch.nn.modules.rnn.RNNBase.__dict__.get("__setattr__")
        _KNOWN_SETATTR = tuple(f for f in (rnn,) if f is not None)
    return _KNOWN_SETATTR


_TABLE_TYPES = (dict, OrderedDict) + STAMPED


def _class_watchable(cls):
    setattr_ = cls.__setattr__
    return (setattr_ is _setattr or setattr_ in _known_setattr()) and cls.__delattr__ is _delattr \
        and cls.__getattribute__ in (object.__getattribute__, torch.nn.Module.__getattribute__)


def watchable(module):
    """Can changes to ``module``'s own state be seen through ``EPOCH``?"""
    if not isinstance(module, torch.nn.Module):
        return False
    install()
    if not _class_watchable(type(module)):
        return False
    d = module.__dict__
    for name in STATE_TABLES:
        if type(d.get(name)) not in _TABLE_TYPES:
            return False
    return True


def watch(module, known_watchable=False):
    """Swap ``module``'s tables for stamped ones (hook tables only while empty: a
    ``RemovableHandle`` holds a weak reference to its table). True if all of its state
    tables are stamped now; the hook tables that are stamped are reported by
    ``hooks_watched``. ``known_watchable``: the caller has just asked ``watchable``."""
    if not known_watchable and not watchable(module):
        return False
    _stamp_tables(module.__dict__)
    return True


def watch_module(module):
    """``watchable``, ``watch`` and ``hooks_watched`` in one pass (a deep model's layers watch
    a dozen modules each): None when ``module`` cannot be watched, else whether all of its hook
    tables are stamped now."""
    if not watchable(module):
        return None
    return _stamp_tables(module.__dict__)


def _stamp_tables(d):
    """Swap the tables in a module's ``__dict__`` ``d`` for stamped ones (hook tables only while
    empty); are all of its hook tables stamped now (``hooks_watched``)?"""
    for name in STATE_TABLES:
        table = d.get(name)
        cls = STAMPED_FOR.get(type(table))
        if cls is not None:
            d[name] = cls(table)
    return _stamp_hook_tables(d)


def _stamp_hook_tables(d):
    hooks = True
    for name in HOOK_TABLES:
        table = d.get(name, _ABSENT)
        kind = type(table)
        if kind is OrderedDict or kind is dict:
            if table:
                hooks = False       # (a RemovableHandle holds a weak reference to it: kept)
            else:
                d[name] = StampedOrderedDict() if kind is OrderedDict else StampedDict()
        elif kind is not StampedOrderedDict and kind is not StampedDict and table is not _ABSENT:
            hooks = False
    return hooks


def is_watched(module):
    d = module.__dict__
    return all(type(d.get(name)) in STAMPED for name in STATE_TABLES)


def hooks_watched(module):
    """Are all of ``module``'s hook tables stamped (so adding or removing a hook bumps)?"""
    d = module.__dict__
    for name in HOOK_TABLES:     # (a loop, not all(): asked for every module of every stamped layer)
        table = d.get(name, _ABSENT)
        if table is not _ABSENT and type(table) not in STAMPED:
            return False
    return True


_ABSENT = object()


def rewatch(modules):
    """Called when a guard passes its detailed checks after ``EPOCH`` moved: tables replaced
    since (``m._modules = {...}`` bumps, but the new table is a plain dict) are stamped again.
    False if some module can no longer be watched (its entry then checks in detail always)."""
    ok = True
    for m in modules:
        if not is_watched(m) or not hooks_watched(m):
            ok = watch(m) and ok
            if not hooks_watched(m):
                ok = False
    return ok


def global_hooks():
    """True if a global module hook is registered (they are not traced)."""
    return bool(_mm._global_forward_hooks or _mm._global_forward_pre_hooks
                or _mm._global_backward_hooks or _mm._global_backward_pre_hooks)
