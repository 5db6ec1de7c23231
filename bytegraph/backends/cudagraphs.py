"""The ``cudagraphs`` backend: AOTAutograd's graphs run as recorded CUDA graphs.

Each half AOTAutograd produces (forward, and backward when anything needs
gradients) runs as plain FX code once to warm up, is then recorded as a CUDA
graph and replayed on later calls through Inductor's CUDA graph trees, which
keep one memory pool for the forward and backward of a step. Replay only
launches the recorded kernels, so the Python and launch overhead of each op is
gone: it pays off for small batches, where that overhead dominates.

Safety rules (each failing one leaves that graph running uncompiled, with the
reason logged under the ``cudagraphs`` topic):

- every tensor of the graph lives on one CUDA device (no CPU ops, no mix);
- the graph writes no input other than parameters and buffers: replay reads
  inputs through copies in the pool, so a write to a user's tensor would land
  in the copy, not in the tensor;
- no op that cannot be captured (CPU synchronisation, data-dependent shapes).

Parameters and buffers are static inputs: replay reads them where they are, and
the tree records again if one of them moves (``param.data = ...``). Other
inputs are copied into the pool on every call; an input whose address changes
each call therefore costs a copy, not a new recording.
"""
import functools
import logging

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from . import grad_presence
from ._common import as_list, compile_failed, data_dependent_cause, flat_tuple_output, run_uncompiled, with_restore

# debug.logs' cudagraphs topic (backends sit beside debug, not above it)
_log = logging.getLogger("bytegraph.cudagraphs")


def cudagraphs(gm, example_inputs):
    """Compile ``gm`` through AOTAutograd and replay each half as a CUDA graph."""
    # Heavy (AOTAutograd, Inductor's CUDA graph trees): imported on first use.
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.utils import count_tangents

    restore = flat_tuple_output(gm)
    grads = grad_presence.plan(gm)
    n_user_inputs = len(example_inputs)
    state = _Recording()

    def forward(aot_gm, aot_inputs, is_inference=False):
        # AOTAutograd puts the parameters and buffers it lifted out of ``gm`` first.
        return state.compile(aot_gm, aot_inputs, len(aot_inputs) - n_user_inputs,
                             is_backward=False, is_inference=is_inference)

    def backward(aot_gm, aot_inputs):
        return state.compile(aot_gm, aot_inputs, count_tangents(aot_gm), is_backward=True)

    try:
        compiled = aot_module_simplified(
            gm,
            as_list(example_inputs),
            fw_compiler=forward,
            bw_compiler=backward,
            inference_compiler=functools.partial(forward, is_inference=True),
            partition_fn=min_cut_rematerialization_partition,
            keep_inference_input_mutations=True,
        )
    except Exception as exc:
        cause = data_dependent_cause(exc)
        if cause is not None:
            return run_uncompiled("cudagraphs", gm, cause, restore)
        raise compile_failed("cudagraphs", exc) from exc
    return with_restore(grad_presence.gate(compiled, grads), restore)


class _Recording:
    """What the forward decided, for the backward of the same graph: it is recorded only
    if the forward was (the two share the tree's memory pool), on the forward's device."""

    def __init__(self):
        self.enabled = True
        self.device_index = None

    def compile(self, aot_gm, aot_inputs, num_static, *, is_backward, is_inference=False):
        # Heavy (Inductor): imported on first use.
        from torch._inductor.cudagraph_trees import cudagraphify_impl
        from torch._inductor.cudagraph_utils import get_placeholder_info

        run = _boxed(aot_gm)
        if not self.enabled:
            return run
        device_index, reason = _devices(aot_gm)
        mutated = _written_inputs(aot_gm)
        if reason is None:
            user_writes = sorted(i for i in mutated if i >= num_static)
            if user_writes:
                reason = f"the graph writes its input(s) {user_writes} in place"
        if reason is None:
            reason = _uncapturable_op(aot_gm)
        if reason is not None:
            self.enabled = False
            _log.info("%s graph runs without CUDA graphs: %s", "backward" if is_backward else "forward", reason)
            return run
        self.device_index = device_index
        replay = cudagraphify_impl(
            run, aot_inputs, range(num_static),
            device_index=device_index, is_backward=is_backward, is_inference=is_inference,
            stack_traces=_output_stack_traces(aot_gm),
            placeholders=get_placeholder_info(aot_gm.graph),
            mutated_input_idxs=mutated,
        )
        replay._boxed_call = True
        return replay


def _boxed(aot_gm):
    """``aot_gm`` called the way AOTAutograd and the CUDA graph trees call compiled code: with
    one list of inputs, which the callee empties (so inputs can be freed as soon as used)."""
    def run(args):
        values = list(args)
        args.clear()
        return aot_gm(*values)

    run._boxed_call = True
    return run


def _devices(aot_gm):
    """(CUDA device index, None) when every tensor of the graph is on that one CUDA device,
    else (None, reason)."""
    devices = set()
    for node in aot_gm.graph.nodes:
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            devices.add(value.device)
    if not devices:
        return None, "no tensors"
    if len(devices) > 1:
        return None, f"tensors on several devices ({', '.join(sorted(map(str, devices)))})"
    (device,) = devices
    if device.type != "cuda":
        return None, f"tensors on {device}, not on a CUDA device"
    return device.index if device.index is not None else torch.cuda.current_device(), None


def _written_inputs(aot_gm):
    """Indices of the placeholders whose storage some op of the graph writes."""
    by_storage = {}
    placeholders = [n for n in aot_gm.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders):
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            by_storage.setdefault(StorageWeakRef(value.untyped_storage()), set()).add(i)
    written = set()
    for node in aot_gm.graph.nodes:
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        if schema is None:
            continue
        for k, arg in enumerate(schema.arguments):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            given = node.args[k] if k < len(node.args) else node.kwargs.get(arg.name)
            value = given.meta.get("val") if isinstance(given, torch.fx.Node) else None
            if isinstance(value, torch.Tensor):
                written |= by_storage.get(StorageWeakRef(value.untyped_storage()), set())
    return written


def _uncapturable_op(aot_gm):
    # Heavy (Inductor): imported on first use.
    from torch._inductor.utils import get_first_incompatible_cudagraph_node

    node = get_first_incompatible_cudagraph_node(aot_gm)
    return None if node is None else f"op {node.target} cannot be recorded ({node.name})"


def _output_stack_traces(aot_gm):
    (outputs,) = aot_gm.graph.output_node().args
    if not isinstance(outputs, (tuple, list)):
        return []
    return [o.stack_trace if isinstance(o, torch.fx.Node) else None for o in outputs]
