"""Tensor subclasses in a trace: traceable wrapper subclasses made from traced tensors.

A traceable wrapper subclass (``__tensor_flatten__``, ``__tensor_unflatten__``,
``__torch_dispatch__``: TwoTensor, DTensor, a quantized weight) is a tensor of the graph like
any other: its fake is the subclass over fake inner tensors, and every operation on it runs its
``__torch_dispatch__`` on those as the node is added. Graph inputs and module state of such a
class are wrapped in ``values.builder`` (guarded on the class, its flatten context and its inner
tensors); here is ``Cls(inner, ...)`` inside the traced code: one call node whose target is the
class, which the eager backend runs as it is and AOTAutograd traces through.
"""
import types

import torch

from ...errors import Unsupported
from ...guards.builder import CONSTANT_MATCH
from ...guards.sources import AttrSource, ObjectSource
from ...values.base import BoundMethodValue, ConstantValue, TensorValue
from ...values.builder import wrap
from ..core import ops
from ..core.basics import as_constant, describe
from ..python.protocols import guard_class_method
from . import dtensor


def is_wrapper_subclass_type(cls) -> bool:
    """Is ``cls`` a tensor class that flattens to inner tensors and dispatches in Python?"""
    return isinstance(cls, type) and issubclass(cls, torch.Tensor) and cls is not torch.Tensor \
        and hasattr(cls, "__tensor_flatten__") and hasattr(cls, "__tensor_unflatten__") \
        and getattr(cls, "__torch_dispatch__", None) not in (None, torch.Tensor.__torch_dispatch__)


def make_wrapper_subclass(frame, cls, args, kwargs):
    """``cls(*args, **kwargs)`` for a traceable wrapper subclass: a graph node making it from
    the traced tensors (constants among the arguments are kept in the node)."""
    values = list(args) + list(kwargs.values())
    if not any(isinstance(v, TensorValue) for v in values):
        raise Unsupported(f"creating a {cls.__qualname__} from no traced tensor is not supported yet",
                          hint="make it outside the compiled function and pass it in")
    target = cls
    if not all(isinstance(v, (TensorValue, ConstantValue)) for v in values):
        target, args, kwargs = _constructor_with_constants(cls, args, kwargs)
    result = frame.tx.graph.call("call_function", target, list(args), dict(kwargs), describe=f"{cls.__qualname__}()")
    if not isinstance(result, TensorValue) or type(result.fake) is not cls:
        raise Unsupported(f"{cls.__qualname__}() did not make a {cls.__qualname__} on fake tensors")
    return result


def _constructor_with_constants(cls, args, kwargs):
    """``cls`` called with its known non-tensor arguments bound (configuration tuples, enum
    members: values an FX graph cannot spell in its code), and the node's arguments, only the
    tensors. Any argument neither a tensor nor fully known is a break."""
    def known(v):
        if isinstance(v, TensorValue):
            return None
        try:
            return as_constant(v)
        except Unsupported:
            raise Unsupported(f"creating a {cls.__qualname__} from {describe(v)} is not supported yet "
                              "(only tensors and known constants)",
                              hint="make it outside the compiled function and pass it in") from None
    construct = SubclassConstructor(cls, [(isinstance(v, TensorValue), known(v)) for v in args],
                                    {k: (isinstance(v, TensorValue), known(v)) for k, v in kwargs.items()})
    tensors = [v for v in args if isinstance(v, TensorValue)] + [v for v in kwargs.values() if isinstance(v, TensorValue)]
    return construct, tensors, {}


class SubclassConstructor:
    """Graph node target: ``cls(...)`` with the known constants bound and the tensors taken in
    order. A class (not a closure) so that a graph holding it can be pickled for another process
    (``backends/tiers.py``), carrying ``cls`` by name and the constants by value."""
    carried_by_value = True

    def __init__(self, cls, arg_spec, kwarg_spec):
        self.cls = cls
        self.arg_spec = arg_spec          # (is_tensor, constant) per positional argument
        self.kwarg_spec = kwarg_spec      # name: (is_tensor, constant)
        self.__name__ = self.__qualname__ = f"make_{cls.__name__}"

    def __call__(self, *tensors):
        it = iter(tensors)
        return self.cls(*[next(it) if is_tensor else c for is_tensor, c in self.arg_spec],
                        **{k: next(it) if is_tensor else c for k, (is_tensor, c) in self.kwarg_spec.items()})

    def __repr__(self):
        return f"<{self.__name__}>"


def subclass_attr(frame, v, name):
    """``t.name`` for a traceable wrapper subclass value ``v``: an inner tensor (a ``getattr`` node),
    what the subclass defines in Python (its methods inlined, properties' getters traced, class
    constants), or an attribute of the object (read through its source, or a constant of the fake
    made by the same code); None where ``name`` reads as on any tensor."""
    tx, cls, fake = frame.tx, v.cls, v.fake
    inner_names, _ = fake.__tensor_flatten__()
    if dtensor.is_dtensor(fake):
        found = dtensor.attr(frame, v, name)
        if found is not None:
            return found
    if name in inner_names and not isinstance(getattr(fake, name), torch.Tensor):
        raise Unsupported(f"{cls.__qualname__}.{name} (an opaque object) is not supported in a graph yet")
    if name in inner_names:
        return tx.graph.call("call_function", getattr, [v, ConstantValue(name)], {},
                             describe=f"{cls.__qualname__}.{name}")
    for klass in cls.__mro__:
        if klass is torch.Tensor or klass is torch._C.TensorBase:
            break
        if name in klass.__dict__:
            return _class_attr(frame, v, klass.__dict__[name], name)
    if name in getattr(fake, "__dict__", {}):
        real = tx.graph.real_tensor(v) if v.source is not None else None
        if real is not None and name in real.__dict__:
            return wrap(tx, real.__dict__[name], AttrSource(v.source, name))
        held = fake.__dict__[name]
        if isinstance(held, _CONSTANTS):
            # Set by the code that made the fake: the code the graph runs (on guarded inputs).
            return ConstantValue(held)
        raise Unsupported(f"{cls.__qualname__}.{name} ({type(held).__name__}) of a {cls.__qualname__} made in the "
                          "graph is not supported yet",
                          hint="read it from a tensor passed to the compiled function, or outside it")
    return None


_CONSTANTS = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.Size, torch.layout)


def _class_attr(frame, v, attr, name):
    tx, cls = frame.tx, v.cls
    src = guard_class_method(tx, cls, name, attr)
    if isinstance(attr, types.FunctionType):
        return BoundMethodValue(wrap(tx, attr, src), v)
    if isinstance(attr, staticmethod) and isinstance(attr.__func__, types.FunctionType):
        return wrap(tx, attr.__func__, src)
    if isinstance(attr, classmethod) and isinstance(attr.__func__, types.FunctionType):
        return BoundMethodValue(wrap(tx, attr.__func__, src), wrap(tx, cls, None))
    if isinstance(attr, property) and isinstance(attr.fget, types.FunctionType):
        getter = wrap(tx, attr.fget, AttrSource(src, "fget") if src is not None else None)
        return ops.call(frame, getter, [v], {})
    if isinstance(attr, _CONSTANTS) and not isinstance(attr, bool) or attr is True or attr is False:
        tx.guards.add(CONSTANT_MATCH, AttrSource(ObjectSource(cls, cls.__qualname__), name), attr)
        return ConstantValue(attr)
    raise Unsupported(f"{cls.__qualname__}.{name} (a {type(attr).__name__} on the tensor subclass) is not supported "
                      "in a graph yet", hint="read it outside the compiled function")
