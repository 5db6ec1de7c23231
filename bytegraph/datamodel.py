"""Facts of Python's data model that every floor asks the same way.

Where a class finds a name (``class_lookup``: its MRO's dicts, in order, never calling
``__get__``), and which descriptors answer before an instance's own ``__dict__``
(``is_data_descriptor``). The tracer's attribute lookup (``trace.python.lookup``) and the guards'
coverage (``guards.coverage``) both decide by these, so they cannot disagree.
"""
import types

class _Missing:
    def __repr__(self):
        return "<no class attribute>"


MISSING = _Missing()


def class_attr(cls, name):
    """What the first class of ``cls.__mro__`` whose ``__dict__`` has ``name`` holds there,
    else ``MISSING``: the static lookup ``type.__getattribute__`` and
    ``object.__getattribute__`` start from (no ``__get__`` runs)."""
    for klass in cls.__mro__:
        attr = klass.__dict__.get(name, MISSING)
        if attr is not MISSING:
            return attr
    return MISSING


def raw_attr(obj, name):
    """``object.__getattribute__(obj, name)``, or ``MISSING`` where that raises AttributeError
    (an unset ``__slots__`` member): what guards compare to know a slot is still unset."""
    try:
        return object.__getattribute__(obj, name)
    except AttributeError:
        return MISSING


def class_lookup(cls, name):
    """``(attr, True)`` as ``class_attr`` finds it, else ``(None, False)``."""
    attr = class_attr(cls, name)
    return (None, False) if attr is MISSING else (attr, True)


def class_lookup_owner(cls, name):
    """The class of ``cls.__mro__`` whose ``__dict__`` answers for ``name``, or None."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass
    return None


def tensor_class_attr(cls, name):
    """``(attr, True)`` when a Python subclass of torch.Tensor in ``cls.__mro__`` defines ``name``
    before torch's own classes do (its own ``device`` property, ``add`` method, ``__add__``):
    Python finds that, not torch's; else ``(None, False)``."""
    import torch
    for klass in cls.__mro__:
        if klass is torch.Tensor or klass is torch._C.TensorBase or klass is torch.nn.Parameter:
            break
        if name in klass.__dict__:
            return klass.__dict__[name], True
    return None, False


def is_data_descriptor(attr):
    """Does ``attr``, found on a class, answer before an instance's own ``__dict__``? (Its type
    defines ``__get__`` and ``__set__`` or ``__delete__``: a property, a slot, ``__dict__``
    itself, a Python descriptor with a setter.)"""
    t = type(attr)
    return hasattr(t, "__get__") and (hasattr(t, "__set__") or hasattr(t, "__delete__"))


def has_python_get(attr):
    """Is ``attr`` a descriptor whose ``__get__`` is Python code (traced, not run natively)?"""
    return isinstance(getattr(type(attr), "__get__", None), types.FunctionType)


def is_callable_type(cls):
    """``callable(obj)`` for any ``obj`` of class ``cls``: whether ``cls`` has ``__call__``."""
    return class_lookup(cls, "__call__")[1]
