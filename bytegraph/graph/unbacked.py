"""Unbacked symbols: sizes and numbers only the graph computes (capture modes).

With ``config.capture_scalar_outputs`` (``Tensor.item()``) or
``config.capture_dynamic_output_shape_ops`` (``nonzero``, ``x[mask]``, ``unique``,
``masked_select``, ``repeat_interleave`` with tensor repeats...) the fake run of such an op gives
a fresh *unbacked* symbol (``u0``, a float ``zuf0``) instead of raising. Nothing outside the
graph knows its value, so:

* the node whose result first holds a fresh symbol is its binding site
  (``node.meta["unbacked_bindings"]``, as torch's passes and AOTAutograd read it);
* no guard may mention it: a Python decision on it (``if n > 0``, ``range(n)``, ``int(f)``)
  raises ``GuardOnDataDependentSymNode``, which becomes a graph break at that instruction
  (``guard_break``), never a guess;
* a comparison that cannot be decided stays a symbolic bool in the graph (``decided``), so it
  can be returned or handed to ``torch._check``;
* facts the trace assumed about it (``torch._check(n > 0)``, a size is >= 0) are checked when
  the graph runs: ``insert_asserts`` adds them as assertion nodes at the end of the trace.
"""
import warnings

import torch
from torch.fx.experimental.symbolic_shapes import (GuardOnDataDependentSymNode, compute_unbacked_bindings,
                                                   free_unbacked_symbols, statically_known_true)
from torch.fx.passes.runtime_assert import insert_deferred_runtime_asserts

from ..errors import Unsupported

SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)

CAPTURE_HINT = ("decide on shapes or Python values, or keep the value a tensor (torch.where instead of an if); "
                "torch._check(cond) states a fact about the value without a branch")


def involves_unbacked(value):
    """Does the symbolic number ``value`` depend on a symbol only the graph computes?"""
    return isinstance(value, SYMBOLIC) and bool(free_unbacked_symbols(value))


def bind(shapes, result):
    """The fresh unbacked symbols the fake run just made, each with where ``result`` holds it
    ({symbol: path}), or None; raises if one is nowhere in ``result``."""
    if not shapes.env.pending_fresh_unbacked_symbols:
        return None
    bindings = compute_unbacked_bindings(shapes.env, result)
    if bindings:
        shapes.unbacked.update(bindings)
    return bindings or None


def forget_pending(shapes):
    """Fresh symbols made by a fake run whose result is not in the graph (a backward check)."""
    shapes.env.pending_fresh_unbacked_symbols.clear()


def decided(cond):
    """``True``/``False`` when the symbolic bool ``cond`` holds (or fails) for every value its
    unbacked symbols may take, without a guard; None when only the data can tell."""
    if statically_known_true(cond):
        return True
    if statically_known_true(torch.sym_not(cond)):
        return False
    return None


def guard_break(exc):
    """The graph break for a Python decision on an unbacked value."""
    cond = getattr(exc, "cond", None)
    what = f" ({cond})" if cond is not None else ""
    return Unsupported(f"a Python decision on a number the graph computes from tensor data{what}: "
                       "its value is unknown while tracing (Tensor.item(), or a size that depends on data)",
                       hint=CAPTURE_HINT)


def insert_asserts(gm, shapes, name):
    """The facts the trace assumed about unbacked symbols, as assertion nodes of ``gm``."""
    if shapes.unbacked:
        insert_deferred_runtime_asserts(gm, shapes.env, name)
        gm.recompile()


__all__ = ["GuardOnDataDependentSymNode", "SYMBOLIC", "bind", "check_node", "decided", "forget_pending",
           "guard_break", "insert_asserts", "involves_unbacked"]


def check_node(builder, check, value, extra_kwargs=None):
    """``check(value)`` (``torch._check`` and friends) on a symbolic number only the graph knows:
    the ShapeEnv learns the fact (later decisions may use it; a runtime assertion is inserted at
    the end) and the graph gets the call, which raises when the graph runs, as eager does."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)     # _check_is_size's deprecation: eager's to give
        check(value.sym, **(extra_kwargs or {}))
    node = builder.graph.create_node("call_function", check, (builder.node_of(value),), dict(extra_kwargs or {}))
    node.meta["example_value"] = None
    return node
