"""Repeated blocks as shared subgraphs: one graph for AOTAutograd and Inductor, each distinct
block traced, partitioned and compiled once inside it.

``regions.compile_by_regions`` splits a graph into parts compiled one by one: every part is its
own AOTAutograd function, which costs Python on every call (a wrapper and, in training, an
autograd node per part). Here the graph stays whole. Each instance of a repeated block
(``node.meta["bytegraph_region"]``, set by ``trace/nn/blocks.py``) becomes one call of the
``invoke_subgraph`` operator on a graph module of the block, every instance whose block graph
is the same (``regions.meta_key`` of its inputs, the same code once named alike) sharing one
module and identifier. AOTAutograd traces and partitions the shared module once per identifier
and Inductor lowers and compiles it once, calling it from the outer graph's generated code for
every layer: no wrapper per block, one backward node for the whole graph, and the whole graph's
CUDA graph when one is asked for.

A block stays inline (compiled with its neighbours) when a shared module could not stand in for
it exactly: it writes a tensor in place, draws random numbers (every call of a shared module
could draw the same ones), returns anything but tensors or a value sharing storage with an
input, or has symbolic sizes. A graph whose blocks run under autocast of two dtypes on one
device is left as it is (``compiling`` sets the one dtype for AOTAutograd's backward traces).
"""
import contextlib
import operator

import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef

from ..config import config
from ..graph_facts import draws_random, is_state_node, writes
from .regions import _GlobalStates, _flat, _parts, _Part, _static

SUBGRAPH_PREFIX = "bytegraph_block_"


def _storage(value):
    return StorageWeakRef(value.untyped_storage()) if isinstance(value, torch.Tensor) else None


def _shareable(part):
    """Can a shared subgraph stand in for ``part`` exactly?"""
    if part.state_nodes or not part.outputs:
        return False
    for n in part.nodes:
        if n.op == "get_attr":
            continue
        if n.op not in ("call_function", "call_method") or writes(n) or draws_random(n):
            return False
        if not all(_static(v) for v in _flat(n.meta.get("example_value")) if v is not None):
            return False
    inputs = set()
    for a in part.inputs:
        value = a.meta.get("example_value")
        if not isinstance(value, torch.Tensor) or not _static(value):
            return False
        inputs.add(_storage(value))
    for out in part.outputs:
        value = out.meta.get("example_value")
        if not isinstance(value, torch.Tensor):
            return False      # a block returning a list or a number: left inline
        if _storage(value) in inputs:
            return False
    return True


class _Shared:
    """The subgraph modules made so far, one per distinct block graph."""

    def __init__(self, gm):
        self.gm = gm
        self.by_signature = {}

    def name_for(self, part):
        name = self.by_signature.get(part.signature)
        if name is None:
            name = f"{SUBGRAPH_PREFIX}{len(self.by_signature)}"
            self.gm.add_submodule(name, part.gm)
            self.by_signature[part.signature] = name
        return name


class _NoStates:
    """A graph without grad-mode or autocast nodes runs every block under the caller's state."""

    def before(self, node):
        return None


def _autocast_dtypes(chosen, states):
    """{device: dtype} of autocast where any shared block runs under it, or None when blocks
    run under autocast of two dtypes on one device."""
    found = {}
    for p in chosen:
        state = states.before(p.nodes[0])
        for device, enabled, dtype in (state[1] if state is not None else ()):
            if enabled:
                found.setdefault(device, set()).add(dtype)
    if any(len(dtypes) > 1 for dtypes in found.values()):
        return None
    return {device: dtypes.pop() for device, dtypes in found.items()}


@contextlib.contextmanager
def compiling(shared):
    """The state to compile a graph from ``with_shared_blocks`` under:

    * autocast's dtype set to the one its blocks run under. AOTAutograd traces a shared block's
      backward after the graph's ``with torch.autocast`` has ended, with autocast switched on as
      the block's forward had it but at the dtype set then; outside a ``with`` block that is
      autocast's default (float16 on a GPU), and a bfloat16 block was differentiated as a
      float16 one;
    * the schema of each shared block worked out once (``_schemas_once``)."""
    dtypes = shared.meta.get("bytegraph_autocast_dtypes") or {}
    saved = {device: torch.get_autocast_dtype(device) for device in dtypes}
    try:
        for device, dtype in dtypes.items():
            torch.set_autocast_dtype(device, dtype)
        with _schemas_once():
            yield
    finally:
        for device, dtype in saved.items():
            torch.set_autocast_dtype(device, dtype)


def _operand_key(value):
    """What a block's schema may depend on in an operand; None where that is not known for sure
    (not a tensor, symbolic sizes): the schema is then worked out as torch does."""
    if isinstance(value, torch.Tensor) and _static(value):
        return (type(value), tuple(value.shape), value.stride(), value.dtype, value.device, value.requires_grad)
    return None


# The identifiers of our blocks, and of the forward and backward graphs torch splits them into
# for a training graph (``fw_<identifier>``, ``bw_<identifier>_<n>``).
_OUR_IDENTIFIERS = tuple(prefix + SUBGRAPH_PREFIX for prefix in ("", "fw_", "bw_"))


@contextlib.contextmanager
def _schemas_once():
    """``invoke_subgraph`` called where autograd records it (a training graph) works out the
    block's schema to refuse blocks that write their inputs, and again for its forward and
    backward graphs when AOTAutograd functionalizes the joint trace; torch 2.11 keeps none of
    them and traces the block's graphs again for every layer (GPT-2 small, 12 layers: ~2.5 s
    of a 15 s first call on an H200). Within one compile of a graph made here, one identifier
    names one graph, so a schema depends only on the identifier and its operands' metadata
    and aliasing: it is worked out once for each and kept until the compile ends (the same
    identifiers name other graphs in other compiles). Other calls go to torch's own method."""
    invoke = torch.ops.higher_order.invoke_subgraph
    if "gen_schema" in vars(invoke):       # already inside one such compile
        yield
        return
    generate = invoke.gen_schema
    memo = {}

    def gen_schema(subgraph, identifier, *operands):
        metas = tuple(map(_operand_key, operands))
        if not (isinstance(identifier, str) and identifier.startswith(_OUR_IDENTIFIERS)) or None in metas:
            return generate(subgraph, identifier, *operands)
        ids = [id(o) for o in operands]
        key = (identifier, metas, tuple(map(ids.index, ids)))
        if key not in memo:
            memo[key] = generate(subgraph, identifier, *operands)
        return memo[key]
    invoke.gen_schema = gen_schema
    try:
        yield
    finally:
        del invoke.gen_schema


def with_shared_blocks(gm):
    """A copy of ``gm`` in which each repeated block is an ``invoke_subgraph`` call of a module
    shared by every instance of the same graph, or None when no block repeats (or none could be
    shared). ``gm`` itself is left as it is, to be compiled whole should the copy fail."""
    if not config.regional_compile:
        return None
    graph = fx.Graph()
    nodes = {}
    graph.output(graph.graph_copy(gm.graph, nodes))
    copy = fx.GraphModule(gm, graph)
    states = _NoStates()
    if any(is_state_node(n) for n in graph.nodes):
        try:
            states = _GlobalStates(copy)
        except (KeyError, TypeError, RuntimeError):
            return None        # a state node with arguments it cannot be done with here
    parts = [_Part(tag, run) for tag, run in _parts(copy)]
    chosen = [p for p in parts if p.tag is not None and _shareable(p)]
    for p in chosen:
        p.build(copy, states)
    counts = {}
    for p in chosen:
        counts[p.signature] = counts.get(p.signature, 0) + 1
    chosen = [p for p in chosen if counts[p.signature] > 1]
    if not chosen:
        return None
    dtypes = _autocast_dtypes(chosen, states)
    if dtypes is None:
        return None
    shared = _Shared(copy)
    invoke = torch.ops.higher_order.invoke_subgraph
    replaced = {}       # a block's output node -> the getitem of its call that stands for it now
    for p in chosen:
        name = shared.name_for(p)
        # After the block's last node: every input (its parameters' get_attr nodes too) is defined.
        with graph.inserting_before(p.nodes[-1].next):
            sub = graph.get_attr(name)
            call = graph.call_function(invoke, (sub, name, *(replaced.get(a, a) for a in p.inputs)))
            outs = []
            for i, out in enumerate(p.outputs):
                g = graph.call_function(operator.getitem, (call, i))
                g.meta = dict(out.meta)
                outs.append(g)
        call.meta["example_value"] = tuple(out.meta["example_value"] for out in p.outputs)
        for out, g in zip(p.outputs, outs):
            out.replace_all_uses_with(g)
            replaced[out] = g
        for n in reversed(p.nodes):
            if n.op != "get_attr" and not n.users:
                graph.erase_node(n)
    graph.lint()
    copy.recompile()
    copy.meta["bytegraph_shared_blocks"] = len(shared.by_signature)
    copy.meta["bytegraph_autocast_dtypes"] = dtypes
    return copy


__all__ = ["compiling", "with_shared_blocks"]
