"""CUDA graphs: the ``cudagraphs`` backend and ``mode="reduce-overhead"``, compared with eager.

On a machine without CUDA only the fallback cases run (a graph on the CPU runs as it is).
"""
import pytest
import torch
import torch.nn as nn

import bytegraph

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _mlp(device):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)).to(device)


def test_cpu_graph_runs_without_cuda_graphs():
    model = _mlp("cpu")
    compiled = bytegraph.compile(model, backend="cudagraphs")
    for _ in range(3):
        x = torch.randn(4, 16)
        torch.testing.assert_close(compiled(x), model(x), rtol=0, atol=0)


@cuda
@pytest.mark.parametrize("how", ["cudagraphs", "reduce-overhead"])
def test_inference_replays_equal_eager(how):
    model = _mlp("cuda").eval()
    compiled = (bytegraph.compile(model, backend="cudagraphs") if how == "cudagraphs"
                else bytegraph.compile(model, mode="reduce-overhead"))
    with torch.no_grad():
        for step in range(5):
            x = torch.randn(4, 16, device="cuda") * (step + 1)
            out = compiled(x).clone()   # a later replay reuses the output's memory
            torch.testing.assert_close(out, model(x))


@cuda
@pytest.mark.parametrize("how", ["cudagraphs", "reduce-overhead"])
def test_training_steps_equal_eager(how):
    ref, model = _mlp("cuda"), _mlp("cuda")
    compiled = (bytegraph.compile(model, backend="cudagraphs") if how == "cudagraphs"
                else bytegraph.compile(model, mode="reduce-overhead"))
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        torch.manual_seed(step)
        x, y = torch.randn(4, 16, device="cuda"), torch.randn(4, 8, device="cuda")
        for m, o in ((ref, opt_ref), (compiled, opt)):
            o.zero_grad()
            loss = ((m(x) - y) ** 2).mean()
            loss.backward()
            o.step()
        for p, q in zip(ref.parameters(), model.parameters()):
            torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5)


@cuda
def test_input_written_in_place_is_not_replayed_over_a_copy():
    def f(x, y):
        x.add_(y)
        return x * 2

    compiled = bytegraph.compile(f, backend="cudagraphs")
    for _ in range(3):
        x, y = torch.randn(8, device="cuda"), torch.randn(8, device="cuda")
        x_ref = x.clone()
        out = compiled(x, y)
        expected = f(x_ref, y)
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(x, x_ref)   # the caller's tensor got the write


@cuda
def test_parameter_replaced_between_calls():
    model = _mlp("cuda").eval()
    compiled = bytegraph.compile(model, backend="cudagraphs")
    x = torch.randn(4, 16, device="cuda")
    with torch.no_grad():
        for _ in range(3):
            compiled(x)
        model[0].weight.data = torch.randn_like(model[0].weight)
        torch.testing.assert_close(compiled(x).clone(), model(x))
