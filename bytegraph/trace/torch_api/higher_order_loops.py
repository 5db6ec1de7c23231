"""Loops as higher-order operators: ``while_loop``, ``scan`` and ``map`` of torch._higher_order_ops.

Each takes functions (a condition and a body, a combine function, a mapped function): they are
traced into graphs of their own (``higher_order.trace_body``), once, on fresh fake tensors shaped
like what one iteration receives, and one node of the enclosing graph runs the loop:

* ``while_loop(cond_fn, body_fn, carried)`` -> ``torch.ops.higher_order.while_loop(cond, body,
  carried, additional)``: both graphs take the carried tensors, then every tensor either of them
  reads from around it (``additional``, the same list for both);
* ``scan(combine_fn, init, xs, dim=, reverse=)`` -> ``torch.ops.higher_order.scan(combine, init,
  xs, additional)`` over ``xs`` moved to dim 0 (and flipped for ``reverse``), the stacked outputs
  moved back, as torch's wrapper does;
* ``map(f, xs, *args)`` -> ``torch.ops.higher_order.map_impl(body, xs, additional)``.

A Python int carried by ``while_loop`` is an unbacked symbolic int inside its bodies and in what
the loop returns (a number only the loop knows), as torch.compile carries it. What torch refuses
when it captures these (outputs aliasing inputs or each other, a body output of other metadata
than the carry, other Python values carried, a body that changes state outside itself) is a
graph break here: the call runs natively, where torch gives its own answer or error.
"""
import torch
from torch._higher_order_ops.map import map as _map
from torch._higher_order_ops.scan import scan as _scan
from torch._higher_order_ops.while_loop import while_loop as _while_loop

from ...errors import Unsupported
from ...graph.subgraph import SubgraphBuilder
from ...graph.higher_order import Structure
from ...values.base import ConstantValue, ListValue, SubgraphValue, SymValue, TensorValue, TupleValue
from . import higher_order
from ..core.basics import as_constant, describe
from .higher_order import _bind, _callable, _order_placeholders, flatten, to_value, trace_body

_HINT = higher_order._BODY_HINT


def call(frame, fv, args, kwargs):
    """The value of a loop operator's call, or None when ``fv`` is none of them."""
    handler = _HANDLERS.get(id(fv.obj))
    return handler(frame, args, kwargs) if handler is not None else None


# --- shared pieces ----------------------------------------------------------------------------

def fresh_like(sub, fake, drop_first=False):
    """A fake tensor of ``fake``'s metadata (its first dim dropped: one slice) with no history and no
    known value, for a body's input: what one iteration receives is not what the first one does."""
    shape, stride = tuple(fake.shape), tuple(fake.stride())
    if drop_first:
        shape, stride = shape[1:], stride[1:]
    with sub.fake_mode:
        out = torch.empty_strided(shape, stride, dtype=fake.dtype, device=fake.device)
    if fake.requires_grad and (out.is_floating_point() or out.is_complex()):
        out.requires_grad_(True)
    return out


def _meta(fake):
    return tuple(fake.shape), tuple(fake.stride()), fake.dtype, fake.device


def _tensor_leaves(value, what, role):
    """The Structure of ``value`` and its tensors; anything else in it is refused (torch makes the
    Python ints of a loop symbolic, and raises for other leaves)."""
    leaves = []
    structure = flatten(value, leaves, what)
    for v in leaves:
        if not isinstance(v, TensorValue):
            raise Unsupported(f"{what}(): {role} holds {describe(v)}; only tensors are traced", hint=_HINT)
    constant = _first_constant(structure)
    if constant is not None:
        raise Unsupported(f"{what}(): {role} holds the constant {constant.data!r}; only tensors are traced (torch "
                          "makes the Python ints of a loop symbolic)", hint=_HINT)
    return structure, leaves


def _first_constant(structure):
    if structure.kind == "const":
        return structure
    for part in structure.parts:
        found = _first_constant(part)
        if found is not None:
            return found
    return None


def _trace(frame, fn, what, label, fakes, build, extra_args=()):
    """Trace ``fn`` on placeholders made from ``fakes`` (regrouped by ``build``); the builder, the
    flat tensor outputs and their Structure."""
    tx = frame.tx
    sub = SubgraphBuilder(tx.graph)
    explicit = [sub.placeholder(f, f"{label}{i}") if isinstance(f, torch.Tensor)
                else sub.sym_placeholder(f, f"{label}{i}") for i, f in enumerate(fakes)]
    call_args = [to_value(a) for a in build(explicit)] + list(extra_args)
    result = trace_body(frame, sub, _callable(frame, fn, what), call_args, {}, f"{what} ({label})")
    return sub, result


def _refuse_aliases(sub, outs, what):
    """torch's loop operators refuse outputs that are (views of) the body's inputs or of each other
    (eager raises for them): those calls run natively."""
    inputs = {p.meta["example_value"].untyped_storage()._cdata for p in list(sub.explicit) + list(sub.lifted.values())
              if isinstance(p.meta.get("example_value"), torch.Tensor)}
    seen = set()
    for v in outs:
        storage = v.fake.untyped_storage()._cdata
        if v.node.graph is not sub.graph or storage in inputs:
            raise Unsupported(f"{what}: the function returns one of its inputs (or a view of one); torch's "
                              "operator requires a new tensor", hint="return x.clone() instead; " + _HINT)
        if storage in seen:
            raise Unsupported(f"{what}: the function returns one tensor twice (or views of one); torch's operator "
                              "requires distinct tensors", hint="clone one of them; " + _HINT)
        seen.add(storage)


def _shared_inputs(subs):
    """Every tensor any of ``subs`` reads from around it, each once, made an input of all of them."""
    lifted = []
    for sub in subs:
        for v in sub.lifted_values:
            if not any(v is w for w in lifted):
                lifted.append(v)
    for sub in subs:
        for v in lifted:
            sub.node_of(v)
    return lifted


def _items(flat):
    return list(flat.items) if isinstance(flat, (TupleValue, ListValue)) else [flat]


def _same_structure(a, b):
    if a.kind != b.kind or len(a.parts) != len(b.parts):
        return False
    if a.kind == "const":
        return a.data == b.data
    if a.kind in ("tuple", "dict") and a.data != b.data:
        return False
    return all(_same_structure(x, y) for x, y in zip(a.parts, b.parts))


# --- while_loop -------------------------------------------------------------------------------

def _while(frame, args, kwargs):
    what = "while_loop"
    bound = _bind(what, ("cond_fn", "body_fn", "carried_inputs"), args, kwargs)
    if len(bound) != 3:
        raise Unsupported(f"{what}() takes cond_fn, body_fn and carried_inputs", hint=_HINT)
    carried = bound["carried_inputs"]
    if not isinstance(carried, (TupleValue, ListValue)):
        raise Unsupported(f"{what}(): carried_inputs must be a tuple or list", hint=_HINT)
    structure, leaves = _carried_leaves(carried, what)
    tx = frame.tx

    def build(explicit):
        return list(structure.build(explicit))

    def fresh():
        return [fresh_like(tx.graph, v.fake) if isinstance(v, TensorValue) else _unbacked_int(tx.graph) for v in leaves]

    cond_sub, pred = _trace(frame, bound["cond_fn"], what, "cond_fn", fresh(), build)
    if isinstance(pred, ConstantValue) and isinstance(pred.value, bool):
        if pred.value:
            raise Unsupported(f"{what}(): cond_fn always returns True: the loop never ends", hint=_HINT)
        return carried      # never entered (torch's capture gives the carried values back as they are)
    if not (isinstance(pred, TensorValue) and pred.fake.dtype is torch.bool and pred.fake.dim() == 0
            or isinstance(pred, SymValue) and isinstance(pred.sym, torch.SymBool)):
        raise Unsupported(f"{what}(): cond_fn must return a boolean tensor of shape () or a comparison of the carried "
                          f"ints (it returns {describe(pred)})", hint=_HINT)
    body_sub, result = _trace(frame, bound["body_fn"], what, "body_fn", fresh(), build)
    out_structure, outs = _body_outputs(result, leaves, what)
    _refuse_aliases(body_sub, [o for o in outs if isinstance(o, TensorValue)], f"{what} (body_fn)")
    lifted = _shared_inputs([cond_sub, body_sub])
    cond_gm = cond_sub.finish([pred])
    _order_placeholders(cond_gm, cond_sub, lifted)
    body_gm = body_sub.finish(outs)
    _order_placeholders(body_gm, body_sub, lifted)
    flat = tx.graph.call("call_function", torch.ops.higher_order.while_loop,
                         [SubgraphValue(cond_gm, "while_loop_cond"), SubgraphValue(body_gm, "while_loop_body"),
                          TupleValue(leaves), TupleValue(lifted)], {}, describe=what)
    return to_value(out_structure.build(_items(flat)))


def _carried_leaves(carried, what):
    """(Structure, leaves) of the carried values: tensors, and Python ints (constants or symbolic),
    which torch's capture carries as unbacked symbolic ints (numbers only the loop knows) and
    gives back as such."""
    found = []
    structure = flatten(carried, found, what)
    leaves = []
    structure = _ints_as_leaves(structure, iter(found), leaves)
    for v in leaves:
        if not (isinstance(v, TensorValue) or isinstance(v, SymValue) and isinstance(v.sym, torch.SymInt)
                or isinstance(v, ConstantValue)):
            raise Unsupported(f"{what}(): carried_inputs holds {describe(v)}; only tensors and ints are carried",
                              hint=_HINT)
    constant = _first_constant(structure)
    if constant is not None:
        raise Unsupported(f"{what}(): carried_inputs holds the constant {constant.data!r}; only tensors and ints "
                          "are carried", hint=_HINT)
    return structure, leaves


def _ints_as_leaves(structure, found, leaves):
    """``structure`` with its int constants made leaves; ``leaves`` gets every leaf in order."""
    if structure.kind == "leaf":
        leaves.append(next(found))
        return structure
    if structure.kind == "const":
        if type(structure.data) is int:
            leaves.append(ConstantValue(structure.data))
            return Structure("leaf")
        return structure
    return Structure(structure.kind, structure.data, [_ints_as_leaves(p, found, leaves) for p in structure.parts])


def _is_int_constant(v):
    return isinstance(v, ConstantValue) and type(v.value) is int


def _unbacked_int(graph):
    """A number the loop alone knows, for an int carry inside its bodies."""
    env = graph.shapes.env
    with env.ignore_fresh_unbacked_symbols():
        return env.create_unbacked_symint()


def _body_outputs(result, leaves, what):
    """(Structure, flat outputs) of what body_fn returns: one per carried value, of its kind
    (a tensor of the same metadata; an int for an int)."""
    found = []
    structure = flatten(result, found, what)
    outs = []
    structure = _ints_as_leaves(structure, iter(found), outs)
    if len(outs) != len(leaves) or _first_constant(structure) is not None:
        raise Unsupported(f"{what}(): body_fn must return values like the carried ones (a tensor for each tensor, an "
                          "int for each int)", hint=_HINT)
    for o, c in zip(outs, leaves):
        if isinstance(c, TensorValue):
            if not isinstance(o, TensorValue) or _meta(o.fake) != _meta(c.fake):
                raise Unsupported(f"{what}(): body_fn returns tensors of other shapes, strides or dtypes than the "
                                  "carried ones", hint=_HINT)
        elif not (isinstance(o, SymValue) and isinstance(o.sym, torch.SymInt) or _is_int_constant(o)):
            raise Unsupported(f"{what}(): body_fn returns {describe(o)} for a carried int", hint=_HINT)
    return structure, outs


# --- scan -------------------------------------------------------------------------------------

def _scan_call(frame, args, kwargs):
    what = "scan"
    options = {k: kwargs[k] for k in ("dim", "reverse") if k in kwargs}
    bound = _bind(what, ("combine_fn", "init", "xs"), args, {k: v for k, v in kwargs.items() if k not in options})
    if len(bound) != 3:
        raise Unsupported(f"{what}() takes combine_fn, init and xs", hint=_HINT)
    try:
        dim = as_constant(options.get("dim", ConstantValue(0)))
        reverse = as_constant(options.get("reverse", ConstantValue(False)))
    except Unsupported:
        raise Unsupported(f"{what}(): dim and reverse must be constants", hint=_HINT) from None
    if type(dim) is not int or type(reverse) is not bool:
        raise Unsupported(f"{what}(): dim must be an int and reverse a bool (torch raises)", hint=_HINT)
    init_structure, init = _tensor_leaves(bound["init"], what, "init")
    xs_structure, xs = _tensor_leaves(bound["xs"], what, "xs")
    if not xs:
        return TupleValue([bound["init"], ListValue([])])
    if not init:
        raise Unsupported(f"{what}(): init holds no tensor (torch raises)", hint=_HINT)
    ndim = xs[0].fake.dim()
    if not -max(ndim, 1) <= dim < max(ndim, 1) or any(x.fake.dim() <= dim % max(ndim, 1) for x in xs):
        raise Unsupported(f"{what}(): dim {dim} is out of range for xs (torch raises)", hint=_HINT)
    dim = dim % ndim
    if any(x.fake.shape[dim] == 0 for x in xs):
        raise Unsupported(f"{what}(): xs is empty along dim {dim} (torch raises)", hint=_HINT)
    tx = frame.tx
    graph = tx.graph
    moved = []
    for x in xs:
        if dim != 0:
            x = graph.call("call_function", torch.movedim, [x, ConstantValue(dim), ConstantValue(0)], {})
        if reverse:
            x = graph.call("call_function", torch.flip, [x, ListValue([ConstantValue(0)])], {})
        moved.append(x)
    n_init = len(init)

    def build(explicit):
        return [init_structure.build(explicit[:n_init]), xs_structure.build(explicit[n_init:])]

    fakes = [fresh_like(graph, v.fake) for v in init] + [fresh_like(graph, x.fake, drop_first=True) for x in moved]
    sub, result = _trace(frame, bound["combine_fn"], what, "combine_fn", fakes, build)
    if not (isinstance(result, (TupleValue, ListValue)) and len(result.items) == 2):
        raise Unsupported(f"{what}(): combine_fn must return a pair (next carry, output)", hint=_HINT)
    carry_structure, carry = _tensor_leaves(result.items[0], what, "the carry combine_fn returns")
    y_structure, ys = _tensor_leaves(result.items[1], what, "the output combine_fn returns")
    if not _same_structure(carry_structure, init_structure) \
            or any(_meta(c.fake) != _meta(i.fake) for c, i in zip(carry, init)):
        raise Unsupported(f"{what}(): the carry combine_fn returns differs from init in structure, shape, stride "
                          "or dtype", hint=_HINT)
    _refuse_aliases(sub, carry + ys, f"{what} (combine_fn)")
    gm = sub.finish(carry + ys)
    flat = _items(graph.call("call_function", torch.ops.higher_order.scan,
                             [SubgraphValue(gm, "scan_combine"), ListValue(init), ListValue(moved),
                              ListValue(list(sub.lifted_values))], {}, describe=what))
    final, stacked = flat[:n_init], []
    for y in flat[n_init:]:
        if reverse:
            y = graph.call("call_function", torch.flip, [y, ListValue([ConstantValue(0)])], {})
        if dim != 0 and dim < y.fake.dim():
            y = graph.call("call_function", torch.movedim, [y, ConstantValue(0), ConstantValue(dim)], {})
        stacked.append(y)
    return TupleValue([to_value(carry_structure.build(final)), to_value(y_structure.build(stacked))])


# --- map --------------------------------------------------------------------------------------

def _map_call(frame, args, kwargs):
    what = "map"
    if len(args) < 2 or kwargs:
        raise Unsupported(f"{what}() takes f, xs and positional arguments", hint=_HINT)
    fn, xs_value, extra = args[0], args[1], list(args[2:])
    xs_structure, xs = _tensor_leaves(xs_value, what, "xs")
    if not xs or any(x.fake.dim() == 0 for x in xs):
        raise Unsupported(f"{what}(): xs must hold tensors of at least one dimension (torch raises)", hint=_HINT)
    n = xs[0].fake.shape[0]
    if any(x.fake.shape[0] != n for x in xs) or n == 0:
        raise Unsupported(f"{what}(): the tensors of xs must share a non-zero leading size (torch raises)", hint=_HINT)
    tx = frame.tx

    def build(explicit):
        return [xs_structure.build(explicit)]

    sub, result = _trace(frame, fn, what, "f", [fresh_like(tx.graph, x.fake, drop_first=True) for x in xs], build,
                         extra_args=extra)
    out_structure, outs = _tensor_leaves(result, what, "what f returns")
    if not outs:
        raise Unsupported(f"{what}(): f returns no tensor", hint=_HINT)
    _refuse_aliases(sub, outs, f"{what} (f)")
    gm = sub.finish(outs)
    flat = tx.graph.call("call_function", torch.ops.higher_order.map_impl,
                         [SubgraphValue(gm, "map_body"), ListValue(xs), ListValue(list(sub.lifted_values))], {},
                         describe=what)
    return to_value(out_structure.build(_items(flat)))


_HANDLERS = {id(_while_loop): _while, id(_scan): _scan_call, id(_map): _map_call}
higher_order.register(call)

__all__ = ["call", "fresh_like"]
