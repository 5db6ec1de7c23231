"""torch.utils._pytree on values while tracing: ``tree_flatten``, ``tree_unflatten``,
``tree_leaves``, ``tree_structure``, ``tree_map``.

pytree itself runs on a real mirror of the structure whose leaves are placeholders; a
``TreeSpec`` is a constant. The handlers register into ``core.handlers.BUILTIN_HANDLERS``.
"""
import collections

import torch.utils._pytree as pytree

from ...errors import Unsupported
from ...values.base import ConstantValue, DictValue, ListValue, TupleValue, UserObjectValue
from ...values.builder import CONSTANT_TYPES
from ..core import ops
from ..python import operators
from ..core.handlers import builtin
from ..python.exceptions import raise_new
from ..python.iteration import iterate


# --- torch.utils._pytree ------------------------------------------------------------------------
# The value structure is mirrored by a real one with placeholder leaves, and pytree itself
# flattens / unflattens that; TreeSpecs are real (immutable) objects, so they are constants.

class _Leaf:
    """A placeholder for a value pytree treats as a leaf (a tensor, an object)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def _mirror(frame, v):
    """The real structure pytree sees for value ``v``."""
    if isinstance(v, TupleValue):
        items = [_mirror(frame, i) for i in v.items]
        if v.cls is tuple:
            return tuple(items)
        if hasattr(v.cls, "_fields"):
            return v.cls(*items)
        return _Leaf(v)   # torch.Size and other tuple subclasses are leaves to pytree
    if isinstance(v, ListValue):
        return [_mirror(frame, i) for i in v.items]
    if isinstance(v, DictValue):
        if v.cls not in (dict, collections.OrderedDict):
            raise Unsupported(f"torch.utils._pytree on a {v.cls.__name__} made in the trace is not supported yet")
        return v.cls((k, _mirror(frame, i)) for k, i in v.items.items())
    if isinstance(v, ConstantValue):
        c = v.value
        if c is None or type(c) in CONSTANT_TYPES and not isinstance(c, (list, dict, set)):
            return c
        return _Leaf(v)
    if isinstance(v, UserObjectValue) and v.cls in pytree.SUPPORTED_NODES:
        raise Unsupported(f"torch.utils._pytree on a {v.cls.__qualname__} made in the trace is not supported yet")
    return _Leaf(v)


def _unmirror(x):
    """The value for a real structure made by pytree from placeholders."""
    if isinstance(x, _Leaf):
        return x.value
    if isinstance(x, tuple):
        cls = type(x) if hasattr(type(x), "_fields") else tuple
        return TupleValue([_unmirror(i) for i in x], cls=cls)
    if isinstance(x, list):
        return ListValue([_unmirror(i) for i in x])
    if type(x) in (dict, collections.OrderedDict):
        return DictValue({k: _unmirror(i) for k, i in x.items()}, cls=type(x))
    return operators.constant_value(x)


def _no_is_leaf(kwargs, what):
    is_leaf = kwargs.pop("is_leaf", None)
    if is_leaf is not None and not operators.is_none(is_leaf):
        raise Unsupported(f"torch.utils._pytree.{what}(is_leaf=...) is not supported yet")
    if kwargs:
        raise Unsupported(f"torch.utils._pytree.{what}() with arguments {sorted(kwargs)} is not supported yet")


def _treespec(v, what):
    spec = v.value if isinstance(v, ConstantValue) else getattr(v, "obj", None)
    if not isinstance(spec, pytree.TreeSpec):
        raise Unsupported(f"torch.utils._pytree.{what}() needs a TreeSpec known while tracing")
    return spec


@builtin(pytree.tree_flatten)
def _tree_flatten(frame, args, kwargs):
    kwargs = dict(kwargs)
    if len(args) > 1:
        kwargs["is_leaf"] = args[1]
    _no_is_leaf(kwargs, "tree_flatten")
    leaves, spec = pytree.tree_flatten(_mirror(frame, args[0]))
    return TupleValue([ListValue([_unmirror(x) for x in leaves]), ConstantValue(spec)])


@builtin(pytree.tree_leaves)
def _tree_leaves(frame, args, kwargs):
    return _tree_flatten(frame, args, kwargs).items[0]


@builtin(pytree.tree_structure)
def _tree_structure(frame, args, kwargs):
    return _tree_flatten(frame, args, kwargs).items[1]


@builtin(pytree.tree_unflatten)
def _tree_unflatten(frame, args, kwargs):
    leaves_value, spec_value = args
    spec = _treespec(spec_value, "tree_unflatten")
    leaves = [_Leaf(v) for v in iterate(frame, leaves_value)]
    try:
        real = pytree.tree_unflatten(leaves, spec)
    except (ValueError, TypeError) as e:
        raise_new(type(e), ConstantValue(str(e)))
    return _unmirror(real)


@builtin(pytree.tree_map)
def _tree_map(frame, args, kwargs):
    kwargs = dict(kwargs)
    _no_is_leaf(kwargs, "tree_map")
    fn, tree, rests = args[0], args[1], args[2:]
    leaves, spec = pytree.tree_flatten(_mirror(frame, tree))
    columns = [[_unmirror(x) for x in leaves]]
    for rest in rests:
        try:
            columns.append([_unmirror(x) for x in spec.flatten_up_to(_mirror(frame, rest))])
        except (ValueError, TypeError) as e:
            raise_new(type(e), ConstantValue(str(e)))
    mapped = [_Leaf(ops.call(frame, fn, list(row), {})) for row in zip(*columns)]
    return _unmirror(pytree.tree_unflatten(mapped, spec))
