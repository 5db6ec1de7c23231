"""Foreach lanes: an optimizer update compiled a few parameters' worth at a time, each distinct
chunk once.

An optimizer's foreach step (``torch._foreach_mul_(params, ...)``, ``_foreach_lerp_(exp_avgs,
grads, ...)``...) is one graph of list ops over every parameter, and item ``i`` of each list
only ever meets item ``i`` of the others: the graph is N independent *lanes* (one per
parameter) plus the values they share (learning rate, betas). Inductor's compile time grows with
N, yet a model's parameters repeat layer after layer: lanes 2..13 of a GPT have the shapes of
lanes 14..25 and so on. ``compile_by_lanes`` finds that period, splits the lists into chunks
of whole periods, compiles each distinct chunk once (the same backend, on fake example
inputs) and calls it for every layer's parameters in turn.

Only a graph that is exactly lanes and shared values is split: the list arguments of each
``_foreach_*`` op have one length (list ops of one length form a *family*: an optimizer with
two parameter groups makes two, chunked apart), item ``i`` of a list is a graph input or item
``i`` of an earlier list op's result, nothing but list ops of its family and the lane's own ops
reads a lane's values (the graph's output may), a lane writes only its own values, the shared
part writes nothing and sets no grad mode or autocast, no two lanes share storage, and nothing
draws random numbers (chunks would draw them in another order). As each lane's ops keep their order and lanes
are independent, running one chunk's ops before the next chunk's gives the whole graph's
results.
"""
import operator

import numpy as np
import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef

from ..config import config
from ..graph_facts import is_random, is_state_node, writes, written
from .regions import meta_key, outer_function, part_caller

# Fewer lanes than this: compiled whole (nothing to gain).
MIN_LANES = 16
# A chunk covers whole periods and at least this many lanes, and the repeated run is cut into
# at most MAX_CHUNKS chunks (``config.lane_max_chunks``): each chunk is one more call of
# compiled code per step, so a model of a thousand identical bias vectors is not split a
# hundred ways (a 48-layer model: 16 chunks of 3 layers).
MIN_CHUNK_LANES = 8
MAX_CHUNKS = 16        # config.lane_max_chunks's default


def _is_foreach(n):
    return n.op == "call_function" and getattr(n.target, "__name__", "").startswith("_foreach_")


def _list_args(n):
    return [a for a in (*n.args, *n.kwargs.values()) if isinstance(a, (list, tuple))]


def _nodes_in(a):
    found = []
    fx.node.map_arg(a, found.append)
    return found


def _all(length):
    """The lane of a list op over lists of ``length`` items: every lane of that family."""
    return ("all", length)


def _is_all(lane):
    return lane is not None and lane[0] == "all"


class _Lanes:
    """The lane of every node of a graph, or ``ok = False`` when the graph is not made of
    independent lanes. List ops over lists of one length form a *family* (an optimizer with two
    parameter groups, decayed and not, makes two); a lane is ``(length, index)``, a list op's
    lane is ``_all(length)``, a shared value's None."""

    def __init__(self, gm):
        self.ok = False
        self.lane = {}
        self.families = []          # the list lengths, in the order the graph meets them
        nodes = list(gm.graph.nodes)
        foreach = [n for n in nodes if _is_foreach(n)]
        length_of = {}
        for n in foreach:
            lengths = {len(a) for a in _list_args(n)}
            if len(lengths) != 1:
                return
            length_of[n] = lengths.pop()
            if length_of[n] not in self.families:
                self.families.append(length_of[n])
        if sum(self.families) < MIN_LANES:
            return
        lane = self.lane
        for n in foreach:        # graph inputs take the lane of the list position they are at
            for a in _list_args(n):
                for i, item in enumerate(a):
                    if isinstance(item, fx.Node) and item.op in ("placeholder", "get_attr"):
                        if lane.setdefault(item, (length_of[n], i)) != (length_of[n], i):
                            return         # one tensor in two lanes
        if any(n.op in ("call_function", "call_method") and is_random(n) for n in nodes):
            return           # chunks would draw random numbers in another order
        for n in nodes:
            if n.op in ("placeholder", "get_attr"):
                lane.setdefault(n, None)
            elif n.op == "output":
                if any(_is_all(lane[a]) for a in n.all_input_nodes):
                    return
            elif n in length_of:
                length = length_of[n]
                for a in (*n.args, *n.kwargs.values()):
                    if isinstance(a, (list, tuple)):
                        for i, item in enumerate(a):
                            if isinstance(item, fx.Node) and lane[item] != (length, i) or \
                                    not isinstance(item, (fx.Node, int, float, bool)):
                                return
                    elif any(lane[x] not in (None, _all(length)) for x in _nodes_in(a)):
                        return     # one lane's value where all lanes read it
                lane[n] = _all(length)
            elif n.target is operator.getitem and n.args and isinstance(n.args[0], fx.Node) \
                    and _is_all(lane[n.args[0]]):
                if not isinstance(n.args[1], int):
                    return
                lane[n] = (lane[n.args[0]][1], n.args[1])
            else:
                seen = {lane[a] for a in n.all_input_nodes} - {None}
                if any(_is_all(x) for x in seen) or len(seen) > 1:
                    return         # mixes lanes
                lane[n] = seen.pop() if seen else None
                if lane[n] is None and (is_state_node(n) or writes(n)):
                    return         # the shared part must be free to run before every chunk
                if lane[n] is not None and writes(n) and any(lane[t] != lane[n] for t in written(n)):
                    return         # a lane writing what other lanes or the shared part read
        storages = set()
        for n, i in lane.items():     # lane inputs: storage of their own, shared with no other input
            if _is_all(i) or n.op not in ("placeholder", "get_attr"):
                continue
            value = n.meta.get("example_value")
            if not isinstance(value, torch.Tensor):
                if i is None:
                    continue
                return
            ref = StorageWeakRef(value.untyped_storage())
            if ref in storages:
                return
            storages.add(ref)
        self.ok = True

    def signatures(self, length):
        """Per lane of the family of lists of ``length``, what it reads and does: the metadata of
        its inputs, its ops, its constants."""
        sig = [[] for _ in range(length)]
        for n, i in self.lane.items():
            if i is None:
                continue
            if i == _all(length):
                for a in _list_args(n):
                    for k, item in enumerate(a):
                        if not isinstance(item, fx.Node):
                            sig[k].append(("constant", item))
            elif _is_all(i) or i[0] != length:
                continue
            elif n.op in ("placeholder", "get_attr"):
                sig[i[1]].append(meta_key(n.meta.get("example_value")))
            else:
                sig[i[1]].append((n.op, str(n.target)))
        return [tuple(s) for s in sig]


def chunks(signatures, max_chunks=None):
    """Contiguous ``(start, stop)`` lane ranges covering all lanes: the longest run of a
    repeating period cut into whole periods of at least ``MIN_CHUNK_LANES`` lanes, the lanes
    before and after it one chunk each; None if nothing repeats at least twice.

    For each period ``p``, ``same[i]`` says lane ``i`` looks like lane ``i + p``; a run of ``r``
    such lanes from ``offset`` means ``1 + r // p`` repeats of the period there. Vectorised: a
    model with a thousand parameters is a few million comparisons, not a billion."""
    max_chunks = max(1, config.lane_max_chunks if max_chunks is None else max_chunks)   # 1: not split
    ids = {}
    seq = np.array([ids.setdefault(s, len(ids)) for s in signatures], dtype=np.int64)
    n = len(seq)
    best = None       # (covered, -period, -offset), offset, period, chunk size, chunk count
    for period in range(1, n // 2 + 1):
        same = seq[period:] == seq[:-period]                      # n - period entries
        # run[i]: how many entries from i on are True in a row
        falses = np.flatnonzero(~same)
        nxt = np.full(len(same) + 1, len(same), dtype=np.int64)
        nxt[falses] = falses
        nxt = np.minimum.accumulate(nxt[::-1])[::-1][:len(same)]
        run = nxt - np.arange(len(same))
        repeats = 1 + run // period
        # periods per chunk at each offset
        group = np.maximum(-(-MIN_CHUNK_LANES // period), -(-repeats // max_chunks))
        count = repeats // group                                   # chunks at each offset
        covered = np.where(count >= 2, count * group * period, 0)
        offset = int(np.argmax(covered))
        if covered[offset] == 0:
            continue
        key = (int(covered[offset]), -period, -offset)
        if best is None or key > best[0]:
            best = (key, offset, period * int(group[offset]), int(count[offset]))
    if best is None:
        return None
    _, offset, size, count = best
    ranges = [(0, offset)] if offset else []
    ranges += [(offset + k * size, offset + (k + 1) * size) for k in range(count)]
    end = offset + count * size
    if end < n:
        ranges.append((end, n))
    return ranges


class _Chunk:
    """The list ops of one family and the ops of one range of its lanes, as a graph of their own
    over its inputs."""

    def __init__(self, gm, lanes, length, start, stop):
        lane = lanes.lane
        every = _all(length)

        def member(n):
            i = lane.get(n)
            return i == every or (i is not None and not _is_all(i) and i[0] == length and start <= i[1] < stop
                                  and n.op not in ("placeholder", "get_attr"))

        members = [n for n in gm.graph.nodes if member(n)]
        self.inputs = []
        seen = set()

        def need(a):
            if not member(a) and a not in seen:
                seen.add(a)
                self.inputs.append(a)

        for n in members:
            for a in (*n.args, *n.kwargs.values()):
                if isinstance(a, (list, tuple)) and lane[n] == every:
                    a = a[start:stop]
                fx.node.map_arg(a, need)
        self.outputs = [n for n in members if lane[n] != every and any(u.op == "output" for u in n.users)]
        g = fx.Graph()
        env = {}
        for i, a in enumerate(self.inputs):
            env[a] = g.placeholder(f"in{i}")
            env[a].meta["example_value"] = a.meta.get("example_value")

        def arg(a, list_op):
            if isinstance(a, (list, tuple)) and list_op:
                return [env[x] if isinstance(x, fx.Node) else x for x in a[start:stop]]
            return fx.node.map_arg(a, env.__getitem__)

        for n in members:
            list_op = lane[n] == every
            args = tuple(arg(a, list_op) for a in n.args)
            if n.target is operator.getitem and lane.get(n.args[0]) == every:
                args = (args[0], n.args[1] - start)
            new = g.create_node(n.op, n.target, args, {k: arg(v, list_op) for k, v in n.kwargs.items()})
            value = n.meta.get("example_value")
            new.meta["example_value"] = type(value)(value[start:stop]) if list_op and isinstance(
                value, (list, tuple)) else value
            env[n] = new
        g.output(tuple(env[n] for n in self.outputs))
        self.graph = g
        self.examples = [a.meta.get("example_value") for a in self.inputs]

    def build(self, root):
        self.gm = fx.GraphModule(root, self.graph)
        self.signature = (self.gm.code, tuple(meta_key(e) for e in self.examples))
        return self


def compile_by_lanes(gm, example_inputs, compile_part):
    """``gm`` (a graph of foreach list ops: an optimizer step) split into chunks of lanes, each
    distinct chunk compiled once with ``compile_part(chunk_gm, fake_example_inputs)``; the
    outer graph module calling them all (its ``forward`` the plain function
    ``regions.outer_function`` writes from it: the state tensors bound once), or None when ``gm``
    is not made of lanes that repeat."""
    if not config.regional_compile:
        return None
    lanes = _Lanes(gm)
    if not lanes.ok:
        return None
    ranges = {length: (chunks(lanes.signatures(length)) if length >= MIN_LANES else None)
              for length in lanes.families}
    if all(r is None for r in ranges.values()):
        return None
    parts = [_Chunk(gm, lanes, length, a, b).build(gm)
             for length in lanes.families for a, b in (ranges[length] or [(0, length)])]
    if any(e is None for p in parts for e in p.examples):
        return None
    outer = fx.Graph()
    env = {}
    for n in gm.graph.nodes:        # inputs and shared values first: they read no lane and write nothing
        if n.op in ("placeholder", "get_attr") or (n.op != "output" and lanes.lane[n] is None):
            env[n] = outer.node_copy(n, lambda a: env[a])
    compiled = {}
    for p in parts:
        fn = compiled.get(p.signature)
        if fn is None:
            fn = compiled[p.signature] = part_caller(compile_part(p.gm, list(p.examples)), "run_lanes")
        call = outer.call_function(fn, tuple(env[a] for a in p.inputs))
        for i, out in enumerate(p.outputs):
            env[out] = outer.call_function(operator.getitem, (call, i))
            env[out].meta = dict(out.meta)
    out_node = gm.graph.output_node()
    outer.output(fx.node.map_arg(out_node.args[0], env.__getitem__))
    outer_gm = fx.GraphModule(gm, outer)
    outer_gm.meta["bytegraph_parts"] = len(compiled)
    outer_gm.meta["bytegraph_chunks"] = [r for length in lanes.families for r in (ranges[length] or [(0, length)])]
    fast = outer_function(outer_gm, "run_lanes_outer")
    if fast is not None:
        outer_gm.forward = fast
    return outer_gm


__all__ = ["compile_by_lanes", "chunks"]
