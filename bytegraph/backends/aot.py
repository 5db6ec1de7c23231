"""The ``aot_eager`` backend: AOTAutograd with compilers that change nothing.

AOTAutograd traces the graph with fake tensors into a functional ATen
forward graph (and, when anything requires grad, a joint graph that it
partitions into forward and backward). Here both halves run as plain FX
code, which makes the backend a check of the AOTAutograd step alone:
results and gradients should match eager up to rounding.
"""
from . import grad_presence
from ._common import as_list, compile_failed, data_dependent_cause, flat_tuple_output, run_uncompiled, with_restore


def _boxed_nop(fx_graph, example_inputs):
    """AOTAutograd compiler hook: run the ATen graph as is.

    AOTAutograd calls what its compilers return with one list of arguments
    (the "boxed" convention, marked by the ``_boxed_call`` attribute), so the
    generated ``forward`` is adapted to that.
    """
    # Heavy (AOTAutograd pulls in torch._dynamo): imported on first use, not with bytegraph.
    from torch._functorch.aot_autograd import make_boxed_func

    return make_boxed_func(fx_graph.forward)


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
    # Heavy (AOTAutograd pulls in torch._dynamo): imported on first use, not with bytegraph.
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    restore = flat_tuple_output(gm)
    grads = grad_presence.plan(gm)
    try:
        compiled = aot_module_simplified(
            gm,
            as_list(example_inputs),
            fw_compiler=_boxed_nop,
            bw_compiler=_boxed_nop,
            partition_fn=min_cut_rematerialization_partition,
            keep_inference_input_mutations=True,
        )
    except Exception as exc:
        cause = data_dependent_cause(exc)
        if cause is not None:
            return run_uncompiled("aot_eager", gm, cause, restore)
        raise compile_failed("aot_eager", exc) from exc
    # NB: aot_module_simplified returns a function called with positional
    # arguments, although functools.wraps copies ``_boxed_call = True`` onto
    # it from the inner boxed function. Never trust that attribute here.
    return with_restore(grad_presence.gate(compiled, grads), restore)
