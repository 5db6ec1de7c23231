"""Deliberately broken compilers for the minifier tests (tests/test_minifier.py, docs/debugging.md).

Frontend backends get bytegraph's graphs (``torch.relu``, ``torch.sigmoid``...); the ``aot_*``
backends are AOTAutograd with a broken inner compiler, which sees ATen ops
(``aten.relu.default``...). Each breaks one way: raising when compiling a graph with relu,
raising when running it, or computing sigmoid wrongly.
"""
import torch
from torch import fx

from bytegraph.backends import aot_autograd

_RELU = {torch.relu, torch.nn.functional.relu, torch.ops.aten.relu.default, "relu"}
_SIGMOID = {torch.sigmoid, torch.ops.aten.sigmoid.default, "sigmoid"}


def _has(gm, targets):
    return any(n.op in ("call_function", "call_method") and n.target in targets for n in gm.graph.nodes)


def _wrong_sigmoid(gm):
    """``gm`` with every sigmoid(x) computed as sigmoid(x) + 0.5."""
    for n in list(gm.graph.nodes):
        if n.op in ("call_function", "call_method") and n.target in _SIGMOID:
            with gm.graph.inserting_after(n):
                wrong = gm.graph.call_function(torch.add, (n, 0.5))
            n.replace_all_uses_with(wrong, delete_user_cb=lambda user: user is not wrong)
    gm.recompile()
    return gm


def relu_compile_error(gm, example_inputs):
    if _has(gm, _RELU):
        raise NotImplementedError("relu_compile_error: this backend cannot compile relu")
    return gm.forward


def relu_runtime_error(gm, example_inputs):
    if not _has(gm, _RELU):
        return gm.forward

    def run(*args):
        raise RuntimeError("relu_runtime_error: relu failed at run time")

    return run


def wrong_sigmoid(gm, example_inputs):
    return _wrong_sigmoid(gm).forward


def _boxed(fn):
    fn._boxed_call = True
    return fn


def working_inner(gm, example_inputs):
    return _boxed(lambda args: gm(*args))


def relu_compile_error_inner(gm, example_inputs):
    if _has(gm, _RELU):
        raise NotImplementedError("relu_compile_error_inner: this compiler cannot compile aten.relu")
    return _boxed(lambda args: gm(*args))


def relu_runtime_error_inner(gm, example_inputs):
    if not _has(gm, _RELU):
        return _boxed(lambda args: gm(*args))

    def run(args):
        raise RuntimeError("relu_runtime_error_inner: aten.relu failed at run time")

    return _boxed(run)


def wrong_sigmoid_inner(gm, example_inputs):
    wrong = _wrong_sigmoid(gm)
    return _boxed(lambda args: wrong(*args))


aot_relu_compile_error = aot_autograd(relu_compile_error_inner, name="aot_relu_compile_error")
aot_relu_runtime_error = aot_autograd(relu_runtime_error_inner, name="aot_relu_runtime_error")
aot_wrong_sigmoid = aot_autograd(wrong_sigmoid_inner, name="aot_wrong_sigmoid")


class TwentyOps(torch.nn.Module):
    """A model of more than 20 ops with one relu and one sigmoid deep inside."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 16)
        self.norm = torch.nn.LayerNorm(32)

    def forward(self, x):
        h = self.fc1(x) * 0.5 + 1.0
        h = self.norm(h)
        h = torch.tanh(h) - h.mean(dim=-1, keepdim=True)
        h = torch.relu(h) * 2.0
        h = h.transpose(0, 1).contiguous().transpose(0, 1)
        h = torch.sigmoid(h) + h.pow(2) * 0.1
        h = self.fc2(h).softmax(dim=-1)
        h = h * x.exp().clamp(max=3.0) + torch.cos(x)
        return h.sum(dim=0) / 3.0, h.abs().max()
