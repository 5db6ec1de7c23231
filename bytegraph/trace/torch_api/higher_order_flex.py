"""FlexAttention as torch's ``flex_attention`` higher-order operator.

``torch.nn.attention.flex_attention.flex_attention`` is plain Python around an operator: under a
compiler it checks its arguments, makes the default block mask, fills the kernel options, calls
``torch._higher_order_ops.flex_attention`` with the score and mask functions as they are, and
scales the log-sum-exp it returns. That Python is traced like any other; the operator's call is
what this module takes: the score function (``score, b, h, q_idx, kv_idx -> score``) and the mask
function (``b, h, q_idx, kv_idx -> bool``) are traced into graphs of their own on 0-d fakes, and
one node runs the operator with them, as ``torch.compile`` captures it, so Inductor generates
its fused kernel (forward and backward) on a GPU::

    flex_attention(q, k, v, score_mod_graph, (*block_mask tensors and sizes, mask_graph), scale,
                   kernel_options, score_mod_other_buffers, mask_mod_other_buffers)

Tensors the functions read from around them (a bias table, document ids, a sliding window
size as a tensor) are the two tuples of other buffers, in first-use order; gradients reach
them through the operator's backward. ``create_block_mask`` inside the compiled function is
traced as plain torch code (its ``vmap`` over the mask function is a torch.func transform).
"""
import torch
from torch._higher_order_ops.flex_attention import flex_attention as flex_attention_op
from torch.nn.attention.flex_attention import noop_mask

from ...errors import Unsupported
from ...graph.higher_order import IndexByTensors
from ...graph.subgraph import SubgraphBuilder
from ...values.base import (ConstantValue, DictValue, SubgraphValue, SymValue, TensorValue, TupleValue)
from ...values.builder import wrap
from . import higher_order
from ..core.basics import as_constant, describe
from .higher_order import _bind, _callable, trace_body

_WHAT = "flex_attention"
_HINT = higher_order._BODY_HINT
_ARGUMENTS = ("query", "key", "value", "score_mod", "block_mask", "scale", "kernel_options",
              "score_mod_other_buffers", "mask_mod_other_buffers")


def call(frame, fv, args, kwargs):
    """The value of a call of the flex_attention operator, or None for any other call."""
    if fv.obj is not flex_attention_op:
        return None
    return _flex_attention(frame, args, kwargs)


def _index_fakes(sub, query):
    """The batch, head, query and key/value index a score or mask function gets: 0-d int32."""
    with sub.fake_mode:
        return [torch.empty((), dtype=torch.int32, device=query.fake.device) for _ in range(4)]


def _trace_function(frame, fn, query, label, with_score):
    """``fn`` traced on 0-d fakes (the score first when ``with_score``) into a graph returning one
    tensor; the graph and the tensors it reads from around it."""
    tx = frame.tx
    sub = SubgraphBuilder(tx.graph)
    fakes = _index_fakes(sub, query)
    names = ["b", "h", "q_idx", "kv_idx"]
    if with_score:
        with sub.fake_mode:
            score = torch.empty((), dtype=query.fake.dtype, device=query.fake.device)
        if query.fake.requires_grad:
            score.requires_grad_(True)
        fakes, names = [score] + fakes, ["score"] + names
    explicit = [sub.placeholder(f, n) for f, n in zip(fakes, names)]
    with IndexByTensors():      # ``bias[q_idx]`` is a lookup there (torch runs them so)
        result = trace_body(frame, sub, _callable(frame, fn, f"{_WHAT} ({label})"), explicit, {},
                            f"{_WHAT} ({label})")
    if not isinstance(result, TensorValue):
        raise Unsupported(f"{_WHAT}: the {label} function returns {describe(result)}, not a tensor", hint=_HINT)
    if result.fake.dim() != 0:
        raise Unsupported(f"{_WHAT}: the {label} function returns a tensor of shape {tuple(result.fake.shape)}, "
                          "not one value", hint=_HINT)
    return sub.finish([result], single=True), list(sub.lifted_values)


def _flex_attention(frame, args, kwargs):
    bound = _bind(_WHAT, _ARGUMENTS, args, kwargs)
    missing = [n for n in _ARGUMENTS[:7] if n not in bound]
    if missing:
        raise Unsupported(f"{_WHAT} operator called without {', '.join(missing)}", hint=_HINT)
    query, key, value = bound["query"], bound["key"], bound["value"]
    if not all(isinstance(t, TensorValue) for t in (query, key, value)):
        raise Unsupported(f"{_WHAT}: query, key and value must be tensors", hint=_HINT)
    for name in ("score_mod_other_buffers", "mask_mod_other_buffers"):
        given = bound.get(name)
        if given is not None and not (isinstance(given, TupleValue) and not given.items):
            raise Unsupported(f"{_WHAT} operator called with {name}: what the functions read is found by tracing "
                              "them", hint=_HINT)
    block_mask = bound["block_mask"]
    if not isinstance(block_mask, TupleValue) or not block_mask.items:
        raise Unsupported(f"{_WHAT}: the block mask must be the tuple BlockMask.as_tuple() gives", hint=_HINT)
    for item in block_mask.items[:-1]:
        if not isinstance(item, (TensorValue, ConstantValue, SymValue)):
            raise Unsupported(f"{_WHAT}: the block mask holds {describe(item)}", hint=_HINT)
    try:
        scale = as_constant(bound["scale"])
        options = as_constant(bound["kernel_options"]) if isinstance(bound["kernel_options"], ConstantValue) \
            else {k: as_constant(v) for k, v in bound["kernel_options"].items.items()}
    except (Unsupported, AttributeError):
        raise Unsupported(f"{_WHAT}: scale and kernel options must be constants", hint=_HINT) from None
    if not isinstance(scale, (int, float)) or not isinstance(options, dict):
        raise Unsupported(f"{_WHAT}: scale must be a number and kernel options a dict", hint=_HINT)
    tx = frame.tx
    score_mod = bound["score_mod"]
    mask_mod = block_mask.items[-1]
    if isinstance(mask_mod, ConstantValue) and mask_mod.value is None:
        mask_mod = wrap(tx, noop_mask, None)
    score_gm, score_buffers = _trace_function(frame, score_mod, query, "score_mod", with_score=True)
    mask_gm, mask_buffers = _trace_function(frame, mask_mod, query, "mask_mod", with_score=False)
    mask_tuple = TupleValue(list(block_mask.items[:-1]) + [SubgraphValue(mask_gm, "mask_fn")])
    return tx.graph.call("call_function", flex_attention_op,
                         [query, key, value, SubgraphValue(score_gm, "score_mod"), mask_tuple,
                          ConstantValue(float(scale)), DictValue({k: ConstantValue(v) for k, v in options.items()}),
                          TupleValue(score_buffers), TupleValue(mask_buffers)], {}, describe=_WHAT)


higher_order.register(call)

__all__ = ["call"]
