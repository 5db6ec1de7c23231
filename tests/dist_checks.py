"""Checks run inside each process of a 2-process gloo group (started by tests/test_distributed.py).

``python tests/dist_checks.py RANK WORLD INIT_FILE OUT_JSON CHECK...`` joins the process group
(a file store: no port to pick), runs each named check in turn on the one group, and writes
``{check: {"ok": bool, "detail": ..., "error": text}}`` to OUT_JSON. Every check compares
compiled against eager on this rank (losses, gradients, parameters after a few optimizer
steps) and fails with an AssertionError naming what differs; ranks feed different data, so
the all-reduces matter. A check raises only after its last collective, so one failing rank
does not leave the other waiting.
"""
import copy
import datetime
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import bytegraph
from bytegraph.backends.aot import aot_eager
from bytegraph.debug import records
from bytegraph.testing import CompileCounter

CHECKS = {}


def check(fn):
    CHECKS[fn.__name__] = fn
    return fn


def close(a, b, what, rtol=1e-5, atol=1e-6):
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{what}: {len(a)} vs {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b)):
            close(x, y, f"{what}[{i}]", rtol, atol)
        return
    if a is None or b is None:
        assert a is None and b is None, f"{what}: eager {a!r} vs compiled {b!r}"
        return
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} vs {tuple(b.shape)}"
    assert torch.allclose(a, b, rtol=rtol, atol=atol), \
        f"{what}: max difference {(a - b).abs().max().item():.3g}\n eager {a.flatten()[:6]}\n compiled {b.flatten()[:6]}"


# --- models -------------------------------------------------------------------------------------

class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, 2 * d)
        self.fc2 = torch.nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class Net(torch.nn.Module):
    """Embedding, blocks, a head tied to the embedding: a tiny GPT-like stack."""

    def __init__(self, d=32, vocab=48, depth=4, unused=False):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList([Block(d) for _ in range(depth)])
        self.norm = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight
        if unused:
            self.spare = torch.nn.Linear(d, d)   # never called: DDP's find_unused_parameters

    def forward(self, idx):
        x = self.emb(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def batch(rank, step, n=4, t=6, vocab=48):
    g = torch.Generator().manual_seed(1000 * rank + step)
    idx = torch.randint(0, vocab, (n, t), generator=g)
    target = torch.randint(0, vocab, (n, t), generator=g)
    return idx, target


def loss_of(logits, target):
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())


def train(model, rank, steps, n_sizes=(4,), params=None, before_step=None):
    """Loss, gradients and parameters of each step of SGD on ``model`` (compiled or not)."""
    params = list(params if params is not None else model.parameters())
    opt = torch.optim.SGD(params, lr=0.05)
    history = []
    for step in range(steps):
        idx, target = batch(rank, step, n=n_sizes[step % len(n_sizes)])
        loss = loss_of(model(idx), target)
        loss.backward()
        if before_step is not None:
            before_step(step)
        grads = [None if p.grad is None else p.grad.detach().clone() for p in params]
        opt.step()
        opt.zero_grad(set_to_none=True)
        history.append((loss.detach(), grads, [p.detach().clone() for p in params]))
    return history


def compare_histories(eager, compiled):
    for step, ((le, ge, pe), (lc, gc, pc)) in enumerate(zip(eager, compiled)):
        close(le, lc, f"loss at step {step}")
        close(ge, gc, f"gradients at step {step}")
        close(pe, pc, f"parameters after step {step}")


def same_on_all_ranks(tensors, what):
    flat = torch.cat([t.detach().flatten() for t in tensors])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    return all(torch.equal(gathered[0], g) for g in gathered[1:]), what


def new_splits(start):
    return [s for r in records.frames[start:] for s in r.ddp_splits]


# --- DDP ----------------------------------------------------------------------------------------

CAP_MB = 0.02    # about 21 KB: several buckets in the tiny model


def _ddp_pair(bucket_cap_mb=CAP_MB, unused=False, **ddp_kwargs):
    torch.manual_seed(0)
    base = Net(unused=unused)
    eager = DDP(copy.deepcopy(base), bucket_cap_mb=bucket_cap_mb, **ddp_kwargs)
    compiled_model = copy.deepcopy(base)
    return eager, compiled_model


@check
def ddp_split_matches_eager(rank, world):
    eager, inner = _ddp_pair()
    ddp = DDP(inner, bucket_cap_mb=CAP_MB)
    counter = CompileCounter(aot_eager)
    compiled = bytegraph.compile(ddp, backend=counter)
    start = len(records.frames)
    ref = train(eager, rank, 4)
    got = train(compiled, rank, 4, params=list(ddp.parameters()))
    splits = new_splits(start)
    agree, _ = same_on_all_ranks(list(ddp.parameters()), "parameters")
    compare_histories(ref, got)
    assert agree, "parameters differ between ranks after compiled DDP steps"
    assert len(splits) == 1, f"expected one split forward graph, got {splits}"
    split = splits[0]
    named = [name for name, p in inner.named_parameters()]
    in_pieces = [name for params, _, _, _ in split.pieces for name in params]
    assert sorted(in_pieces) == sorted(named), f"pieces hold {in_pieces}, model has {named}"
    assert split.piece_count >= 3, f"expected at least 3 pieces at cap {CAP_MB} MB: {split.describe()}"
    assert counter.frame_count == split.piece_count, (counter.frame_count, split.piece_count)
    # DDP's rebuilt buckets (after step 1) follow the order gradients became ready.
    logged = ddp._get_ddp_logging_data()
    return {"pieces": split.piece_count, "graphs": counter.frame_count, "explain": split.describe(),
            "ddp_rebuilt_bucket_sizes": logged.get("rebuilt_bucket_sizes"),
            "piece_bytes": [nbytes for _, nbytes, _, _ in split.pieces]}


@check
def ddp_optimize_off_one_graph(rank, world):
    eager, inner = _ddp_pair()
    ddp = DDP(inner, bucket_cap_mb=CAP_MB)
    counter = CompileCounter(aot_eager)
    start = len(records.frames)
    with bytegraph.config.patch(optimize_ddp=False):
        compiled = bytegraph.compile(ddp, backend=counter)
        ref = train(eager, rank, 3)
        got = train(compiled, rank, 3, params=list(ddp.parameters()))
    compare_histories(ref, got)
    assert not new_splits(start), "optimize_ddp=False still split the graph"
    assert counter.frame_count == 1, f"expected one graph, got {counter.frame_count}"
    return {"graphs": counter.frame_count}


@check
def ddp_around_compiled_module(rank, world):
    eager, inner = _ddp_pair()
    counter = CompileCounter(aot_eager)
    ddp = DDP(bytegraph.compile(inner, backend=counter), bucket_cap_mb=CAP_MB)
    start = len(records.frames)
    ref = train(eager, rank, 3)
    got = train(ddp, rank, 3)
    compare_histories(ref, got)
    splits = new_splits(start)
    assert len(splits) == 1 and splits[0].piece_count >= 3, splits
    return {"pieces": splits[0].piece_count}


@check
def ddp_dynamic_batch(rank, world):
    eager, inner = _ddp_pair()
    ddp = DDP(inner, bucket_cap_mb=CAP_MB)
    compiled = bytegraph.compile(ddp, backend="aot_eager")
    start = len(records.frames)
    ref = train(eager, rank, 3, n_sizes=(4, 3, 5))
    got = train(compiled, rank, 3, n_sizes=(4, 3, 5), params=list(ddp.parameters()))
    compare_histories(ref, got)
    splits = new_splits(start)
    assert len(splits) == 2, f"expected a static and a dynamic compile, both split: {splits}"
    return {"splits": [s.piece_count for s in splits]}


@check
def ddp_no_sync(rank, world):
    eager, inner = _ddp_pair()
    ddp = DDP(inner, bucket_cap_mb=CAP_MB)
    compiled = bytegraph.compile(ddp, backend="aot_eager")

    def accumulate(model, params):
        opt = torch.optim.SGD(params, lr=0.05)
        out = []
        for step in range(2):
            with model.no_sync():
                for micro in range(2):
                    idx, target = batch(rank, 10 * step + micro)
                    loss_of(model(idx), target).backward()
            local = [p.grad.clone() for p in params]
            idx, target = batch(rank, 10 * step + 5)
            loss_of(model(idx), target).backward()
            out.append((local, [p.grad.clone() for p in params]))
            opt.step()
            opt.zero_grad()
        return out + [[p.detach().clone() for p in params]]

    ref = accumulate(eager, list(eager.parameters()))
    got = accumulate(compiled, list(ddp.parameters()))
    for step in range(2):
        close(ref[step][0], got[step][0], f"gradients accumulated under no_sync, step {step}")
        close(ref[step][1], got[step][1], f"gradients after the synchronising step {step}")
    close(ref[2], got[2], "parameters")
    local_differs = any(not torch.equal(a, b) for a, b in zip(ref[0][0], ref[0][1]))
    assert local_differs, "no_sync made no difference (the test would not see a missing sync)"
    return {}


@check
def ddp_find_unused_parameters(rank, world):
    eager, inner = _ddp_pair(unused=True, find_unused_parameters=True)
    ddp = DDP(inner, bucket_cap_mb=CAP_MB, find_unused_parameters=True)
    compiled = bytegraph.compile(ddp, backend="aot_eager")
    start = len(records.frames)
    ref = train(eager, rank, 3)
    got = train(compiled, rank, 3, params=list(ddp.parameters()))
    compare_histories(ref, got)
    assert inner.spare.weight.grad is None
    return {"pieces": [s.piece_count for s in new_splits(start)]}


@check
def ddp_static_graph(rank, world):
    eager, inner = _ddp_pair(static_graph=True)
    ddp = DDP(inner, bucket_cap_mb=CAP_MB, static_graph=True)
    compiled = bytegraph.compile(ddp, backend="aot_eager")
    start = len(records.frames)
    ref = train(eager, rank, 4)
    got = train(compiled, rank, 4, params=list(ddp.parameters()))
    compare_histories(ref, got)
    return {"pieces": [s.piece_count for s in new_splits(start)]}


@check
def ddp_overlap(rank, world):
    """With the split, buckets start all-reducing before the first layer's gradient exists."""
    _, inner = _ddp_pair()
    ddp = DDP(inner, bucket_cap_mb=CAP_MB)
    events = []

    def hook(state, bucket):
        events.append("bucket")
        return default_hooks.allreduce_hook(None, bucket)

    ddp.register_comm_hook(None, hook)
    first = inner.blocks[0].fc1.weight
    first.register_hook(lambda g: events.append("first layer") or None)
    compiled = bytegraph.compile(ddp, backend="aot_eager")
    before = []
    for step in range(3):   # DDP rebuilds its buckets after the first step
        events.clear()
        idx, target = batch(rank, step)
        loss_of(compiled(idx), target).backward()
        before.append(events.index("first layer"))
    assert before[-1] >= 1, f"no bucket all-reduce started before the first layer's gradient: {events}"
    return {"buckets_started_before_first_layer_grad": before, "buckets": events.count("bucket")}


@check
def ddp_explain_shows_split(rank, world):
    _, inner = _ddp_pair()
    ddp = DDP(inner, bucket_cap_mb=CAP_MB)
    idx, _ = batch(rank, 0)
    out = bytegraph.explain(ddp)(idx)
    text = str(out)
    assert "DDP Splits:" in text and "bucket" in text and "optimize_ddp" in text, text
    assert out.graph_count == out.ddp_splits[0].piece_count >= 3, text
    assert out.graph_break_count == 0, text
    return {"explain": text[:2000]}


@check
def ddp_called_inside_compiled_function(rank, world):
    eager, inner = _ddp_pair()
    ddp = DDP(inner, bucket_cap_mb=CAP_MB)

    def step(model, idx, target):
        return loss_of(model(idx), target) * 1.0

    compiled_step = bytegraph.compile(step, backend="aot_eager")
    start = len(records.frames)
    ref, got = [], []
    for s in range(2):
        idx, target = batch(rank, s)
        le = step(eager, idx, target)
        le.backward()
        lc = compiled_step(ddp, idx, target)
        lc.backward()
        ref.append((le.detach(), [p.grad.clone() for p in eager.parameters()]))
        got.append((lc.detach(), [p.grad.clone() for p in ddp.parameters()]))
    for (le, ge), (lc, gc) in zip(ref, got):
        close(le, lc, "loss")
        close(ge, gc, "gradients")
    reasons = [r.break_reason for r in records.frames[start:] if r.break_reason]
    assert any("DistributedDataParallel" in r for r in reasons), reasons
    assert new_splits(start), "the module under DDP was not compiled with a split"
    return {"break": reasons[0]}


# --- collectives --------------------------------------------------------------------------------

@check
def functional_collectives_in_graph(rank, world):
    group = dist.group.WORLD

    def f(x):
        a = fc.all_reduce(x * 2, "sum", group)
        b = fc.all_gather_tensor(a + 1, 0, group)
        c = fc.all_gather_tensor(a, 1, group)
        d = fc.reduce_scatter_tensor(b, "sum", 0, group)
        e = fc.wait_tensor(fc.all_reduce(x, "max", group))
        return a, b, c, d, e

    x = torch.arange(12.0).reshape(4, 3) + rank
    ref = f(x)
    counter = CompileCounter()
    got = bytegraph.compile(f, backend=counter, fullgraph=True)(x)
    got_aot = bytegraph.compile(f, backend="aot_eager", fullgraph=True)(x)
    close(list(ref), list(got), "functional collectives (eager backend)")
    close(list(ref), list(got_aot), "functional collectives (aot_eager)")
    assert counter.frame_count == 1
    ops = [str(n.target) for n in counter.graphs[0].graph.nodes if n.op == "call_function"]
    assert any("all_reduce" in o for o in ops) and any("wait_tensor" in o for o in ops), ops
    return {"ops": ops}


@check
def inplace_collectives_rewritten(rank, world):
    def f(x):
        y = x + 1
        dist.all_reduce(y)
        out = torch.empty(world * 4, 3)
        dist.all_gather_into_tensor(out, y * 2)
        small = torch.empty(2, 3)
        dist.reduce_scatter_tensor(small, y)
        z = y.clone()
        dist.broadcast(z, src=1)
        return y, out, small, z * dist.get_world_size() + dist.get_rank()

    x = torch.arange(12.0).reshape(4, 3) * (rank + 1)
    ref = f(x)
    counter = CompileCounter()
    got = bytegraph.compile(f, backend=counter, fullgraph=True)(x)
    got_aot = bytegraph.compile(f, backend="aot_eager", fullgraph=True)(x)
    close(list(ref), list(got), "in-place collectives (eager backend)")
    close(list(ref), list(got_aot), "in-place collectives (aot_eager)")
    ops = [str(n.target) for n in counter.graphs[0].graph.nodes if n.op in ("call_function", "call_method")]
    assert "copy_" in ops, ops
    return {"ops": ops}


@check
def async_collective_breaks(rank, world):
    def f(x):
        y = x * 2
        work = dist.all_reduce(y, async_op=True)
        work.wait()
        return y + 1

    x = torch.ones(3) * (rank + 1)
    ref = f(x)
    out = bytegraph.explain(f)(x)
    got = bytegraph.compile(f, backend="eager")(x)
    close(ref, got, "async all_reduce")
    reasons = [b.reason for b in out.break_reasons]
    assert any("async_op=True" in r for r in reasons), reasons
    return {"reasons": reasons}


@check
def rank_is_a_guarded_constant(rank, world):
    def f(x):
        if dist.get_rank() == 0:
            return x + dist.get_world_size()
        return x - 1

    def g(x, group):
        return x * group.size() + group.rank() + dist.get_rank(group)

    x = torch.ones(3)
    group = dist.new_group([0, 1])
    close(g(x, group), bytegraph.compile(g, backend="eager", fullgraph=True)(x, group), "group.rank()/size()")
    counter = CompileCounter()
    compiled = bytegraph.compile(f, backend=counter, fullgraph=True)
    close(f(x), compiled(x), "rank branch")
    close(f(x), compiled(x), "rank branch, second call")
    assert counter.frame_count == 1
    out = bytegraph.explain(f)(x)
    guards = [g.describe() for g in out.out_guards]
    assert any("default process group" in g and f"({rank}, {world}" in g for g in guards), guards
    return {"guard": [g for g in guards if "process group" in g]}


# --- FSDP2 --------------------------------------------------------------------------------------

def _fsdp_model(base, compile_first=False, counter=None):
    from torch.distributed.fsdp import fully_shard   # heavy; only the FSDP checks need it
    model = copy.deepcopy(base)
    if compile_first:
        for i, block in enumerate(model.blocks):
            model.blocks[i] = bytegraph.compile(block, backend=counter)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def _fsdp_train(model, compiled, rank, steps=3):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    out = []
    for step in range(steps):
        idx, target = batch(rank, step)
        loss = loss_of(compiled(idx), target)
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.detach())
    params = [p.full_tensor().detach().clone() for p in model.parameters()]
    return out, params


def _untied(d=32, vocab=48):
    torch.manual_seed(0)
    net = Net(d, vocab)
    net.head = torch.nn.Linear(d, vocab, bias=False)   # FSDP2 shards tied weights with the root
    return net


@check
def fsdp2_shard_then_compile(rank, world):
    base = _untied()
    eager = _fsdp_model(base)
    model = _fsdp_model(base)
    counter = CompileCounter(aot_eager)
    start = len(records.frames)
    ref = _fsdp_train(eager, eager, rank)
    got = _fsdp_train(model, bytegraph.compile(model, backend=counter), rank)
    close(ref[0], got[0], "FSDP2 losses")
    close(ref[1], got[1], "FSDP2 parameters")
    breaks = [r.break_reason for r in records.frames[start:] if r.break_reason]
    assert counter.frame_count >= len(base.blocks) + 1, counter.frame_count
    return {"graphs": counter.frame_count, "breaks": len(breaks)}


@check
def fsdp2_compile_then_shard(rank, world):
    base = _untied()
    eager = _fsdp_model(base)
    counter = CompileCounter(aot_eager)
    model = _fsdp_model(base, compile_first=True, counter=counter)
    ref = _fsdp_train(eager, eager, rank)
    got = _fsdp_train(model, model, rank)
    close(ref[0], got[0], "FSDP2 losses")
    close(ref[1], got[1], "FSDP2 parameters")
    assert counter.frame_count == len(base.blocks), counter.frame_count
    return {"graphs": counter.frame_count}


# --- driver -------------------------------------------------------------------------------------

def main(argv):
    rank, world, init_file, out_path, *names = argv
    rank, world = int(rank), int(world)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    results = {}
    try:
        for name in names or list(CHECKS):
            bytegraph.reset()
            torch.manual_seed(0)
            try:
                detail = CHECKS[name](rank, world)
                results[name] = {"ok": True, "detail": detail}
            except Exception as e:
                results[name] = {"ok": False, "error": "".join(traceback.format_exception(e))}
            dist.barrier()
    finally:
        with open(out_path, "w") as f:
            json.dump(results, f, default=str)
        dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(sys.argv[1:])
