"""torch.distributed in traced code: ranks and sizes as guarded constants, collectives as graph nodes.

* ``dist.get_rank()``, ``get_world_size()``, ``is_initialized()``, ``get_backend()`` are read at
  trace time. For the default group the trace is guarded on the default process group's state
  (rank, size, name: ``guards.builder.process_group_state``); for a group object read from a
  source, on the object's identity (a group's ranks never change).
* The functional collectives (``torch.distributed._functional_collectives``: ``all_reduce``,
  ``all_gather_tensor``/``all_gather_single``, ``reduce_scatter_tensor``/``reduce_scatter_single``,
  ``broadcast``, ``wait_tensor``) become ``torch.ops._c10d_functional`` nodes, each followed by its
  ``wait_tensor``, as they are when torch.compile traces them; the group is resolved to its name
  while tracing.
* ``group.rank()`` and ``group.size()`` of a ``ProcessGroup`` are constants too; other methods
  of torch.distributed's C++ objects (``work.wait()``...) break the graph with that reason.
* The in-place c10d calls (``dist.all_reduce(t)``, ``all_gather_into_tensor``,
  ``reduce_scatter_tensor``, ``broadcast``) are rewritten into the functional op and a ``copy_``
  into their tensor. With ``async_op=True`` (a ``Work`` handle the graph cannot hold), on a tensor
  that requires grad, or with a reduce op the functional ops lack, they break the graph and run
  natively.
"""
import types

import torch
import torch.distributed as dist

from ...errors import Unsupported
from ...guards.builder import ID_MATCH, add_process_group_guard
from ...guards.sources import AttrSource
from ...values.base import ConstantValue, ListValue, ObjectValue, TensorValue
from ...values.builder import is_placement_type
from ..core import ops
from ..core.basics import as_constant, describe

DIST_HANDLERS = {}

_HINT = ("without fullgraph=True it runs natively at a graph break; use the functional collectives "
         "(torch.distributed._functional_collectives) to keep it in the graph")


def _bind(name, params, args, kwargs):
    """Values of ``params`` [(name, default)] from the call's positional and keyword values."""
    if len(args) > len(params):
        raise Unsupported(f"{name}() takes at most {len(params)} arguments ({len(args)} given)")
    bound = {}
    for (pname, _), value in zip(params, args):
        bound[pname] = value
    known = {p for p, _ in params}
    for key, value in kwargs.items():
        if key not in known or key in bound:
            raise Unsupported(f"{name}() got an unexpected or repeated argument {key!r}")
        bound[key] = value
    for pname, default in params:
        if pname not in bound:
            if default is _REQUIRED:
                raise Unsupported(f"{name}() missing argument {pname!r}")
            bound[pname] = ConstantValue(default)
    return bound


_REQUIRED = object()


def _real_group(frame, value):
    """The real group (or None: the default group) a value names, with the guards that keep it."""
    tx = frame.tx
    if isinstance(value, ConstantValue) and value.value is None:
        add_process_group_guard(tx.guards)
        return None
    if isinstance(value, ObjectValue):
        if value.source is not None:
            tx.guards.add(ID_MATCH, value.source, value.obj)
        else:
            # Read from torch itself (dist.group.WORLD): the default group's state decides it.
            add_process_group_guard(tx.guards)
        return value.obj
    try:
        return as_constant(value)    # a list of ranks or a group name
    except Unsupported:
        raise Unsupported(f"process group given as {describe(value)} is not understood while tracing")


def _group_name(frame, value, tag=""):
    """(group name, group size) for a group value, resolved at trace time."""
    if not dist.is_available() or not dist.is_initialized():
        raise Unsupported("a collective traced before torch.distributed.init_process_group",
                          hint="initialise the process group before the compiled function first runs")
    group = _real_group(frame, value)
    if group is None:
        group = dist.group.WORLD
    try:
        name = _functional._resolve_group_name(group, tag)
        size = dist.distributed_c10d._get_group_size_by_name(name)
    except Exception as e:
        raise Unsupported(f"process group {group!r} could not be resolved while tracing: {type(e).__name__}: {e}")
    return str(name), int(size)


def _tensor(name, what, value):
    if not isinstance(value, TensorValue):
        raise Unsupported(f"{name}(): {what} is {describe(value)}, not a tensor")
    return value


def _node(frame, op, args):
    return frame.tx.graph.call("call_function", op, [v if not _plain(v) else ConstantValue(v) for v in args], {},
                               describe=str(op))


def _plain(v):
    return isinstance(v, (int, str))


def _c10d(name):
    return getattr(torch.ops._c10d_functional, name).default


def _waited(frame, op, args):
    return _node(frame, _c10d("wait_tensor"), [_node(frame, _c10d(op), args)])


_REDUCE_OPS = {"SUM": "sum", "AVG": "avg", "PRODUCT": "product", "MIN": "min", "MAX": "max"}


def _reduce_op_name(name, value):
    op = as_constant(value)
    if isinstance(op, str):
        return op.lower()
    key = getattr(op, "name", None)
    if key not in _REDUCE_OPS:
        raise Unsupported(f"{name}() with reduce op {op!r}: the functional collectives have no such op",
                          hint=_HINT)
    return _REDUCE_OPS[key]


def call_native(frame, fv, args, kwargs):
    """A call of a method of torch.distributed's C++ objects: ``group.rank()`` and ``group.size()``
    are constants of the group (guarded by its identity); anything else is Unsupported with the
    reason. None when ``fv`` is not such a method."""
    obj = fv.obj
    reason = native_only(obj)
    if reason is None:
        return None
    owner = getattr(obj, "__self__", None)
    if dist.is_available() and isinstance(owner, dist.ProcessGroup) and not args and not kwargs \
            and getattr(obj, "__name__", None) in ("rank", "size"):
        if fv.source is not None:
            frame.tx.guards.add(ID_MATCH, AttrSource(fv.source, "__self__"), owner)
        else:
            add_process_group_guard(frame.tx.guards)
        return ConstantValue(obj())
    if is_placement_type(type(owner)) and getattr(obj, "__name__", None) in _PLACEMENT_QUERIES:
        # Shard(0).is_shard(): a question about an immutable value.
        return ops.fold(frame, obj, args, kwargs, what=f"{type(owner).__name__}.{obj.__name__}")
    raise Unsupported(reason, hint="without fullgraph=True it runs natively at a graph break")


_PLACEMENT_QUERIES = ("is_shard", "is_replicate", "is_partial", "__eq__", "__ne__", "__hash__", "__repr__",
                      "__str__")


def native_only(obj):
    """Why calling ``obj`` cannot be traced when it is a method of torch.distributed's C++ objects
    (a ``Work`` handle's ``wait()``, a process group's or store's methods), else None."""
    owner = getattr(obj, "__self__", None)
    module = type(owner).__module__ if owner is not None else ""
    func = getattr(obj, "__func__", obj)
    if (getattr(func, "__module__", None) or "").startswith(("torch._C._distributed",
                                                            "torch.distributed.distributed_c10d")) \
            or module.startswith(("torch._C._distributed", "torch.distributed.distributed_c10d")):
        name = getattr(func, "__name__", "?")
        if owner is None or isinstance(owner, types.ModuleType):
            return (f"torch.distributed.{name}() is not traced (in a graph: all_reduce, all_gather_into_tensor, "
                    "reduce_scatter_tensor and broadcast, rewritten into functional collectives; get_rank, "
                    "get_world_size, get_backend, is_initialized as constants)")
        return f"{type(owner).__name__}.{name}() acts on torch.distributed's C++ objects outside any graph"
    return None


# --- ranks and sizes --------------------------------------------------------------------------

def _rank_query(real_fn):
    def handler(frame, args, kwargs):
        name = f"torch.distributed.{real_fn.__name__}"
        bound = _bind(name, [("group", None)], args, kwargs)
        if not dist.is_available() or not dist.is_initialized():
            raise Unsupported(f"{name}() before torch.distributed.init_process_group")
        group = _real_group(frame, bound["group"])
        try:
            return ConstantValue(real_fn(group))
        except Exception as e:
            raise Unsupported(f"{name}() raised {type(e).__name__}: {e}")
    return handler


def _is_initialized(frame, args, kwargs):
    if args or kwargs:
        raise Unsupported("torch.distributed.is_initialized() takes no arguments")
    add_process_group_guard(frame.tx.guards)
    return ConstantValue(dist.is_initialized())


def _is_available(frame, args, kwargs):
    return ConstantValue(dist.is_available())


# --- functional collectives -------------------------------------------------------------------

def _f_wait(frame, args, kwargs):
    b = _bind("wait_tensor", [("tensor", _REQUIRED)], args, kwargs)
    return _node(frame, _c10d("wait_tensor"), [_tensor("wait_tensor", "tensor", b["tensor"])])


def _f_all_reduce(frame, args, kwargs):
    b = _bind("all_reduce", [("self", _REQUIRED), ("reduceOp", _REQUIRED), ("group", _REQUIRED), ("tag", "")],
              args, kwargs)
    t = _tensor("all_reduce", "self", b["self"])
    name, _ = _group_name(frame, b["group"], as_constant(b["tag"]))
    return _waited(frame, "all_reduce", [t, _reduce_op_name("all_reduce", b["reduceOp"]), name])


def _f_broadcast(frame, args, kwargs):
    b = _bind("broadcast", [("self", _REQUIRED), ("src", _REQUIRED), ("group", _REQUIRED), ("tag", "")],
              args, kwargs)
    t = _tensor("broadcast", "self", b["self"])
    name, _ = _group_name(frame, b["group"], as_constant(b["tag"]))
    return _waited(frame, "broadcast", [t, int(as_constant(b["src"])), name])


def _chunk_cat(frame, t, chunks, chunk_dim, cat_dim):
    """torch.cat(torch.chunk(t, chunks, chunk_dim), cat_dim) as graph nodes."""
    pieces = frame.tx.graph.call("call_function", torch.chunk, [t, ConstantValue(chunks)],
                                 {"dim": ConstantValue(chunk_dim)})
    return frame.tx.graph.call("call_function", torch.cat, [ListValue(list(pieces.items))],
                               {"dim": ConstantValue(cat_dim)})


def _f_all_gather(fname):
    def handler(frame, args, kwargs):
        b = _bind(fname, [("self", _REQUIRED), ("gather_dim", _REQUIRED), ("group", _REQUIRED), ("tag", "")],
                  args, kwargs)
        t = _tensor(fname, "self", b["self"])
        name, size = _group_name(frame, b["group"], as_constant(b["tag"]))
        out = _waited(frame, "all_gather_into_tensor", [t, size, name])
        gather_dim = as_constant(b["gather_dim"])
        if gather_dim != 0:
            out = _chunk_cat(frame, out, size, 0, gather_dim)
        return out
    return handler


def _f_reduce_scatter(fname):
    def handler(frame, args, kwargs):
        b = _bind(fname, [("self", _REQUIRED), ("reduceOp", _REQUIRED), ("scatter_dim", _REQUIRED),
                          ("group", _REQUIRED), ("tag", "")], args, kwargs)
        t = _tensor(fname, "self", b["self"])
        name, size = _group_name(frame, b["group"], as_constant(b["tag"]))
        scatter_dim = as_constant(b["scatter_dim"])
        if t.fake.size(scatter_dim) % size != 0:
            raise Unsupported(f"{fname}(): dimension {scatter_dim} is not a multiple of the group size {size}")
        if scatter_dim != 0:
            t = _chunk_cat(frame, t, size, scatter_dim, 0)
        return _waited(frame, "reduce_scatter_tensor", [t, _reduce_op_name(fname, b["reduceOp"]), size, name])
    return handler


# --- in-place c10d calls, rewritten -----------------------------------------------------------

def _inplace(fname, params, run):
    """A c10d call that writes into a tensor: the functional op, then ``copy_`` into the tensor."""
    def handler(frame, args, kwargs):
        qualified = f"torch.distributed.{fname}"
        b = _bind(qualified, params, args, kwargs)
        if as_constant(b["async_op"]):
            raise Unsupported(f"{qualified}(async_op=True) returns a Work handle that a graph cannot hold",
                              hint=_HINT)
        target, result = run(frame, b)
        if target.fake.requires_grad:
            raise Unsupported(f"{qualified}() writes into a tensor that requires grad", hint=_HINT)
        ops.tensor_method(frame, target, "copy_", [result], {})
        return ConstantValue(None)
    return handler


def _c_all_reduce(frame, b):
    t = _tensor("all_reduce", "tensor", b["tensor"])
    name, _ = _group_name(frame, b["group"])
    return t, _waited(frame, "all_reduce", [t, _reduce_op_name("all_reduce", b["op"]), name])


def _c_all_gather_into_tensor(frame, b):
    out = _tensor("all_gather_into_tensor", "output_tensor", b["output_tensor"])
    inp = _tensor("all_gather_into_tensor", "input_tensor", b["input_tensor"])
    name, size = _group_name(frame, b["group"])
    return out, _waited(frame, "all_gather_into_tensor", [inp, size, name])


def _c_reduce_scatter_tensor(frame, b):
    out = _tensor("reduce_scatter_tensor", "output", b["output"])
    inp = _tensor("reduce_scatter_tensor", "input", b["input"])
    name, size = _group_name(frame, b["group"])
    return out, _waited(frame, "reduce_scatter_tensor",
                        [inp, _reduce_op_name("reduce_scatter_tensor", b["op"]), size, name])


def _c_broadcast(frame, b):
    t = _tensor("broadcast", "tensor", b["tensor"])
    if not (isinstance(b["group_src"], ConstantValue) and b["group_src"].value is None):
        raise Unsupported("torch.distributed.broadcast(group_src=...) is not traced yet", hint=_HINT)
    group = b["group"]
    name, _ = _group_name(frame, group)
    src = int(as_constant(b["src"]))
    real = _real_group(frame, group)
    if real is not None:   # broadcast's src is a global rank; the functional op takes the group rank
        src = dist.get_group_rank(real, src)
    return t, _waited(frame, "broadcast", [t, src, name])


if dist.is_available():
    # Not loaded by ``import torch``; 15 ms, no torch._dynamo.
    import torch.distributed._functional_collectives as _functional

    DIST_HANDLERS.update({
        dist.get_rank: _rank_query(dist.get_rank),
        dist.get_world_size: _rank_query(dist.get_world_size),
        dist.get_backend: _rank_query(dist.get_backend),
        dist.is_initialized: _is_initialized,
        dist.is_available: _is_available,
        _functional.wait_tensor: _f_wait,
        _functional.all_reduce: _f_all_reduce,
        _functional.broadcast: _f_broadcast,
        dist.all_reduce: _inplace("all_reduce", [("tensor", _REQUIRED), ("op", dist.ReduceOp.SUM),
                                                 ("group", None), ("async_op", False)], _c_all_reduce),
        dist.all_gather_into_tensor: _inplace(
            "all_gather_into_tensor", [("output_tensor", _REQUIRED), ("input_tensor", _REQUIRED), ("group", None),
                                       ("async_op", False)], _c_all_gather_into_tensor),
        dist.reduce_scatter_tensor: _inplace(
            "reduce_scatter_tensor", [("output", _REQUIRED), ("input", _REQUIRED), ("op", dist.ReduceOp.SUM),
                                      ("group", None), ("async_op", False)], _c_reduce_scatter_tensor),
        dist.broadcast: _inplace("broadcast", [("tensor", _REQUIRED), ("src", 0), ("group", None),
                                               ("async_op", False), ("group_src", None)], _c_broadcast),
    })
    for _name in ("all_gather_tensor", "all_gather_single", "all_gather_tensor_autograd",
                  "all_gather_single_autograd"):
        if hasattr(_functional, _name):
            DIST_HANDLERS[getattr(_functional, _name)] = _f_all_gather(_name)
    for _name in ("reduce_scatter_tensor", "reduce_scatter_single", "reduce_scatter_tensor_autograd",
                  "reduce_scatter_single_autograd"):
        if hasattr(_functional, _name):
            DIST_HANDLERS[getattr(_functional, _name)] = _f_reduce_scatter(_name)


__all__ = ["DIST_HANDLERS"]
