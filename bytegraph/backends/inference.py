"""Graphs with ``with torch.inference_mode()`` blocks, for the AOTAutograd-based backends.

The tracer puts such a block in the graph as torch's own ``_enter_inference_mode`` /
``_exit_inference_mode`` nodes (trace/torch_api/torch_calls.py), which a graph run as it is handles as
eager does. AOTAutograd does not: it refuses some ops on inference tensors while it traces
(``detach`` inside the block), and the function it compiles runs outside autograd, so what eager
refuses with the tensors the block made (saving one for backward, changing one in place after
the block) would pass. So such a graph is compiled in parts: the code outside the blocks and each
block's body are compiled apart, the body in inference mode, and a graph run as it is calls them
with the block's own enter and exit nodes around the body, as eager runs it.
"""
import operator

import torch
import torch.fx as fx

from ._common import flat_tuple_output, run_uncompiled
from ..graph_facts import is_state_node
from .regions import _GlobalStates, _Part, part_caller

# The tracer's nodes for a block's ends (bytegraph.residual, a floor above backends: named here).
_ENTER_NAME, _EXIT_NAME = "enter_inference_mode", "exit_inference_mode"


def _is(n, name):
    return n.op == "call_function" and getattr(n.target, "__module__", None) == "bytegraph.residual" \
        and getattr(n.target, "__name__", None) == name


def is_inference_node(n):
    return _is(n, _ENTER_NAME) or _is(n, _EXIT_NAME)


def has_inference_blocks(gm):
    return any(is_inference_node(n) for n in gm.graph.nodes)


def _runs(n):
    return is_inference_node(n) or is_state_node(n)


def _perform(n, args, kwargs):
    """A state node done while compiling; a block's ends through torch's own inference-mode
    object (not the graph's functions, which keep the blocks a running graph has open)."""
    if _is(n, _ENTER_NAME):
        block = torch._C._InferenceMode(*args)
        block.__enter__()
        return block
    if _is(n, _EXIT_NAME):
        args[0].__exit__(None, None, None)
        return None
    return n.target(*args, **kwargs)


def _pieces(gm):
    """The graph's nodes in order as runs between inference nodes: [(inference node or None,
    [nodes])], each run after the inference node that starts it (None before the first)."""
    pieces = [(None, [])]
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "output"):
            continue
        if is_inference_node(n):
            pieces.append((n, []))
        else:
            pieces[-1][1].append(n)
    return pieces


def _passes_between_parts(value):
    return isinstance(value, (torch.Tensor, torch.SymInt, int, float, bool))


def compile_by_inference_blocks(gm, example_inputs, compile_part):
    """``gm`` compiled part by part around its inference blocks, each part with
    ``compile_part(part_gm, fake_example_inputs)``; the callable running it, or None where it
    has no such block or cannot be cut there (a value other than a tensor or a number would pass
    between parts, or a part input has no example value)."""
    if not has_inference_blocks(gm):
        return None
    parts = [(start, _Part(None, nodes)) for start, nodes in _pieces(gm)]
    for _, p in parts:
        for a in p.inputs:
            if a.op != "get_attr" and not _passes_between_parts(a.meta.get("example_value")):
                return None
    try:
        # Grad mode and autocast at each node, the blocks' ends done for real too (entering
        # inference mode turns grad mode off until the block ends).
        states = _GlobalStates(gm, runs=_runs, perform=_perform)
    except (KeyError, TypeError, RuntimeError):
        return None
    outer = fx.Graph()
    env = {}
    opened = {}      # enter node -> the real inference-mode object entered while compiling

    def copy(n):
        env[n] = outer.node_copy(n, lambda a: outer.get_attr(a.target) if a.op == "get_attr"
                                 and a not in env else env[a])

    for n in gm.graph.nodes:
        if n.op == "placeholder":
            env[n] = outer.placeholder(n.name)
            env[n].meta = dict(n.meta)
    try:
        for start, p in parts:
            if start is not None:
                # The block's edge, done for real (a body is compiled in inference mode) and kept
                # in the outer graph, which runs as it is.
                if _is(start, _ENTER_NAME):
                    opened[start] = _perform(start, list(start.args), {})
                else:
                    _perform(start, [opened.pop(start.args[0])], {})
                copy(start)
            if not p.outputs:
                for n in p.nodes:
                    copy(n)
                continue
            p.build(gm, states)
            states.enter(p.nodes[0])
            fn = part_caller(compile_part(p.gm, list(p.examples)), "run_inference_part")
            args = [outer.get_attr(a.target) if a.op == "get_attr" else env[a] for a in p.inputs]
            call = outer.call_function(fn, tuple(args))
            for i, out in enumerate(p.outputs):
                env[out] = outer.call_function(operator.getitem, (call, i))
                env[out].meta = dict(out.meta)
            for n in p.state_nodes:     # the state the part left, for the parts after it
                copy(n)
    finally:
        for real in reversed(list(opened.values())):
            real.__exit__(None, None, None)
        states.restore()
    out_node = gm.graph.output_node()
    outer.output(fx.node.map_arg(out_node.args[0], env.__getitem__))
    return fx.GraphModule(gm, outer)


def inference_parts(backend_name, gm, example_inputs, compile_part):
    """``gm``, which has inference-mode blocks, compiled in parts around them; where it cannot be
    cut there, it runs uncompiled (logged)."""
    split = compile_by_inference_blocks(gm, example_inputs, compile_part)
    if split is not None:
        return split.forward
    return run_uncompiled(backend_name, gm, RuntimeError("an inference_mode block that cannot be compiled apart"),
                          flat_tuple_output(gm))


__all__ = ["compile_by_inference_blocks", "has_inference_blocks", "inference_parts", "is_inference_node"]
