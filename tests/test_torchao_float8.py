"""torchao's float8 training (``convert_to_float8_training``) under bytegraph: the Float8Linear
forward makes torchao's ``Float8TrainingTensor`` from traced tensors and configuration tuples
(``LinearMMConfig`` of ``ScaledMMConfig``s, a ``GemmInputRole`` member), all inside one graph.
Runs on the CPU (torch's ``_scaled_mm`` has a CPU kernel); the GPU figures are in
``bench/train_step.py --float8``."""
import copy

import pytest
import torch
import torch.nn.functional as F

from test_subclasses import compiled, same_training

pytest.importorskip("torchao")


def float8_mlp():
    from torchao.float8 import convert_to_float8_training
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
    convert_to_float8_training(model)
    return model


class Loss(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return F.mse_loss(self.inner(x), x)


def test_float8_linears_convert():
    from torchao.float8.float8_linear import Float8Linear
    assert all(isinstance(m, Float8Linear) for m in (float8_mlp()[0], float8_mlp()[2]))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_float8_forward_one_graph(backend):
    model = float8_mlp()
    cmodel, cnt = compiled(model, backend)
    for seed in range(2):
        x = torch.randn(16, 32, generator=torch.Generator().manual_seed(seed))
        torch.testing.assert_close(cmodel(x), model(x))
    assert cnt.frame_count == 1


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_float8_training_gradients(backend):
    eager = Loss(float8_mlp())
    model = copy.deepcopy(eager)
    cmodel, cnt = compiled(model, backend)
    same_training(eager, model, cmodel, lambda: torch.randn(16, 32))
    assert cnt.frame_count == 1
