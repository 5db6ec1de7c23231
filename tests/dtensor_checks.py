"""DTensor checks run inside each process of a 2-process gloo group (started by tests/test_dtensor.py).

``python tests/dtensor_checks.py RANK WORLD INIT_FILE OUT_JSON`` joins the process group (a file
store), runs every check in turn and writes ``{check: {"ok": bool, "detail": ..., "error": text}}``
to OUT_JSON. Each check compares compiled against eager on this rank (values, gradients) and
counts graphs; ranks feed different data, so the collectives matter. A check raises only after
its last collective, so one failing rank does not leave the other waiting.
"""
import copy
import json
import sys
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import bytegraph
from bytegraph.backends.registry import lookup_backend
from bytegraph.testing import CompileCounter
from helpers import torch_compile_fullgraph_count

CHECKS = {}


def check(fn):
    CHECKS[fn.__name__] = fn
    return fn


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def close(expected, actual, what, rtol=1e-5, atol=1e-6):
    if isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected) and len(actual) == len(expected), f"{what}: {actual!r} vs {expected!r}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            close(e, a, f"{what}[{i}]", rtol, atol)
        return
    if not isinstance(expected, torch.Tensor):
        assert actual == expected, f"{what}: {actual!r} vs eager's {expected!r}"
        return
    assert type(actual) is type(expected), f"{what}: {type(actual).__name__} vs eager's {type(expected).__name__}"
    if hasattr(expected, "placements"):
        assert actual.placements == expected.placements, f"{what}: {actual.placements} vs {expected.placements}"
    e, a = local(expected).detach(), local(actual).detach()
    assert e.shape == a.shape, f"{what}: shape {tuple(a.shape)} vs eager's {tuple(e.shape)}"
    assert torch.allclose(e, a, rtol=rtol, atol=atol), f"{what}: max difference {(e - a).abs().max().item():.3g}"


def compiled(fn, backend="eager", fullgraph=True):
    cnt = CompileCounter(lookup_backend(backend))
    return bytegraph.compile(fn, backend=cnt, fullgraph=fullgraph), cnt




# --- tensor parallel: a transformer block ----------------------------------------------------

class Block(nn.Module):
    """Pre-norm attention (per-head q, k, v projections) and an MLP, as in GPT-2."""

    def __init__(self, d=16, heads=4):
        super().__init__()
        self.head_dim = d // heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, _ = x.shape
        y = self.ln1(x)
        # -1: the heads of this rank (the projections are split by column).
        q, k, v = (m(y).view(b, t, -1, self.head_dim).transpose(1, 2) for m in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
        x = x + self.o(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def _tp_plan():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    return {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "o": RowwiseParallel(),
            "fc1": ColwiseParallel(), "fc2": RowwiseParallel()}


def _tp_block(backend, rank, world, mesh):
    from torch.distributed.tensor.parallel import parallelize_module
    torch.manual_seed(0)
    base = Block()
    eager = parallelize_module(copy.deepcopy(base), mesh, _tp_plan())
    model = parallelize_module(copy.deepcopy(base), mesh, _tp_plan())
    cmodel, cnt = compiled(model, backend)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_c = torch.optim.SGD(model.parameters(), lr=0.1)
    failures = []
    for step in range(3):
        # The same input on every rank (tensor parallelism replicates activations).
        x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(step))
        loss_e, loss_c = eager(x).square().mean(), cmodel(x).square().mean()
        loss_e.backward()
        loss_c.backward()
        try:
            close(loss_e, loss_c, f"loss at step {step}")
            for (name, pe), pc in zip(eager.named_parameters(), model.parameters()):
                close(pe.grad, pc.grad, f"{name}.grad at step {step}", rtol=1e-4, atol=1e-5)
        except AssertionError as e:
            failures.append(str(e))
        opt_e.step()
        opt_c.step()
        opt_e.zero_grad()
        opt_c.zero_grad()
    sharded = sorted(n for n, p in model.named_parameters() if type(p.data).__name__ == "DTensor")
    reference = torch_compile_fullgraph_count(parallelize_module(copy.deepcopy(base), mesh, _tp_plan()), torch.randn(2, 5, 16))
    assert not failures, failures[0]
    assert cnt.frame_count == 1, f"{cnt.frame_count} graphs"
    return {"graphs": cnt.frame_count, "torch_compile_graphs": reference, "sharded": sharded}


@check
def tp_block_eager(rank, world, mesh):
    return _tp_block("eager", rank, world, mesh)


@check
def tp_block_aot_eager(rank, world, mesh):
    return _tp_block("aot_eager", rank, world, mesh)


# --- from_local and redistribute across two ranks --------------------------------------------

@check
def redistribute_placements(rank, world, mesh):
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    def fn(t, p):
        s = DTensor.from_local(t, mesh, [Shard(0)])
        part = DTensor.from_local(p, mesh, [Partial()])
        return (s.redistribute(mesh, [Replicate()]).to_local(),           # all-gather
                part.redistribute(mesh, [Replicate()]).to_local(),        # all-reduce
                part.redistribute(mesh, [Shard(1)]).to_local(),           # reduce-scatter
                s.redistribute(mesh, [Replicate()]).redistribute(mesh, [Shard(1)]).to_local(),  # local split
                s.redistribute(mesh, [Shard(1)]).to_local(),              # all-to-all
                (s * 2).full_tensor())
    cfn, cnt = compiled(fn, "aot_eager")
    failures = []
    for step in range(2):
        g = torch.Generator().manual_seed(100 * rank + step)
        t, p = torch.randn(2, 4, generator=g, requires_grad=True), torch.randn(4, 4, generator=g, requires_grad=True)
        expected, actual = fn(t, p), cfn(t, p)
        grads = []
        for out in (expected, actual):
            loss = sum((o * (i + 1)).sum() for i, o in enumerate(out))
            grads.append(torch.autograd.grad(loss, (t, p)))
        try:
            close(expected, actual, f"outputs at step {step}")
            close(grads[0], grads[1], f"gradients at step {step}", rtol=1e-4, atol=1e-5)
        except AssertionError as e:
            failures.append(str(e))
    reference = torch_compile_fullgraph_count(fn, torch.randn(2, 4), torch.randn(4, 4))
    assert not failures, failures[0]
    assert cnt.frame_count == 1, f"{cnt.frame_count} graphs"
    return {"graphs": cnt.frame_count, "torch_compile_graphs": reference}


@check
def distribute_tensor_local_split(rank, world, mesh):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    def fn(t):
        a = distribute_tensor(t, mesh, [Shard(0)], src_data_rank=None)
        b = distribute_tensor(t * 2, mesh, [Replicate()], src_data_rank=None)
        return a.to_local(), (a + b.redistribute(mesh, [Shard(0)])).full_tensor()
    cfn, cnt = compiled(fn)
    t = torch.randn(4, 3, generator=torch.Generator().manual_seed(7))   # the same on every rank
    expected, actual = fn(t), cfn(t)
    close(expected, actual, "outputs")
    assert cnt.frame_count == 1, f"{cnt.frame_count} graphs"
    return {"graphs": cnt.frame_count}


@check
def distribute_tensor_from_rank0_breaks(rank, world, mesh):
    from torch.distributed.tensor import Replicate, distribute_tensor

    def fn(t):
        return distribute_tensor(t, mesh, [Replicate()]).to_local() + 1
    cfn, _ = compiled(fn)
    reason = None
    try:
        cfn(torch.randn(3))
    except bytegraph.Unsupported as e:
        reason = str(e).splitlines()[0]
    cfn, _ = compiled(fn, fullgraph=False)
    g = torch.Generator().manual_seed(rank)
    t_e, t_c = torch.randn(3, generator=g), None
    t_c = t_e.clone()
    expected, actual = fn(t_e), cfn(t_c)
    close(expected, actual, "outputs")
    close(t_e, t_c, "the input after the call (the broadcast writes into it)")
    assert reason is not None and "src_data_rank" in reason, reason
    return {"reason": reason}


@check
def dynamic_sizes_sharded(rank, world, mesh):
    # Shard(0) over two ranks: the local size is half the global one, so the inner tensor's dim
    # gets a symbol of its own; one graph after the second size, as torch.compile.
    import torch._dynamo
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    def fn(d, w):
        return (torch.relu(d @ w) * d.shape[0]).full_tensor(), (d + 1).to_local()
    cfn, cnt = compiled(fn, "aot_eager")
    ref_graphs = []

    def ref_backend(gm, example_inputs):
        ref_graphs.append(gm)
        return gm.forward
    torch._dynamo.reset()
    ref = torch.compile(fn, backend=ref_backend)
    counts, ref_counts = [], []
    for n in (4, 6, 8, 12):
        g = torch.Generator().manual_seed(n)    # the same global data on every rank
        d = distribute_tensor(torch.randn(n, 3, generator=g), mesh, [Shard(0)], src_data_rank=None)
        w = distribute_tensor(torch.randn(3, 5, generator=g), mesh, [Replicate()], src_data_rank=None)
        close(fn(d, w), cfn(d, w), f"outputs at size {n}")
        counts.append(cnt.frame_count)
        ref(d, w)
        ref_counts.append(len(ref_graphs))
    torch._dynamo.reset()
    assert counts == [1, 2, 2, 2], counts
    return {"graphs": counts, "torch_compile_graphs": ref_counts}


def main():
    rank, world, init_file, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (world,))
    results = {}
    for name, fn in CHECKS.items():
        bytegraph.reset()
        try:
            results[name] = {"ok": True, "detail": fn(rank, world, mesh), "error": None}
        except Exception:   # noqa: BLE001 - reported to the test
            results[name] = {"ok": False, "detail": None, "error": traceback.format_exc()}
        dist.barrier()
    with open(out, "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
