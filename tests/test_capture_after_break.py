"""Capture after a graph break: the code that runs after a break is compiled too.

A break met inside inlined calls splits every frame on the way; the callee's remainder and the
functions called from code that then runs natively (user functions, module forwards, a module's
forward under its hooks, ``functools.partial``, callable objects, a custom autograd Function's
forward) are compiled as frames of their own, as torch.compile's frame hook compiles them. Each
test compares the compiled result with eager's and the ops that run inside graphs during a call
with torch.compile's (the reference, counted by the same kind of backend).
"""
import functools
import os

import pytest
import torch

import bytegraph
from bytegraph.debug import records
from bytegraph.debug.counting import count_ops
from bytegraph.testing import CompileCounter, same
import generated_breaks


def RunCounter():
    """A backend that counts its graphs and the ops (``count_ops``) of the graphs that run (``ran``)."""
    return generated_breaks.RunCounter(count_ops)


def _second_call(compile_fn, fn, args, reset):
    reset()
    counter = RunCounter()
    compiled = compile_fn(fn, counter)
    first = compiled(*args)
    counter.ran = 0
    second = compiled(*args)
    reset()
    return first, second, counter


def ops_in_graphs(fn, *args):
    """(bytegraph's results of two calls, ops its graphs ran in the second, torch.compile's count)."""
    import torch._dynamo
    first, second, bg = _second_call(lambda f, b: bytegraph.compile(f, backend=b), fn, args, bytegraph.reset)
    _, _, tc = _second_call(lambda f, b: torch.compile(f, backend=b), fn, args, torch._dynamo.reset)
    return (first, second), bg, tc


def check_captured(fn, *args, rtol=1e-5, atol=1e-6):
    """fn compiled equals eager on two calls and runs at least torch.compile's ops in graphs."""
    expected = fn(*args)
    (first, second), bg, tc = ops_in_graphs(fn, *args)
    assert same(expected, first, rtol=rtol, atol=atol)
    assert same(expected, second, rtol=rtol, atol=atol)
    assert bg.ran >= tc.ran, f"ops run in graphs: bytegraph {bg.ran}, torch.compile {tc.ran}"
    return bg, tc


def _no_eager_frames():
    return [r.name for r in records.frames if r.fallback_reason]


# --- a break inside inlined calls --------------------------------------------------------------

def _positive(t):
    return bool(t.sum().item() > -1e9)     # breaks: .item()


def _level3(x):
    y = x.sin() * 2
    if _positive(y):
        y = y + 1
    return y.cos() - y.exp().mean()


def _level2(x):
    h = x.relu() + 1
    h = _level3(h) * h
    return h.tanh() + h.sum(0, keepdim=True)


def _level1(x):
    a = x @ x.t()
    b = _level2(a)
    return (b.softmax(-1) * 3).log1p()


def test_break_three_calls_deep_resumes_every_level():
    bg, tc = check_captured(_level1, torch.randn(5, 5))
    assert bg.ran >= 15     # the work after the break at each level is in graphs


def test_each_level_of_a_nested_break_is_traced_once(monkeypatch):
    # The first trace saw where every level stands: each callee is then traced once, stopping
    # before its call of the next level (a break hint), not once to the break and once to stop;
    # the compiled frame itself stops at the break without a second trace.
    from bytegraph.runtime import compile_frame
    traced = []
    original = compile_frame._Compile.trace

    def counting(self, values, stop_before=None):
        traced.append(self.name)
        return original(self, values, stop_before)
    monkeypatch.setattr(compile_frame._Compile, "trace", counting)
    x = torch.randn(5, 5)
    assert same(_level1(x), bytegraph.compile(_level1, backend="eager")(x))
    # _level1: once, to the break; it is given back its state before _level2(a) (a checkpoint,
    # trace/machine/checkpoint.py) instead of being traced again to stop there.
    assert traced.count("_level1") == 1
    assert traced.count("_level2") == 1 and traced.count("_level3") == 1 and traced.count("_positive") == 1


class _Block(torch.nn.Module):
    def __init__(self, breaks):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.breaks = breaks

    def forward(self, x):
        h = self.lin(x).relu()
        if self.breaks and h.max().item() > 1e9:   # data-dependent: a break
            h = h * 0
        return self.norm(h + x) * 2


class _Stack(torch.nn.Module):
    def __init__(self, pattern):
        super().__init__()
        self.layers = torch.nn.ModuleList([_Block(b) for b in pattern])
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x):
        x = x * 1.5
        for i, layer in enumerate(self.layers):
            x = layer(x) + i
        return self.head(x).sigmoid()


@pytest.mark.parametrize("pattern", [(True, True, True), (False, True, False, True)])
def test_break_inside_an_enumerate_loop_over_layers_resumes_the_loop(pattern):
    # The loop's enumerate iterator is handed to the resume function, which keeps unrolling it:
    # the frame is split, not run eagerly as a whole.
    torch.manual_seed(0)
    model = _Stack(pattern).eval()
    with torch.no_grad():
        check_captured(model, torch.randn(4, 8))
    assert not _no_eager_frames()


def _loop_over_list(xs, w):
    total = w.sum()
    for x in xs:
        x = x @ w
        if _positive(x):
            x = x.relu()
        total = total + x.sum() * 2
    return total.sin()


def test_loop_over_a_list_keeps_being_traced_after_each_break():
    xs = [torch.randn(3, 3) for _ in range(4)]
    check_captured(_loop_over_list, xs, torch.randn(3, 3))
    assert not _no_eager_frames()


# --- what the native step calls is compiled -----------------------------------------------------

def test_module_with_hooks_called_at_a_break_has_its_forward_compiled():
    calls = []
    block = _Block(True)
    block.register_forward_hook(lambda m, args, out: calls.append(1))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), block, torch.nn.Tanh())

    def f(x):
        return model(x) * 2
    x = torch.randn(4, 8)
    expected = f(x)
    assert len(calls) == 1
    (first, second), bg, tc = ops_in_graphs(f, x)
    assert same(expected, first) and same(expected, second)
    assert len(calls) == 5      # once per call: eager, then two calls under each compiler
    assert bg.ran >= tc.ran
    # the block's own work after its break ran in a graph
    assert bg.ran >= 5


class _Scaler:
    def __init__(self, k):
        self.k = k

    def __call__(self, x):
        y = x * self.k
        if _positive(y):
            y = y.exp()
        return y.sum(-1).sqrt() + self.k


def _scaled(x, y, k):
    return (x + 1) * y.cos() - k


def test_callable_object_and_partial_at_a_break_are_compiled():
    scale = _Scaler(0.5)
    part = functools.partial(_scaled, k=3.0)

    def f(x):
        a = scale(x.abs())
        b = part(a, _positive(a) and a)
        return b.tanh()
    check_captured(f, torch.randn(4, 6))


# --- custom autograd Functions ---------------------------------------------------------------------

class _Chain(torch.autograd.Function):
    """Runs modules given as an argument; records outputs in a list it is given."""

    @staticmethod
    def forward(ctx, x, layers, seen, scale):
        for layer in layers:
            x = layer(x) * scale
            seen.append(x)
        ctx.layers = layers
        ctx.save_for_backward(x)
        return x.relu()

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_tensors
        return g * (out > 0), None, None, None


def test_function_apply_with_modules_lists_and_floats_without_grad_is_traced_inline():
    torch.manual_seed(0)
    layers = torch.nn.ModuleList([torch.nn.Linear(6, 6) for _ in range(3)])

    def f(x):
        seen = []
        y = _Chain.apply(x + 1, layers, seen, 0.5)
        return y * 2, len(seen), seen[-1]
    x = torch.randn(3, 6)
    with torch.no_grad():
        bg, tc = check_captured(f, x)
    assert bg.graphs == 1


def test_function_apply_returning_its_input_gives_an_alias_as_eager():
    class Identity(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, k):
            return x, x * k

        @staticmethod
        def backward(ctx, a, b):
            return a, None

    def f(x):
        a, b = Identity.apply(x, 2.0)
        return a, b + 1
    x = torch.randn(4)
    cnt = CompileCounter()
    with torch.no_grad():
        expected = f(x)
        actual = bytegraph.compile(f, backend=cnt)(x)
    assert same(expected, actual)
    assert cnt.frame_count == 1       # the forward traced into f's graph (torch.compile: 1)
    assert expected[0] is not x and expected[0]._base is x
    assert actual[0] is not x and actual[0]._base is x


class _Recompute(torch.autograd.Function):
    """Like Reformer's reversible layers: the backward runs the modules again under
    enable_grad and differentiates them itself (not traceable), the forward reads a module."""

    @staticmethod
    def forward(ctx, x, layer):
        ctx.layer = layer
        ctx.save_for_backward(x)
        h = layer(x)
        return (h.tanh() * 2 + h.sigmoid()).sum(-1)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            h = ctx.layer(x)
            out = (h.tanh() * 2 + h.sigmoid()).sum(-1)
            torch.autograd.backward(out, g)
        return x.grad, None


def test_function_apply_that_breaks_runs_its_forward_compiled_with_eager_gradients():
    torch.manual_seed(0)
    layer = torch.nn.Linear(5, 5)
    ref_layer = torch.nn.Linear(5, 5)
    ref_layer.load_state_dict(layer.state_dict())

    def f(x, layer):
        return (_Recompute.apply(x * 2, layer) + 1).pow(2).sum()
    x = torch.randn(3, 5, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    expected = f(x_ref, ref_layer)
    expected.backward()
    cnt = RunCounter()
    actual = bytegraph.compile(f, backend=cnt)(x, layer)
    actual.backward()
    assert torch.allclose(expected, actual)
    assert torch.allclose(x_ref.grad, x.grad)
    for p, q in zip(ref_layer.parameters(), layer.parameters()):
        assert torch.allclose(p.grad, q.grad)
    # the forward's ops (linear, tanh, mul, sigmoid, add, sum) ran in a graph of its own
    assert cnt.ran >= 8, cnt.ran


class _ThroughModules(torch.autograd.Function):
    """Takes a module, a ModuleList and a config object; its backward reads the module."""

    @staticmethod
    def forward(ctx, x, layer, layers, cfg):
        h = layer(x) * cfg.scale
        for sub in layers:
            h = sub(h).tanh()
        ctx.layer = layer
        ctx.save_for_backward(x)
        return h * 2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g.sum(-1, keepdim=True) * ctx.layer.weight.sum(0) + x * 0, None, None, None


class _Config:
    scale = 0.5


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_function_apply_with_module_arguments_is_traced_with_its_backward(backend):
    from bytegraph.backends.registry import lookup_backend
    from bytegraph.testing import CompileCounter
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 4)
    layers = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(2)])
    cfg = _Config()

    def f(x):
        return _ThroughModules.apply(x * 2, layer, layers, cfg).pow(2).sum()
    x = torch.randn(3, 4, requires_grad=True)
    x_c = x.detach().clone().requires_grad_()
    expected = f(x)
    expected.backward()
    cnt = CompileCounter(lookup_backend(backend))
    actual = bytegraph.compile(f, backend=cnt, fullgraph=True)(x_c)
    actual.backward()
    assert cnt.frame_count == 1
    assert torch.allclose(expected, actual) and torch.allclose(x.grad, x_c.grad)
    # forward runs under no_grad in eager: the modules' parameters get no gradient through it
    assert all(p.grad is None for p in list(layer.parameters()) + list(layers.parameters()))


# --- Module.to inside forward ---------------------------------------------------------------------

def test_submodule_to_in_forward_is_traced():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 4)
            self.inner = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())

        def forward(self, x):
            self.inner.to(x.dtype)        # changes nothing: Module._apply sets p.data = p
            return self.inner(self.a(x)).sum(-1)
    model = Model()
    x = torch.randn(3, 4)
    expected = model(x)
    cnt = RunCounter()
    compiled = bytegraph.compile(model, backend=cnt)
    assert same(expected, compiled(x)) and same(expected, compiled(x))
    # One graph with the model's work (torch.compile's also holds the .to() bookkeeping of each
    # parameter: more nodes, the same computation).
    assert cnt.graphs == 1 and cnt.ran >= 2 * 4, (cnt.graphs, cnt.ran)


# --- 0-d integer tensors used as numbers ----------------------------------------------------------

def _sizes_from_a_count(x, n):
    # n: a 0-d int64 tensor (a count computed by an earlier graph, e.g. before a break)
    rest = x.size(1) - n
    y = x.new_zeros(2, n * 2 + 1) + 1
    return x.narrow(1, n, rest).exp() * 2, torch.arange(n).float().sum() + y.sum(), x.view(n, -1).sum()


def test_int_tensor_input_used_as_a_size_keeps_one_graph():
    x = torch.randn(4, 6)
    cnt = RunCounter()
    compiled = bytegraph.compile(_sizes_from_a_count, backend=cnt)
    for value in (2, 4, 2, 1):
        n = torch.tensor(value)
        assert same(_sizes_from_a_count(x, n), compiled(x, n)), value
    assert not [r for r in records.frames if r.break_reason or r.fallback_reason]


def test_int_tensor_input_written_by_the_graph_before_its_use_still_breaks():
    def f(x, n):
        n.add_(1)           # the number read before the graph would be stale: a break, as before
        return x.new_zeros(n, 2) + x.sum()
    x = torch.randn(3)
    expected = f(x, torch.tensor(2))
    n = torch.tensor(2)
    assert same(expected, bytegraph.compile(f, backend="eager")(x, n))
    assert n.item() == 3
    assert any("needs a tensor's value" in (r.break_reason or "") for r in records.frames)


# --- HF models that break (transformers) ----------------------------------------------------------

@pytest.mark.parametrize("name", ["longformer", "reformer"])
def test_hf_model_that_breaks_captures_as_much_as_torch_compile(name):
    pytest.importorskip("transformers")
    from bytegraph.demo.hf_models import build, inputs
    model = build(name).eval()
    kw = inputs(name, use_cache=True)

    def run(**kwargs):
        return model(**kwargs)

    import torch._dynamo
    with torch.no_grad():
        expected = model(**kw)
        results = {}
        for engine in ("bg", "tc"):
            reset = bytegraph.reset if engine == "bg" else torch._dynamo.reset
            reset()
            counter = RunCounter()
            compiled = bytegraph.compile(model, backend=counter) if engine == "bg" else \
                torch.compile(model, backend=counter)
            first = compiled(**kw)
            counter.ran = 0
            second = compiled(**kw)
            reset()
            results[engine] = (first, second, counter)
    first, second, bg = results["bg"]
    assert same(expected, first, rtol=1e-4, atol=1e-5) and same(expected, second, rtol=1e-4, atol=1e-5)
    tc = results["tc"][2]
    assert bg.ran >= 0.95 * tc.ran, f"ops run in graphs per call: bytegraph {bg.ran}, torch.compile {tc.ran}"


# --- the generated family (tests/generated_breaks.py) ---------------------------------------------

_GEN_SEEDS = int(os.environ.get("BYTEGRAPH_GEN_SEEDS", 16))


@pytest.mark.parametrize("seed", range(_GEN_SEEDS))
def test_generated_program_breaking_in_callees_captures_the_resumed_work(seed):
    generated_breaks.run_seed(seed)


@pytest.mark.parametrize("name", ["longformer", "reformer"])
def test_hf_model_that_breaks_trains_as_eager(name):
    # aot_eager over every graph; Reformer's reversible Function (a backward that re-runs its
    # layers under enable_grad) runs natively with its forward compiled.
    pytest.importorskip("transformers")
    from bytegraph.backends.registry import lookup_backend
    from bytegraph.demo.hf_models import build, inputs, loss_of
    eager_model = build(name).train()
    compiled_model = build(name).train()
    compiled_model.load_state_dict(eager_model.state_dict())
    kw = inputs(name, labels=True)
    eager_loss = loss_of(eager_model(**kw))
    eager_loss.backward()
    cnt = CompileCounter(lookup_backend("aot_eager"))
    loss = loss_of(bytegraph.compile(compiled_model, backend=cnt)(**kw))
    loss.backward()
    # trained through compiled graphs (how many, against torch.compile, is the test above's point)
    assert cnt.frame_count >= 1
    assert torch.allclose(eager_loss, loss, rtol=1e-4, atol=1e-5)
    eager_params = dict(eager_model.named_parameters())
    for pname, p in compiled_model.named_parameters():
        ref = eager_params[pname].grad
        assert (ref is None) == (p.grad is None), pname
        if ref is not None:
            assert torch.allclose(ref, p.grad, rtol=1e-3, atol=1e-5), pname
