"""The ``aot_eager`` backend: AOTAutograd with compilers that change nothing.

AOTAutograd traces the graph with fake tensors into a functional ATen
forward graph (and, when anything requires grad, a joint graph that it
partitions into forward and backward). Here both halves run as plain FX
code, which makes the backend a check of the AOTAutograd step alone:
results and gradients should match eager up to rounding.
"""
from ..errors import BackendError
from . import grad_presence
from .inference import has_inference_blocks, inference_parts
from ._common import (compile_failed, uncompilable_cause, flat_tuple_output, input_made_differentiable,
                      loop_examples, run_uncompiled, watched_inner, with_restore)


def _boxed_nop(fx_graph, example_inputs):
    """AOTAutograd compiler hook: run the ATen graph as is.

    AOTAutograd calls what its compilers return with one list of arguments
    (the "boxed" convention, marked by the ``_boxed_call`` attribute), so the
    generated ``forward`` is adapted to that.
    """
    # Heavy (AOTAutograd pulls in torch._dynamo): imported on first use, not with bytegraph.
    from torch._functorch.aot_autograd import make_boxed_func

    return make_boxed_func(fx_graph.forward)


def aot_autograd(fw_compiler, bw_compiler=None, *, name="aot_autograd"):
    """A backend running AOTAutograd with your inner compilers.

    ``fw_compiler(fx_graph, example_inputs) -> callable`` compiles the functional ATen forward
    graph (and ``bw_compiler``, default the same, the backward graph); the callable is called
    positionally, or with one list if it has ``_boxed_call = True``. With
    ``BYTEGRAPH_REPRO_AFTER=aot`` the minifier watches these inner compilers.
    """
    if not callable(fw_compiler) or (bw_compiler is not None and not callable(bw_compiler)):
        raise BackendError("aot_autograd: fw_compiler and bw_compiler must be callables "
                           "(fx.GraphModule, example_inputs) -> callable")

    def backend(gm, example_inputs):
        return _aot(gm, example_inputs, fw_compiler, bw_compiler or fw_compiler, name)

    backend.__name__ = name
    return backend


def aot_eager(gm, example_inputs):
    """Compile ``gm`` through AOTAutograd without any code generation.

    Parameters and buffers of ``gm`` (submodule parameters and get_attr
    targets alike) become extra graph inputs that are read from ``gm`` when
    this function runs and passed on every call, so gradients accumulate on
    the original ``nn.Parameter`` objects.

    The returned callable takes the graph's inputs positionally and returns
    a list of its outputs. Non-tensor example inputs (int, float) are
    specialised to their example values by AOTAutograd; the caller has to
    guard on them. ``gm`` may be modified in place (its output node is
    flattened to a tuple when it was not one already).
    """
    return _aot(gm, example_inputs, _boxed_nop, _boxed_nop, "aot_eager")


def _aot(gm, example_inputs, fw_compiler, bw_compiler, name):
    # Heavy (AOTAutograd pulls in torch._dynamo): imported on first use, not with bytegraph.
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    if has_inference_blocks(gm):
        return inference_parts(name, gm, example_inputs,
                               lambda part, examples: _aot(part, examples, fw_compiler, bw_compiler, name))
    restore = flat_tuple_output(gm)
    cause = input_made_differentiable(gm, example_inputs)
    if cause is not None:
        return run_uncompiled(name, gm, cause, restore)
    grads = grad_presence.plan(gm)
    try:
        compiled = aot_module_simplified(
            gm,
            loop_examples(gm, example_inputs),
            fw_compiler=watched_inner(fw_compiler, name, "forward"),
            bw_compiler=watched_inner(bw_compiler, name, "backward"),
            partition_fn=min_cut_rematerialization_partition,
            keep_inference_input_mutations=True,
        )
    except Exception as exc:
        cause = uncompilable_cause(exc)
        if cause is not None:
            return run_uncompiled(name, gm, cause, restore)
        raise compile_failed(name, exc) from exc
    # NB: aot_module_simplified returns a function called with positional
    # arguments, although functools.wraps copies ``_boxed_call = True`` onto
    # it from the inner boxed function. Never trust that attribute here.
    return with_restore(grad_presence.gate(compiled, grads), restore)
