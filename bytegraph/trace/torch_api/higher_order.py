"""Higher-order operations: calls that take a function and run it specially.

``torch.cond``, ``torch.utils.checkpoint.checkpoint``, the torch.func transforms (``grad``,
``grad_and_value``, ``vmap``, ``jacrev``, ``jacfwd``, ``hessian``) and, registered from
``autograd_function.py``, ``torch.autograd.Function`` subclasses' ``apply``: the function they take is traced into a graph of its own (a body,
``graph.subgraph.SubgraphBuilder``), and one node of the enclosing graph runs it the special way
(``graph/higher_order.py``: the torch.cond operator, checkpointing, the transform, a custom
autograd Function built from the traced forward and backward). ``torch.func.functional_call``
needs no body: the module is traced with the given tensors read in place of its parameters.

A body must be a function of its inputs: one that changes Python state outside itself (a list
made earlier, an attribute, a global), or changes an input tensor in place, is not traced that
way; the call then runs natively at a graph break (or is an error under ``fullgraph=True``).
Anything else the tracer cannot do inside a body does the same.
"""
import types

import torch
import torch.func
from torch._higher_order_ops.associative_scan import associative_scan_op, generic_associative_scan
from torch.utils import _pytree as pytree

from ...errors import Unsupported
from ...guards.sources import AttrSource
from ...graph.subgraph import SubgraphBuilder
from ...graph.higher_order import FunctorchCall, Structure, checkpointed
from ...values.base import (BoundMethodValue, CellValue, ConstantValue, DictValue, FunctionValue, ListValue,
                           ObjectValue, PartialValue, SubgraphValue, SymValue, TensorValue, TracerCallableValue,
                           TupleValue, UserObjectValue)
from ...values.builder import wrap
from ..core import ops
from ..core.basics import as_constant, describe

# torch.func transforms traced as one node: transform -> whether it differentiates (reverse mode)
_TRANSFORMS = {torch.func.grad: True, torch.func.grad_and_value: True, torch.func.jacrev: True,
               torch.func.hessian: True, torch.func.jacfwd: False, torch.func.vmap: False}
_BODY_HINT = "without fullgraph=True the call runs natively at a graph break, with the same result"


def call(frame, fv, args, kwargs):
    """The value of a higher-order call, or None when ``fv`` is not one."""
    obj = fv.obj
    try:
        if obj in _TRANSFORMS:
            return _transform(frame, obj, args, kwargs)
        if obj is torch.cond:
            return _cond(frame, args, kwargs)
        if obj is torch.utils.checkpoint.checkpoint:
            return _checkpoint(frame, args, kwargs)
        if obj is torch.func.functional_call:
            return _functional_call(frame, args, kwargs)
        if obj is associative_scan_op:
            return _associative_scan(frame, args, kwargs)
        if obj is torch.compile:
            return _nested_compile(args, kwargs)
    except TypeError:       # unhashable callables are none of these
        pass
    original = _torch_compiled(obj)
    if original is not None:
        # Made by torch.compile outside the trace (a module-level ``torch.compile(flex_attention)``):
        # what it compiles, traced into this graph, as a nested compile is under torch.compile.
        attr = "_orig_mod" if isinstance(obj, torch.nn.Module) else "_torchdynamo_orig_callable"
        return ops.call(frame, wrap(frame.tx, original, AttrSource(fv.source, attr) if fv.source else None),
                        list(args), kwargs)
    for extension in _EXTENSIONS:
        special = extension(frame, fv, args, kwargs)
        if special is not None:
            return special
    return None


# Higher-order calls implemented in the modules above this one (autograd_function.py,
# higher_order_<topic>.py: loops, FlexAttention, compile regions), each a call(frame, fv, args, kwargs) -> value or None that its
# module registers at import (trace/tracer.py imports them).
_EXTENSIONS = []


def register(extension):
    """Have ``call`` also try ``extension(frame, fv, args, kwargs)`` (None: not its call)."""
    _EXTENSIONS.append(extension)


def _torch_compiled(obj):
    """The function or module that ``torch.compile`` compiled into ``obj``, or None."""
    if isinstance(obj, torch.nn.Module):
        if type(obj).__name__ == "OptimizedModule" and type(obj).__module__ == "torch._dynamo.eval_frame":
            return getattr(obj, "_orig_mod", None)
        return None
    original = getattr(obj, "_torchdynamo_orig_callable", None) if isinstance(obj, types.FunctionType) else None
    if obj.__dict__.get("_torchdynamo_disable") if original is not None else False:
        return None     # torch.compiler.disable's wrapper carries the same marks: it runs natively
    if original is not None and getattr(obj, "__wrapped__", None) is original and callable(original):
        return original
    return None


def _nested_compile(args, kwargs):
    """``torch.compile(fn, ...)`` met while tracing (transformers compiles ``create_block_mask`` on
    each call): what it makes computes what ``fn`` does, and inside a graph being captured the
    call is traced into it, as torch.compile's own front end does with a nested compile. The
    value stands for the compiled function only where it is called; anywhere else (returned,
    stored) it cannot be rebuilt, and the graph breaks."""
    if not args or kwargs.get("disable") is not None and not isinstance(kwargs["disable"], ConstantValue):
        raise Unsupported("torch.compile() used as a decorator factory while tracing",
                          hint="it runs natively at a graph break")
    fn = args[0]
    if isinstance(kwargs.get("disable"), ConstantValue) and kwargs["disable"].value:
        return fn

    def impl(frame, call_args, call_kwargs):
        return ops.call(frame, fn, call_args, call_kwargs)

    impl.reaches = [fn]
    return TracerCallableValue("torch.compile(...)", impl)


# --- values <-> flat lists of tensors --------------------------------------------------------

def flatten(value, leaves, what):
    """The Structure of ``value`` (tuples, lists, dicts, constants), its tensors put in ``leaves``."""
    if isinstance(value, (TensorValue, SymValue)):
        leaves.append(value)
        return Structure("leaf")
    if isinstance(value, ConstantValue):
        return Structure("const", value.value)
    if isinstance(value, TupleValue):
        return Structure("tuple", value.cls, [flatten(i, leaves, what) for i in value.items])
    if isinstance(value, ListValue):
        return Structure("list", None, [flatten(i, leaves, what) for i in value.items])
    if isinstance(value, DictValue) and value.cls in (dict,):
        keys = list(value.items)
        return Structure("dict", (value.cls, keys), [flatten(value.items[k], leaves, what) for k in keys])
    raise Unsupported(f"{what}: {describe(value)} cannot pass in or out of the traced function yet",
                      hint=_BODY_HINT)


def to_value(obj):
    """Python tuples/lists/dicts (from ``Structure.build`` over values) as values."""
    if isinstance(obj, (TensorValue, SymValue, ConstantValue)):
        return obj
    if isinstance(obj, list):
        return ListValue([to_value(i) for i in obj])
    if isinstance(obj, dict):
        return DictValue({k: to_value(v) for k, v in obj.items()}, cls=type(obj))
    if isinstance(obj, tuple):
        cls = type(obj)
        return TupleValue([to_value(i) for i in obj], cls=cls)
    return ConstantValue(obj)


# --- tracing a body -------------------------------------------------------------------------

def _snapshot(values):
    """The symbolic objects reachable from ``values`` with their contents, to tell afterwards
    whether a body changed any of them (a side effect it cannot have)."""
    seen, out = set(), []

    def visit(v):
        if id(v) in seen or v is None:
            return
        seen.add(id(v))
        if isinstance(v, (TupleValue, ListValue)):
            if isinstance(v, ListValue):
                out.append((v, list(v.items)))
            for i in v.items:
                visit(i)
        elif isinstance(v, DictValue):
            out.append((v, dict(v.items)))
            for i in v.items.values():
                visit(i)
        elif isinstance(v, UserObjectValue):
            out.append((v, dict(v.attrs)))
            for i in v.attrs.values():
                visit(i)
            if v.dict_items is not None:
                visit(v.dict_items)
        elif isinstance(v, CellValue):
            out.append((v, v.contents))
            visit(v.contents)
        elif isinstance(v, FunctionValue):
            for c in list(v.closure) + list(v.defaults) + list(v.kwdefaults.values()):
                visit(c)
        elif isinstance(v, PartialValue):
            for i in [v.func] + v.args + list(v.kwargs.values()):
                visit(i)
        elif isinstance(v, BoundMethodValue):
            visit(v.func)
            visit(v.self_value)
        elif isinstance(v, TracerCallableValue):
            for i in getattr(v.impl, "reaches", ()):
                visit(i)

    for v in values:
        visit(v)
    return out


def _changed(snapshot):
    for v, before in snapshot:
        if isinstance(v, ListValue):
            now = v.items
        elif isinstance(v, DictValue):
            now = v.items
        elif isinstance(v, UserObjectValue):
            now = v.attrs
        else:
            now = v.contents
        if isinstance(before, list):
            if len(now) != len(before) or any(a is not b for a, b in zip(now, before)):
                return True
        elif isinstance(before, dict):
            if now.keys() != before.keys() or any(now[k] is not before[k] for k in before):
                return True
        elif now is not before:
            return True
    return False


def _effect_marks(tx):
    return tx.effects.count()


def trace_body(frame, sub, fn, args, kwargs, what, grad_mode=None, own=()):
    """Trace ``fn(*args, **kwargs)`` into ``sub``; the value it returns.

    ``grad_mode``: the grad mode the body runs under (None: as around it). ``own``: values the
    body may change (the ``ctx`` of a custom Function)."""
    tx = frame.tx
    outer = tx.graph
    if outer.function_modes:
        # Eager hands the mode what the operator's own Python calls too (checkpoint reads each
        # argument's .device) and a backward recomputation runs without it: a body traced under
        # the mode would give the mode another record (torch.compile's computes without it).
        raise Unsupported(f"{what} under a TorchFunctionMode is not supported yet: eager hands the mode the "
                          "operator's own calls as well as its body's",
                          hint="without fullgraph=True it runs natively under the mode at a graph break, as in eager")
    reachable = _snapshot([fn] + list(args) + list(kwargs.values()))
    reachable = [(v, c) for v, c in reachable if not any(v is o for o in own)]
    marks = _effect_marks(tx)
    prev_grad = torch.is_grad_enabled()
    changes = len(tx.state_changes)
    tx.graph = sub
    try:
        if grad_mode is not None:
            torch._C._set_grad_enabled(grad_mode)
        result = ops.call(frame, fn, list(args), dict(kwargs))
    finally:
        tx.undo_state_changes(changes)     # grad-mode / autocast blocks the body entered
        torch._C._set_grad_enabled(prev_grad)
        tx.graph = outer
    if _effect_marks(tx) != marks or _changed(reachable):
        raise Unsupported(f"{what}: the function changes Python state outside itself, which cannot happen "
                          "inside a graph of its own", hint=_BODY_HINT)
    if sub.mutated_inputs():
        raise Unsupported(f"{what}: the function changes one of its input tensors in place", hint=_BODY_HINT)
    return result


def _fresh_fake(sub, fake, shape=None, requires_grad=None):
    with sub.fake_mode:
        out = torch.empty(tuple(fake.shape) if shape is None else shape, dtype=fake.dtype, device=fake.device)
    rg = fake.requires_grad if requires_grad is None else requires_grad
    if rg and (out.is_floating_point() or out.is_complex()):
        out.requires_grad_(True)
    return out


def _callable(frame, fn, what):
    if isinstance(fn, (FunctionValue, BoundMethodValue, PartialValue, TracerCallableValue, UserObjectValue)):
        return fn
    if isinstance(fn, ObjectValue) and callable(fn.obj):
        return fn
    raise Unsupported(f"{what} of {describe(fn)} is not supported yet", hint=_BODY_HINT)


# --- torch.func transforms ------------------------------------------------------------------

def _transform(frame, transform, args, kwargs):
    """``torch.func.grad(f, ...)`` and friends: a function value that traces the transform when called."""
    name = transform.__name__
    if not args:
        raise Unsupported(f"torch.func.{name}() without a function")
    fn = _callable(frame, args[0], f"torch.func.{name}")
    positional = {"vmap": ("in_dims", "out_dims", "randomness"),
                  "grad": ("argnums", "has_aux"), "grad_and_value": ("argnums", "has_aux"),
                  "jacrev": ("argnums", "has_aux", "chunk_size", "_preallocate_and_copy"),
                  "jacfwd": ("argnums", "has_aux", "randomness"), "hessian": ("argnums",)}[name]
    if len(args) - 1 > len(positional):
        raise Unsupported(f"torch.func.{name}() with {len(args) - 1} options")
    options = {}
    for key, v in list(zip(positional, args[1:])) + list(kwargs.items()):
        try:
            options[key] = as_constant(v)
        except Unsupported:
            raise Unsupported(f"torch.func.{name}(): option {key} is not a constant") from None

    def impl(frame, call_args, call_kwargs):
        return _call_transformed(frame, transform, options, fn, call_args, call_kwargs)

    impl.reaches = [fn]
    return TracerCallableValue(f"torch.func.{name}({describe(fn)})", impl)


class _Marker:
    __slots__ = ()


def _call_transformed(frame, transform, options, fn, args, kwargs):
    tx = frame.tx
    name = transform.__name__
    what = f"torch.func.{name}"
    leaves = []
    in_structure = flatten(TupleValue(list(args)), leaves, what)
    if not all(isinstance(v, TensorValue) for v in leaves):
        raise Unsupported(f"{what} over symbolic sizes is not supported yet", hint=_BODY_HINT)
    sub = SubgraphBuilder(tx.graph)
    if transform is torch.func.vmap:
        dims = _vmap_dims(in_structure, options.get("in_dims", 0), what)
        fakes = []
        for v, d in zip(leaves, dims):
            shape = list(v.fake.shape)
            if d is not None:
                del shape[d % max(len(shape), 1)]
            fakes.append(_fresh_fake(sub, v.fake, shape))
    else:
        differentiated = _differentiated(in_structure, options.get("argnums", 0), len(args)) \
            if _TRANSFORMS[transform] else [False] * len(leaves)
        fakes = [_fresh_fake(sub, v.fake, requires_grad=True if d else None)
                 for v, d in zip(leaves, differentiated)]
    explicit = [sub.placeholder(f, f"arg{i}") for i, f in enumerate(fakes)]
    body_args = to_value(in_structure.build(explicit))
    result = trace_body(frame, sub, fn, body_args.items, kwargs, what)
    outs = []
    out_structure = flatten(result, outs, what)
    if not all(isinstance(v, TensorValue) for v in outs):
        raise Unsupported(f"{what}: the function returns symbolic sizes", hint=_BODY_HINT)
    gm = sub.finish(outs)
    target = FunctorchCall(transform, options, in_structure, out_structure, len(explicit))
    flat = tx.graph.call("call_function", target, [SubgraphValue(gm, f"{name}_body")] + leaves + sub.lifted_values,
                         {}, describe=what)
    items = flat.items if isinstance(flat, (TupleValue, ListValue)) else [flat]
    return to_value(pytree.tree_unflatten(list(items), target.result_spec))


def _vmap_dims(in_structure, in_dims, what):
    """The batch dim of each tensor leaf of the arguments (``in_dims`` broadcast over them)."""
    markers = []

    def mark(s):
        if s.kind == "leaf":
            m = _Marker()
            markers.append(m)
            return Structure("const", m)
        return Structure(s.kind, s.data, [mark(p) for p in s.parts])

    args_tree = mark(in_structure).build([])
    flat, spec = pytree.tree_flatten(args_tree)
    if isinstance(in_dims, int) or in_dims is None:
        per_leaf = [in_dims] * len(flat)
    else:
        per_leaf = pytree._broadcast_to_and_flatten(in_dims, spec)
        if per_leaf is None:
            raise Unsupported(f"{what}: in_dims {in_dims!r} does not match the arguments")
    dims = {id(x): d for x, d in zip(flat, per_leaf)}
    return [dims[id(m)] for m in markers]


def _differentiated(in_structure, argnums, nargs):
    """For each tensor leaf of the arguments, whether it is in ``argnums``."""
    chosen = {argnums} if isinstance(argnums, int) else set(argnums)
    chosen = {a % nargs for a in chosen}
    out = []
    for i, part in enumerate(in_structure.parts):
        out += [i in chosen] * part.leaf_count()
    return out


# --- torch.cond ------------------------------------------------------------------------------

def _bind(what, names, args, kwargs):
    """{parameter name: value} of a call of ``what(*names)``."""
    bound = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names or k in bound:
            raise Unsupported(f"{what}() got an unexpected argument {k!r}")
        bound[k] = v
    return bound


def _cond(frame, args, kwargs):
    bound = _bind("torch.cond", ("pred", "true_fn", "false_fn", "operands"), args, kwargs)
    pred, true_fn, false_fn = bound["pred"], bound["true_fn"], bound["false_fn"]
    operands = bound.get("operands", TupleValue([]))
    if not isinstance(operands, (TupleValue, ListValue)):
        raise Unsupported("torch.cond(): operands must be a tuple or list")
    if not isinstance(pred, TensorValue):
        # A Python predicate: the branch it picks, as eager does.
        branch = true_fn if _truth(pred) else false_fn
        return ops.call(frame, branch, list(operands.items), {})
    if pred.fake.numel() != 1 or pred.fake.dtype is not torch.bool and pred.fake.is_floating_point():
        raise Unsupported("torch.cond(): the predicate must be a one-element boolean tensor")
    tx = frame.tx
    leaves = []
    flatten(TupleValue(list(operands.items)), leaves, "torch.cond")
    if not all(isinstance(v, TensorValue) for v in leaves) or len(leaves) != len(operands.items):
        raise Unsupported("torch.cond(): operands must be tensors", hint=_BODY_HINT)
    branches = []
    for fn, label in ((true_fn, "true"), (false_fn, "false")):
        sub = SubgraphBuilder(tx.graph)
        explicit = [sub.placeholder(v.fake, f"operand{i}") for i, v in enumerate(leaves)]
        result = trace_body(frame, sub, _callable(frame, fn, "torch.cond"), explicit, {}, f"torch.cond ({label} branch)")
        outs = []
        structure = flatten(result, outs, "torch.cond")
        if not all(isinstance(v, TensorValue) for v in outs):
            raise Unsupported("torch.cond(): a branch returns something other than tensors", hint=_BODY_HINT)
        branches.append((sub, outs, structure))
    (t_sub, t_outs, t_struct), (f_sub, f_outs, f_struct) = branches
    if len(t_outs) != len(f_outs) or any(
            a.fake.shape != b.fake.shape or a.fake.dtype != b.fake.dtype for a, b in zip(t_outs, f_outs)):
        raise Unsupported("torch.cond(): the branches return tensors of different shapes or dtypes", hint=_BODY_HINT)
    # Both branches take the operands, then every tensor either of them reads from around it.
    lifted = []
    for sub in (t_sub, f_sub):
        for v in sub.lifted_values:
            if not any(v is w for w in lifted):
                lifted.append(v)
    gms = []
    for sub, outs in ((t_sub, t_outs), (f_sub, f_outs)):
        for v in lifted:
            sub.node_of(v)       # an input of both, used or not
        gm = sub.finish(outs, clone_inputs=True)    # the operator's outputs must not alias its inputs
        _order_placeholders(gm, sub, lifted)
        gms.append(gm)
    flat = tx.graph.call("call_function", torch.ops.higher_order.cond,
                         [pred, SubgraphValue(gms[0], "cond_true"), SubgraphValue(gms[1], "cond_false"),
                          TupleValue(leaves + lifted)], {}, describe="torch.cond")
    items = flat.items if isinstance(flat, (TupleValue, ListValue)) else [flat]
    return to_value(t_struct.build(list(items)))


def _order_placeholders(gm, sub, lifted):
    """Put the lifted placeholders of a branch in the order of ``lifted`` (both branches alike)."""
    wanted = list(sub.explicit) + [sub.lifted[v.node] for v in lifted]
    graph = gm.graph
    first = next(n for n in graph.nodes if n.op != "placeholder")
    for node in wanted:
        first.prepend(node)
    # prepend moves each in turn before `first`: they end up in `wanted` order.
    gm.recompile()


def _truth(v):
    try:
        return bool(as_constant(v))
    except Unsupported:
        raise Unsupported("torch.cond(): the predicate is neither a tensor nor a constant") from None


# --- associative_scan -----------------------------------------------------------------------

def _associative_scan(frame, args, kwargs):
    """torch's ``associative_scan`` operator, as its Python wrapper calls it under a compiler (the
    ``pointwise`` mode, on CUDA; the ``generic`` mode is plain torch code, traced as it is): the
    combine function becomes a body over one slice of each input (left operands, then right),
    and one node runs the operator on it. Where a gradient flows through it, the operator's
    own dense kernel is traced instead (the operator's backward is wrong in torch today)."""
    what = "associative_scan"
    bound = _bind(what, ("combine_fn", "xs", "additional_inputs"), args, kwargs)
    xs = bound.get("xs")
    extra = bound.get("additional_inputs", TupleValue([]))
    if not isinstance(xs, (TupleValue, ListValue)) or not all(isinstance(x, TensorValue) for x in xs.items) \
            or not xs.items:
        raise Unsupported(f"{what}(): xs must be a non-empty list of tensors", hint=_BODY_HINT)
    if isinstance(extra, ConstantValue) and extra.value in ((), []):
        extra = TupleValue([])
    if not isinstance(extra, (TupleValue, ListValue)) or extra.items:
        raise Unsupported(f"{what}() with additional inputs is not supported yet", hint=_BODY_HINT)
    tx = frame.tx
    leaves = list(xs.items)
    combine = _callable(frame, bound["combine_fn"], what)
    if torch.is_grad_enabled() and any(x.fake.requires_grad for x in leaves):
        # torch's operator computes wrong gradients for some combine functions (torch 2.11-2.13:
        # Mamba's linear recurrence gets a wrong d/da); its dense kernel, plain torch code over
        # the combine function, differentiates as eager does.
        out = ops.call(frame, wrap(tx, generic_associative_scan, None), [combine, ListValue(leaves)], {})
        return TupleValue(list(out.items)) if isinstance(out, ListValue) else out
    sub = SubgraphBuilder(tx.graph)
    explicit = [sub.placeholder(_fresh_fake(sub, x.fake, tuple(x.fake.shape[1:])), f"{side}{i}")
                for side in ("left", "right") for i, x in enumerate(leaves)]
    result = trace_body(frame, sub, combine, explicit, {}, what)
    outs = []
    flatten(result, outs, what)
    if len(outs) != len(leaves) or not all(isinstance(v, TensorValue) for v in outs):
        raise Unsupported(f"{what}(): the combine function must return one tensor per input", hint=_BODY_HINT)
    for o, x in zip(outs, leaves):
        if tuple(o.fake.shape) != tuple(x.fake.shape[1:]) or o.fake.dtype != x.fake.dtype:
            raise Unsupported(f"{what}(): the combine function changes the shape or dtype of its inputs",
                              hint=_BODY_HINT)
    if sub.lifted_values:
        # torch's operator refuses gradients for them, and its dense kernel passes them as extra
        # combine arguments: keep the body closed.
        raise Unsupported(f"{what}(): the combine function reads tensors from around it "
                          f"({', '.join(describe(v) for v in sub.lifted_values[:3])})", hint=_BODY_HINT)
    gm = sub.finish(outs, clone_inputs=True)
    flat = tx.graph.call("call_function", torch.ops.higher_order.associative_scan,
                         [SubgraphValue(gm, "associative_scan_combine"), ListValue(leaves),
                          TupleValue([])], {}, describe=what)
    items = flat.items if isinstance(flat, (TupleValue, ListValue)) else [flat]
    return TupleValue(list(items))


# --- activation checkpointing --------------------------------------------------------------

_CHECKPOINT_OPTIONS = {"use_reentrant", "preserve_rng_state", "determinism_check", "debug", "early_stop"}


def _checkpoint(frame, args, kwargs):
    if not args:
        raise Unsupported("checkpoint() without a function")
    options = {k: v for k, v in kwargs.items() if k in _CHECKPOINT_OPTIONS or k == "context_fn"}
    fn_kwargs = {k: v for k, v in kwargs.items() if k not in options}
    reentrant = as_constant(options["use_reentrant"]) if "use_reentrant" in options else None
    if reentrant is not False:
        raise Unsupported("torch.utils.checkpoint with use_reentrant=True (or unset, which means True) runs "
                          "natively", hint="pass use_reentrant=False to have it traced into the graph")
    if "context_fn" in options:
        ctx_fn = options["context_fn"]
        if not (isinstance(ctx_fn, ObjectValue) and ctx_fn.obj is torch.utils.checkpoint.noop_context_fn):
            raise Unsupported("checkpoint() with a context_fn (selective checkpointing) is not supported yet",
                              hint=_BODY_HINT)
    for key in ("determinism_check", "debug"):
        if key in options and as_constant(options[key]) not in ("default", False):
            raise Unsupported(f"checkpoint() with {key}={as_constant(options[key])!r} is not supported yet")
    tx = frame.tx
    fn = _callable(frame, args[0], "checkpoint")
    sub = SubgraphBuilder(tx.graph)
    result = trace_body(frame, sub, fn, list(args[1:]), fn_kwargs, "torch.utils.checkpoint")
    outs = []
    structure = flatten(result, outs, "torch.utils.checkpoint")
    if not all(isinstance(v, TensorValue) for v in outs):
        raise Unsupported("checkpoint(): the function returns symbolic sizes", hint=_BODY_HINT)
    gm = sub.finish(outs, clone_inputs=True)
    flat = tx.graph.call("call_function", checkpointed, [SubgraphValue(gm, "checkpoint_body")] + sub.lifted_values,
                         {}, describe="torch.utils.checkpoint")
    items = flat.items if isinstance(flat, (TupleValue, ListValue)) else [flat]
    return to_value(structure.build(list(items)))


# --- torch.func.functional_call --------------------------------------------------------------

def _functional_call(frame, args, kwargs):
    names = ("module", "parameter_and_buffer_dicts", "args", "kwargs")
    bound = dict(zip(names, args))
    for k, v in kwargs.items():
        if k in bound:
            raise Unsupported(f"functional_call() got {k!r} twice")
        bound[k] = v
    tie_weights = as_constant(bound.pop("tie_weights", ConstantValue(True)))
    strict = as_constant(bound.pop("strict", ConstantValue(False)))
    module = bound.get("module")
    if not (isinstance(module, ObjectValue) and isinstance(module.obj, torch.nn.Module)):
        raise Unsupported("functional_call() on something other than an nn.Module")
    dicts = bound.get("parameter_and_buffer_dicts")
    dicts = list(dicts.items) if isinstance(dicts, (TupleValue, ListValue)) else [dicts]
    merged = {}
    for d in dicts:
        if not isinstance(d, DictValue):
            raise Unsupported("functional_call(): parameters must be given as dicts")
        for k, v in d.items.items():
            if k in merged:
                raise Unsupported(f"functional_call(): {k!r} given twice")
            merged[k] = v
    m = module.obj
    named = dict(m.named_parameters(remove_duplicate=False))
    named.update(dict(m.named_buffers(remove_duplicate=False)))
    overrides = {}
    for key, v in merged.items():
        if key not in named:
            raise Unsupported(f"functional_call(): {key!r} is not a parameter or buffer of the module")
        if not isinstance(v, TensorValue):
            raise Unsupported(f"functional_call(): {key!r} is not a tensor")
        real = named[key]
        shared = [n for n, t in named.items() if t is real]
        if len(shared) > 1 and not tie_weights and any(n not in merged for n in shared):
            raise Unsupported("functional_call(tie_weights=False) on tied weights is not supported yet")
        overrides[id(real)] = (real, v)
    if strict and set(merged) != set(named):
        raise Unsupported("functional_call(strict=True) with missing keys raises")
    call_args = bound.get("args", ConstantValue(None))
    if isinstance(call_args, TupleValue):
        call_args = list(call_args.items)
    elif isinstance(call_args, ConstantValue) and call_args.value is None:
        call_args = []
    else:
        call_args = [call_args]
    call_kwargs = bound.get("kwargs", ConstantValue(None))
    if isinstance(call_kwargs, DictValue):
        call_kwargs = dict(call_kwargs.items)
    elif isinstance(call_kwargs, ConstantValue) and call_kwargs.value is None:
        call_kwargs = {}
    else:
        raise Unsupported("functional_call(): kwargs must be a dict")
    tx = frame.tx
    saved = tx.state_overrides
    tx.state_overrides = {**saved, **overrides}
    try:
        return ops.call(frame, module, call_args, call_kwargs)
    finally:
        tx.state_overrides = saved


__all__ = ["call", "trace_body", "flatten", "to_value"]
