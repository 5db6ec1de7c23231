"""DTensor's API in a trace: made, redistributed and read back as graph nodes.

As under torch.compile, a ``DeviceMesh`` is an object the graph holds by reference (read
through ``get_attr``, its identity guarded where it was read) and placements (``Shard(0)``,
``Replicate()``, ``Partial()``) are constants (guarded by value where they are read from
outside). What DTensor does in Python (its autograd Functions, the collectives of a
redistribution) runs inside one node, so the eager backend runs DTensor's own code and
AOTAutograd traces through it:

* ``DTensor.from_local(t, mesh, placements, ...)``: a ``call_function`` node;
* ``d.redistribute(mesh, placements)``, ``d.to_local()``, ``d.full_tensor()``: ``call_method`` nodes
  (``async_op=True``, as tensor parallel's styles ask, runs waited on at once, as under
  torch.compile: the same values, a plain tensor where eager's ``to_local()`` gives an
  ``AsyncCollectiveTensor``);
* ``distribute_tensor(t, mesh, placements)`` where no data moves between ranks (every mesh
  dimension it would scatter or broadcast over has one rank, or ``src_data_rank=None``): a node
  splitting ``t`` locally;
* ``d.placements`` and ``d.device_mesh``: what the fake DTensor holds (for an input, guarded by
  its flatten context and the mesh's identity).

Anything else of this API (a mesh not given, ``run_check=True``, placements that are not
constants, ``distribute_tensor`` moving data between ranks) breaks the graph with its reason.
"""
import inspect
import sys

import torch

from ...errors import Unsupported
from ...guards.sources import AttrSource
from ...values.base import (ConstantValue, ListValue, ObjectValue, TensorValue, TracerCallableValue, TupleValue,
                           Value)
from ...values.builder import is_placement_type, wrap

_HINT = "make it outside the compiled function and pass it in (without fullgraph=True it runs eagerly at a break)"


def _api():
    """torch.distributed.tensor's DTensor and distribute_tensor, once something imported them."""
    module = sys.modules.get("torch.distributed.tensor._api")
    return (module.DTensor, module.distribute_tensor) if module is not None else (None, None)


def is_dtensor(fake):
    dtensor, _ = _api()
    return dtensor is not None and isinstance(fake, dtensor)


def call(frame, fv, args, kwargs):
    """``DTensor.from_local(...)`` or ``distribute_tensor(...)``: their graph node; None for any
    other callable."""
    dtensor, distribute_tensor = _api()
    if dtensor is None:
        return None
    if fv.obj is dtensor.from_local:
        return _from_local(frame, dtensor, args, kwargs)
    if fv.obj is distribute_tensor:
        return _distribute_tensor(frame, distribute_tensor, args, kwargs)
    return None


def _bind(fn, args, kwargs, what):
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as e:
        raise Unsupported(f"{what}: {e}") from None
    bound.apply_defaults()
    return {name: v if isinstance(v, Value) else ConstantValue(v) for name, v in bound.arguments.items()}


def _mesh(value, what):
    """The DeviceMesh value passed (an object held by reference); None for ``None``."""
    if isinstance(value, ConstantValue) and value.value is None:
        return None
    if isinstance(value, ObjectValue) and type(value.obj).__name__ == "DeviceMesh":
        return value
    raise Unsupported(f"{what}: the device mesh is a {type(value).__name__}, not a DeviceMesh read from outside the "
                      "compiled function", hint=_HINT)


def _placements(value, what, where="placements"):
    """A sequence of placement constants as one tuple constant; None for ``None``."""
    if isinstance(value, ConstantValue) and value.value is None:
        return None
    items = value.items if isinstance(value, (ListValue, TupleValue)) else None
    if isinstance(value, ConstantValue) and isinstance(value.value, (tuple, list)):
        items = [ConstantValue(p) for p in value.value]
    if items is None or not all(isinstance(p, ConstantValue) and is_placement_type(type(p.value)) for p in items):
        raise Unsupported(f"{what}: {where} must be a list or tuple of placements (Shard, Replicate, Partial) known "
                          f"while tracing, not {value!r}", hint=_HINT)
    return ConstantValue(tuple(p.value for p in items))


def _require(value, expected, what, name):
    if not (isinstance(value, ConstantValue) and value.value == expected and type(value.value) is type(expected)):
        raise Unsupported(f"{what} with {name}={value!r} is not supported in a graph yet (only {name}={expected!r})",
                          hint=_HINT)


def _from_local(frame, dtensor, args, kwargs):
    what = "DTensor.from_local()"
    b = _bind(dtensor.from_local, args, kwargs, what)
    local = b["local_tensor"]
    if not isinstance(local, TensorValue) or is_dtensor(local.fake):
        raise Unsupported(f"{what} of a {type(local).__name__ if not isinstance(local, TensorValue) else 'DTensor'}: "
                          "it takes a plain tensor", hint=_HINT)
    mesh = _mesh(b["device_mesh"], what)
    if mesh is None:
        raise Unsupported(f"{what} without a device mesh (the mesh of a `with mesh:` block) is not supported in a "
                          "graph yet", hint="pass the mesh")
    _require(b["run_check"], False, what, "run_check")   # run_check=True moves data between ranks
    node_kwargs = {}
    for name in ("shape", "stride"):
        if not (isinstance(b[name], ConstantValue) and b[name].value is None):
            node_kwargs[name] = b[name]
    grad_placements = _placements(b["grad_placements"], what, "grad_placements")
    if grad_placements is not None:
        node_kwargs["grad_placements"] = grad_placements
    placements = _placements(b["placements"], what)
    node_args = [local, mesh] + ([placements] if placements is not None else [])
    return _dtensor_node(frame, "call_function", dtensor.from_local, node_args, node_kwargs, what)


def _distribute_tensor(frame, distribute_tensor, args, kwargs):
    what = "distribute_tensor()"
    b = _bind(distribute_tensor, args, kwargs, what)
    tensor = b["tensor"]
    if not isinstance(tensor, TensorValue) or is_dtensor(tensor.fake):
        raise Unsupported(f"{what} of a {'DTensor' if isinstance(tensor, TensorValue) else type(tensor).__name__} "
                          "in a graph is not supported yet", hint=_HINT)
    if tensor.fake.requires_grad:
        raise Unsupported(f"{what} of a tensor that requires grad makes a new leaf tensor, which a graph cannot "
                          "make", hint="distribute parameters outside the compiled function")
    mesh = _mesh(b["device_mesh"], what)
    if mesh is None:
        raise Unsupported(f"{what} without a device mesh is not supported in a graph yet", hint="pass the mesh")
    placements = _placements(b["placements"], what)
    src = b["src_data_rank"]
    if not isinstance(src, ConstantValue):
        raise Unsupported(f"{what}: src_data_rank must be known while tracing", hint=_HINT)
    if src.value is not None:
        # Ranks other than src_data_rank get its data (a scatter, a broadcast written into the
        # input itself): in the graph only where nobody else is there to send it.
        mesh.pin_identity()
        moving = [d for d in range(mesh.obj.ndim) if mesh.obj.size(d) > 1]
        if moving:
            raise Unsupported(f"{what} with src_data_rank={src.value!r} on mesh dimensions {moving} of more than one "
                              "rank sends rank 0's data to the others (and writes a broadcast into the input): "
                              "not supported in a graph yet",
                              hint="pass src_data_rank=None if every rank already holds the same tensor, or use "
                                   "DTensor.from_local on each rank's part; " + _HINT)
    node_args = [tensor, mesh] + ([placements] if placements is not None else [])
    return _dtensor_node(frame, "call_function", distribute_tensor, node_args, {"src_data_rank": ConstantValue(None)},
                         what)


def _dtensor_node(frame, kind, target, args, kwargs, what):
    result = frame.tx.graph.call(kind, target, args, kwargs, describe=what)
    if not isinstance(result, TensorValue) or not is_dtensor(result.fake):
        raise Unsupported(f"{what} did not make a DTensor on fake tensors")
    return result


# --- methods and attributes of a DTensor value -----------------------------------------------

_METHODS = ("to_local", "full_tensor", "redistribute")


def attr(frame, v, name):
    """``d.name`` for a DTensor value ``d``: its methods that are graph nodes, its placements and
    mesh; None for the rest (read as for any wrapper subclass)."""
    if name in _METHODS:
        return TracerCallableValue(f"DTensor.{name}", lambda f, args, kwargs: _method(f, v, name, args, kwargs))
    if name == "placements":
        # For an input, guarded by its flatten context (SUBCLASS_META); else the graph's own result.
        return ConstantValue(tuple(v.fake.placements))
    if name == "device_mesh":
        return _mesh_of(frame, v)
    return None


def _mesh_of(frame, v):
    tx = frame.tx
    real = tx.graph.real_tensor(v) if v.source is not None else None
    if real is not None:
        # guard_subclass_layout guarded this object's identity.
        return wrap(tx, real.device_mesh, AttrSource(v.source, "device_mesh"))
    # A DTensor the graph made: its mesh came from one read (and guarded) in this trace.
    return ObjectValue(v.fake.device_mesh)


def _method(frame, v, name, args, kwargs):
    what = f"DTensor.{name}()"
    method = getattr(_api()[0], name)
    b = _bind(method, [v] + list(args), kwargs, what)
    node_args, node_kwargs = [v], {}
    if name == "redistribute":
        if not isinstance(b["async_op"], ConstantValue) or not isinstance(b["async_op"].value, bool):
            raise Unsupported(f"{what}: async_op must be a bool known while tracing", hint=_HINT)
        # async_op=True (tensor parallel's styles ask for it) is run waited on at once in the
        # graph, as under torch.compile: the same values, only the wait comes earlier.
        mesh = _mesh(b["device_mesh"], what)
        placements = _placements(b["placements"], what)
        if placements is None:
            raise Unsupported(f"{what} without placements raises in eager", hint="pass the placements")
        node_args += [mesh if mesh is not None else ConstantValue(None), placements]
        for key in ("forward_dtype", "backward_dtype"):
            value = b[key]
            if not isinstance(value, ConstantValue) or not (value.value is None or isinstance(value.value, torch.dtype)):
                raise Unsupported(f"{what}: {key} must be a dtype known while tracing", hint=_HINT)
            if value.value is not None:
                node_kwargs[key] = value
    else:
        grad_placements = _placements(b["grad_placements"], what, "grad_placements")
        if grad_placements is not None:
            node_kwargs["grad_placements"] = grad_placements
    return frame.tx.graph.call("call_method", name, node_args, node_kwargs, describe=what)


__all__ = ["call", "attr", "is_dtensor"]
