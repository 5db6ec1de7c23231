"""Turning iterable values into lists of values (loops are unrolled)."""
from __future__ import annotations

import enum

import torch

from ...errors import Unsupported
from ...guards.builder import DICT_KEYS
from ...guards.sources import AttrSource, ModuleEntrySource
from ...values.base import (ConstantValue, DictValue, DictViewValue, IteratorValue, ListValue,
                           ObjectValue, TensorValue, TupleValue)
from ...values.builder import wrap
from . import attrs, generators, protocols
from ..numpy_api import numpy_calls
from ..core import ops
from ..core.basics import item_value
from .exceptions import PythonError
from ..core.basics import note_process_local
from .operators import getitem
from ...values.base import Value
from ..core.context import RunningFrame


def iterate(frame: RunningFrame, v: Value) -> list[Value]:
    """All items of an iterable value, as a new list."""
    if isinstance(v, (TupleValue, ListValue)):
        return list(v.items)
    if isinstance(v, IteratorValue):
        items = v.items[v.pos:]
        v.pos = len(v.items)
        return items
    if isinstance(v, DictValue):
        return [ConstantValue(k) if _is_plain(k) else ObjectValue(k) for k in v.items]
    if isinstance(v, DictViewValue):
        return v.materialize()
    if isinstance(v, ConstantValue):
        note_process_local(frame.tx, v.value)
        try:
            return [item_value(x) for x in v.value]
        except TypeError as e:
            raise PythonError(f"{type(v.value).__name__} object is not iterable", e) from None
    if numpy_calls.involves_arrays(v):
        return numpy_calls.iterate(frame, v)
    if isinstance(v, TensorValue):
        if protocols.has_special_method(v, "__iter__"):    # its class's own, in Python
            return iterate(frame, protocols.call_special_method(frame, v, "__iter__", []))
        n = v.fake.shape[0] if v.fake.dim() else None
        if n is None:
            raise Unsupported("iteration over a 0-d tensor")
        if v.cls not in (torch.Tensor, torch.nn.Parameter) or frame.tx.graph.function_modes:
            # Tensor.__iter__ asks self.dim(), then iterates self.unbind(0): an override or a mode
            # sees those calls
            # (read off the object: a class's own `dim` or `unbind` in Python is what runs)
            ops.call(frame, attrs.get_attr(frame, v, "dim"), [], {})
            return iterate(frame, ops.call(frame, attrs.get_attr(frame, v, "unbind"), [ConstantValue(0)], {}))
        return [getitem(frame, v, ConstantValue(i)) for i in range(n)]
    if protocols.dict_part(v) is not v and not protocols.has_special_method(v, "__iter__"):
        return iterate(frame, protocols.dict_part(v))
    if attrs.is_mapping_proxy(v):
        return [ConstantValue(k) for k in attrs.proxy_keys(frame, v)]
    if isinstance(v, ObjectValue) and isinstance(v.obj, enum.EnumMeta):
        return [wrap(frame.tx, member, None) for member in v.obj]   # fixed with the class
    if isinstance(v, ObjectValue):
        m = v.obj
        table = "_parameters" if isinstance(m, torch.nn.ParameterList) else "_modules"
        if v.source is not None and isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict,
                                                   torch.nn.ParameterList)):
            # The entries iterated: `append`, `insert` and `extend` change them.
            frame.tx.guards.add(DICT_KEYS, AttrSource(v.source, table), list(m.__dict__[table]))
        if isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential)):
            return [wrap(frame.tx, sub, ModuleEntrySource(v.source, "_modules", k) if v.source else None)
                    for k, sub in m._modules.items() if sub is not None]
        if isinstance(m, torch.nn.ModuleDict):
            return [ConstantValue(k) for k in m._modules]
        if isinstance(m, torch.nn.ParameterList):
            return [wrap(frame.tx, p, ModuleEntrySource(v.source, "_parameters", k) if v.source else None)
                    for k, p in m._parameters.items()]
    if generators.is_lazy(v):
        return generators.drain(frame, v)
    user = generators.user_iterator(frame, v)
    if user is not None:
        return generators.drain(frame, user)
    raise Unsupported(f"iterating over {attrs.describe(v)} is not supported yet")


def _is_plain(k):
    return isinstance(k, (int, float, str, bytes, bool, type(None), tuple, frozenset))


def unpack(frame, v, n):
    if isinstance(v, TensorValue):
        if v.fake.dim() == 0 or v.fake.shape[0] != n:
            raise Unsupported(f"cannot unpack a tensor of shape {tuple(v.fake.shape)} into {n} values")
    if generators.is_lazy(v):
        items = generators.take(frame, v, n + 1)   # CPython pulls one more item, no further
    else:
        items = iterate(frame, v)
    if len(items) != n:
        msg = (f"too many values to unpack (expected {n})" if len(items) > n
               else f"not enough values to unpack (expected {n}, got {len(items)})")
        raise PythonError(msg, ValueError(msg))
    return items
