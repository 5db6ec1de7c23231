"""DTensor on the CPU (gloo, one process): DTensor inputs and parameters through compiled
functions, compared with eager; what is not traced yet breaks with its reason and gives eager's
results."""
import copy
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import bytegraph
from bytegraph.backends.registry import lookup_backend
from bytegraph.testing import CompileCounter
from helpers import rank_details, run_ranks, torch_compile_fullgraph_count, torch_compile_graphs
from test_subclasses import assert_same_tensors, compiled, same_training

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


@pytest.fixture(scope="module")
def mesh():
    from torch.distributed.device_mesh import init_device_mesh
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    store = tempfile.mktemp(prefix="bytegraph_dtensor_")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()
        if os.path.exists(store):
            os.remove(store)




def _dt(mesh, *shape, placement=None, requires_grad=False):
    from torch.distributed.tensor import Shard, distribute_tensor
    return distribute_tensor(torch.randn(*shape, requires_grad=requires_grad), mesh, [placement or Shard(0)])


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_dtensor_inputs_ops_and_outputs(mesh, backend):
    from torch.distributed.tensor import DTensor, Replicate
    fn = lambda d, r: (torch.sin(d) * 2 + r.sum(), (d @ r.t()).to_local(), (d + 1).full_tensor())  # noqa: E731
    cfn, cnt = compiled(fn, backend)
    for seed in range(2):
        torch.manual_seed(seed)
        d, r = _dt(mesh, 4, 4), _dt(mesh, 4, 4, placement=Replicate())
        out = cfn(d, r)
        assert_same_tensors(fn(d, r), out)
        assert type(out[0]) is DTensor and out[0].placements == fn(d, r)[0].placements
    assert cnt.frame_count == 1


def test_dtensor_placement_change_recompiles(mesh):
    from torch.distributed.tensor import Replicate
    fn = lambda d: d * 3  # noqa: E731
    cfn, cnt = compiled(fn, fullgraph=False)
    for d, graphs in [(_dt(mesh, 4, 2), 1), (_dt(mesh, 4, 2), 1), (_dt(mesh, 4, 2, placement=Replicate()), 2)]:
        out = cfn(d)
        assert_same_tensors(fn(d), out)
        assert out.placements == d.placements
        assert cnt.frame_count == graphs


class DTLinear(torch.nn.Module):
    def __init__(self, mesh):
        super().__init__()
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor
        self.w1 = torch.nn.Parameter(distribute_tensor(torch.randn(8, 4), mesh, [Shard(0)]))
        self.w2 = torch.nn.Parameter(distribute_tensor(torch.randn(4, 8), mesh, [Replicate()]))

    def forward(self, x):
        return F.linear(torch.relu(F.linear(x, self.w1)), self.w2).sum()


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_dtensor_parameters_training(mesh, backend):
    from torch.distributed.tensor import Replicate, distribute_tensor
    torch.manual_seed(0)
    eager = DTLinear(mesh)
    model = copy.deepcopy(eager)
    cmodel, cnt = compiled(model, backend)
    same_training(eager, model, cmodel, lambda: distribute_tensor(torch.randn(3, 4), mesh, [Replicate()]))
    assert cnt.frame_count == 1


# --- DTensor made and redistributed inside the compiled function --------------------------------

PLACEMENT = None     # a module-level placement the compiled function reads (set by the test)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_from_local_redistribute_and_back(mesh, backend):
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    def fn(t, w):
        d = DTensor.from_local(t, mesh, [Shard(0)])
        r = d.redistribute(mesh, [Replicate()])
        p = DTensor.from_local(w * 2, mesh, (Partial(),)).redistribute(mesh, [Replicate()])
        s = DTensor.from_local(w, mesh, [Replicate()], run_check=False).redistribute(placements=[Shard(1)])
        return (d.sin() + r).to_local(), (p + s).full_tensor(), (r @ r.t()).to_local()
    cfn, cnt = compiled(fn, backend)
    for seed in range(2):
        torch.manual_seed(seed)
        t, w = torch.randn(4, 4, requires_grad=backend == "aot_eager"), torch.randn(4, 4)
        expected, actual = fn(t, w), cfn(t, w)
        assert_same_tensors(expected, actual)
        if t.requires_grad:
            ge, = torch.autograd.grad(sum(o.sum() for o in expected), t)
            gc, = torch.autograd.grad(sum(o.sum() for o in actual), t)
            assert_same_tensors(ge, gc, "grad")
    assert cnt.frame_count == 1
    assert torch_compile_graphs(fn, (torch.randn(4, 4), torch.randn(4, 4))) == 1


def test_placements_and_mesh_read_from_dtensors(mesh):
    from torch.distributed.tensor import DTensor, Replicate, Shard

    def fn(d, t):
        p = d.placements
        e = DTensor.from_local(t, d.device_mesh, p)
        made = (e + 1).placements
        return e.redistribute(e.device_mesh, [Replicate()]).to_local() * p[0].dim, p, made, \
            isinstance(p[0], Shard), p[0].is_shard(), p[0] == Shard(0)
    cfn, cnt = compiled(fn)
    for _ in range(2):
        d, t = _dt(mesh, 4, 2), torch.randn(4, 2)
        assert_same_tensors(fn(d, t), cfn(d, t))
    assert cnt.frame_count == 1
    assert torch_compile_fullgraph_count(fn, _dt(mesh, 4, 2), torch.randn(4, 2)) == 1


def test_module_level_placement_is_guarded(mesh):
    from torch.distributed.tensor import DTensor, Shard

    def fn(t):
        return DTensor.from_local(t, mesh, [PLACEMENT]).redistribute(mesh, [Shard(0)]).to_local() + 1
    cfn, cnt = compiled(fn)
    global PLACEMENT
    try:
        for placement, graphs in [(Shard(0), 1), (Shard(0), 1), (Shard(1), 2)]:
            PLACEMENT = placement
            t = torch.randn(4, 4)
            assert_same_tensors(fn(t), cfn(t))
            assert cnt.frame_count == graphs
    finally:
        PLACEMENT = None


def test_another_mesh_recompiles(mesh):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Replicate
    other = DeviceMesh("cpu", [0])
    assert other is not mesh

    def fn(t, m):
        d = DTensor.from_local(t, m, [Replicate()])
        return d, (d * 2).to_local()
    cfn, cnt = compiled(fn, fullgraph=False)
    for m, graphs in [(mesh, 1), (mesh, 1), (other, 2)]:
        t = torch.randn(3)
        out = cfn(t, m)
        assert_same_tensors(fn(t, m), out)
        assert out[0].device_mesh is m
        assert cnt.frame_count == graphs


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_distribute_tensor_in_the_function(mesh, backend):
    # One rank: nothing is scattered or broadcast, so the split is local and in the graph.
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    def fn(t, w):
        a = distribute_tensor(t, mesh, [Shard(0)])
        b = distribute_tensor(w * 2, mesh, [Replicate()], src_data_rank=None)
        return (a @ b).full_tensor(), a.placements
    check = [(torch.randn(4, 3), torch.randn(3, 2)) for _ in range(2)]
    cfn, cnt = compiled(fn, backend)
    for args in check:
        assert_same_tensors(fn(*args), cfn(*args))
    assert cnt.frame_count == 1


def test_dtensor_api_breaks_with_reason(mesh):
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    cases = [
        (lambda t: DTensor.from_local(t, mesh, [Replicate()], run_check=True).to_local(), "run_check"),
        (lambda t: DTensor.from_local(t).to_local(), "without a device mesh"),   # the mesh of `with mesh:`
        (lambda t: distribute_tensor(t.requires_grad_(), mesh, [Shard(0)]).to_local(), "requires grad"),
        (lambda t: DTensor.from_local(t, mesh, [Shard(0)] if t.sum() > 0 else [Replicate()]).to_local(), None),
    ]
    for fn, reason in cases:
        cfn, _ = compiled(fn)
        with mesh, pytest.raises(bytegraph.Unsupported, match=reason):
            cfn(torch.randn(4))
        cfn, _ = compiled(fn, fullgraph=False)
        t = torch.randn(4)
        with mesh:
            assert_same_tensors(fn(t.clone()), cfn(t.clone()))


# --- dynamic sizes --------------------------------------------------------------------------

def _dynamic_fn(d):
    return (torch.sin(d) * d.shape[0]).full_tensor(), (d + 1).to_local(), d.placements


def _graphs_over_sizes(call, mesh, dynamic, sizes=(4, 6, 8, 10), placement=None):
    """Graphs so far after each call of ``call(d)`` on a DTensor of each size (dim 0 marked
    dynamic first where ``dynamic == "mark"``)."""
    counts = []
    for n in sizes:
        d = _dt(mesh, n, 3, placement=placement)
        if dynamic == "mark":
            torch._dynamo.mark_dynamic(d, 0)
        counts.append(call(d))
    return counts


def _torch_compile_graphs_over_sizes(mesh, dynamic):
    import torch._dynamo
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    torch._dynamo.reset()
    try:
        cfn = torch.compile(_dynamic_fn, backend=backend, dynamic=True if dynamic == "dynamic" else None)
        return _graphs_over_sizes(lambda d: (cfn(d), len(graphs))[1], mesh, dynamic)
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("dynamic", ["automatic", "mark", "dynamic"])
def test_dtensor_dynamic_sizes(mesh, dynamic, backend):
    # DTensor's flatten context holds its global shape: compared without it (the shape guards
    # check the sizes), so sizes are symbolic as in torch.compile: [1, 2, 2, 2] seen changing,
    # one graph for all when marked or with dynamic=True.
    cnt = CompileCounter(lookup_backend(backend))
    cfn = bytegraph.compile(_dynamic_fn, backend=cnt, fullgraph=True, dynamic=True if dynamic == "dynamic" else None)

    def call(d):
        assert_same_tensors(_dynamic_fn(d), cfn(d))
        return cnt.frame_count
    counts = _graphs_over_sizes(call, mesh, dynamic)
    assert counts == ([1, 2, 2, 2] if dynamic == "automatic" else [1, 1, 1, 1])
    assert counts == _torch_compile_graphs_over_sizes(mesh, dynamic)


def test_dynamic_dtensor_guards_still_check_placements_and_dtype(mesh):
    from torch.distributed.tensor import Replicate, distribute_tensor
    cnt = CompileCounter()
    cfn = bytegraph.compile(_dynamic_fn, backend=cnt, dynamic=True)
    cases = [(_dt(mesh, 4, 3), 1), (_dt(mesh, 6, 3), 1), (_dt(mesh, 6, 3, placement=Replicate()), 2),
             (_dt(mesh, 5, 3, placement=Replicate()), 2),
             (distribute_tensor(torch.randn(5, 3, dtype=torch.float64), mesh, [Replicate()]), 3)]
    for d, graphs in cases:
        out = cfn(d)
        assert_same_tensors(_dynamic_fn(d), out)
        assert out[2] == d.placements
        assert cnt.frame_count == graphs


# --- two processes (tests/dtensor_checks.py) ---------------------------------------------------

WORLD = 2


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Every check of tests/dtensor_checks.py, run once on a 2-process gloo group: per rank,
    {check: {"ok", "detail", "error"}}."""
    return run_ranks("dtensor_checks.py", tmp_path_factory.mktemp("dtensor"), WORLD)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_tensor_parallel_block_two_ranks(two_ranks, backend):
    # parallelize_module with ColwiseParallel/RowwiseParallel on attention and MLP: three training
    # steps, losses and (sharded) gradients equal to eager's, one graph as torch.compile makes.
    for d in rank_details(two_ranks, f"tp_block_{backend}"):
        assert d["graphs"] == 1 and d["torch_compile_graphs"] == 1
        assert d["sharded"] == sorted(f"{m}.{p}" for m in ("q", "k", "v", "o", "fc1", "fc2") for p in ("weight", "bias"))


def test_redistribute_two_ranks(two_ranks):
    for d in rank_details(two_ranks, "redistribute_placements"):
        assert d["graphs"] == 1 and d["torch_compile_graphs"] == 1


def test_distribute_tensor_two_ranks(two_ranks):
    for d in rank_details(two_ranks, "distribute_tensor_local_split"):
        assert d["graphs"] == 1
    for d in rank_details(two_ranks, "distribute_tensor_from_rank0_breaks"):
        assert "src_data_rank" in d["reason"]


def test_dynamic_sizes_two_ranks(two_ranks):
    for d in rank_details(two_ranks, "dynamic_sizes_sharded"):
        assert d["graphs"] == d["torch_compile_graphs"] == [1, 2, 2, 2]
