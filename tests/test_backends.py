"""Tests of bytegraph.backends: the registry and the eager / aot_eager / inductor backends.

Graphs are built with torch.fx.symbolic_trace (standing in for the tracer's
output) and given a flat tuple output, as the tracer produces.
"""
import importlib
import os
import subprocess
import sys
import types

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load_registry():
    """Import bytegraph.backends.registry.

    The backends depend only on bytegraph.errors; should another part of the
    package fail to import, the package shell is replaced by a bare one so
    that these tests still exercise the backends alone.
    """
    try:
        importlib.import_module("bytegraph")
    except Exception:
        for key in [k for k in sys.modules if k == "bytegraph" or k.startswith("bytegraph.")]:
            del sys.modules[key]
        shell = types.ModuleType("bytegraph")
        shell.__path__ = [os.path.join(REPO, "bytegraph")]
        sys.modules["bytegraph"] = shell
    return importlib.import_module("bytegraph.backends.registry")


registry = _load_registry()
from bytegraph.errors import BackendError, BytegraphError  # noqa: E402

register_backend = registry.register_backend
lookup_backend = registry.lookup_backend
list_backends = registry.list_backends

BACKENDS = ["eager", "aot_eager", "inductor"]


# ---------------------------------------------------------------- graphs


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 16)
        self.fc3 = torch.nn.Linear(16, 4)

    def forward(self, x):
        x = torch.relu(self.fc1(x))
        x = torch.tanh(self.fc2(x))
        return self.fc3(x)


def pointwise_matmul_reduce(x, y):
    a = torch.sin(x) * 2.0 + torch.cos(y) - x * y
    b = torch.matmul(a, y.t()).relu()
    return a.exp().sum(dim=1), b.mean(), b.amax(dim=0), torch.sigmoid(a).sum()


def traced(root):
    """symbolic_trace ``root`` and make its output a flat tuple, as the tracer's graphs are."""
    gm = torch.fx.symbolic_trace(root)
    out = gm.graph.output_node()
    (result,) = out.args
    if not isinstance(result, (tuple, list)):
        out.args = ((result,),)
        gm.recompile()
    return gm


def compile_with(name, gm, example_inputs):
    compiled = lookup_backend(name)(gm, list(example_inputs))
    assert callable(compiled)
    return compiled


def assert_close_seq(actual, expected):
    assert isinstance(actual, (tuple, list))
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.shape == e.shape and a.dtype == e.dtype
        assert torch.allclose(a, e, rtol=1e-4, atol=1e-5), (a, e)


# ---------------------------------------------------------------- backends


@pytest.mark.parametrize("name", BACKENDS)
def test_mlp_matches_eager(name):
    torch.manual_seed(0)
    model = MLP()
    gm = traced(model)
    x = torch.randn(6, 8)
    compiled = compile_with(name, gm, [x])
    with torch.no_grad():
        expected = (model(x),)
        assert_close_seq(compiled(x), expected)
        x2 = torch.randn(6, 8)  # same shape, new values
        assert_close_seq(compiled(x2), (model(x2),))


@pytest.mark.parametrize("name", BACKENDS)
def test_function_matches_eager(name):
    torch.manual_seed(1)
    gm = traced(pointwise_matmul_reduce)
    x, y = torch.randn(5, 7), torch.randn(5, 7)
    compiled = compile_with(name, gm, [x, y])
    assert_close_seq(compiled(x, y), pointwise_matmul_reduce(x, y))


@pytest.mark.parametrize("name", BACKENDS)
def test_mlp_training_gradients(name):
    torch.manual_seed(2)
    model = MLP()
    gm = traced(model)
    params = dict(model.named_parameters())
    # the GraphModule holds the very same Parameter objects as the model
    for pname, p in gm.named_parameters():
        assert p is params[pname]
    x = torch.randn(4, 8, requires_grad=True)
    target = torch.randn(4, 4)
    compiled = compile_with(name, gm, [x])

    (out,) = compiled(x)
    loss = torch.nn.functional.mse_loss(out, target)
    loss.backward()
    got_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    got_x_grad = x.grad.clone()

    model.zero_grad()
    x.grad = None
    ref_loss = torch.nn.functional.mse_loss(model(x), target)
    ref_loss.backward()

    assert torch.allclose(loss, ref_loss, rtol=1e-5, atol=1e-6)
    for n, p in model.named_parameters():
        assert p.grad is not None
        assert torch.allclose(got_grads[n], p.grad, rtol=1e-4, atol=1e-6), n
    assert torch.allclose(got_x_grad, x.grad, rtol=1e-4, atol=1e-6)

    # a second step (after an in-place parameter update) still sees the same parameters
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
    model.zero_grad()
    (out2,) = compiled(x)
    torch.nn.functional.mse_loss(out2, target).backward()
    grads2 = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    torch.nn.functional.mse_loss(model(x), target).backward()
    for n, p in model.named_parameters():
        assert torch.allclose(grads2[n], p.grad, rtol=1e-4, atol=1e-6), n


def _get_attr_graph():
    """A hand-built graph reading a parameter and a buffer with get_attr nodes."""
    root = torch.nn.Module()
    root.register_parameter("weight", torch.nn.Parameter(torch.randn(4, 3)))
    root.register_buffer("shift", torch.randn(3))
    g = torch.fx.Graph()
    x = g.placeholder("x")
    n = g.placeholder("n")
    s = g.placeholder("s")
    w = g.get_attr("weight")
    b = g.get_attr("shift")
    y = g.call_function(torch.add, (g.call_function(torch.matmul, (x, w)), b))
    z = g.call_function(torch.mul, (g.call_function(torch.mul, (y, n)), s))
    g.output((g.call_method("sum", (z,)), y))
    return root, torch.fx.GraphModule(root, g)


@pytest.mark.parametrize("name", ["eager", "aot_eager"])
def test_get_attr_params_and_scalar_inputs(name):
    torch.manual_seed(3)
    root, gm = _get_attr_graph()
    weight = root.weight
    assert gm.weight is weight
    x = torch.randn(2, 4, requires_grad=True)
    compiled = compile_with(name, gm, [x, 3, 0.5])  # Python int and float inputs pass through
    out = compiled(x, 3, 0.5)
    ref = gm(x, 3, 0.5)
    assert_close_seq(out, ref)
    out[0].backward()
    got = weight.grad.clone()
    weight.grad = None
    ref[0].backward()
    assert torch.allclose(got, weight.grad)
    assert gm.weight is weight


def test_eager_is_the_graph_forward():
    gm = traced(pointwise_matmul_reduce)
    compiled = lookup_backend("eager")(gm, [torch.randn(2, 3), torch.randn(2, 3)])
    # the bound forward itself: no wrapper, no nn.Module.__call__ on each call
    assert compiled == gm.forward
    assert getattr(compiled, "__self__", None) is gm


def test_aot_eager_non_tuple_output_is_regrouped():
    torch.manual_seed(4)
    model = MLP()
    gm = torch.fx.symbolic_trace(model)  # returns a bare tensor, not a tuple
    x = torch.randn(3, 8)
    compiled = lookup_backend("aot_eager")(gm, [x])
    out = compiled(x)
    assert isinstance(out, torch.Tensor)
    assert torch.allclose(out, model(x), atol=1e-6)


def test_aot_eager_outputs_are_a_list_called_positionally():
    gm = traced(pointwise_matmul_reduce)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    compiled = lookup_backend("aot_eager")(gm, [x, y])
    out = compiled(x, y)
    assert isinstance(out, (list, tuple)) and len(out) == 4


def test_compile_failure_is_backend_error():
    def bad(x):
        return (torch.ops.aten.mm(x, x),)  # shapes (2, 3) @ (2, 3) do not match

    gm = torch.fx.symbolic_trace(bad)
    with pytest.raises(BackendError, match="aot_eager"):
        lookup_backend("aot_eager")(gm, [torch.randn(2, 3)])


# ---------------------------------------------------------------- registry


@pytest.fixture
def clean_registry(monkeypatch):
    """Let a test register backends without leaving them behind."""
    monkeypatch.setattr(registry, "_BACKENDS", dict(registry._BACKENDS))
    monkeypatch.setattr(registry, "_TAGS", dict(registry._TAGS))
    return registry


def test_builtin_backends_listed_sorted():
    names = list_backends()
    assert {"eager", "aot_eager", "inductor"} <= set(names)
    assert names == sorted(names)


def test_lookup_builtin_names():
    for name in BACKENDS:
        fn = lookup_backend(name)
        assert callable(fn)
    assert lookup_backend("eager") is lookup_backend("eager")


def test_register_plain_and_lookup(clean_registry):
    def my_backend(gm, example_inputs):
        return gm.forward

    assert register_backend(my_backend) is my_backend
    assert "my_backend" in list_backends()
    assert lookup_backend("my_backend") is my_backend


def test_register_decorator_forms(clean_registry):
    @register_backend
    def deco_bare(gm, example_inputs):
        return gm.forward

    @register_backend(name="deco_named")
    def something_else(gm, example_inputs):
        return gm.forward

    def fn(gm, example_inputs):
        return gm.forward

    assert register_backend(fn, name="called_named") is fn
    assert register_backend(compiler_fn=fn, name="kw_named") is fn
    assert lookup_backend("deco_bare") is deco_bare
    assert lookup_backend("deco_named") is something_else
    assert "something_else" not in list_backends()
    assert lookup_backend("called_named") is fn
    assert lookup_backend("kw_named") is fn


def test_registered_backend_compiles(clean_registry):
    seen = []

    @register_backend(name="counting")
    def counting(gm, example_inputs):
        seen.append((gm, list(example_inputs)))
        return gm.forward

    gm = traced(pointwise_matmul_reduce)
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    compiled = lookup_backend("counting")(gm, [x, y])
    assert_close_seq(compiled(x, y), pointwise_matmul_reduce(x, y))
    assert len(seen) == 1 and seen[0][0] is gm


def test_duplicate_name_raises(clean_registry):
    def one(gm, example_inputs):
        return gm.forward

    def two(gm, example_inputs):
        return gm.forward

    register_backend(one, name="dup")
    register_backend(one, name="dup")  # same function again: fine
    with pytest.raises(BackendError, match="'dup' is already registered"):
        register_backend(two, name="dup")
    with pytest.raises(BackendError, match="already registered"):
        register_backend(two, name="eager")
    assert lookup_backend("dup") is one
    assert lookup_backend("eager") is registry.eager


def test_register_bad_arguments(clean_registry):
    with pytest.raises(BackendError, match="callable"):
        register_backend(42, name="x")
    with pytest.raises(BackendError, match="name"):
        register_backend(lambda gm, ex: gm.forward, name="")

    class NoName:
        def __call__(self, gm, example_inputs):
            return gm.forward

    with pytest.raises(BackendError, match="name="):
        register_backend(NoName())
    inst = NoName()
    assert register_backend(inst, name="instance_backend") is inst


def test_tags_filter_listing(clean_registry):
    @register_backend(name="debug_thing", tags=("debug",))
    def debug_thing(gm, example_inputs):
        return gm.forward

    assert "debug_thing" not in list_backends()
    assert "debug_thing" in list_backends(exclude_tags=None)
    assert "debug_thing" in list_backends(exclude_tags=())
    assert lookup_backend("debug_thing") is debug_thing


def test_unknown_backend_lists_known_names():
    with pytest.raises(BackendError) as info:
        lookup_backend("foo")
    msg = str(info.value)
    assert "unknown backend 'foo'" in msg
    assert "known backends:" in msg
    for name in BACKENDS:
        assert name in msg
    assert isinstance(info.value, BytegraphError)


def test_callable_backend_used_as_is():
    def custom(gm, example_inputs):
        return gm.forward

    assert lookup_backend(custom) is custom


@pytest.mark.parametrize("bad", [42, None, 3.5, ["eager"]])
def test_non_callable_backend_names_type(bad):
    with pytest.raises(BackendError, match=type(bad).__name__):
        lookup_backend(bad)


@pytest.mark.parametrize("name", ["eager", "aot_eager"])
def test_mode_and_options_only_for_inductor(name):
    with pytest.raises(BackendError, match="only apply to the inductor"):
        lookup_backend(name, mode="max-autotune")
    with pytest.raises(BackendError, match="only apply to the inductor"):
        lookup_backend(name, options={"max_autotune": True})
    with pytest.raises(BackendError, match="only apply to the inductor"):
        lookup_backend(lambda gm, ex: gm.forward, mode="reduce-overhead")
    # the default mode and no options are fine everywhere
    assert lookup_backend(name, mode="default") is lookup_backend(name)
    assert lookup_backend(name, mode=None, options={}) is lookup_backend(name)


def test_unknown_mode_and_bad_options_type():
    with pytest.raises(BackendError, match="unknown mode 'fast'"):
        lookup_backend("inductor", mode="fast")
    with pytest.raises(BackendError, match="options must be a dict"):
        lookup_backend("inductor", options=[("max_autotune", True)])


def test_inductor_option_validation():
    with pytest.raises(BackendError, match="not_a_real_option"):
        lookup_backend("inductor", options={"not_a_real_option": 1})
    with pytest.raises(BackendError, match="max_autotune"):
        lookup_backend("inductor", options={"max_autotune": "yes"})
    fn = lookup_backend("inductor", options={"max-autotune": True, "triton.cudagraphs": False})
    assert fn.keywords["config_patches"] == {"max_autotune": True, "triton.cudagraphs": False}


def test_inductor_mode_maps_to_options():
    from torch._inductor import list_mode_options

    for mode in ("reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"):
        fn = lookup_backend("inductor", mode=mode)
        assert fn.keywords["config_patches"] == list_mode_options(mode)
    assert lookup_backend("inductor", mode="default") is registry.inductor


def test_inductor_settings_reach_compile_fx(monkeypatch):
    import torch._inductor.compile_fx as compile_fx_module

    calls = []

    def fake_compile_fx(gm, example_inputs, config_patches=None, **kwargs):
        calls.append(config_patches)
        return gm.forward

    monkeypatch.setattr(compile_fx_module, "compile_fx", fake_compile_fx)
    gm = traced(pointwise_matmul_reduce)
    ex = [torch.randn(2, 3), torch.randn(2, 3)]
    lookup_backend("inductor", options={"max_autotune": True})(gm, ex)
    lookup_backend("inductor")(gm, ex)
    assert calls == [{"max_autotune": True}, None]


def test_registry_import_is_cheap():
    code = (
        "import sys, types, torch\n"
        f"pkg = types.ModuleType('bytegraph'); pkg.__path__ = [{os.path.join(REPO, 'bytegraph')!r}]\n"
        "sys.modules['bytegraph'] = pkg\n"
        "import bytegraph.backends.registry as r\n"
        "heavy = [m for m in ('torch._inductor', 'torch._functorch.aot_autograd', 'torch._dynamo')"
        " if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert {'eager', 'aot_eager', 'inductor'} <= set(r.list_backends())\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""


# ---------------------------------------------------------------- global state across a compile

def _state():
    return (torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"),
            torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled())


def _leaves_state_behind(gm, example_inputs):
    """A backend that draws random numbers (as kernel benchmarking does) and leaves the state a
    compile that failed inside a ``with torch.autocast`` block would: autocast on, grad off."""
    torch.rand(7)
    torch.set_autocast_enabled("cpu", True)
    torch.set_autocast_dtype("cpu", torch.float16)
    torch._C._set_grad_enabled(False)
    torch.set_default_dtype(torch.float64)
    return gm.forward


def test_the_program_goes_on_in_the_state_a_backend_found():
    import bytegraph
    from bytegraph.testing import CompileCounter

    def step(x, w):
        y = (x @ w).relu()
        return y.sum(), torch.rand(3)      # reads the generator the backend drew from

    counter = CompileCounter(_leaves_state_behind)
    compiled = bytegraph.compile(step, backend=counter)
    before = _state()
    try:
        for _ in range(3):
            x, w = torch.randn(4, 4), torch.randn(4, 4, requires_grad=True)
            torch.manual_seed(1)
            expected = step(x, w), torch.randn(2), (torch.ones(2) / 3).dtype
            torch.manual_seed(1)
            got = compiled(x, w), torch.randn(2), (torch.ones(2) / 3).dtype
            assert _state() == before
            assert torch.equal(got[0][0], expected[0][0]) and got[0][0].requires_grad
            assert torch.equal(got[0][1], expected[0][1]) and torch.equal(got[1], expected[1])
            assert got[2] == expected[2] == torch.float32
        assert counter.frame_count == 1     # no second compile for a state the backend left
    finally:
        torch.set_autocast_enabled("cpu", before[1])
        torch.set_autocast_dtype("cpu", before[2])
        torch._C._set_grad_enabled(before[0])
        torch.set_default_dtype(before[3])


def test_inductors_first_use_work_runs_once_in_a_thread_that_the_compile_waits_for(monkeypatch):
    """On a GPU, building Triton's driver and hashing Triton's files (part of Inductor's first
    use) run in one thread per process, started by the first graph; ``compile_fx`` waits for it
    (``first_use_work_done``) before reading what it computed."""
    import threading
    from bytegraph.backends import inductor as inductor_backend
    monkeypatch.setattr(inductor_backend, "_first_use", [])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(importlib.import_module("torch.utils._triton"), "has_triton", lambda: True)
    gate, done = threading.Event(), []

    def work():
        gate.wait(10)
        done.append(threading.current_thread().name)
    monkeypatch.setattr(inductor_backend, "_first_use_work", work)
    inductor_backend.start_first_use_work()
    inductor_backend.start_first_use_work()
    assert len(inductor_backend._first_use) == 1 and done == []
    gate.set()
    inductor_backend.first_use_work_done()
    assert done == ["bytegraph-inductor-first-use"]
