"""Small helpers shared by the built-in backends.

Nothing here imports torch._inductor or AOTAutograd at module level, so that
``import bytegraph.backends.registry`` stays cheap.
"""
import contextlib
import functools
import logging
import warnings

import torch
import torch.fx as fx

from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException, FakeTensor,
                                           FakeTensorMode)
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode, ShapeEnv
from torch.utils import _pytree as pytree

from ..config import warn_once
from ..errors import BackendError
from ..graph_facts import writes, written


# Set by the runtime at its import (runtime.compile_frame): a function (inner compiler, backend
# name, role) -> inner compiler that AOTAutograd-based backends pass their inner compilers through,
# so the debug directory sees what they make and the minifier can watch them
# (BYTEGRAPH_REPRO_AFTER=aot). Backends sit beside debug, not above it, hence the slot.
inner_compiler_hook = [None]


def watched_inner(compiler, backend_name, role="graph"):
    """``compiler`` (an AOTAutograd inner compiler for ``role``: 'forward', 'backward' or
    'graph') as the debugging tools want it wrapped."""
    hook = inner_compiler_hook[0]
    return compiler if hook is None else hook(compiler, backend_name, role)


def flat_tuple_output(gm):
    """Make ``gm`` return a flat tuple, as AOTAutograd insists.

    Graphs from the bytegraph tracer already return a flat tuple or list and
    are left alone (the usual, free case). Otherwise (a bare tensor, a nested
    structure, a dict) the output node is rewritten in place to return the
    flattened leaves, and the returned ``restore`` function rebuilds the
    original structure from the flat list. ``restore`` is ``None`` when no
    rewrite was needed.
    """

    node = gm.graph.output_node()
    (result,) = node.args
    if isinstance(result, (tuple, list)) and not any(
            isinstance(r, (tuple, list, dict)) for r in result):
        return None
    leaves, spec = pytree.tree_flatten(result)
    node.args = (tuple(leaves),)
    gm.recompile()

    def restore(flat):
        return pytree.tree_unflatten(list(flat), spec)

    return restore


def with_restore(compiled, restore):
    """Wrap a positional-call ``compiled`` so that its flat outputs are regrouped."""
    if restore is None:
        return compiled

    @functools.wraps(compiled, assigned=("__doc__",), updated=())
    def call(*args):
        return restore(compiled(*args))

    return call


def compile_failed(backend_name, exc):
    """The BackendError raised when a backend's compiler throws."""
    err = BackendError(
        f"backend {backend_name!r} failed to compile a graph: {type(exc).__name__}: {exc}")
    err.backend = backend_name
    return err


_AOT_ALIASED_INPUTS = "does not yet handle non-differentiable view input mutations"
_NO_DERIVATIVE = "the derivative for "     # an op eager runs forward only (torch.unique)
_AOT_AUTOCAST_LEFT = "does not support tracing graphs that mutate the autocast state"


def uncompilable_cause(exc):
    """The exception in ``exc``'s chain saying why a correct graph cannot be compiled, or None:

    * a size or value depends on tensor data: the tracer breaks the graph before ops whose
      outputs (or, for ops with index or mask arguments, gradients) depend on data; a backend
      that still meets one while tracing the backward hits a case that check did not foresee;
    * AOTAutograd's limit on inputs sharing storage without being views of each other (``t``
      and ``t.detach()`` passed together) when one of them is changed in place;
    * AOTAutograd before torch 2.13 refusing a graph that leaves autocast changed (a resume
      function's graph that ends a ``with torch.autocast`` block begun before it);
    * an op with no derivative in a graph needing gradients (``torch.unique`` of a tensor that
      requires grad, captured under capture_dynamic_output_shape_ops): eager runs its forward and
      raises only if backward reaches it.
    """
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (DataDependentOutputException, DynamicOutputShapeException,
                            GuardOnDataDependentSymNode)):
            return exc
        if isinstance(exc, AssertionError) and _AOT_ALIASED_INPUTS in str(exc):
            return exc
        if isinstance(exc, RuntimeError) and _AOT_AUTOCAST_LEFT in str(exc):
            return exc
        if isinstance(exc, NotImplementedError) and str(exc).startswith(_NO_DERIVATIVE):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def input_made_differentiable(gm, example_inputs):
    """A reason AOTAutograd cannot compile ``gm`` correctly, or None: an input that does not
    require grad written in place with a value that does (``x.mul_(w)``). AOTAutograd's
    backward then reads a copy of the input its own write-back has changed, and fails."""
    inputs = {p: x for p, x in zip((n for n in gm.graph.nodes if n.op == "placeholder"), example_inputs)}
    for n in gm.graph.nodes:
        if not writes(n):
            continue
        targets = [t for t in written(n) if t in inputs and isinstance(inputs[t], torch.Tensor)
                   and not inputs[t].requires_grad]
        if targets and any(isinstance(v, torch.Tensor) and v.requires_grad
                           for a in n.all_input_nodes if a not in targets
                           for v in [a.meta.get("example_value")]):
            return RuntimeError(f"{n.format_node()}: an input that does not require grad is written in place "
                                "with a value that does")
    return None


def run_uncompiled(backend_name, gm, exc, restore):
    """The graph's own ``forward`` (eager ops, eager autograd), for a graph the backend cannot
    compile (``uncompilable_cause``): correct, only not compiled. Logged."""
    # debug.logs' graph_breaks topic (backends sit beside debug, not above it)
    logging.getLogger("bytegraph.graph_breaks").debug(
        "backend %r cannot compile a graph (%s: %s); its ops run uncompiled",
        backend_name, type(exc).__name__, exc)
    return with_restore(gm.forward, restore)


def note_static_addresses(example_inputs, label):
    """``torch._dynamo.mark_static_address(t)`` asks CUDA graphs to read ``t`` where it is rather
    than through a copy; bytegraph's CUDA graphs do not honour it yet (inputs are copied, and a
    graph writing one is not recorded): said once, never silently."""
    if any(isinstance(t, torch.Tensor) and getattr(t, "_dynamo_static_input_type", None) is not None
           for t in example_inputs):
        warn_once("mark_static_address", f"bytegraph {label}: an input marked with "
                  "torch._dynamo.mark_static_address is copied into the CUDA graph's memory like any input "
                  "(not kept at its address yet); results are the same, the copy costs time")


def as_list(example_inputs):
    """The example inputs as a fresh list (backends may consume or reorder it)."""
    return list(example_inputs)


# torch's loop operators: AOTAutograd traces them with sizes that only a ShapeEnv can hold (the
# iteration count of a while_loop's backward is an unbacked symbol).
_LOOP_OPERATORS = ("while_loop", "scan", "map_impl")


def loop_examples(gm, example_inputs):
    """The example inputs for AOTAutograd: real ones (static sizes) as fakes of a static fake mode
    with a ShapeEnv when ``gm`` or a body in it runs a loop operator, else as they are."""
    examples = as_list(example_inputs)
    if any(isinstance(t, FakeTensor) for t in examples) or not any(
            node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator)
            and node.target.name() in _LOOP_OPERATORS
            for module in gm.modules() if isinstance(module, fx.GraphModule) for node in module.graph.nodes):
        return examples
    mode = FakeTensorMode(allow_non_fake_inputs=True, static_shapes=True, shape_env=ShapeEnv())
    return [mode.from_tensor(t, static_shapes=True) if isinstance(t, torch.Tensor) else t for t in examples]



@contextlib.contextmanager
def quiet_torch_imports():
    """Hide the DeprecationWarnings torch.jit emits while TorchInductor is first imported.

    They concern torch's own modules, not the user's code.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.jit")
        yield
