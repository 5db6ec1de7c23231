"""Training through compiled forwards: loss and gradients equal eager's."""
import copy

import pytest
import torch

import bytegraph
from bytegraph.backends.registry import lookup_backend
from bytegraph.demo.models import MLP, GPTConfig, TinyGPT
from bytegraph.testing import CompileCounter
from helpers import assert_same


def _step(model, inputs, loss_fn):
    model.zero_grad(set_to_none=True)
    out = model(*inputs)
    loss = loss_fn(out)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _compare(model_ctor, inputs, loss_fn, backend, steps=2):
    torch.manual_seed(0)
    eager_model = model_ctor()
    compiled_src = copy.deepcopy(eager_model)
    cnt = CompileCounter(bytegraph.backends.registry.lookup_backend(backend))
    compiled = bytegraph.compile(compiled_src, backend=cnt)
    opt_e = torch.optim.SGD(eager_model.parameters(), lr=0.1)
    opt_c = torch.optim.SGD(compiled.parameters(), lr=0.1)
    for _ in range(steps):
        loss_e, grads_e = _step(eager_model, inputs, loss_fn)
        loss_c, grads_c = _step(compiled, inputs, loss_fn)
        assert torch.allclose(loss_e, loss_c, rtol=1e-4, atol=1e-5), (loss_e, loss_c)
        assert grads_e.keys() == grads_c.keys()
        for name in grads_e:
            assert torch.allclose(grads_e[name], grads_c[name], rtol=1e-3, atol=1e-5), name
        opt_e.step()
        opt_c.step()
    # Gradients landed on the original module's parameters, and one graph served every step.
    assert all(p.grad is not None for p in compiled_src.parameters())
    assert cnt.frame_count == 1
    return cnt


def _mlp():
    return MLP()


def _gpt():
    m = TinyGPT(GPTConfig())
    m.eval()   # dropout off, so eager and compiled see the same numbers
    return m


def _mlp_inputs():
    torch.manual_seed(1)
    return (torch.randn(8, 64),)


def _gpt_inputs():
    torch.manual_seed(1)
    cfg = GPTConfig()
    return (torch.randint(0, cfg.vocab_size, (2, 16)),)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_mlp_training(backend):
    _compare(_mlp, _mlp_inputs(), lambda out: out.pow(2).mean(), backend)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_tiny_transformer_training(backend):
    def loss_fn(logits):
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 torch.arange(logits.shape[0] * logits.shape[1]) % logits.shape[-1])
    _compare(_gpt, _gpt_inputs(), loss_fn, backend)


def test_input_gradients_flow_through_compiled_function():
    def f(x, w):
        return (x @ w).relu().sum()

    x = torch.randn(4, 5, requires_grad=True)
    w = torch.randn(5, 3, requires_grad=True)
    f(x, w).backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    cnt = CompileCounter(lookup_backend("aot_eager"))
    bytegraph.compile(f, backend=cnt)(x, w).backward()
    assert torch.allclose(gx, x.grad) and torch.allclose(gw, w.grad)
    assert cnt.frame_count == 1


def test_first_graph_of_the_process_compiled_under_no_grad():
    # The AOTAutograd backends look up autograd's AccumulateGrad class once per process, by
    # making a small graph; the first lookup could come while compiling a graph cut inside
    # `with torch.no_grad()` (grad_fn None there). A fresh process, so this is that first time.
    import subprocess
    import sys
    code = (
        "import torch, bytegraph\n"
        "def f(x):\n"
        "    with torch.no_grad():\n"
        "        y = x * 2\n"
        "        print('break')\n"
        "        y = y + x\n"
        "    return (x * y).sum()\n"
        "x = torch.randn(3, requires_grad=True)\n"
        "out = bytegraph.compile(f, backend='aot_eager')(x)\n"
        "out.backward()\n"
        "x2 = x.detach().clone().requires_grad_()\n"
        "f(x2).backward()\n"
        "assert torch.allclose(out, f(x2)) and torch.allclose(x.grad, x2.grad)\n"
        "print('ok')\n")
    import os
    import pathlib
    root = str(pathlib.Path(__file__).resolve().parent.parent)
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)   # keep what is there
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=path))
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_an_input_made_differentiable_in_place(backend):
    # AOTAutograd's backward fails on an input that does not require grad written in place
    # with one that does (torch.compile too): that graph runs uncompiled, with eager's gradients.
    def f(x, w):
        x.mul_(w)
        return x

    w = torch.tensor([4.0, 5.0, 6.0], requires_grad=True)
    w2 = w.detach().clone().requires_grad_()
    expected = f(torch.tensor([1.0, 2.0, 3.0]), w)
    expected.sum().backward()
    cnt = CompileCounter(lookup_backend(backend))
    out = bytegraph.compile(f, backend=cnt)(torch.tensor([1.0, 2.0, 3.0]), w2)
    out.sum().backward()
    assert_same(expected, out)
    assert_same(w.grad, w2.grad)
    assert cnt.frame_count == 1     # captured; the backend's compile of it is what falls back
