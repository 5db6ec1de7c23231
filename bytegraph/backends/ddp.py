"""Graphs split at DistributedDataParallel's gradient-bucket boundaries (``config.optimize_ddp``).

DDP all-reduces gradients bucket by bucket, each bucket as soon as all of its
gradients are ready, so that communication overlaps the rest of the backward.
AOTAutograd turns a captured graph into *one* autograd node: every gradient of
its parameters becomes ready at the same moment, when that node's whole
backward has run, and every all-reduce would wait for the end of backward.

So when a graph is compiled inside a DDP forward (DDP marks itself active
while its wrapped module runs), it is cut into pieces whose parameters fill
DDP's buckets, and each piece is compiled on its own by the user's backend.
The backward of the last piece runs first; when it ends, the gradients of its
bucket are ready and DDP starts that bucket's all-reduce while the backward of
the piece before it runs.

Which parameters a bucket holds: DDP's reducer rebuilds its buckets after the
first iteration in the order gradients became ready, filling each bucket until
it holds at least its cap (``first_bucket_bytes_cap`` for the first, then
``bucket_bytes_cap``; or the per-bucket caps of ``bucket_cap_mb_list``). A
parameter's gradient is ready when the backward of its *earliest* use in the
forward has run, so the graph is walked from its end to its start, each
parameter counted at its earliest use, and a piece closed as soon as it holds
a bucket's worth. A piece at the start of the graph without parameters of its
own joins the next one. The split never changes what is computed: pieces run
one after the other on the same tensors.
"""
import linecache
import logging

import torch
import torch.fx as fx
from torch.nn.parallel import DistributedDataParallel

_counter = [0]
# debug.logs' "distributed" topic (backends sit beside debug, not above it)
log = logging.getLogger("bytegraph.distributed")

WHY = ("DDP all-reduces a bucket of gradients once all of them are ready; one graph would make every "
       "gradient ready only at the end of its backward, so the graph is split where DDP's buckets end "
       "and each bucket's all-reduce overlaps the backward of the pieces before it")
HOW_TO_TURN_OFF = "set bytegraph.config.optimize_ddp = False (BYTEGRAPH_OPTIMIZE_DDP=0) for one graph"


class Piece:
    """One piece of a split graph: its compute nodes (forward order) and the bucket they fill."""
    __slots__ = ("nodes", "params", "nbytes", "cap")

    def __init__(self, cap):
        self.nodes = []
        self.params = []     # names of the DDP-managed parameters whose gradients this piece makes ready
        #                      (forward order of their earliest uses)
        self.nbytes = 0
        self.cap = cap


class DDPSplit:
    """What ``explain`` shows of one split: the pieces, their buckets, and why."""

    def __init__(self, graph_name, pieces, limits):
        self.graph_name = graph_name
        self.limits = list(limits)
        self.pieces = [(list(p.params), p.nbytes, len(p.nodes), p.cap) for p in pieces]

    @property
    def piece_count(self):
        return len(self.pieces)

    def describe(self, indent=""):
        caps = ", ".join(_mib(c) for c in self.limits)
        lines = [f"{indent}{self.graph_name}: split into {len(self.pieces)} graphs at DDP bucket boundaries "
                 f"(bucket caps {caps}; the last graph's bucket is all-reduced first)",
                 f"{indent}  Why: {WHY}; {HOW_TO_TURN_OFF}"]
        for i, (params, nbytes, ops, cap) in enumerate(self.pieces, 1):
            shown = ", ".join(params[:6]) + (f", ... ({len(params)} parameters)" if len(params) > 6 else "")
            lines.append(f"{indent}  Graph {i}: {ops} ops, bucket of {_mib(nbytes)} (cap {_mib(cap)}): "
                         f"{shown or 'no parameters'}")
        return "\n".join(lines)

    def __repr__(self):
        return f"DDPSplit({self.graph_name!r}, {self.piece_count} pieces)"


def _mib(nbytes):
    return f"{nbytes / 2 ** 20:.3g} MiB"


def active_ddp_module():
    """The DistributedDataParallel module whose forward is running now, or None."""
    get = getattr(DistributedDataParallel, "_get_active_ddp_module", None)
    return get() if get is not None else None


def bucket_limits(ddp):
    """The byte caps of DDP's buckets in the order its reducer fills them after rebuilding
    (first bucket first; the last cap repeats)."""
    bucket_config = getattr(ddp, "_bucket_config", None)
    if bucket_config is not None:
        if bucket_config.per_bucket_bytes_caps:
            return list(bucket_config.per_bucket_bytes_caps)
        return [bucket_config.first_bucket_bytes_cap, bucket_config.bucket_bytes_cap]
    # Older DDP (torch < 2.13): a small first bucket only when bucket_cap_mb was left at its default.
    cap = int(ddp.bucket_bytes_cap)
    first = getattr(torch.distributed, "_DEFAULT_FIRST_BUCKET_BYTES", cap) \
        if getattr(ddp, "bucket_bytes_cap_default", False) else cap
    return [min(first, cap), cap]


def managed_parameters(ddp):
    """id -> name of the parameters whose gradients DDP all-reduces (requires_grad, not ignored)."""
    ignored = set(getattr(ddp, "parameters_to_ignore", ()) or ())
    return {id(p): name for name, p in ddp.module.named_parameters()
            if p.requires_grad and name not in ignored and not getattr(p, "_ddp_ignored", False)}


def bucketed(compiler_fn, ddp, graph_name, on_split=None):
    """A backend that splits each graph at ``ddp``'s bucket boundaries and compiles the pieces
    with ``compiler_fn``; graphs that fill one bucket or less go to ``compiler_fn`` whole.
    ``on_split(DDPSplit)`` is told of each split."""
    limits = bucket_limits(ddp)
    managed = managed_parameters(ddp)

    def compile_bucketed(gm, example_inputs):
        pieces = plan(gm, limits, managed)
        if len(pieces) < 2:
            return compiler_fn(gm, example_inputs)
        split = DDPSplit(graph_name, pieces, limits)
        log.debug("%s", split.describe())
        if on_split is not None:
            on_split(split)
        return compile_pieces(gm, example_inputs, pieces, compiler_fn)

    compile_bucketed.__name__ = getattr(compiler_fn, "__name__", "backend")
    return compile_bucketed


def plan(gm, limits, managed):
    """The pieces of ``gm`` (forward order): contiguous runs of its compute nodes."""
    compute = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    position = {n: i for i, n in enumerate(compute)}
    # Each managed parameter, counted once at its earliest use (its gradient is ready only when
    # the backward of that use has run; a tied weight's later uses come before it in backward).
    first_use = {}     # compute index -> [(name, bytes)]
    earliest = {}      # id(param) -> (index, name, bytes)
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        tensor = _attr(gm, node.target)
        if not isinstance(tensor, torch.Tensor) or id(tensor) not in managed:
            continue
        uses = [position[u] for u in node.users if u in position]
        if not uses:
            continue
        index = min(uses)
        known = earliest.get(id(tensor))
        if known is None or index < known[0]:
            earliest[id(tensor)] = (index, managed[id(tensor)], tensor.numel() * tensor.element_size())
    for index, name, nbytes in earliest.values():
        first_use.setdefault(index, []).append((name, nbytes))

    cut_ok = _cut_points(compute)
    pieces = [Piece(limits[0])]
    for index in range(len(compute) - 1, -1, -1):
        piece = pieces[-1]
        if piece.nbytes >= piece.cap and cut_ok[index + 1]:
            piece = Piece(limits[min(len(pieces), len(limits) - 1)])
            pieces.append(piece)
        piece.nodes.append(compute[index])
        uses = first_use.get(index, ())
        piece.params[0:0] = [name for name, _ in uses]    # kept in forward order
        piece.nbytes += sum(nbytes for _, nbytes in uses)
    if len(pieces) > 1 and not pieces[-1].params:
        # Ops before the first parameter: they join the piece after them.
        pieces[-2].nodes.extend(pieces.pop().nodes)
    if not pieces[-1].nodes:
        pieces.pop()
    pieces.reverse()
    for piece in pieces:
        piece.nodes.reverse()
    return pieces


def _cut_points(compute):
    """``ok[j]``: the graph may be cut between ``compute[j - 1]`` and ``compute[j]``.

    Not inside a region with other global state than the graph's entry (a ``no_grad`` or autocast
    block: each piece is traced by the backend in the state it starts in), and not where a value
    other than a tensor or a symbolic int would cross (the tuple of a ``split`` before its
    ``getitem``s, an autocast handle): pieces pass tensors and sizes only.
    """
    n = len(compute)
    ok = [True] * (n + 1)
    entry_grad = torch.is_grad_enabled()   # a graph is compiled in the state it is guarded on
    grad, autocast, unknown = entry_grad, 0, False
    for i, node in enumerate(compute):
        ok[i] = grad == entry_grad and autocast == 0 and not unknown
        target = node.target
        if target is torch._C._set_grad_enabled:
            grad = bool(node.args[0])
        elif target is torch.amp._enter_autocast:
            autocast += 1
        elif target is torch.amp._exit_autocast:
            autocast -= 1
        elif getattr(target, "__name__", "") == "set_autocast_state":
            unknown = True   # residual.set_autocast_state: the end of a block entered before the graph
    position = {node: i for i, node in enumerate(compute)}
    crossing = [0] * (n + 2)
    for i, node in enumerate(compute):
        value = node.meta.get("example_value")
        if isinstance(value, (torch.Tensor, torch.SymInt)) or not node.users:
            continue
        last = max((position.get(u, n) for u in node.users), default=i)
        crossing[i + 1] += 1       # cuts i+1 .. last would pass this value on
        crossing[last + 1] -= 1
    running = 0
    for j in range(n + 1):
        running += crossing[j]
        if running:
            ok[j] = False
    return ok


def _attr(gm, target):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part, None)
    return obj


def compile_pieces(gm, example_inputs, pieces, compiler_fn):
    """Build a GraphModule per piece, compile each, and return one callable running them in turn."""
    graph_inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    output_node = gm.graph.output_node()
    piece_of = {n: k for k, p in enumerate(pieces) for n in p.nodes}
    # Where each value lives at run time: graph inputs by position, piece outputs by slot.
    slot = {n: f"a{i}" for i, n in enumerate(graph_inputs)}
    steps = []
    for k, piece in enumerate(pieces):
        members = set(piece.nodes)
        needed = []
        for node in piece.nodes:
            for arg in node.all_input_nodes:
                if arg not in members and arg.op != "get_attr" and arg not in needed:
                    needed.append(arg)
        outputs = [n for n in piece.nodes
                   if any(piece_of.get(u, -1) > k or u is output_node for u in n.users)]
        sub = _piece_module(gm, piece.nodes, needed, outputs)
        examples = [_example(n) for n in needed]
        compiled = compiler_fn(sub, examples)
        names = []
        for n in outputs:
            slot[n] = f"v{len(slot)}"
            names.append(slot[n])
        steps.append((compiled, [slot[n] for n in needed], names))
    (result,) = output_node.args
    return _runner(gm, steps, graph_inputs, result, slot)


def _example(node):
    value = node.meta.get("example_value")
    if value is None:
        raise RuntimeError(f"DDP split: graph value {node.name} carries no example value")
    return value


def _piece_module(gm, nodes, needed, outputs):
    graph = fx.Graph()
    env = {}
    for n in needed:
        p = graph.placeholder(n.name)
        p.meta = dict(n.meta)
        env[n] = p

    def lookup(n):
        if n not in env:   # a parameter or buffer read by this piece: its own get_attr
            env[n] = graph.node_copy(n, lookup)
        return env[n]

    for n in nodes:
        env[n] = graph.node_copy(n, lookup)
    graph.output(tuple(env[n] for n in outputs))
    sub = fx.GraphModule(gm, graph)
    sub.graph.lint()
    return sub


def _runner(gm, steps, graph_inputs, result, slot):
    """Straight-line Python calling the compiled pieces; each value dropped after its last use."""
    _counter[0] += 1
    name = f"ddp_pieces_{_counter[0]}"
    ns = {"__gm": gm}
    args = [f"a{i}" for i in range(len(graph_inputs))]
    lines = [f"def {name}({', '.join(args)}):"]
    last_use = {}
    for k, (_, ins, _) in enumerate(steps):
        for v in ins:
            last_use[v] = k
    for k, (compiled, ins, outs) in enumerate(steps):
        ns[f"__piece{k}"] = compiled
        call = f"__piece{k}({', '.join(ins)})"
        if outs:
            lines.append(f"    __out = {call}")
            lines.extend(f"    {o} = __out[{j}]" for j, o in enumerate(outs))
        else:
            lines.append(f"    {call}")
        dead = [v for v in ins if last_use[v] == k and v not in _result_names(result, slot)]
        if dead:
            lines.append(f"    del {', '.join(dead)}")
    lines.append(f"    return ({''.join(_result_expr(r, slot) + ', ' for r in result)})")
    source = "\n".join(lines) + "\n"
    filename = f"<bytegraph {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), ns)
    fn = ns[name]
    fn.pieces = [compiled for compiled, _, _ in steps]
    return fn


def _result_names(result, slot):
    return {slot[r] for r in result if isinstance(r, fx.Node) and r in slot}


def _result_expr(r, slot):
    if not isinstance(r, fx.Node):
        return repr(r)
    if r.op == "get_attr":
        return f"__gm.{r.target}"
    return slot[r]


__all__ = ["DDPSplit", "active_ddp_module", "bucket_limits", "bucketed", "managed_parameters", "plan"]
