"""Library utilities model code calls while tracing: the process environment, ...

Handlers register into ``builtin_calls.BUILTIN_HANDLERS`` (``trace.calls`` consults it
for every call, including the special methods ``protocols`` inlines):

- **The environment** (``os.environ``, ``os.getenv``, ``in os.environ``): a read folds to
  the variable's value under a guard on that value (``os.environ.get(name)``), so setting
  or unsetting it recompiles. ``Mapping.get``/``__contains__``/``os.getenv`` are Python and
  are traced down to ``_Environ.__getitem__``, which is what is handled here. A store or
  ``del`` is a side effect: later reads in the trace see it, and it is done for real after
  the graph (``TraceContext.item_stores``).
"""
import os

import torch

from ..errors import Unsupported
from ..guards import builder as g
from ..guards.sources import MappingGetSource, ObjectSource
from ..values.base import ConstantValue, ObjectValue, PrivateObjectValue
from . import operators
from .builtin_calls import builtin
from .context import DELETED
from .exceptions import raise_new


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
    stored = frame.tx.item_stores.get((id(env), key))
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
    frame.tx.record_item_store(env_value, key, ConstantValue(text))
    return ConstantValue(None)


@builtin(os._Environ.__delitem__)
def _environ_delitem(frame, args, kwargs):
    env_value, key_value = args
    env = _environ(env_value)
    key = _env_key(frame, key_value, f"del {_env_name(env)}[...]")
    _environ_getitem(frame, [env_value, key_value], {})   # KeyError when unset, as eager
    if env_value.source is None:
        raise Unsupported(f"deleting {_env_name(env)}[{key!r}] on an environment read without a source")
    frame.tx.record_item_store(env_value, key, DELETED)
    return ConstantValue(None)


def _environ_unsupported(name):
    def h(frame, args, kwargs):
        raise Unsupported(f"os.environ.{name}() reads every environment variable, which is not supported yet",
                          hint="read the variables by name (os.environ.get(name), os.getenv(name)): each read "
                               "is guarded on its value")
    return h


for _name in ("__iter__", "__len__", "copy", "__repr__"):
    builtin(getattr(os._Environ, _name))(_environ_unsupported(_name.strip("_")))


# --- torch.autograd.Function ------------------------------------------------------------------

@builtin(torch.autograd.Function.apply.__func__)
def _autograd_function_apply(frame, args, kwargs):
    # Custom autograd Functions are traced elsewhere once supported (issue 11); until then
    # the call runs eagerly at a graph break with a reason that names the Function.
    cls = args[0].obj if args and isinstance(args[0], ObjectValue) else None
    name = getattr(cls, "__qualname__", "a torch.autograd.Function")
    raise Unsupported(f"custom torch.autograd.Function {name}.apply is not supported yet",
                      hint="it runs eagerly at a graph break (fullgraph=True refuses it); to keep one graph, "
                           "call its forward computation directly when no custom backward is needed")


# --- nn.Module.__init__ on a module made in the trace ---------------------------------------------

@builtin(torch.nn.Module.__init__)
def _module_init(frame, args, kwargs):
    # calls._make_module traces a module class's __init__ on a private object; torch's own
    # __init__ (no effects outside the object) runs on it for real.
    module = args[0]
    if not isinstance(module, PrivateObjectValue):
        raise Unsupported("nn.Module.__init__ on a module that exists outside the compiled function")
    try:
        torch.nn.Module.__init__(module.obj, *[operators.as_constant(a) for a in args[1:]],
                                 **{k: operators.as_constant(v) for k, v in kwargs.items()})
    except Unsupported:
        raise Unsupported("nn.Module.__init__ with arguments not known while tracing") from None
    return ConstantValue(None)
