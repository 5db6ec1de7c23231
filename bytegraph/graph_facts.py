"""What the nodes of a captured graph do, read off their operators' identity and schema.

For a node: whether it draws random numbers (ATen's ``nondeterministic_seeded`` tag), updates
a normalization layer's running statistics, switches grad mode or autocast, seeds or restores
a random generator, runs a collective (the c10d operator namespaces, ``torch.distributed``'s
functions), writes tensors in place (``out=``, ``inplace=True``, a schema's written arguments,
PyTorch's trailing underscore for in-place methods), or may fail for some values of tensors
whose sizes and dtypes the trace checked (indices, class targets, singular matrices, integer
division). For a graph: whether it may run again after it failed (``restart_plan``), which of
its inputs it writes (``mutates_inputs``), what grad mode and autocast it leaves (``state_left``).

A target is identified as the ATen operator it is or whose name it carries (``torch.add``,
``"add_"``, ``F.embedding``, ``torch.linalg.inv`` as ``linalg_inv``; a few functions are named
otherwise, ``_ATEN_NAMES``), or by the tables below (torch's Python functions that draw random
numbers without one seeded operator to show it, Python's ``operator`` functions). A function
that is none of torch's, Python's or bytegraph's (allowed in the graph by the user) is taken
to draw no random numbers and fail on no value, as before: its body is not seen.

Below the backends and codegen: the backends that split and share graphs and the code
generator ask one place.
"""
from __future__ import annotations

import operator
from typing import NamedTuple

import torch
import torch.fx as fx
import torch.nn.functional as F

from .inplace import is_inplace_operator

_ATEN = torch.ops.aten
_SEEDED = torch.Tag.nondeterministic_seeded
_INPLACE_VIEW = torch.Tag.inplace_view

# torch functions whose ATen operator has another name.
_ATEN_NAMES = {"cross_entropy": "cross_entropy_loss"}

# torch's Python functions that draw random numbers inside (no seeded ATen operator of their name).
_RANDOM_FUNCTIONS = frozenset({
    F.dropout1d, F.dropout2d, F.dropout3d, F.gumbel_softmax, F.fractional_max_pool2d, F.fractional_max_pool3d,
    F.fractional_max_pool2d_with_indices, F.fractional_max_pool3d_with_indices, F.multi_head_attention_forward,
    *(getattr(torch.nn.init, name) for name in (
        "uniform_", "normal_", "trunc_normal_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
        "kaiming_normal_", "orthogonal_", "sparse_", "uniform", "normal", "xavier_uniform", "xavier_normal",
        "kaiming_uniform", "kaiming_normal", "orthogonal", "sparse") if hasattr(torch.nn.init, name))})
# Dropouts: they draw nothing with p=0 or outside training.
_DROPOUTS = frozenset({F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout,
                       torch.dropout, torch.alpha_dropout, torch.feature_dropout, torch.feature_alpha_dropout})

# ATen operators that update running statistics they are given (batch norm in training).
_STATS_OPS = frozenset({"batch_norm", "instance_norm", "native_batch_norm", "_native_batch_norm_legit",
                        "cudnn_batch_norm", "miopen_batch_norm", "_batch_norm_impl_index"})

# Nodes that set grad mode or autocast (as `with` blocks become in a graph): (module, name).
_STATE_FUNCTIONS = {("torch._C", "_set_grad_enabled"), ("torch.amp.autocast_mode", "_enter_autocast"),
                    ("torch.amp.autocast_mode", "_exit_autocast"), ("bytegraph.residual", "set_autocast_state")}
_AUTOCAST_FUNCTIONS = {f for f in _STATE_FUNCTIONS if f[1] != "_set_grad_enabled"}
_INFERENCE_FUNCTIONS = {("bytegraph.residual", "enter_inference_mode"): True,
                        ("bytegraph.residual", "exit_inference_mode"): False}
# Other functions that change autocast state, and those that seed or restore random generators.
_SWITCHES = frozenset(getattr(torch, name) for name in (
    "set_autocast_enabled", "set_autocast_dtype", "set_autocast_cache_enabled", "set_autocast_cpu_enabled",
    "set_autocast_cpu_dtype", "set_autocast_gpu_dtype", "set_autocast_ipu_enabled", "set_autocast_ipu_dtype",
    "set_autocast_xla_enabled", "set_autocast_xla_dtype", "autocast_increment_nesting",
    "autocast_decrement_nesting", "clear_autocast_cache") if hasattr(torch, name))
_RNG_MODULES = ("torch.random", "torch.cuda.random", "torch._numpy.random")
_RNG_NAMES = frozenset({"manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "set_rng_state",
                        "set_rng_state_all", "get_rng_state", "get_rng_state_all", "set_state", "get_state"})
_COLLECTIVE_NAMESPACES = frozenset({"c10d", "_c10d_functional", "c10d_functional", "_c10d_functional_autograd",
                                    "_dtensor"})

# Failing for some values of arguments whose sizes and dtypes are fixed: ATen operators reading
# tensors of indices (an argument so named, not an output); these operators and torch functions
# (class targets, counts, probabilities, masks, inputs out of a loss's range, asserts and checks);
# linear algebra (singular or indefinite matrices: every ``linalg_`` operator).
_INDEX_ARGUMENTS = frozenset({"index", "indices", "offsets"})
_FAILING_OPS = frozenset({
    "nll_loss", "nll_loss2d", "nll_loss_nd", "cross_entropy_loss", "linear_cross_entropy", "ctc_loss", "_ctc_loss",
    "_cudnn_ctc_loss", "miopen_ctc_loss", "binary_cross_entropy", "gaussian_nll_loss", "one_hot", "bincount",
    "histc", "repeat_interleave", "take", "take_along_dim", "put", "put_", "gather", "unravel_index",
    "masked_scatter", "masked_scatter_", "multinomial", "inverse", "cholesky", "cholesky_inverse", "cholesky_solve",
    "triangular_solve", "lu_solve", "lu", "pinverse", "solve", "lstsq", "eig", "symeig", "matrix_rank",
    "max_unpool1d", "_assert", "_assert_async", "_assert_scalar", "_assert_tensor_metadata",
    "_functional_assert_async", "_functional_assert_scalar", "_check", "_check_index", "_check_value",
    "_check_with", "_check_is_size", "_check_type", "_check_not_implemented", "_check_tensor_all",
    "_check_tensor_all_with"})
_FAILING_MODULES = ("torch.linalg", "torch._C._linalg", "torch._numpy.linalg")
# Division: integers by zero.
_DIVISIONS = frozenset({
    "div", "div_", "divide", "divide_", "true_divide", "true_divide_", "floor_divide", "floor_divide_",
    "remainder", "remainder_", "fmod", "fmod_", "divmod", "mod", "__truediv__", "__rtruediv__", "__itruediv__",
    "__floordiv__", "__rfloordiv__", "__ifloordiv__", "__mod__", "__rmod__", "__imod__", "__div__", "__rdiv__"})
_DIVISION_OPERATORS = frozenset({operator.truediv, operator.floordiv, operator.mod, operator.itruediv,
                                 operator.ifloordiv, operator.imod})
# In-place ops that change a tensor's sizes or strides (besides ATen's ``inplace_view`` ones),
# which copying values back does not undo.
_METADATA_WRITERS = frozenset({"resize_", "resize_as_", "set_", "as_strided_", "t_", "transpose_", "squeeze_",
                               "unsqueeze_", "swapdims_", "swapaxes_", "detach_", "requires_grad_"})
_PYTHON_MODULES = ("_operator", "operator", "math", "builtins")


class OpFacts(NamedTuple):
    """What a node does that depends on its op and target alone."""
    name: str                 # a method's or function's name, or an ATen operator's
    known: bool               # torch's, Python's or bytegraph's (else a function whose body is not seen)
    seeded: bool              # may draw random numbers
    runs_once: bool           # must not run twice: seeds or restores a generator, switches autocast, a collective
    may_fail: bool            # may raise for some values of tensors whose sizes and dtypes are fixed
    divides: bool             # a division (fails on an integer zero)
    stats: bool               # updates running statistics
    writes_schema: bool       # an operator whose schema writes an argument
    metadata_writer: bool     # changes a tensor's sizes or strides in place


def _packet(name):
    """ATen's operator packet called ``name``, or None."""
    try:
        op = getattr(_ATEN, name)
    except (AttributeError, RuntimeError):
        return None
    return op if isinstance(op, torch._ops.OpOverloadPacket) else None


def _overloads(packet):
    return tuple(getattr(packet, name) for name in packet.overloads()) if packet is not None else ()


def _takes_indices(op):
    return any(a.name in _INDEX_ARGUMENTS and "Tensor" in str(a.type)
               and not (a.alias_info is not None and a.alias_info.is_write) for a in op._schema.arguments)


def _identify(op, target):
    """(name, module, ATen overloads it stands for, known: torch's, Python's or bytegraph's)."""
    if isinstance(target, str):       # a Tensor method
        return target, "torch.Tensor", _overloads(_packet(target)), True
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name.split("::")[-1], f"torch.ops.{target.namespace}", (target,), True
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target._qualified_op_name.split("::")[-1], f"torch.ops.{target._qualified_op_name.split('::')[0]}", \
            _overloads(target), True
    name = getattr(target, "__name__", "")
    name = name if isinstance(name, str) else ""
    if type(target).__module__ == "bytegraph.graph.numpy_ops":
        # graph.numpy_ops names its ops np_<NumPy's name>; a function's op runs a torch._numpy
        # function (``fn``), whose module tells random draws and linear algebra.
        name = name[3:] if name.startswith("np_") else name
        target = getattr(target, "fn", target)
    module = getattr(target, "__module__", None)
    if module is None and getattr(target, "__objclass__", None) is torch._C.TensorBase:
        module = "torch.Tensor"
    module = module if isinstance(module, str) else ""
    if module == "torch" or module.startswith(("torch.", "bytegraph.")):
        return name, module, _overloads(_packet(_ATEN_NAMES.get(name, name))), True
    return name, module, (), module in _PYTHON_MODULES


def _among(target, table):
    try:
        return target in table
    except TypeError:               # an unhashable target
        return False


def _facts(op, target):
    name, module, overloads, known = _identify(op, target)
    aten = {o._schema.name.split("::")[-1] for o in overloads}
    namespace = module[len("torch.ops."):] if module.startswith("torch.ops.") else None
    seeded = _among(target, _RANDOM_FUNCTIONS) or module == "torch._numpy.random" \
        or any(_SEEDED in o.tags for o in overloads)
    runs_once = _among(target, _SWITCHES) or (module in _RNG_MODULES or op == "call_method") and name in _RNG_NAMES \
        or namespace in _COLLECTIVE_NAMESPACES or module.startswith("torch.distributed") \
        or (module, name) in _AUTOCAST_FUNCTIONS or module == "torch.amp.autocast_mode"
    may_fail = known and (
        module.startswith(_FAILING_MODULES) or name.lstrip("_").startswith("linalg_")
        or bool(aten & _FAILING_OPS) or name in _FAILING_OPS or any(_takes_indices(o) for o in overloads))
    divides = known and (_among(target, _DIVISION_OPERATORS) or name in _DIVISIONS)
    stats = known and bool(aten & _STATS_OPS)
    writes_schema = isinstance(target, torch._ops.OpOverload) and any(
        a.alias_info is not None and a.alias_info.is_write for a in target._schema.arguments)
    metadata_writer = name in _METADATA_WRITERS or any(_INPLACE_VIEW in o.tags for o in overloads)
    return OpFacts(name, known, seeded, runs_once, may_fail, divides, stats, writes_schema, metadata_writer)


_cache = {}


def op_facts(node) -> OpFacts:
    """The facts of ``node`` that depend on its op and target alone (worked out once per known
    target; a user function's each time, so the cache does not keep it alive)."""
    key = (node.op, node.target)
    try:
        facts = _cache.get(key)
    except TypeError:               # an unhashable target
        return _facts(node.op, node.target)
    if facts is None:
        facts = _facts(node.op, node.target)
        if facts.known:
            _cache[key] = facts
    return facts


# --- one node -------------------------------------------------------------------------------------

def is_state_node(n) -> bool:
    """Does ``n`` set grad mode or autocast (a `with` block's start or end)?"""
    return n.op == "call_function" and (getattr(n.target, "__module__", None),
                                        getattr(n.target, "__name__", None)) in _STATE_FUNCTIONS


def inference_switch(n):
    """True where ``n`` enters a `with torch.inference_mode()` block, False where it leaves one,
    else None."""
    if n.op != "call_function":
        return None
    return _INFERENCE_FUNCTIONS.get((getattr(n.target, "__module__", None), getattr(n.target, "__name__", None)))


def is_random(n) -> bool:
    """May ``n`` draw random numbers (whatever its arguments)?"""
    return n.op in ("call_function", "call_method") and op_facts(n).seeded


def draws_random(n) -> bool:
    """Does ``n`` draw random numbers? A dropout of probability 0 or outside training does not."""
    if n.target is F.scaled_dot_product_attention:
        p = n.kwargs.get("dropout_p", n.args[4] if len(n.args) > 4 else 0.0)
        return not (type(p) in (int, float) and p == 0)
    if not is_random(n):
        return False
    if n.op == "call_function" and _among(n.target, _DROPOUTS):
        p = n.kwargs.get("p", n.args[1] if len(n.args) > 1 else 0.5)
        training = n.kwargs.get("training", n.args[2] if len(n.args) > 2 else True)
        return not (training is False or (type(p) in (int, float) and p == 0))
    return True


def updates_running_stats(n) -> bool:
    """Does ``n`` update a normalization layer's running statistics (in training)?"""
    return n.op in ("call_function", "call_method") and op_facts(n).stats


def runs_once(n) -> bool:
    """Must ``n`` not run twice: it seeds or restores a random generator, switches autocast, or
    is a collective (the other processes wait for each one)? (Grad mode is set back before a
    graph runs again.)"""
    return n.op in ("call_function", "call_method") and op_facts(n).runs_once


def writes(node) -> bool:
    """May the graph node ``node`` write a tensor in place (``x.add_(y)``, ``x[i] = v``,
    ``inplace=True``, ``out=``, running statistics)?"""
    if node.op not in ("call_function", "call_method"):
        return False
    if "out" in node.kwargs or node.kwargs.get("inplace") is True:
        return True
    target = node.target
    if target is operator.setitem or is_inplace_operator(target):
        return True
    facts = op_facts(node)
    if facts.stats or facts.writes_schema:
        return True
    # PyTorch names its in-place methods and functions with a trailing underscore.
    name = facts.name
    return name.endswith("_") and not name.endswith("__")


def written(node) -> list:
    """The nodes a writing ``node`` may write: its first argument (``x.add_(y)``,
    ``_foreach_mul_(xs, s)``, ``setitem``) or ``out=``; any argument for the rest (running
    statistics, fused kernels)."""
    if "out" in node.kwargs:
        args = node.kwargs["out"]
    else:
        name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
        if node.args and (node.target is operator.setitem or node.kwargs.get("inplace") is True
                          or is_inplace_operator(node.target)
                          or (name.endswith("_") and not name.startswith("_fused"))):
            args = node.args[0]
        else:
            args = (node.args, node.kwargs)
    out = []
    fx.node.map_arg(args, out.append)
    return out


def may_fail_on_values(node, gm) -> bool:
    """May ``node`` (of ``gm``) raise for some values of tensors whose shapes and dtypes the
    trace has checked?"""
    if node.target in (operator.getitem, operator.setitem):     # with a tensor of indices
        index = []
        fx.node.map_arg(node.args[1:2], index.append)
        return any(isinstance(n.meta.get("example_value"), torch.Tensor) for n in index)
    facts = op_facts(node)
    if facts.divides:                                            # integers by zero
        out = node.meta.get("example_value")
        return isinstance(out, torch.Tensor) and not (out.is_floating_point() or out.is_complex())
    if facts.may_fail:
        return True
    # A higher-order op's body (checkpoint, cond, a traced function): anything may be inside.
    return any(a.op == "get_attr" and isinstance(getattr(gm, a.target, None), torch.fx.GraphModule)
               for a in node.all_input_nodes)


# --- one graph ------------------------------------------------------------------------------------

def restart_plan(gm):
    """Can ``gm`` be run again after it raised, with nothing left of the failed run?

    A list of the placeholder and get_attr nodes to copy before each call and put back after a
    failure when it can (empty when it writes none of them in place). None when it cannot: it
    writes such a tensor that needs grad, its sizes, or running statistics (batch norm in
    training); draws random numbers, switches autocast state or calls a collective; or writes
    such a tensor and has no op expected to fail (``may_fail_on_values``; an op before the
    write counts as well as one after it). Copying costs on every call, so only a graph with
    such an op pays it (an optimizer step writes every parameter and has none)."""
    given = None    # storage -> the placeholder and get_attr nodes over it (at the first write)
    copied = {}
    may_fail = False
    for m in gm.modules():
        if not isinstance(m, torch.fx.GraphModule):
            continue
        for node in m.graph.nodes:
            if node.op == "call_module" and not isinstance(m.get_submodule(node.target), torch.fx.GraphModule):
                return None   # a module called as a leaf: what it does is not in the graph
            if node.op not in ("call_function", "call_method"):
                continue
            if is_state_node(node) and node.target is not torch._C._set_grad_enabled:
                return None
            facts = op_facts(node)
            if facts.runs_once or facts.seeded and draws_random(node):
                return None
            if m is gm and not may_fail:
                may_fail = may_fail_on_values(node, gm)
            if not writes(node):
                continue
            if m is not gm or facts.stats:
                # (a normalization layer's running statistics: a copy of every layer's on every
                # training step would cost a CNN ~5 µs a tensor; such a graph is not rerun)
                return None
            if given is None:
                given = _given_by_storage(gm)
            for n in _written_inputs(node, given):
                if n is None or facts.metadata_writer \
                        or n.op == "get_attr" and not isinstance(n.meta.get("real_tensor"), torch.Tensor):
                    return None
                fake = n.meta.get("example_value")
                if not isinstance(fake, torch.Tensor) or fake.requires_grad:
                    return None
                copied[n] = True
    if copied and not may_fail:
        return None
    return list(copied)


def _given_by_storage(gm):
    given = {}
    for n in gm.graph.nodes:
        fake = n.meta.get("example_value") if n.op in ("placeholder", "get_attr") else None
        if isinstance(fake, torch.Tensor):
            given.setdefault(fake.untyped_storage()._cdata, []).append(n)
    return given


def _written_inputs(node, given):
    """The nodes of ``given`` (storage -> placeholder and get_attr nodes) over whose storage
    ``node`` writes; None for a written value whose storage is unknown."""
    found = []
    for arg in written(node):
        fake = arg.meta.get("example_value")
        if not isinstance(fake, torch.Tensor):
            return [None]
        found += given.get(fake.untyped_storage()._cdata, [])
    return found


def mutates_inputs(gm, placeholders, nodes=None, unknown=False) -> bool:
    """Does a node that mutates (of ``nodes``, by default all of ``gm``'s) write to (a view of)
    one of ``placeholders``? ``unknown``: what a written value is unknown counts as yes."""
    storages = set()
    for p in placeholders:
        fake = p.meta.get("example_value")
        if isinstance(fake, torch.Tensor):
            storages.add(fake.untyped_storage()._cdata)
    for node in gm.graph.nodes if nodes is None else nodes:
        if not writes(node):
            continue
        for arg in written(node):
            fake = arg.meta.get("example_value")
            if isinstance(fake, torch.Tensor) and fake.untyped_storage()._cdata in storages \
                    or unknown and not isinstance(fake, torch.Tensor):
                return True
    return False


def state_left(gm, entry_grad_mode):
    """(does ``gm`` do nothing but switch grad mode and autocast?, the grad mode it leaves,
    {device: (enabled, dtype, cache)} of the autocast state it sets outside any `with` block),
    or None where that cannot be read off its nodes. ``with`` blocks inside the graph end in it
    and leave nothing; a `with torch.inference_mode()` block's end puts grad mode back as it
    was at its start."""
    only_states = True
    grad = entry_grad_mode
    autocast = {}       # device -> (enabled, dtype, cache) set last
    depth = 0           # autocast blocks open
    inference = []      # grad mode at the start of each inference_mode block open
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        entering = inference_switch(node)
        if entering is not None:
            if entering:
                inference.append(grad)
            elif not inference:
                return None
            else:
                grad = inference.pop()
            continue
        if not is_state_node(node):
            only_states = False
            continue
        name = node.target.__name__
        if name == "_enter_autocast":
            depth += 1
        elif name == "_exit_autocast":
            depth -= 1
        elif any(isinstance(a, torch.fx.Node) for a in node.args):
            return None
        elif name == "_set_grad_enabled":
            grad = node.args[0]
        elif depth:
            return None     # a block's state changed inside another block: not from `with` code
        else:
            autocast[node.args[0]] = node.args[1:]
    if depth or inference:
        return None
    return only_states, grad, autocast
