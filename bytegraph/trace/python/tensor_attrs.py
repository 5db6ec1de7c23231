"""Attribute reads and stores on traced tensors (``t.name``, ``t.name = v``): what the fake tensor
answers, a subclass's own attributes, ``.data`` and ``.grad``, and ``requires_grad`` changed
between graphs. ``attrs.py`` sends tensors here."""
from __future__ import annotations

import os

import torch

from ...datamodel import is_data_descriptor, tensor_class_attr
from ...errors import Unsupported
from ...guards.builder import MISSING_ATTR
from ...guards.sources import AttrSource
from ...values.base import ConstantValue, TensorMethodValue, TensorValue, TupleValue
from ...values.builder import wrap
from ..core import ops
from ..core.basics import as_constant, describe
from ..core.context import DELETED
from . import exceptions, lookup
from .exceptions import MissingAttribute

# Tensor attributes answered from the fake tensor (fixed by the tensor's guard).
_TENSOR_META = {"dtype", "device", "ndim", "requires_grad", "is_cuda", "is_cpu", "is_sparse",
                "is_quantized", "is_meta", "layout", "is_leaf", "is_mps", "is_nested",
                "itemsize", "nbytes", "is_mkldnn"}
# Tensor attributes that are tensors computed in the graph.
_TENSOR_VIEWS = {"T", "mT", "H", "mH", "real", "imag"}
# Tensor flags that follow from the device type (guarded with the tensor).
_TENSOR_DEVICE_FLAGS = {"is_ipu", "is_maia", "is_mtia", "is_sparse_csr", "is_vulkan", "is_xla", "is_xpu", "volatile"}


def requires_grad_of(frame, v):
    """``v.requires_grad`` as the trace has left it."""
    stored = frame.tx.effects.attr_stores.get((id(v), "requires_grad"))
    return as_constant(stored[2]) if stored is not None else v.fake.requires_grad


def set_requires_grad(frame, v, flag):
    """``v.requires_grad_(flag)``: done on the real tensor after the graph; a later graph op on
    ``v`` starts a new graph (autograd must see the new flag from there on)."""
    if not isinstance(flag, bool):
        raise Unsupported(f"requires_grad set to a {type(flag).__name__}")
    if flag == requires_grad_of(frame, v):
        return v
    if not flag and not v.fake.is_leaf:
        raise Unsupported("requires_grad_(False) on a tensor that is not a leaf raises RuntimeError in eager")
    if flag and not (v.fake.dtype.is_floating_point or v.fake.dtype.is_complex):
        raise Unsupported(f"requires_grad_() on a {v.fake.dtype} tensor raises RuntimeError in eager")
    frame.tx.effects.attr_stores[(id(v), "requires_grad")] = (v, "requires_grad", ConstantValue(flag))
    graph = frame.tx.graph
    graph.frozen[v.node] = ("a tensor whose requires_grad was changed in the compiled function is used "
                            "again: the change is made between graphs, so the graph breaks here")
    at = _root_index(frame.tx)
    if at is not None:
        graph.frozen_breaks[v.node] = _FrozenBreak(frame.tx, at, frame.tx.user_stack())
    return v


def _root_index(tx):
    """Where the compiled frame would break for something met now (its current row, or the call
    that leads here), or None."""
    root = tx.frames[0] if tx.frames else None
    if root is None or root.parent is not None or root.current is None:
        return None
    return exceptions.break_index(root)


class _FrozenBreak:
    """The break for a later use of a tensor whose requires_grad the trace changed.

    The change is made after the graph, so the use must be in the next one. Where the use is
    inside a call the compiled frame made after the change (a layer, a loop of layers), the frame
    breaks at the change instead, as torch.compile does: the change runs natively and the rest,
    the call included, is traced as one graph with the tensor as an input (breaking at the call
    would split each level the use is nested in, and a loop around it). Either way no break hint
    is left for the callee: once the change is made its trace meets no break."""
    __slots__ = ("tx", "index", "stack")

    def __init__(self, tx, index, stack):
        self.tx, self.index, self.stack = tx, index, stack

    def __call__(self, reason):
        err = Unsupported(reason)
        err.frames = []
        tx = self.tx
        if len(tx.frames) > 1 and _root_index(tx) != self.index:
            use = tx.user_stack()[-1]
            err.reason = (f"a tensor whose requires_grad was changed in the compiled function is used again "
                          f"inside a call ({os.path.basename(use.filename)}, line {use.lineno}): the change "
                          f"is made between graphs, so the graph breaks at the change")
            err.root_index = self.index
            err.user_stack = list(self.stack)
        return err


def set_tensor_attr(frame, v, name, value):
    """``tensor.name = value``: recorded, seen by later reads in the trace, done after the graph."""
    if name == "requires_grad":
        set_requires_grad(frame, v, as_constant(value))
        return
    if name == "grad":
        if isinstance(value, TensorValue):
            g_fake, t_fake = value.fake, v.fake
            if g_fake.shape != t_fake.shape or g_fake.dtype != t_fake.dtype or g_fake.device != t_fake.device:
                raise Unsupported("assigning a .grad of another shape, dtype or device raises in eager")
        elif not (isinstance(value, ConstantValue) and value.value is None):
            raise Unsupported(f"assigning {describe(value)} to a tensor's .grad raises in eager")
    elif name == "data":
        if _is_data_of(value, v):
            return     # ``t.data -= u``: the in-place op changed t's storage; storing it back is a no-op
        if value is v:
            return     # issue 40: ``p.data = p`` (Module._apply when ``p.to(...)`` changed nothing): a no-op
        raise Unsupported("setting Tensor.data to another tensor (the tensor then shares that tensor's "
                          "storage) is not supported in a graph; change it in place (t.data.copy_(u))")
    elif hasattr(torch.Tensor, name) or name.startswith("__"):
        raise Unsupported(f"setting Tensor.{name} is not supported yet")
    frame.tx.effects.attr_stores[_tensor_store_key(frame, v, name)] = (v, name, value)


def _tensor_data(frame, v):
    """``v.data``: the same storage without autograd history, and with a version counter of its
    own, so changing it in place is hidden from autograd: backward uses the changed values and
    no saved-tensor check fails. For a tensor from outside (an argument, a parameter) the graph
    gets ``v.data`` made at each call as an input of its own, however often it is read; a change
    written back to it leaves ``v``'s version as it was (``GraphBuilder._check_data_aliases``
    keeps ``v`` itself out of a graph that changes it). Of a tensor computed in the graph, it
    is made natively at a graph break: a graph has no such alias."""
    real = frame.tx.graph.real_tensor(v) if v.source is not None else None
    if real is None:
        raise Unsupported("Tensor.data of a tensor computed in the compiled function is made natively at a "
                          "graph break (a graph cannot give it a version counter of its own)",
                          hint="use .detach() to read it in the graph")
    known = frame.tx.graph.data_inputs.get(v.source)
    if known is None:
        known = frame.tx.graph.data_inputs[v.source] = wrap(frame.tx, real.data, AttrSource(v.source, "data"))
    return known


def _is_data_of(value, v):
    """Is ``value`` what reading ``v.data`` gave?"""
    return isinstance(value, TensorValue) and v.source is not None and value.source == AttrSource(v.source, "data")


def _tensor_store_key(frame, v, name):
    """The key of a store on tensor ``v`` in ``tx.effects.attr_stores``: ``.grad`` of a graph input or a
    parameter by the real tensor (an optimizer reaches one parameter through several values:
    ``p.grad = None`` in ``zero_grad`` must be seen by every later read), else by value."""
    if name == "grad" and v.source is not None:
        real = frame.tx.graph.real_tensor(v)
        if real is not None:
            return (id(real), name)
    return (id(v), name)


def tensor_attr(frame, v, name):
    if v.cls not in (torch.Tensor, torch.nn.Parameter) and name not in _CLASS_BOOKKEEPING \
            and not hasattr(v.cls, "__tensor_flatten__"):
        own = _tensor_class_attr(frame, v, name)    # what the subclass defines in Python
        if own is not None:
            return own
    if frame.tx.graph.function_modes or v.cls not in (torch.Tensor, torch.nn.Parameter) \
            and not hasattr(v.cls, "__tensor_flatten__"):
        overridden = ops.function_subclass_attr(frame, v, name)   # a mode's or a class's   # a __torch_function__ class's
        if overridden is not None:
            return overridden
    stored = frame.tx.effects.attr_stores.get(_tensor_store_key(frame, v, name))
    if stored is not None:
        if stored[2] is DELETED:
            raise MissingAttribute(f"'Tensor' object has no attribute {name!r}")
        return stored[2]
    if name in ("requires_grad", "is_leaf") and (id(v), "requires_grad") in frame.tx.effects.attr_stores:
        return ConstantValue(requires_grad_of(frame, v) if name == "requires_grad" else v.fake.is_leaf)
    if name == "shape":
        return shape_value(frame, v)
    if name == "__class__":
        return wrap(frame.tx, v.python_type(), None)   # the type is guarded with the tensor
    if hasattr(v.cls, "__tensor_flatten__"):
        found = ops.subclass_attr(frame, v, name)
        if found is not None:
            return found
    if name in _TENSOR_META:
        return ConstantValue(getattr(v.fake, name))
    if name in _TENSOR_VIEWS:
        return frame.tx.graph.call("call_function", getattr, [v, ConstantValue(name)], {},
                                   describe=f"Tensor.{name}")
    real = frame.tx.graph.real_tensor(v) if v.source is not None else None
    if name == "grad" and real is not None:
        # Only inputs can be re-read; the grad tensor is then an input of its own.
        return wrap(frame.tx, real.grad, AttrSource(v.source, "grad"))
    if name == "grad_fn" and not v.fake.requires_grad:
        return ConstantValue(None)   # a tensor that needs no grad has no history (guarded)
    if name == "data":
        return _tensor_data(frame, v)
    if name in ("grad", "grad_fn", "_version", "untyped_storage"):
        raise Unsupported(f"Tensor.{name} is not supported in a graph yet")
    attr = getattr(torch.Tensor, name, None)
    if attr is None:
        # A Python attribute set on the tensor object (``t.tag = ...``), read through its source.
        if real is not None and name in getattr(real, "__dict__", {}):
            return wrap(frame.tx, real.__dict__[name], AttrSource(v.source, name))
        if real is not None:
            frame.tx.guards.add(MISSING_ATTR, v.source, name)
        raise MissingAttribute(f"'Tensor' object has no attribute {name!r}")
    if callable(attr):
        return TensorMethodValue(v, name)
    if name in _TENSOR_DEVICE_FLAGS:
        return ConstantValue(getattr(v.fake, name))   # fixed by the device, which is guarded
    # The fake tensor cannot answer the rest for the real one: `_base` is another tensor (the
    # view's base), `_cdata` an address, `retains_grad`/`output_nr`/hooks autograd's state.
    raise Unsupported(f"Tensor.{name} is not supported in a graph: the traced tensor cannot say what the "
                      "real one holds there",
                      hint="read it outside the compiled function, or pass what you need as an argument")


# Entries every class's __dict__ has, which no read of a tensor's attribute finds there.
_CLASS_BOOKKEEPING = {"__module__", "__doc__", "__dict__", "__weakref__", "__qualname__", "__slots__",
                      "__annotations__", "__firstlineno__", "__static_attributes__"}


def _tensor_class_attr(frame, v, name):
    """``t.name`` where ``t``'s class (a Python subclass of torch.Tensor) defines ``name`` itself:
    Python finds that before torch's attribute of the name (a ``device`` property, an ``add``
    method), so it is traced as on any object; None where the class leaves ``name`` to torch."""
    attr, found = tensor_class_attr(v.cls, name)
    if not found:
        return None
    real = frame.tx.graph.real_tensor(v) if v.source is not None else None
    if real is not None and name in getattr(real, "__dict__", {}) and not is_data_descriptor(attr):
        return None    # the object's own entry comes first (read below)
    return lookup.bind(frame, lookup.Instance(v, v.cls), name, attr)


def shape_value(frame, v):
    shape = v.fake.shape
    if not any(isinstance(s, torch.SymInt) for s in shape):
        return ConstantValue(shape)
    return TupleValue([frame.tx.graph.size_value(v, d) for d in range(len(shape))], cls=torch.Size)
