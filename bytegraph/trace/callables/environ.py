"""The environment while tracing: ``os.environ``, ``os.getenv``, ``in os.environ``.

A read folds to the variable's value under a guard on that value (``os.environ.get(name)``),
so setting or unsetting it recompiles. ``Mapping.get``/``__contains__``/``os.getenv`` are
Python and are traced down to ``_Environ.__getitem__``, which is what is handled here (the
handlers register into ``core.handlers.BUILTIN_HANDLERS``). A store or ``del`` is a side effect:
later reads in the trace see it, and it is done for real after the graph
(``TraceContext.effects.item_stores``).
"""
import os

from ...errors import Unsupported
from ...guards import builder as g
from ...guards.sources import MappingGetSource, ObjectSource
from ...values.base import ConstantValue, ObjectValue
from ..python import operators
from ..core.context import DELETED
from ..python.exceptions import raise_new
from ..core.handlers import builtin


# --- os.environ --------------------------------------------------------------------------

def _environ(v):
    if not isinstance(v, ObjectValue) or not isinstance(v.obj, os._Environ):
        raise Unsupported("os._Environ methods on an object that is not an environment mapping")
    return v.obj


def _env_name(env):
    return "os.environb" if env is getattr(os, "environb", None) else "os.environ"


def _env_key(frame, v, what):
    try:
        return operators.as_constant(v)
    except Unsupported:
        raise Unsupported(f"{what} with a name that is not known while tracing") from None


@builtin(os._Environ.__getitem__)
def _environ_getitem(frame, args, kwargs):
    env_value, key_value = args
    env = _environ(env_value)
    key = _env_key(frame, key_value, f"{_env_name(env)}[...]")
    stored = frame.tx.effects.item_stores.get((id(env), key))
    if stored is not None:
        value = stored[2]
    else:
        value = env.get(key)
        # One guard per variable read: its value (None when unset) must stay what it was.
        frame.tx.guards.add(g.CONSTANT_MATCH, MappingGetSource(ObjectSource(env, _env_name(env)), key), value)
    if value is None or value is DELETED:
        raise_new(KeyError, ConstantValue(key))
    return value if isinstance(value, ConstantValue) else ConstantValue(value)


@builtin(os._Environ.__setitem__)
def _environ_setitem(frame, args, kwargs):
    env_value, key_value, value = args
    env = _environ(env_value)
    key = _env_key(frame, key_value, f"setting {_env_name(env)}[...]")
    if env_value.source is None:
        raise Unsupported(f"setting {_env_name(env)}[{key!r}] on an environment read without a source")
    text = operators.as_constant(value)
    # What os does: the value must be a str (bytes for os.environb); its TypeError is eager's.
    try:
        env.encodevalue(text)
        env.encodekey(key)
    except TypeError as e:
        raise_new(TypeError, ConstantValue(str(e)))
    frame.tx.effects.record_item_store(env_value, key, ConstantValue(text))
    return ConstantValue(None)


@builtin(os._Environ.__delitem__)
def _environ_delitem(frame, args, kwargs):
    env_value, key_value = args
    env = _environ(env_value)
    key = _env_key(frame, key_value, f"del {_env_name(env)}[...]")
    _environ_getitem(frame, [env_value, key_value], {})   # KeyError when unset, as eager
    if env_value.source is None:
        raise Unsupported(f"deleting {_env_name(env)}[{key!r}] on an environment read without a source")
    frame.tx.effects.record_item_store(env_value, key, DELETED)
    return ConstantValue(None)


def _environ_unsupported(name):
    def h(frame, args, kwargs):
        raise Unsupported(f"os.environ.{name}() reads every environment variable, which is not supported yet",
                          hint="read the variables by name (os.environ.get(name), os.getenv(name)): each read "
                               "is guarded on its value")
    return h


for _name in ("__iter__", "__len__", "copy", "__repr__"):
    builtin(getattr(os._Environ, _name))(_environ_unsupported(_name.strip("_")))
