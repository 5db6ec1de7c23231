"""``torch.autograd.Function`` subclasses' ``apply``, traced: forward under no_grad with a
``FunctionCtx`` recording what it saves and marks, backward on fresh gradients and the saved
tensors, both run as one custom Function (``graph.higher_order.AutogradFunctionCall``), so
AOTAutograd traces the user's backward into the joint graph. Where autograd records nothing
(grad mode off, no input needing grad), forward is traced inline like any function. Registered
with ``higher_order.call`` (a higher-order operation whose bodies are the two methods).
"""
import torch

from ...errors import Unsupported
from ...graph.higher_order import AutogradFunctionCall, FunctionPlan
from ...graph.subgraph import SubgraphBuilder
from ...values.base import (ConstantValue, ListValue, ObjectValue, TensorValue, TracerCallableValue, TupleValue,
                           UserObjectValue)
from ...values.builder import wrap
from ..core import ops
from ..core.basics import as_constant
from . import higher_order
from .higher_order import _BODY_HINT, _fresh_fake, flatten, to_value, trace_body

_AUTOGRAD_FUNCTION_APPLY = torch.autograd.Function.apply.__func__
_SINGLE_LEVEL_SETUP_CONTEXT = torch.autograd.function._SingleLevelFunction.setup_context


def call(frame, fv, args, kwargs):
    """``MyFunction.apply(*args)``, or None for any other callable."""
    obj = fv.obj
    if getattr(obj, "__func__", None) is _AUTOGRAD_FUNCTION_APPLY and isinstance(obj.__self__, type):
        return _autograd_function(frame, obj.__self__, args, kwargs)
    return None


higher_order.register(call)


# --- torch.autograd.Function ---------------------------------------------------------------------

class FunctionCtx:
    """What ``ctx`` is while a custom Function's forward and backward are traced (its methods
    are traced like user code; the trace reads what they recorded)."""

    def save_for_backward(self, *tensors):
        self._bytegraph_saved = tensors

    def save_for_forward(self, *tensors):
        self._bytegraph_saved_forward = tensors

    def mark_non_differentiable(self, *tensors):
        self._bytegraph_non_differentiable = tensors

    def mark_dirty(self, *tensors):
        self._bytegraph_dirty = tensors

    def set_materialize_grads(self, value):
        self._bytegraph_materialize = value


_CTX_RECORDS = ("_bytegraph_saved", "_bytegraph_saved_forward", "_bytegraph_non_differentiable",
                "_bytegraph_dirty", "_bytegraph_materialize")


def _autograd_function(frame, cls, args, kwargs):
    what = f"{cls.__qualname__}.apply"
    if kwargs:
        raise Unsupported(f"{what} with keyword arguments", hint=_BODY_HINT)
    if getattr(cls, "apply").__func__ is not _AUTOGRAD_FUNCTION_APPLY:
        raise Unsupported(f"{what} is overridden")
    tx = frame.tx
    args = list(args)
    if not (torch.is_grad_enabled() and any(isinstance(a, TensorValue) and a.fake.requires_grad for a in args)):
        return _apply_recording_nothing(frame, cls, args)
    tensor_positions = [i for i, a in enumerate(args) if isinstance(a, TensorValue)]
    for a in args:
        if not isinstance(a, (TensorValue, ConstantValue)):
            if _passes_as_object(a):
                continue    # issue 40: a module, a config...: forward reads it; tensors read are lifted
            flatten(a, [], what)    # containers of constants are fine; tensors inside them are not
            if _contains_tensor(a):
                raise Unsupported(f"{what}: tensors inside containers are not supported", hint=_BODY_HINT)
    needs_input_grad = tuple(isinstance(a, TensorValue) and a.fake.requires_grad and torch.is_grad_enabled()
                             for a in args)

    # forward, under no_grad (as autograd runs it), recording what ctx is told
    fwd = SubgraphBuilder(tx.graph)
    explicit = {i: fwd.placeholder(args[i].fake, f"arg{i}") for i in tensor_positions}
    fwd_args = [explicit.get(i, a) for i, a in enumerate(args)]
    ctx = UserObjectValue(FunctionCtx, {"needs_input_grad": to_value(needs_input_grad)})
    setup_context = cls.setup_context
    if setup_context is not _SINGLE_LEVEL_SETUP_CONTEXT:
        def run_forward(f, a, k):
            out = ops.call(f, wrap(f.tx, cls.forward, None), fwd_args, {})
            ops.call(f, wrap(f.tx, setup_context, None), [ctx, TupleValue(fwd_args), out], {})
            return out
        body = TracerCallableValue(f"{cls.__qualname__}.forward", run_forward)
        body_args = []
    else:
        body = wrap(tx, cls.forward, None)
        body_args = [ctx] + fwd_args
    result = trace_body(frame, fwd, body, body_args, {}, f"{cls.__qualname__}.forward", grad_mode=False,
                        own=[ctx])
    if "_bytegraph_dirty" in ctx.attrs:
        raise Unsupported(f"{what}: mark_dirty (changing inputs in place) is not supported yet", hint=_BODY_HINT)
    if "_bytegraph_saved_forward" in ctx.attrs:
        raise Unsupported(f"{what}: save_for_forward (forward-mode AD) is not supported yet", hint=_BODY_HINT)
    materialize = ctx.attrs.get("_bytegraph_materialize", ConstantValue(True))
    if not as_constant(materialize):
        raise Unsupported(f"{what}: set_materialize_grads(False) is not supported yet", hint=_BODY_HINT)
    outs = []
    out_structure = flatten(result, outs, what)
    if not outs or not all(isinstance(v, TensorValue) for v in outs):
        raise Unsupported(f"{what}: forward returns no tensor (or a symbolic size)", hint=_BODY_HINT)
    non_diff = ctx.attrs.get("_bytegraph_non_differentiable", TupleValue([]))
    non_diff_idx = []
    for t in (non_diff.items if isinstance(non_diff, TupleValue) else []):
        idx = [i for i, o in enumerate(outs) if o is t]
        if not idx:
            raise Unsupported(f"{what}: mark_non_differentiable on something that is not an output")
        non_diff_idx += idx
    # Tensors the backward reads: saved ones, and tensors stored on ctx as attributes.
    saved_values = []
    saved = ctx.attrs.get("_bytegraph_saved", TupleValue([]))
    saved_structure = flatten(saved, saved_values, what)
    user_attrs = {k: v for k, v in ctx.attrs.items() if k not in _CTX_RECORDS and k != "needs_input_grad"}
    attr_structures = {}
    passed = {k: v for k, v in user_attrs.items() if _passes_as_object(v)}   # issue 40: backward reads them
    for k, v in user_attrs.items():
        if k not in passed:
            attr_structures[k] = flatten(v, saved_values, what)
    if not all(isinstance(v, TensorValue) for v in saved_values):
        raise Unsupported(f"{what}: ctx holds symbolic sizes", hint=_BODY_HINT)
    fwd_gm = fwd.finish(outs + saved_values)

    # backward, on fresh inputs: the output gradients, then the saved tensors
    bwd = SubgraphBuilder(tx.graph)
    grads = [bwd.placeholder(_fresh_fake(bwd, o.fake, requires_grad=False), f"grad{i}") for i, o in enumerate(outs)]
    saved_inputs = [bwd.placeholder(v.fake, f"saved{i}") for i, v in enumerate(saved_values)]
    grad_args = out_structure.build(grads)
    grad_list = list(grad_args) if isinstance(grad_args, tuple) else [grad_args]
    n_saved = saved_structure.leaf_count()
    bwd_saved = to_value(saved_structure.build(saved_inputs[:n_saved]))
    rest = saved_inputs[n_saved:]
    bwd_attrs = {"needs_input_grad": to_value(needs_input_grad), "saved_tensors": bwd_saved,
                 "saved_variables": bwd_saved, **passed}
    offset = 0
    for k, s in attr_structures.items():
        n = s.leaf_count()
        bwd_attrs[k] = to_value(s.build(rest[offset:offset + n]))
        offset += n
    bwd_ctx = UserObjectValue(FunctionCtx, bwd_attrs)
    grad_result = trace_body(frame, bwd, wrap(tx, cls.backward, None), [bwd_ctx] + [to_value(g) for g in grad_list],
                             {}, f"{cls.__qualname__}.backward", grad_mode=False, own=[bwd_ctx])
    grad_leaves = []
    grad_structure = flatten(grad_result if isinstance(grad_result, TupleValue) else TupleValue([grad_result]),
                             grad_leaves, what)
    if len(grad_structure.parts) != len(args):
        raise Unsupported(f"{what}: backward returns {len(grad_structure.parts)} gradients for {len(args)} inputs",
                          hint=_BODY_HINT)
    for i, part in enumerate(grad_structure.parts):
        if i in tensor_positions:
            if part.kind not in ("leaf", "const") or part.kind == "const" and part.data is not None:
                raise Unsupported(f"{what}: backward returns something other than a tensor or None")
        elif not (part.kind == "const" and part.data is None):
            raise Unsupported(f"{what}: backward returns a gradient for a non-tensor input", hint=_BODY_HINT)
    if not all(isinstance(v, TensorValue) for v in grad_leaves):
        raise Unsupported(f"{what}: backward returns symbolic sizes", hint=_BODY_HINT)
    bwd_gm = bwd.finish(grad_leaves)
    plan = FunctionPlan(fwd_gm, _BackwardRunner(bwd_gm, grad_structure, tensor_positions), len(outs), non_diff_idx,
                        len(tensor_positions), len(fwd.lifted_values), len(bwd.lifted_values), cls.__name__)
    inputs = [args[i] for i in tensor_positions] + fwd.lifted_values + bwd.lifted_values
    flat = tx.graph.call("call_function", AutogradFunctionCall(plan), inputs, {}, describe=what)
    items = flat.items if isinstance(flat, (TupleValue, ListValue)) else [flat]
    return to_value(out_structure.build(list(items)))


def _passes_as_object(v):
    """issue 40: an argument (or ctx attribute) of a custom Function that reaches its forward and
    backward as it is: an object from outside the compiled function (a module, a list of modules,
    a config), or a tuple/list of those and constants. Tensors the bodies read from it are lifted
    as inputs of their graphs; like eager, forward gives them no gradient."""
    if isinstance(v, ObjectValue) and v.source is not None and not isinstance(v.obj, torch.Tensor):
        return True
    if isinstance(v, (TupleValue, ListValue)):
        return bool(v.items) and all(isinstance(i, ConstantValue) or _passes_as_object(i) for i in v.items) \
            and any(not isinstance(i, ConstantValue) for i in v.items)
    return False


# --- issue 40: apply where autograd records nothing (no grad mode, no input needing grad) ---

def _apply_recording_nothing(frame, cls, args):
    """``cls.apply(*args)`` when autograd records no node for it: grad mode is off, or no tensor
    argument requires grad. Eager then runs ``forward`` under no_grad and returns its outputs as
    they are (an input returned comes back as an alias of it), so ``forward`` is traced inline,
    like any function: its arguments may be anything (modules, lists it appends to, configs)."""
    tx = frame.tx
    grad_was = torch.is_grad_enabled()
    set_grad = wrap(tx, torch._C._set_grad_enabled, None)
    ctx = UserObjectValue(FunctionCtx, {"needs_input_grad": to_value(tuple(False for _ in args))})
    if grad_was:
        ops.call(frame, set_grad, [ConstantValue(False)], {})   # a graph node, as in eager
    try:
        if cls.setup_context is not _SINGLE_LEVEL_SETUP_CONTEXT:
            out = ops.call(frame, wrap(tx, cls.forward, None), list(args), {})
            ops.call(frame, wrap(tx, cls.setup_context, None), [ctx, TupleValue(list(args)), out], {})
        else:
            out = ops.call(frame, wrap(tx, cls.forward, None), [ctx] + list(args), {})
    finally:
        if grad_was:
            ops.call(frame, set_grad, [ConstantValue(True)], {})
    if "_bytegraph_saved_forward" in ctx.attrs:
        raise Unsupported(f"{cls.__qualname__}.apply: save_for_forward (forward-mode AD) is not supported yet",
                          hint=_BODY_HINT)
    dirty = ctx.attrs.get("_bytegraph_dirty", TupleValue([]))
    dirty = dirty.items if isinstance(dirty, TupleValue) else []
    inputs = [a for a in args if isinstance(a, TensorValue)]
    leaves = []
    structure = flatten(out, leaves, f"{cls.__qualname__}.apply")
    fresh = []
    for leaf in leaves:
        if any(leaf is a for a in inputs) and not any(leaf is d for d in dirty):
            # An input returned unchanged: eager returns a new tensor over its storage.
            name = "detach" if leaf.fake.requires_grad else "view_as"
            leaf = ops.tensor_method(frame, leaf, name, [leaf] if name == "view_as" else [], {})
        fresh.append(leaf)
    return to_value(structure.build(fresh))


class _BackwardRunner:
    """The traced backward as the plan calls it: output gradients, saved tensors and the tensors it
    reads from around it in; one gradient (or None) per tensor argument of forward out."""

    def __init__(self, gm, structure, tensor_positions):
        self.gm = gm
        self.structure = structure
        self.tensor_positions = tensor_positions

    def __call__(self, *inputs):
        grads = self.structure.build(self.gm(*inputs))
        return [grads[i] for i in self.tensor_positions]


def _contains_tensor(v):
    leaves = []
    try:
        flatten(v, leaves, "")
    except Unsupported:
        return True
    return bool(leaves)
