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
the tree records again if one of them moves (``param.data = ...``); one that
moves on every call is warned about, then stops the recording (``PointerWatch``).
Other inputs are copied into the pool on every call; an input whose address
changes each call therefore costs a copy, not a new recording. A graph whose
recording fails (an op that cannot be captured, found only then) runs
uncompiled from then on (``GuardedReplay``).
"""
import functools
import logging
import sys
import warnings

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from . import grad_presence
from ._common import (as_list, compile_failed, flat_tuple_output, note_static_addresses, run_uncompiled,
                      uncompilable_cause, with_restore)
from .inference import has_inference_blocks, inference_parts

# Inductor's CUDA graph trees start a new generation (free the previous call's outputs for
# reuse) only when a counter they read has moved since the last replay; torch.compile moves
# it on each call of a compiled callable. Without it, a caller still holding the last call's
# output (``out = model(x)`` in a loop) makes every later call warm up again, uncaptured.
_generation_tracker = [None]


def new_invocation():
    """Tell CUDA graph trees that a new top-level call of a compiled callable begins."""
    tracker = _generation_tracker[0]
    if tracker is None:
        # Loaded together with the CUDA graph trees; until then there is nothing to tell.
        module = sys.modules.get("torch._dynamo.mutation_guard")
        if module is None:
            return
        tracker = _generation_tracker[0] = module.GenerationTracker
    tracker.generation += 1


# debug.logs' cudagraphs topic (backends sit beside debug, not above it)
_log = logging.getLogger("bytegraph.cudagraphs")


def cudagraphs(gm, example_inputs):
    """Compile ``gm`` through AOTAutograd and replay each half as a CUDA graph."""
    # Heavy (AOTAutograd, Inductor's CUDA graph trees): imported on first use.
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.utils import count_tangents

    if has_inference_blocks(gm):
        return inference_parts("cudagraphs", gm, example_inputs, cudagraphs)
    note_static_addresses(as_list(example_inputs), "cudagraphs")
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
        cause = uncompilable_cause(exc)
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
        return GuardedReplay(replay, run, num_static, "backward" if is_backward else "forward")


# Calls during which recording may still fail (warm-up, recording, first replays).
RECORDING_CALLS = 3
# Consecutive calls whose static inputs moved before a warning / before recording stops.
MOVED_WARN_AFTER = 4
MOVED_STOP_AFTER = 16


class PointerWatch:
    """Watches the addresses of inputs a CUDA graph reads in place (parameters, buffers).

    Replay reads them where they were recorded; one that moves makes the tree record again
    (correct, but a recording costs much more than the ops). One that moves on every call
    (a parameter rebuilt each step, ``param.data = ...`` in a loop) would record every call:
    after ``MOVED_WARN_AFTER`` consecutive calls a warning says which inputs move; after
    ``MOVED_STOP_AFTER`` the graph stops using CUDA graphs."""

    def __init__(self, label):
        self.label = label
        self.last = None
        self.moved_calls = 0
        self.warned = False

    def observe(self, pointers):
        """'replay', 'warn' (replay, and warn now) or 'stop' for a call with these addresses."""
        pointers = tuple(pointers)
        moved = [i for i, (a, b) in enumerate(zip(self.last or (), pointers)) if a != b]
        self.last = pointers
        if not moved:
            self.moved_calls = 0
            return "replay"
        self.moved_calls += 1
        self.moved = moved
        if self.moved_calls >= MOVED_STOP_AFTER:
            return "stop"
        if self.moved_calls >= MOVED_WARN_AFTER and not self.warned:
            self.warned = True
            return "warn"
        return "replay"


class GuardedReplay:
    """A CUDA graph tree entry with bytegraph's fallbacks around it: a graph that fails to
    record (an op that cannot be captured, found only when recording) runs uncompiled from
    then on; parameters and buffers that move on every call are warned about, then stop
    the recording (``PointerWatch``). Boxed calling convention (one list of inputs)."""

    _boxed_call = True

    def __init__(self, replay, run, num_static, label):
        self.replay = replay
        self.run = run
        self.num_static = num_static
        self.label = label
        self.calls = 0
        self.enabled = True
        self.watch = PointerWatch(label)

    def __call__(self, args):
        if not self.enabled:
            return self.run(args)
        self.calls += 1
        if self.num_static:
            action = self.watch.observe(_pointer(a) for a in args[:self.num_static])
            if action != "replay":
                moved = ", ".join(str(i) for i in self.watch.moved[:8])
                message = (f"bytegraph cudagraphs: parameter/buffer input(s) {moved} of a {self.label} graph "
                           f"changed address on {self.watch.moved_calls} calls in a row; each change records "
                           "the CUDA graph again. Keep parameters in place (update them with in-place ops, "
                           "not `.data =` or new tensors)")
                if action == "stop":
                    self.enabled = False
                    _log.info("%s; running without CUDA graphs from now on", message)
                    return self.run(args)
                warnings.warn(message, stacklevel=2)
        if self.calls > RECORDING_CALLS:
            return self.replay(args)
        kept = list(args)     # the tree empties the list; a failed recording runs these instead
        try:
            return self.replay(args)
        except RuntimeError as exc:
            if not is_capture_failure(exc):
                raise
            self.enabled = False
            _log.info("%s graph cannot be recorded as a CUDA graph (%s); it runs without", self.label, exc)
            return self.run(kept)


def watch_static_inputs(compiled, tensors, label):
    """``compiled`` (positional call) with a sampled ``PointerWatch`` over ``tensors`` (the
    parameters and buffers a ``mode="reduce-overhead"`` graph reads in place; Inductor's CUDA
    graph trees record again when one moves): a warning when they move call after call."""
    if not tensors:
        return compiled
    watch = PointerWatch(label)
    calls = [0]

    def run(*args):
        calls[0] += 1
        n = calls[0]
        # Every call at first, then one in 16: the check is O(parameters).
        if n <= 2 * MOVED_STOP_AFTER or n % 16 == 0:
            if watch.observe(t.data_ptr() for t in tensors) == "warn":
                warnings.warn(f"bytegraph reduce-overhead: {len(watch.moved)} parameter/buffer input(s) of a "
                              f"{label} graph changed address on {watch.moved_calls} calls in a row; each change "
                              "records the CUDA graph again. Keep parameters in place (update them with "
                              "in-place ops, not `.data =` or new tensors)", stacklevel=2)
        return compiled(*args)

    return functools.wraps(compiled, assigned=("__doc__",), updated=())(run)


def _pointer(t):
    return t.data_ptr() if isinstance(t, torch.Tensor) else None


# What CUDA says when an op is not allowed while a stream is being captured.
_CAPTURE_ERRORS = ("stream is capturing", "during capture", "cudaErrorStreamCapture", "graph capture",
                   "capture")


def is_capture_failure(exc):
    """Did recording fail because something cannot be captured (as opposed to the user's error)?"""
    text = str(exc)
    return any(word in text for word in _CAPTURE_ERRORS)


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
