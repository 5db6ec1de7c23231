"""The ``inductor`` backend: TorchInductor code generation (C++/OpenMP on CPU)."""
import logging
import threading

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from . import grad_presence, tiers
from .inference import has_inference_blocks, inference_parts
from .lanes import compile_by_lanes
from .regions import compile_by_regions, global_state_kept, on_cuda, worth_sharing, worth_splitting
from .subgraphs import compiling, with_shared_blocks
from .cudagraphs import watch_static_inputs
from ._common import (as_list, compile_failed, flat_tuple_output, input_made_differentiable, note_static_addresses,
                      quiet_torch_imports, run_uncompiled, uncompilable_cause, watched_inner, with_restore)


def mark_parameters_static(gm):
    """Tell AOTAutograd that the parameters and buffers it lifts out of ``gm`` keep their
    addresses (``static_input_indices``). CUDA graphs (``mode=\"reduce-overhead\"``) then read
    them in place instead of copying every one of them into the graph's pool on each call.

    AOTAutograd reads this from a graph-module marker: present, with no per-input source
    table, it counts every lifted parameter and buffer as static."""
    gm.meta.setdefault("dynamo_compile_id", None)


def cacheable_examples(example_inputs):
    """Real example inputs (static sizes) as fakes of a static fake mode with a ShapeEnv.
    Inductor's FX graph cache and AOTAutograd's cache read the ShapeEnv of the fake mode they
    compile under and refuse to cache without one ("No shape env"), which made every process
    compile such a graph again; fake inputs (symbolic sizes) carry the tracer's own mode."""
    examples = as_list(example_inputs)
    if any(isinstance(t, FakeTensor) for t in examples):
        return examples
    mode = FakeTensorMode(allow_non_fake_inputs=True, static_shapes=True, shape_env=ShapeEnv())
    return [mode.from_tensor(t, static_shapes=True) if isinstance(t, torch.Tensor) else t for t in examples]


# Inductor settings of a quick tier (a compile the whole one replaces after a few steps): no
# benchmarking of pointwise kernels' configurations or of padded matmuls, which its few steps
# would not repay. GPT-2 small compiled alone (training, 8x1024 tokens, H200): first call 6.5 s
# with these against 7.6-8.7 s without; the whole compile keeps the caller's settings.
QUICK_TIER_PATCHES = {"triton.autotune_pointwise": False, "shape_padding": False}


# The thread doing Inductor's first use of Triton in this process (``start_first_use_work``).
_first_use = []


def start_first_use_work():
    """Start, once per process, a thread doing the part of Inductor's first use on a GPU that
    leaves the interpreter to the compiling thread for much of its time: building Triton's CUDA
    driver module (a C compile in a child process), which Inductor's matmul padding asks for, and
    hashing Triton's files for AOTAutograd's cache key. On the compiling thread they took about
    1 s of a cold first call (H200, torch 2.11: the driver 0.5 s, Triton's key 0.5 s); here they
    overlap Inductor's imports and the work before ``compile_fx``, which waits for them
    (``first_use_work_done``). Both are cached by Triton, so whatever this thread did not finish
    (or failed at) is done again where it is needed, as before. (torch's own key is not here:
    Inductor's pool of compiling processes asks for it at once.)"""
    if _first_use or not torch.cuda.is_available():
        return
    from torch.utils._triton import has_triton
    if not has_triton():
        return
    thread = threading.Thread(target=_first_use_work, name="bytegraph-inductor-first-use", daemon=True)
    _first_use.append(thread)
    thread.start()


def _first_use_work():
    try:
        from triton.runtime import driver
        from triton.runtime.cache import triton_key
    except Exception:    # noqa: BLE001 - nothing done here: the compile does it all, as before
        return
    # ``utils`` builds the driver and touches no device: a device call here would make a
    # context on this thread's device 0, whatever device the caller's thread is on.
    for step in (lambda: driver.active.utils, triton_key):
        try:
            step()
        except Exception:    # noqa: BLE001 - done again, and reported, where the compile needs it
            pass


def first_use_work_done():
    """Wait for ``start_first_use_work``'s thread (if any): ``compile_fx`` reads what it computes,
    and computing it twice at once would only cost more."""
    if _first_use:
        _first_use[0].join()


def inductor(gm, example_inputs, *, config_patches=None):
    """Compile ``gm`` with Inductor. A graph with repeated blocks compiles each distinct block
    once: on a GPU, as shared subgraphs inside the whole graph (``backends/subgraphs.py``) where
    ``regions.worth_sharing`` says so; otherwise, split block by block (``backends/regions.py``)
    unless CUDA graphs are asked for (they want one graph with its parameters in place) or, on a
    GPU, the graph will be differentiated or its blocks do too little work for the extra calls
    to hide behind the kernels (``worth_splitting``): on a GPU a training graph is compiled whole
    unless CUDA graphs are asked for. An optimizer's foreach update is compiled a layer's
    parameters at a time, each distinct chunk once (``backends/lanes.py``); on a GPU, until a
    child process has compiled it whole (``backends/tiers.py``)."""
    if has_inference_blocks(gm):
        return inference_parts("inductor", gm, example_inputs,
                               lambda part, examples: inductor(part, examples, config_patches=config_patches))
    if on_cuda(gm):
        start_first_use_work()      # before Inductor's imports, which it overlaps
    with quiet_torch_imports():
        # Heavy (Inductor): imported on first use. Its pool of kernel-compiling processes takes
        # seconds to start: start it now, so it is up by the time the first kernels are ready
        # (only where Triton is installed; a no-op after the first graph).
        from torch._inductor.async_compile import maybe_warm_pool
    maybe_warm_pool()
    cudagraphs = bool((config_patches or {}).get("triton.cudagraphs"))
    # Shared blocks in two tiers where the graph can be compiled whole later (backends/tiers.py),
    # else where sharing pays for itself.
    later = None
    if not cudagraphs and tiers.possible(gm, example_inputs) and worth_sharing(gm, cudagraphs, tiered=True):
        later = _whole_later(gm, example_inputs, config_patches)
        # An earlier process's second tier left this graph's whole compile in the caches: that
        # now, in seconds, with neither a quick tier nor a child.
        whole = None if later is None else tiers.whole_from_caches(later, "whole graph")
        if whole is not None:
            return whole
    quick = config_patches if later is None else dict(config_patches or {}, **QUICK_TIER_PATCHES)
    if later is not None or worth_sharing(gm, cudagraphs):
        compiled = _with_shared_blocks(gm, example_inputs, quick)
        if compiled is not None:
            return compiled if later is None else tiers.tiered(compiled, later, "shared blocks")
    if not cudagraphs:
        def compile_part(part, examples):
            return inductor_whole(part, examples, config_patches=quick)
        # Split at the blocks where the steps stay as fast (worth_splitting), or as the quick tier
        # where the blocks could not be shared (torchao's float8 weights under autocast: a
        # subclass op torch reaches undecomposed inside invoke_subgraph) and the whole compile
        # will replace the split anyway.
        split = compile_by_regions(gm, example_inputs, compile_part) if later is not None or worth_splitting(gm) \
            else None
        if split is not None and later is not None:
            return tiers.tiered(split.forward, later, "split blocks")
        if split is None:
            split = compile_by_lanes(gm, example_inputs, compile_part)
        if split is not None:
            # An optimizer's update (its in-place writes to parameters make it count as
            # differentiated: ``worth_sharing(tiered=True)``) in lanes is a quick tier too.
            return split.forward if later is None else tiers.tiered(split.forward, later, "lanes")
    return inductor_whole(gm, example_inputs, config_patches=config_patches)


def _whole_later(gm, example_inputs, config_patches):
    """What a child process needs to compile ``gm`` whole for the second tier
    (``backends/tiers.py``), with what turns that compile into the graph's callable here; None
    where ``gm`` cannot be written down (logged) or would not be compiled (``run_uncompiled``)."""
    examples = as_list(example_inputs)
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    copy = fx.GraphModule(gm, graph)     # node metadata kept: the gradient plan reads it
    restore = flat_tuple_output(copy)
    if input_made_differentiable(copy, examples) is not None:
        return None
    grads = grad_presence.plan(copy)
    try:
        return tiers.WholeLater(tiers.GraphRecord(copy, examples), config_patches,
                                finish=lambda compiled: with_restore(grad_presence.gate(compiled, grads), restore),
                                compile_whole=compile_fx_whole, source=copy)
    except tiers.NotRecordable as exc:
        logging.getLogger("bytegraph.regions").info("not compiled in two tiers: %s", exc)
        return None


def _with_shared_blocks(gm, example_inputs, config_patches):
    """A graph on a GPU compiled whole with its repeated blocks shared (``backends/subgraphs.py``):
    one AOTAutograd function, each distinct block traced, partitioned and compiled once, and one
    CUDA graph for all of it under ``mode="reduce-overhead"``. None when no block repeats, or
    when that compile fails (the graph is then compiled as it is; logged under ``regions``).

    Inductor's reuse of buffers is off for such a graph: with it on, torch 2.13's code for a
    training graph with shared blocks computed wrong gradients (on the CPU, where this path is
    not taken; torch.compile's ``nested_compile_region`` gives the same wrong gradients), with it
    off they equal eager's. The memory it costs is small beside the saved activations (GPT-2
    small, 8x1024 tokens, one training step: 10600 MiB peak against 10746 compiled whole)."""
    shared = with_shared_blocks(gm)
    if shared is None:
        return None
    patches = dict(config_patches or {}, allow_buffer_reuse=False)
    try:
        with compiling(shared), global_state_kept(gm):     # the next attempt starts as this one did
            return inductor_whole(shared, example_inputs, config_patches=patches)
    except Exception as exc:     # noqa: BLE001 - any failure: the plain whole graph instead
        logging.getLogger("bytegraph.regions").debug(
            "shared blocks not compiled (%s: %s)", type(exc).__name__, exc)
        return None


def inductor_whole(gm, example_inputs, *, config_patches=None):
    """Compile ``gm`` with ``torch._inductor.compile_fx.compile_fx``.

    ``config_patches`` (a dict of ``torch._inductor.config`` settings, built
    by ``lookup_backend`` from ``mode`` and ``options``) is applied both to
    the forward compile and to the backward compile, which AOTAutograd may
    run later, at the first ``backward()``.

    The returned callable takes the graph's inputs positionally and returns
    a list of outputs; parameters and buffers are read from ``gm`` here, so
    gradients land on the original parameters. ``gm`` may be modified in
    place. Non-tensor example inputs are specialised to their values.
    """
    restore = flat_tuple_output(gm)
    cause = input_made_differentiable(gm, example_inputs)
    if cause is not None:
        return run_uncompiled("inductor", gm, cause, restore)
    grads = grad_presence.plan(gm)
    try:
        compiled = compile_fx_whole(gm, cacheable_examples(example_inputs), config_patches)
    except Exception as exc:
        cause = uncompilable_cause(exc)
        if cause is not None:
            return run_uncompiled("inductor", gm, cause, restore)
        raise compile_failed("inductor", exc) from exc
    # compile_fx hands back AOTAutograd's positional-call forward (wrapped by
    # a frame-evaluation "disable" shim); it carries a stale
    # ``_boxed_call = True`` copied by functools.wraps, which does not apply.
    if (config_patches or {}).get("triton.cudagraphs"):
        note_static_addresses(as_list(example_inputs), "reduce-overhead")
        static = list(gm.parameters()) + list(gm.buffers())
        compiled = watch_static_inputs(compiled, [t for t in static if t.is_cuda], "reduce-overhead")
    return with_restore(grad_presence.gate(compiled, grads), restore)


def compile_fx_whole(gm, example_inputs, config_patches):
    """``compile_fx`` on ``gm`` (outputs a flat tuple) with its parameters marked static: the one
    call both tiers' whole compiles make (``backends/tiers.py``), so that they hit the same cache
    entries."""
    with quiet_torch_imports():
        # Heavy (Inductor): imported on first use, not with bytegraph.
        from torch._inductor.compile_fx import compile_fx, compile_fx_inner
    mark_parameters_static(gm)
    first_use_work_done()
    return compile_fx(gm, example_inputs, inner_compile=watched_inner(compile_fx_inner, "inductor"),
                      config_patches=config_patches or None)
