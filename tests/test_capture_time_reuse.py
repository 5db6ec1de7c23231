"""Work a capture does once instead of again (issue 40, capture time).

* Known breaking calls (runtime.compile_frame): a loop whose layers each break inside a nested
  call inlines the first layer down to the break; the next layers' calls break at the call at
  once, with the same hint chain, instead of being inlined again. Compared with eager, with the
  graphs of the same program when the site is not remembered, and by how often the layer's
  code is inlined; a site whose later calls do not break is forgotten.
* Remembered fake results (graph/fake_memo.py): a call repeated on the same metadata gets a new
  fake tensor of the remembered layout instead of running on fakes again. Every node's fake
  result is compared with the real tensor the graph computes there (shape, strides, dtype),
  and the results and module state with eager.
"""
import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

import bytegraph
from bytegraph.graph import fake_memo
from bytegraph.runtime import compile_frame, reuse
from bytegraph.stacks import CUT_FROM
from bytegraph.trace.machine import frame as machine_frame
from helpers import assert_no_internal_errors, assert_same, compile_counted


# --- known breaking calls -------------------------------------------------------------------

def _count_of(t):
    return t.nonzero().shape[0]        # a size from the tensor's data: a graph break


def _inner(x):
    y = x * 2
    return y + _count_of(y > 0)


def _middle(x):
    return _inner(x.sin()) * 3


class _Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, breaks=True):
        h = self.lin(x).relu()
        if breaks:
            h = _middle(h)
        return h - 1


class _Stack(torch.nn.Module):
    def __init__(self, n=3, breaking=None):
        super().__init__()
        self.layers = torch.nn.ModuleList(_Layer() for _ in range(n))
        self.breaking = breaking

    def forward(self, x):
        x = x + 1
        for i, layer in enumerate(self.layers):
            x = layer(x, breaks=self.breaking is None or i in self.breaking)
        return x.cos()


def _inlines_of(code, run):
    """How many times ``code`` was inlined by a root frame while ``run()`` ran."""
    count = [0]
    original = machine_frame.Frame.run

    def counting(frame):
        if frame.code is code and frame.parent is not None and frame.parent.parent is None:
            count[0] += 1
        return original(frame)

    machine_frame.Frame.run = counting
    try:
        run()
    finally:
        machine_frame.Frame.run = original
    return count[0]


def _compile_and_compare(model, remember=True, remake=True):
    """Two calls compiled, each compared with eager; the counter. ``remember=False``: no known
    breaking calls; ``remake=False``: no entries made again for other modules (runtime/reuse.py)."""
    original, original_remake = compile_frame._remember_known_break, reuse.remake
    if not remember:
        compile_frame._remember_known_break = lambda *args, **kwargs: None
    if not remake:
        reuse.remake = lambda *args, **kwargs: None
    try:
        bytegraph.reset()
        compiled, cnt = compile_counted(model)
        for seed in (0, 1):
            torch.manual_seed(seed)
            x = torch.randn(2, 4)
            assert_same(model(x.clone()), compiled(x.clone()))
        assert_no_internal_errors()
    finally:
        compile_frame._remember_known_break, reuse.remake = original, original_remake
    return cnt


@pytest.mark.parametrize("n", [2, 3])
def test_layers_breaking_alike_inline_the_layer_once(n):
    torch.manual_seed(0)
    model = _Stack(n)
    forward = _Layer.forward.__code__
    with torch.no_grad():
        found = []
        assert _inlines_of(forward, lambda: found.append(_compile_and_compare(model))) == 1
        # without the site remembered: each layer's call inlines the layer down to the break
        alone = []
        assert _inlines_of(forward, lambda: alone.append(_compile_and_compare(model, remember=False,
                                                                               remake=False))) == n
    # the same graphs either way
    assert found[0].frame_count == alone[0].frame_count > n
    assert found[0].op_count == alone[0].op_count


def test_site_whose_later_calls_do_not_break_is_forgotten():
    torch.manual_seed(0)
    model = _Stack(4, breaking={0})       # only the first layer breaks
    with torch.no_grad():
        found = _compile_and_compare(model)
        alone = _compile_and_compare(model, remember=False)
    assert found.op_count == alone.op_count
    assert found.frame_count <= alone.frame_count + 2     # (the second layer split before it is known)


# --- entries made again for another module of the same structure (runtime/reuse.py) ----------

class _ScaledLayer(_Layer):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x, breaks=True):
        h = self.lin(x).relu() * self.scale
        if breaks:
            h = _middle(h)
        return h - self.scale


def _traces_of(codes, run):
    """How many traces of a frame of ``codes`` (or of a resume function cut from one) ``run()`` made."""
    count = [0]
    original = compile_frame.trace_frame

    def counting(fn, *args, **kwargs):
        if CUT_FROM.get(fn.__code__, fn.__code__) in codes:
            count[0] += 1
        return original(fn, *args, **kwargs)

    compile_frame.trace_frame = counting
    try:
        run()
    finally:
        compile_frame.trace_frame = original
    return count[0]


def test_later_layers_frames_are_made_again_not_traced():
    torch.manual_seed(0)
    model = _Stack(3)
    codes = {_Layer.forward.__code__}
    with torch.no_grad():
        found, alone = [], []
        made = _traces_of(codes, lambda: found.append(_compile_and_compare(model)))
        traced = _traces_of(codes, lambda: alone.append(_compile_and_compare(model, remake=False)))
    # the layer's forward and its resume function: traced for the first layer only
    assert made == 2 < traced
    assert found[0].frame_count == alone[0].frame_count
    assert found[0].op_count == alone[0].op_count


def test_layers_that_differ_are_traced_again():
    """A layer whose constant differs (or whose submodule has a hook) is traced; one like a layer
    already compiled is made from that layer's entry; every call equal to eager."""
    torch.manual_seed(0)
    model = _Stack(1)
    model.layers = torch.nn.ModuleList([_ScaledLayer(1.0), _ScaledLayer(2.0), _ScaledLayer(2.0), _ScaledLayer(2.0)])
    model.layers[3].lin.register_forward_hook(lambda m, args, out: out * 3)
    codes = {_ScaledLayer.forward.__code__}
    with torch.no_grad():
        # traced: layers 0 and 1 (forward and resume function each), layer 3's forward (the
        # hook: its resume function reads no hooked module and is made from layer 2's); layer 2 made again
        assert _traces_of(codes, lambda: _compile_and_compare(model)) == 5


def test_other_parameter_shapes_are_traced_again():
    torch.manual_seed(0)
    model = _Stack(1)
    plain, transposed = _Layer(), _Layer()
    transposed.lin.weight = torch.nn.Parameter(torch.randn(4, 4).t())    # another layout, same shape
    model.layers = torch.nn.ModuleList([plain, transposed])
    with torch.no_grad():
        # traced: the first layer's forward and resume function, the second's forward (its
        # resume function reads no parameter and is made from the first's)
        assert _traces_of({_Layer.forward.__code__}, lambda: _compile_and_compare(model)) == 3


# --- remembered fake results ------------------------------------------------------------------

class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)
        self.out = torch.nn.Linear(16, 16)
        self.norm = torch.nn.BatchNorm1d(16)

    def forward(self, x):
        q, k, v = (x @ self.qkv.weight.T + self.qkv.bias).chunk(3, dim=-1)
        q, k, v = (t.view(2, 5, 2, 8).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(2, 5, 16)
        h = self.out(a) + x
        return self.norm(h.transpose(1, 2)).transpose(1, 2)


class _Blocks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Block() for _ in range(3))

    def forward(self, x):
        for b in self.blocks:
            x = b(x) * 0.5
            x = torch.cat([x[:, :1] * 2, x[:, 1:]], dim=1)
        return x.sum(-1)


def _checked_layouts(gm, inputs):
    """Compare each node's fake result with what running the graph on fakes again gives there
    (a remembered result must have the layout the call's own fake run gives); how many."""
    fakes = {n: n.meta.get("example_value") for n in gm.graph.nodes}
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    FakeTensorProp(gm, mode).propagate(*[mode.from_tensor(t) for t in inputs])
    checked = 0
    for n in gm.graph.nodes:
        fake, again = fakes[n], n.meta.get("val")
        if isinstance(fake, torch.Tensor) and isinstance(again, torch.Tensor):
            assert (tuple(fake.shape), tuple(fake.stride()), fake.storage_offset(), fake.dtype) == \
                (tuple(again.shape), tuple(again.stride()), again.storage_offset(), again.dtype), n.format_node()
            checked += 1
    return checked


@pytest.mark.parametrize("training, grad", [(False, False), (True, False), (True, True)])
def test_repeated_calls_get_fake_results_of_the_real_layout(training, grad):
    # (train mode without grad: batch_norm updates its running statistics in place, a call whose
    # result is never reused)
    torch.manual_seed(0)
    model = _Blocks().train(training)
    eager_model = _Blocks().train(training)
    eager_model.load_state_dict(model.state_dict())
    served = [0]
    original = fake_memo.FakeMemo.result

    def counting(self, key):
        out = original(self, key)
        served[0] += out is not None
        return out

    graphs = []

    def backend(gm, example_inputs):
        graphs.append((gm, [t.clone() for t in example_inputs]))
        return gm.forward

    x = torch.randn(2, 5, 16)
    bytegraph.reset()
    fake_memo.FakeMemo.result = counting
    try:
        with torch.set_grad_enabled(grad):
            actual = bytegraph.compile(model, backend=backend, fullgraph=True)(x.clone())
    finally:
        fake_memo.FakeMemo.result = original
    with torch.set_grad_enabled(grad):
        expected = eager_model(x.clone())
    assert_same(expected, actual)
    # the running statistics batch_norm updates in place (training): as eager's
    assert_same(eager_model.state_dict(), model.state_dict(), what="module state")
    if not grad:
        assert served[0] >= 5    # the later blocks repeat the first one's calls
    (gm, inputs), = graphs
    with torch.no_grad():
        assert _checked_layouts(gm, inputs) > 30
