"""Regional compilation: compile a repeated block once and call it for every layer.

The tracer copies the trace of a repeated block (``trace/nn/blocks.py``) and tags the nodes of each
copy with ``node.meta["bytegraph_region"]``: the ``(template, instance)`` of every block the node is
in, outermost first (a model traced as a block around its layers: the layers are what repeat). A backend whose
compile time grows with the graph (Inductor) can then split the graph at those regions:

* each region becomes a graph of its own whose inputs are the values it reads from earlier
  nodes and the parameters and buffers it reads (its ``get_attr`` nodes, lifted to inputs so
  that every layer can share one compiled function), and whose outputs are the values later
  nodes read;
* regions whose graphs are the same (same code once named alike, inputs of the same shapes,
  strides, dtypes, devices and requires_grad) are compiled once;
* the nodes between regions (embeddings, the final norm and head) form graphs of their own,
  compiled once each;
* an outer graph calls the compiled parts in order, passing each region its own parameters
  (run as a plain function written from it, ``outer_function``, with the parameters bound once).

Each part is compiled by the same backend on fake example inputs, so training works as for a
whole graph (AOTAutograd per part, autograd across them). The result is the whole graph's,
computed by the same kernels up to fusion across part boundaries.
"""
import contextlib
import operator
import random

import torch
import torch.fx as fx

from ..config import config
from ..graph_facts import is_state_node

REGION = "bytegraph_region"   # the node.meta key trace/nn/blocks.py sets


# A region smaller than this (call nodes) is left inside its neighbours: splitting a graph at
# every repeated Linear would cost more in lost fusion than it saves in compile time.
MIN_REGION_NODES = 8


def _region_of(gm):
    """{node: (template, instance)}: for each node inside a block repeated at least twice (with
    at least MIN_REGION_NODES call nodes an instance), the outermost such block."""
    sizes = {}
    for n in gm.graph.nodes:
        if n.op in ("call_function", "call_method"):
            for template, instance in n.meta.get(REGION, ()):
                sizes.setdefault(template, {}).setdefault(instance, 0)
                sizes[template][instance] += 1
    repeated = {t for t, instances in sizes.items()
                if len(instances) > 1 and min(instances.values()) >= MIN_REGION_NODES}
    chosen = {}
    for n in gm.graph.nodes:
        for tag in n.meta.get(REGION, ()):
            if tag[0] in repeated:
                chosen[n] = tag
                break
    return chosen


def _parts(gm):
    """[(region tag or None, [nodes])] in graph order (placeholders and output left out): a run
    of nodes of one instance of a repeated block, or a run of other nodes. Nodes setting grad
    mode or autocast stay in the run they are in: a part is compiled under the state its
    nodes see (``_GlobalStates``), so a `with torch.autocast(...)` ending between the model's
    head and the loss does not cut the two apart (Inductor fuses the loss into the head's output)."""
    region = _region_of(gm)
    parts = []
    current = None
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "output"):
            continue
        tag = region.get(n)
        if current is None or current[0] != tag:
            current = (tag, [])
            parts.append(current)
        current[1].append(n)
    return parts


# On a GPU, kernels run while Python goes on: a split graph (or one with shared blocks) costs
# nothing more as long as each region keeps the GPU busy longer than calling its compiled code
# takes. Measured: a 12-layer GPT on an H100, 1x256 tokens (~4 GFLOP a block) ran 1.6x slower
# split, 8x512 (~60 GFLOP) within 0.3%; BERT-base on an H200, 8x128 tokens in bf16 (~15 GFLOP a
# block), with shared blocks 5.26 ms a call back to back against 4.18 whole (torch.compile 4.21).
# Below this much work per region a graph is compiled whole (unless CUDA graphs replay it). On
# the CPU kernels run in the caller's thread and outlast the call anyway.
CUDA_MIN_REGION_FLOPS = 5e10

_MATMULS = {torch.matmul, torch.bmm, torch.mm, operator.matmul, "matmul", "bmm", "mm", "__matmul__"}


def _example(node):
    value = node.meta.get("example_value") if isinstance(node, fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _node_flops(node):
    """A rough count of the floating-point operations ``node`` does (matrix products dominate)."""
    out = _example(node)
    if out is None:
        return 0
    args = node.args
    first = _example(args[0]) if args else None
    target = node.target
    if target is torch.nn.functional.linear and len(args) > 1 and _example(args[1]) is not None:
        return 2 * out.numel() * _example(args[1]).shape[-1]
    if target in _MATMULS and first is not None and first.ndim:
        return 2 * out.numel() * first.shape[-1]
    if target is torch.addmm and len(args) > 1 and _example(args[1]) is not None:
        return 2 * out.numel() * _example(args[1]).shape[-1]
    if target is torch.nn.functional.scaled_dot_product_attention and len(args) > 1 \
            and first is not None and _example(args[1]) is not None and _example(args[1]).ndim >= 2:
        return 4 * first.numel() * _example(args[1]).shape[-2]
    return out.numel()


def region_flops(gm):
    """{(template, instance): rough floating-point operations} of each repeated region of ``gm``."""
    work = {}
    for n, tag in _region_of(gm).items():
        work[tag] = work.get(tag, 0) + _node_flops(n)
    return work


def on_cuda(gm):
    return any(v is not None and v.is_cuda for v in map(_example, gm.graph.nodes))


def worth_splitting(gm):
    """Would splitting ``gm`` at its repeated regions keep its steady-state speed?

    On a GPU the split costs CPU time on every call, hidden only while the GPU has queued work
    to run meanwhile: each part call goes through AOTAutograd's Python wrappers (forward, and
    for a graph that is differentiated an autograd node in backward too), and each part checks
    and allocates its own inputs and outputs.

    * A graph that will be differentiated (a training step) is compiled whole. Measured
      (GPT-2 small, 12 layers, 8x1024 tokens, bf16, foreach AdamW, the variants interleaved in
      one process): split, the whole step cost ~4.5 ms more CPU a step and ran 22.1 ms against
      19.5 whole on an H200 and 30.7 against 22.1 on an H100, both hosts then bound by the CPU;
      compiling whole matched torch.compile (19.5 / 23.8 ms). The split's gain is the first call
      only (20 s against 46 s), which a training run repays within minutes.
    * An inference graph is split when each region does enough work to cover its call
      (``CUDA_MIN_REGION_FLOPS``); small regions are launch-bound and would show the calls.

    On the CPU kernels run in the caller's thread and outlast the calls, so an inference graph
    is split: a 12-layer GPT (d=256, 4x64 tokens, 2 threads; ``bench/cpu_split.py``) ran its
    forward in 25.0-26.1 ms split, 24.8-25.2 whole, 26.6 with torch.compile, and the split's
    first call took 15.4-15.8 s against 20.7-21.4. A training graph is compiled whole there too:
    each part is partitioned for its backward apart from the others, and the split steps ran
    slower, 92.6 against 83.6 ms (torch.compile 88.8) for that GPT's forward and backward, 30.7
    against 27.1 ms at 6 layers, d=128, 8x64 tokens. The split's first call was shorter (21.6 s
    against 32.9 s), which a training run repays within ~1,300 steps."""
    if _differentiated(gm):
        return False
    if not on_cuda(gm):
        return True
    work = region_flops(gm)
    return bool(work) and max(work.values()) >= CUDA_MIN_REGION_FLOPS


def worth_sharing(gm, cudagraphs, tiered=False):
    """Should ``gm``'s repeated blocks become shared subgraphs (``backends/subgraphs.py``)?

    On a GPU only (on the CPU, Inductor's code for shared blocks computed wrong gradients with
    buffer reuse on, and the split steps about as fast: a 6-layer d=64 training step, 11.34 ms
    split against 11.09 shared): when CUDA graphs replay the whole
    graph (nothing of the extra calls is left a step: 1x128 tokens, 1.65 ms against 1.63 for
    torch.compile), or, for a graph that will not be differentiated, when each block does enough
    work to hide one more kernel boundary per layer (``CUDA_MIN_REGION_FLOPS``; without CUDA
    graphs a GPT at 1x256 tokens stepped in 3.19 ms shared against 2.83 whole, BERT-base at
    8x128 in 5.26 against 4.18).

    A graph that will be differentiated (a training step) without CUDA graphs is shared only
    when a whole compile will replace it (``tiered``: ``backends/tiers.py``), otherwise compiled
    whole: its shared blocks cost host work on every step (their input checks, outputs
    allocated without Inductor's buffer reuse), and the steps lost to torch.compile wherever the
    GPU outran the host. Measured (H200, GPT-2 small, 8x1024 tokens, bf16, whole training step,
    three processes each alternating the compilers in six rounds): foreach AdamW 1.066x
    torch.compile's shared (processes 1.041-1.121) against 1.003x whole, fused AdamW 1.022x shared;
    pinned to a busy core 1.083x and 1.095x shared, 1.003x whole. The first call stays short
    without the sharing where the optimizer's update is in the step (in lanes): 20.0 s against
    torch.compile's 45.2 s (17 s shared); the model compiled alone is not helped by lanes."""
    if not on_cuda(gm):
        return False
    if cudagraphs:
        return True
    if _differentiated(gm):
        return tiered
    work = region_flops(gm)
    return bool(work) and max(work.values()) >= CUDA_MIN_REGION_FLOPS


def _differentiated(gm):
    """Does ``gm`` compute anything that requires grad (so AOTAutograd will compile a backward)?"""
    return any(n.op in ("call_function", "call_method", "call_module") and any(
        isinstance(v, torch.Tensor) and v.requires_grad for v in _flat(n.meta.get("example_value")))
        for n in gm.graph.nodes)


def _flat(value):
    return value if isinstance(value, (tuple, list)) else (value,)


def _static(value):
    if isinstance(value, torch.Tensor):
        return all(type(s) is int for s in value.shape) and all(type(s) is int for s in value.stride())
    return not isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool))


def meta_key(value):
    """What a compiled part depends on in an example input: shape, strides, dtype, device,
    requires_grad of a tensor; type and value of anything else."""
    if isinstance(value, torch.Tensor):
        return ("T", tuple(value.shape), tuple(value.stride()), value.dtype, value.device, value.requires_grad)
    return (type(value).__name__, value)


class _Part:
    """One piece of the split graph: its nodes, the outer nodes it reads, the nodes read after it.
    Its grad-mode/autocast nodes are not values it passes: inside the part each becomes
    ``set_global_state`` of the state after it; the outer graph does the nodes themselves."""

    def __init__(self, tag, nodes):
        self.tag = tag
        self.nodes = nodes
        members = set(nodes)
        self.inputs = []          # outer nodes read, then this part's get_attr nodes (lifted)
        seen = set()
        for n in nodes:
            if n.op == "get_attr" or is_state_node(n):
                continue
            for a in n.all_input_nodes:
                if a not in members and a not in seen:
                    seen.add(a)
                    self.inputs.append(a)
        self.lifted = [n for n in nodes if n.op == "get_attr"]
        self.inputs += self.lifted
        self.state_nodes = [n for n in nodes if is_state_node(n)]
        self.outputs = [n for n in nodes if n.op != "get_attr" and not is_state_node(n)
                        and any(u not in members for u in n.users)]
        self.gm = None
        self.signature = None

    def build(self, root, states):
        """The part as a GraphModule over its inputs (named in0, in1...), and its signature."""
        g = fx.Graph()
        env = {}
        for i, a in enumerate(self.inputs):
            p = g.placeholder(f"in{i}")
            p.meta["example_value"] = a.meta.get("example_value")
            env[a] = p
        for n in self.nodes:
            if n.op == "get_attr":
                continue
            if is_state_node(n):
                g.call_function(set_global_state, states.after[n])
                continue
            new = g.create_node(n.op, n.target, fx.node.map_arg(n.args, env.__getitem__),
                                fx.node.map_arg(n.kwargs, env.__getitem__))
            new.meta = dict(n.meta)
            new.meta.pop(REGION, None)
            env[n] = new
        start = states.before(self.nodes[0])
        if self.state_nodes and states.after[self.state_nodes[-1]] != start:
            # Put back what the part changed: AOTAutograd refuses a graph that leaves autocast
            # changed (the outer graph does the real state nodes; compiled code has none).
            g.call_function(set_global_state, start)
        g.output(tuple(env[n] for n in self.outputs))
        self.gm = fx.GraphModule(root, g)
        self.examples = [a.meta.get("example_value") for a in self.inputs]
        self.signature = (self.gm.code, tuple(meta_key(e) for e in self.examples), states.before(self.nodes[0]))
        return self


_AUTOCAST_DEVICES = ("cpu", "cuda")


def _global_state(devices):
    return (torch.is_grad_enabled(),
            tuple((d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in devices),
            torch.is_autocast_cache_enabled())


@fx.node.has_side_effect
def set_global_state(grad, autocast, cache):
    """Grad mode and autocast as a part's graph sets them where the whole graph had a ``with``
    block begin or end: AOTAutograd runs it while tracing the part, so the ops after it are traced
    (cast, differentiated) as in the whole graph."""
    torch._C._set_grad_enabled(grad)
    for device, enabled, dtype in autocast:
        torch.set_autocast_enabled(device, enabled)
        torch.set_autocast_dtype(device, dtype)
    torch.set_autocast_cache_enabled(cache)


def _state_devices(gm):
    devices = list(_AUTOCAST_DEVICES)
    for n in gm.graph.nodes if gm is not None else ():
        if is_state_node(n) and n.args and isinstance(n.args[0], str) and n.args[0] not in devices:
            devices.append(n.args[0])
    return devices


def deterministic_mode():
    """(deterministic algorithms on, warn only) as torch has them now."""
    return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


def set_deterministic_mode(mode):
    """``mode`` (from ``deterministic_mode``) set, where it differs from torch's now."""
    if mode != deterministic_mode():
        torch.use_deterministic_algorithms(mode[0], warn_only=mode[1])


@contextlib.contextmanager
def global_state_kept(gm):
    """The process's global state put back as it was after running ``gm``'s nodes for real (its
    state nodes switch grad mode and autocast as they go) or compiling it: grad mode, autocast
    (its dispatch keys, dtypes and cache), the default dtype, deterministic mode and the random
    generators. Inductor benchmarks kernels on random inputs, and a compile that fails half-way
    through a ``with torch.autocast`` block leaves autocast on (torchao's float8 blocks shared on
    a GPU did: every later step ran under autocast, and compiled once more for it). ``gm`` None:
    autocast on the CPU and CUDA only."""
    saved = _global_state(_state_devices(gm))
    # (CUDA's generators cannot be read while a CUDA graph is being captured.)
    cuda = torch.cuda.is_initialized() and not torch.cuda.is_current_stream_capturing()
    rngs = (torch.random.get_rng_state(), torch.cuda.get_rng_state_all() if cuda else None, random.getstate())
    dtype = torch.get_default_dtype()
    deterministic = deterministic_mode()
    try:
        with torch._C._PreserveDispatchKeyGuard():
            yield
    finally:
        set_global_state(*saved)
        torch.random.set_rng_state(rngs[0])
        if rngs[1] is not None:
            torch.cuda.set_rng_state_all(rngs[1])
        random.setstate(rngs[2])
        if torch.get_default_dtype() != dtype:
            torch.set_default_dtype(dtype)
        set_deterministic_mode(deterministic)


class _GlobalStates:
    """Grad mode and autocast at each point of the graph: the graph's own state nodes done for
    real, in order, once (the state after each is recorded), then everything put back. Each part
    is compiled with the state before its first node set (``enter``). ``runs``: which nodes are
    done for real, and ``perform(node, args, kwargs)`` does one (backends/inference.py adds the
    ends of inference-mode blocks, done its own way)."""

    def __init__(self, gm, runs=None, perform=None):
        runs = runs or is_state_node
        perform = perform or (lambda n, args, kwargs: n.target(*args, **kwargs))
        devices = _state_devices(gm)
        self.saved = _global_state(devices)
        self.after = {}                  # state node -> the state after it
        self._at = {}                    # node -> the state before it
        state = self.saved
        values = {}
        try:
            for n in gm.graph.nodes:
                self._at[n] = state
                if runs(n):
                    args = fx.node.map_arg(n.args, lambda a: values[a])
                    kwargs = fx.node.map_arg(n.kwargs, lambda a: values[a])
                    values[n] = perform(n, args, kwargs)
                    state = self.after[n] = _global_state(devices)
        finally:
            self.restore()

    def before(self, node):
        return self._at[node]

    def enter(self, node):
        set_global_state(*self._at[node])

    def restore(self):
        set_global_state(*self.saved)


def part_caller(compiled, name="run_part"):
    """``compiled`` as a function of this module, named ``name``: the outer graph's code names it
    as a global of its own (a target from torch's modules would be spelled as an import path).
    ``outer_function`` calls ``compiled`` itself (``_bytegraph_part``)."""
    def run_part(*args):
        return compiled(*args)
    run_part.__name__ = run_part.__qualname__ = name
    run_part._bytegraph_part = compiled
    return run_part


def outer_function(gm, name="run_outer"):
    """``gm``'s forward (an outer graph calling compiled parts) as a plain function of its
    placeholders, or None where the graph has what this does not write (then ``gm.forward``).

    What fx's code for the graph does per call and this does once: each ``get_attr`` (a
    parameter or optimizer state tensor: ``Module.__getattr__``, ~1 us each, hundreds in an
    optimizer's update) is read here and bound, as AOTAutograd binds the parameters it lifts when
    it compiles a graph whole; a part's ``part_caller`` is skipped for the compiled callable it
    wraps. Values are freed after their last use, as fx's code frees them, except the inputs
    (the caller holds them anyway)."""
    graph = gm.graph
    if type(graph._codegen) is not fx.graph.CodeGen:
        return None
    names, params, lines = {}, [], []
    namespace = {}

    def bind(value):
        key = f"_k{len(namespace)}"
        namespace[key] = value
        return key

    def expr(a):
        if isinstance(a, fx.Node):
            return names[a]
        if isinstance(a, tuple):
            return "(" + "".join(expr(x) + ", " for x in a) + ")"
        if isinstance(a, list):
            return "[" + ", ".join(expr(x) for x in a) + "]"
        if isinstance(a, dict):
            return "{" + ", ".join(f"{bind(k)}: {expr(v)}" for k, v in a.items()) + "}"
        if a is None or type(a) in (bool, int):
            return repr(a)
        return bind(a)

    def call_args(args, kwargs):
        if not all(isinstance(k, str) and k.isidentifier() for k in kwargs):
            raise _Unwritable
        return ", ".join([expr(a) for a in args] + [f"{k}={expr(v)}" for k, v in kwargs.items()])

    nodes = list(graph.nodes)
    last_use = {}
    for i, n in enumerate(nodes):
        for a in n.all_input_nodes:
            last_use[a] = i
    try:
        for i, n in enumerate(nodes):
            names[n] = v = f"v{i}"
            if n.op == "placeholder":
                if n.args or str(n.target).startswith("*"):
                    return None          # a default value or *args
                params.append(v)
                continue
            if n.op == "get_attr":
                value = gm
                for atom in str(n.target).split("."):
                    value = getattr(value, atom)
                names[n] = bind(value)
                continue
            if n.op == "output":
                lines.append(f"return {expr(n.args[0])}")
                break
            if n.op == "call_function":
                target = getattr(n.target, "_bytegraph_part", n.target)
                lines.append(f"{v} = {bind(target)}({call_args(n.args, n.kwargs)})")
            elif n.op == "call_method" and isinstance(n.target, str) and n.target.isidentifier() and n.args:
                lines.append(f"{v} = {expr(n.args[0])}.{n.target}({call_args(n.args[1:], n.kwargs)})")
            elif n.op == "call_module":
                lines.append(f"{v} = {bind(gm.get_submodule(n.target))}({call_args(n.args, n.kwargs)})")
            else:
                return None
            dead = [names[a] for a in n.all_input_nodes if last_use[a] == i
                    and a.op not in ("placeholder", "get_attr")]
            if not n.users:
                dead.append(v)
            if dead:
                lines.append(f"del {', '.join(dict.fromkeys(dead))}")
    except _Unwritable:
        return None
    source = f"def {name}({', '.join(params)}):\n" + "".join(f"    {line}\n" for line in lines)
    code = compile(source, f"<bytegraph {name}>", "exec")
    exec(code, namespace)
    fn = namespace[name]
    fn._bytegraph_source = source
    return fn


class _Unwritable(Exception):
    pass


def compile_by_regions(gm, example_inputs, compile_part):
    """``gm`` split at its repeated regions, each distinct part compiled once with
    ``compile_part(part_gm, fake_example_inputs)`` (a callable returning the part's outputs in
    order); the outer graph module running them all (its ``forward`` the plain function
    ``outer_function`` writes from it), or None when ``gm`` has no region repeated (or cannot
    be split: symbolic sizes, inputs without fake values)."""
    if not config.regional_compile:
        return None
    parts = [_Part(tag, nodes) for tag, nodes in _parts(gm)]
    if not any(p.tag is not None for p in parts):
        return None
    for n in gm.graph.nodes:
        value = n.meta.get("example_value")
        if n.op != "output" and not all(_static(v) for v in (value if isinstance(value, (tuple, list)) else [value])
                                        if v is not None):
            return None    # symbolic sizes: compiled whole
    if any(a.meta.get("example_value") is None for p in parts for a in p.inputs):
        return None
    try:
        states = _GlobalStates(gm)
    except (KeyError, TypeError, RuntimeError):
        return None        # a state node with arguments it cannot be done with here: compiled whole
    compiled = {}     # signature -> compiled callable
    outer = fx.Graph()
    env = {}

    def copy(n):
        env[n] = outer.node_copy(n, lambda a: outer.get_attr(a.target) if a.op == "get_attr"
                                 and a not in env else env[a])

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for n in placeholders:
        env[n] = outer.placeholder(n.name)
        env[n].meta = dict(n.meta)
    try:
        for p in parts:
            if not p.outputs:
                # Only grad mode / autocast, reads of state, or nothing read later (an in-place
                # update): run as it is.
                for n in p.nodes:
                    copy(n)
                continue
            p.build(gm, states)
            fn = compiled.get(p.signature)
            if fn is None:
                states.enter(p.nodes[0])
                fn = compiled[p.signature] = part_caller(compile_part(p.gm, list(p.examples)))
            args = [outer.get_attr(a.target) if a.op == "get_attr" else env[a] for a in p.inputs]
            call = outer.call_function(fn, tuple(args))
            for i, out in enumerate(p.outputs):
                env[out] = outer.call_function(operator.getitem, (call, i))
                env[out].meta = dict(out.meta)
            for n in p.state_nodes:     # the state the part left, for the parts after it and the caller
                copy(n)
    finally:
        states.restore()
    out_node = gm.graph.output_node()
    outer.output(fx.node.map_arg(out_node.args[0], env.__getitem__))
    outer_gm = fx.GraphModule(gm, outer)
    outer_gm.meta["bytegraph_parts"] = len(compiled)
    fast = outer_function(outer_gm, "run_regions_outer")
    if fast is not None:
        outer_gm.forward = fast
    return outer_gm


__all__ = ["compile_by_regions", "deterministic_mode", "global_state_kept", "set_deterministic_mode",
           "worth_sharing", "worth_splitting", "is_state_node", "meta_key", "outer_function", "part_caller", "REGION"]
