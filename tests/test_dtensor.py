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


def test_dtensor_made_in_the_function_breaks_with_reason(mesh):
    from torch.distributed.tensor import DTensor, Shard

    def fn(t):
        return DTensor.from_local(t, mesh, [Shard(0)]).sin().to_local()
    cfn, _ = compiled(fn)
    with pytest.raises(bytegraph.Unsupported, match="Shard"):
        cfn(torch.randn(4))
    cfn, _ = compiled(fn, fullgraph=False)
    t = torch.randn(4)
    assert_same_tensors(fn(t), cfn(t))
