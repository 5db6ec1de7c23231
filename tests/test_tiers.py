"""Two tiers (backends/tiers.py): a training graph compiled with shared blocks is called as such
until a child process has compiled it whole; then this process compiles it from the caches the
child filled, and calls use that. Results and gradients stay eager's all along.

Tiers are for GPUs; these tests take the GPU's rule on the CPU (``regions.on_cuda`` patched),
where Inductor makes C++ instead of Triton kernels."""
import copy
import os
import sys

import pytest
import torch
import torch.fx as fx

import bytegraph
from bytegraph.backends import inductor as inductor_backend
from bytegraph.backends import regions, tiers
from bytegraph.demo.models import GPTConfig, TinyGPT
from helpers import assert_same

INVOKE = torch.ops.higher_order.invoke_subgraph


def gpt(n_layer):
    torch.manual_seed(0)
    return TinyGPT(GPTConfig(n_layer=n_layer, n_embd=32, n_head=4, block_size=8, vocab_size=64, dropout=0.0))


def captured(model, x):
    """The graph bytegraph captures for ``model(x)`` and its example inputs."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm.forward
    bytegraph.compile(model, backend=backend)(x)
    bytegraph.reset()
    (graph,) = graphs
    return graph


def code_of(gm):
    """The graph's code without the comments naming the user's source lines."""
    return "\n".join(line for line in gm.code.splitlines() if not line.strip().startswith("#"))


# --- writing a graph down ------------------------------------------------------------------------

def test_a_written_down_graph_builds_the_same_graph_with_the_same_tensors():
    model = gpt(2)
    x = torch.randint(0, 64, (2, 8))
    gm, examples = captured(model, x)
    record = tiers.GraphRecord(gm, examples)
    rebuilt = record.build(record.state_tensors)
    assert code_of(rebuilt) == code_of(gm)
    # The rebuilt graph reads the model's own parameters (gradients land on them).
    params = {id(p) for p in model.parameters()}
    assert {id(p) for p in rebuilt.parameters()} <= params and len(list(rebuilt.parameters())) > 0
    assert_same(gm(*examples), rebuilt(*examples))
    # Through pickle (as the child gets it): the same graph again, with fakes for the tensors.
    again = tiers._loads(tiers._dumps(record))
    mode = tiers._fake_mode()
    fake_state = [spec.fake(mode) for spec in again.state_specs]
    assert code_of(again.build(fake_state)) == code_of(gm)
    for spec, real in zip(again.state_specs, record.state_tensors):
        fake = spec.fake(mode)
        assert (fake.shape, fake.stride(), fake.dtype, fake.requires_grad) == \
            (real.shape, real.stride(), real.dtype, real.requires_grad)
        assert isinstance(fake, torch.nn.Parameter) == isinstance(real, torch.nn.Parameter)


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, i):
        return self.head(self.emb(i) * 2)


def test_tied_weights_stay_one_tensor():
    model = Tied()
    gm, examples = captured(model, torch.randint(0, 16, (2, 3)))
    record = tiers.GraphRecord(gm, examples)
    assert len(record.state_specs) == 1
    rebuilt = record.build([spec.fake(tiers._fake_mode()) for spec in record.state_specs])

    def distinct(module):
        return len({id(getattr(*tiers._owner(module, n.target))) for n in module.graph.nodes if n.op == "get_attr"})
    assert distinct(rebuilt) == distinct(gm) == 1


def _graph(build):
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output(build(graph, x))
    return graph


def test_graphs_that_cannot_be_written_down_are_refused_with_the_reason():
    x = torch.randn(3)
    lam = lambda t: t + 1                                              # noqa: E731
    gm = fx.GraphModule(torch.nn.Module(), _graph(lambda g, x: g.call_function(lam, (x,))))
    with pytest.raises(tiers.NotRecordable, match="not importable"):
        tiers.GraphRecord(gm, [x])
    gm = fx.GraphModule(torch.nn.Module(), _graph(lambda g, x: g.call_function(torch.add, (x, torch.ones(3)))))
    with pytest.raises(tiers.NotRecordable, match="Tensor in the graph"):
        tiers.GraphRecord(gm, [x])
    root = torch.nn.Module()
    root.lin = torch.nn.Linear(3, 3)
    gm = fx.GraphModule(root, _graph(lambda g, x: g.call_module("lin", (x,))))
    with pytest.raises(tiers.NotRecordable, match="submodule call"):
        tiers.GraphRecord(gm, [x])
    base = torch.randn(6)
    gm = fx.GraphModule(torch.nn.Module(), _graph(lambda g, x: g.call_function(torch.add, (x, x))))
    graph = fx.Graph()
    a, b = graph.placeholder("a"), graph.placeholder("b")
    graph.output(graph.call_function(torch.add, (a, b)))
    with pytest.raises(tiers.NotRecordable, match="share memory"):
        tiers.GraphRecord(fx.GraphModule(torch.nn.Module(), graph), [base.view(2, 3), base.view(3, 2)])
    with pytest.raises(tiers.NotRecordable, match="starting inside its storage"):
        tiers.GraphRecord(gm, [base[3:]])
    with pytest.raises(tiers.NotRecordable, match="input of type"):
        tiers.GraphRecord(gm, [object()])


class ClippedMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return (x @ w.t()).clamp(-1, 1)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        g = g * 0.5           # not the true gradient: a rebuilt backward that is not this one shows
        return g @ w, g.t() @ x


class CustomMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(32, 64)
        self.b = torch.nn.Linear(64, 32)

    def forward(self, x):
        return ClippedMatmul.apply(torch.relu(self.a(x)), self.b.weight) + self.b.bias


def float8_mlp():
    pytest.importorskip("torchao")
    from torchao.float8 import convert_to_float8_training
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
    return convert_to_float8_training(model)


@pytest.mark.parametrize("make", [CustomMLP, float8_mlp])
def test_a_custom_autograd_function_is_written_down_with_its_forward_and_backward(make):
    # Float8 training calls torchao's autograd Function, whose traced graphs make
    # Float8TrainingTensors: both go to the child as graphs written down.
    torch.manual_seed(0)
    model = make()
    x = torch.randn(16, 32)
    gm, examples = captured(model, x)
    assert any(getattr(type(n.target), "carried_by_value", False) for n in gm.graph.nodes)
    record = tiers.GraphRecord(gm, examples)
    again = tiers._loads(tiers._dumps(record))
    rebuilt = again.build(record.state_tensors)
    assert code_of(rebuilt) == code_of(gm)
    params = list(model.parameters())

    def run(graph):
        (out,) = graph(*examples)
        return [out] + list(torch.autograd.grad(out.square().sum(), params))
    for got, want in zip(run(rebuilt), run(model_call(model, x))):
        assert_same(want, got)
    # With fakes, as the child compiles it: AOTAutograd traces forward and backward through it.
    from torch._functorch.aot_autograd import aot_module_simplified
    mode = tiers._fake_mode()
    graphs = []

    def keep(g, _):
        graphs.append(g)
        return g
    with torch._functorch.config.patch(force_non_lazy_backward_lowering=True):
        aot_module_simplified(again.build([spec.fake(mode) for spec in again.state_specs]), again.fake_inputs(mode),
                              fw_compiler=keep, bw_compiler=keep)
    assert len(graphs) == 2


def model_call(model, x):
    return lambda *_: (model(x),)


def test_a_graph_a_node_calls_may_not_hold_tensors():
    inner = fx.GraphModule({"w": torch.randn(3)}, _graph(lambda g, x: g.call_function(torch.mul, (x, g.get_attr("w")))))
    from bytegraph.graph.higher_order import AutogradFunctionCall, FunctionPlan
    call = AutogradFunctionCall(FunctionPlan(inner, inner, 1, (), 1, 0, 0, "f"))
    gm = fx.GraphModule(torch.nn.Module(), _graph(lambda g, x: g.call_function(call, (x,))))
    with pytest.raises(tiers.NotRecordable, match="a graph called by a node reads w"):
        tiers.GraphRecord(gm, [torch.randn(3)])


# --- the switch ----------------------------------------------------------------------------------

class _Later:
    """A stand-in WholeLater whose child runs ``code`` instead of a compile."""

    def __init__(self, code, compiled=None):
        self.record = type("R", (), {"state_tensors": []})()
        self.config_patches, self.settings, self.compile_whole = {}, {}, None
        self.source = None
        self.code = code
        self.compiled = compiled

    def job(self):
        return self.code.encode()

    def finish(self, compiled):
        return compiled


def stand_in_child(monkeypatch, compiled):
    """Children run ``python -c <job>``; this process's compile from the caches returns ``compiled``."""
    real_popen = tiers.subprocess.Popen

    def popen(cmd, **kwargs):
        code = open(cmd[-1]).read()
        return real_popen([sys.executable, "-c", code], **kwargs)
    monkeypatch.setattr(tiers.subprocess, "Popen", popen)
    monkeypatch.setattr(tiers, "compile_record", lambda *a, **k: compiled())


def test_quick_until_the_child_ends_then_whole(monkeypatch):
    stand_in_child(monkeypatch, lambda: (lambda x: ("whole", x)))
    tiered = tiers.tiered(lambda x: ("quick", x), _Later("import time; time.sleep(1)"), "test")
    assert tiered(1) == ("quick", 1)
    assert tiered._child is None                  # the first call starts nothing
    assert tiered(2) == ("quick", 2)              # the second starts the child
    assert tiered._child is not None
    assert tiered(3) == ("quick", 3)              # still compiling
    assert bytegraph.wait_for_background_compiles(60)
    assert tiered(4) == ("whole", 4)
    assert tiered.whole is not None and tiered.error is None and tiered.switch_seconds is not None


def test_a_failed_child_keeps_the_quick_compile_and_says_why(monkeypatch, caplog):
    stand_in_child(monkeypatch, lambda: (lambda x: "never"))
    tiered = tiers.tiered(lambda x: x + 1, _Later("raise SystemExit('no whole graph today')"), "failing")
    with caplog.at_level("WARNING", logger="bytegraph.regions"):
        assert [tiered(i) for i in range(3)] == [1, 2, 3]
        assert bytegraph.wait_for_background_compiles(60)
        assert tiered(10) == 11
    assert tiered.whole is None and "exited with 1" in tiered.error and "no whole graph today" in tiered.error
    assert "failing: not compiled whole in the background" in caplog.text


def test_a_failed_compile_here_keeps_the_quick_compile(monkeypatch):
    def fails():
        raise RuntimeError("cache entry unreadable")
    stand_in_child(monkeypatch, fails)
    tiered = tiers.tiered(lambda x: x * 2, _Later("pass"), "failing here")
    assert tiered(1) == 2 and tiered(2) == 4
    assert bytegraph.wait_for_background_compiles(60)
    assert tiered(3) == 6 and "cache entry unreadable" in tiered.error


def test_children_beyond_the_limit_wait_for_a_free_one(monkeypatch):
    stand_in_child(monkeypatch, lambda: (lambda x: "whole"))
    monkeypatch.setattr(tiers, "MAX_CHILDREN", 1)
    first = tiers.tiered(lambda x: "quick", _Later("import time; time.sleep(1)"), "first")
    second = tiers.tiered(lambda x: "quick", _Later("pass"), "second")
    first(0), first(0), second(0), second(0)
    assert first._child is not None and second._child is None
    assert bytegraph.wait_for_background_compiles(60)
    assert (first(0), second(0)) == ("whole", "whole")


# --- through the inductor backend ----------------------------------------------------------------

@pytest.fixture
def gpu_rule(monkeypatch, tmp_path):
    monkeypatch.setattr(regions, "on_cuda", lambda gm: True)
    # Caches of this test's own: a whole compile noted there by another test (or an earlier run)
    # would be taken straight from the caches, with no tiers.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


def train_steps(model, compiled, x, steps, lr=0.1):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = compiled(x).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return losses


def cache_counts(counters):
    aot, fx = counters["aot_autograd"], counters["inductor"]
    return {"hit": aot["autograd_cache_hit"] + fx["fxgraph_cache_hit"],
            "miss": aot["autograd_cache_miss"] + fx["fxgraph_cache_miss"]}


def test_a_training_model_switches_to_the_whole_graph_from_the_caches_and_trains_like_eager(gpu_rule):
    from torch._dynamo.utils import counters      # torch's own cache counters, read here only
    model = gpt(3).train()
    reference = copy.deepcopy(model)
    x = torch.randint(0, 64, (2, 8))
    made = []
    real_tiered = tiers.tiered
    # A thread count the child would not pick by itself (Inductor's key reads it).
    threads = torch.get_num_threads()
    torch.set_num_threads((os.cpu_count() or 1) + 1)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(inductor_backend.tiers, "tiered", lambda *a: made.append(real_tiered(*a)) or made[-1])
            compiled = bytegraph.compile(model, backend="inductor")
            before = train_steps(model, compiled, x, 3)
            counts = cache_counts(counters)
            aot_hits = counters["aot_autograd"]["autograd_cache_hit"]
            assert bytegraph.wait_for_background_compiles(300)
            after = train_steps(model, compiled, x, 3)
    finally:
        torch.set_num_threads(threads)
    expected = train_steps(reference, reference, x, 6)
    for got, want in zip(before + after, expected):
        assert_same(want, got, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.allclose(p, q, atol=1e-5), name
    (tiered,) = made
    assert tiered.error is None and tiered.whole is not None and tiered.call is tiered.whole
    # This process found the child's compile in the caches (AOTAutograd's, or Inductor's where
    # AOTAutograd bypasses its own): nothing missed while it switched, something was hit.
    now = cache_counts(counters)
    assert (now["miss"], now["hit"] > counts["hit"]) == (counts["miss"], True), (counts, now)
    # AOTAutograd's own cache answered (the graph's call_method nodes carry example values), so
    # the switch did not trace the graph through AOTAutograd again.
    assert counters["aot_autograd"]["autograd_cache_hit"] > aot_hits, dict(counters["aot_autograd"])


def test_a_later_run_compiles_whole_from_the_caches_with_no_quick_tier_or_child(gpu_rule, monkeypatch):
    """After a switch, the caches hold the whole compile and that is noted: the next run of the
    same model (another process, here the same one after ``reset``) compiles it whole from them
    at its first call, starting no child, and trains like eager."""
    from torch._dynamo.utils import counters      # torch's own cache counters, read here only
    x = torch.randint(0, 64, (2, 8))
    first = gpt(2).train()
    compiled = bytegraph.compile(first, backend="inductor")
    train_steps(first, compiled, x, 2)
    assert bytegraph.wait_for_background_compiles(300)
    assert tiers.outcomes[-1]["whole"] and not tiers.outcomes[-1].get("from_caches")
    bytegraph.reset()

    def no_child(*args, **kwargs):
        raise AssertionError("a child was started")
    made = []
    monkeypatch.setattr(tiers.subprocess, "Popen", no_child)
    monkeypatch.setattr(inductor_backend.tiers, "tiered", lambda *a: made.append(a) or a[0])
    model = gpt(2).train()
    reference = copy.deepcopy(model)
    hits = counters["aot_autograd"]["autograd_cache_hit"]
    compiled = bytegraph.compile(model, backend="inductor")
    losses = train_steps(model, compiled, x, 3)
    assert made == [] and tiers.outcomes[-1]["from_caches"], tiers.outcomes[-1]
    assert counters["aot_autograd"]["autograd_cache_hit"] > hits
    for got, want in zip(losses, train_steps(reference, reference, x, 3)):
        assert_same(want, got, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.allclose(p, q, atol=1e-5), name


def test_a_noted_whole_compile_that_fails_here_leaves_the_two_tiers(gpu_rule, monkeypatch, caplog):
    """The note says the caches hold the whole compile, but compiling it here fails (a cache
    emptied by hand, say): the graph is compiled in two tiers as if nothing were noted."""
    x = torch.randint(0, 64, (2, 8))
    gm, examples = captured(gpt(2).train(), x)
    tiers.note_whole_cached(inductor_backend._whole_later(gm, examples, None))

    def fails(*args, **kwargs):
        raise RuntimeError("cache entry gone")
    made = []
    monkeypatch.setattr(tiers, "compile_record", fails)
    monkeypatch.setattr(inductor_backend.tiers, "tiered", lambda quick, later, label: made.append(label) or quick)
    model = gpt(2).train()
    with caplog.at_level("WARNING", logger="bytegraph.regions"):
        out = bytegraph.compile(model, backend="inductor")(x)
    assert_same(model(x), out, atol=1e-5)
    assert made == ["shared blocks"] or made == ["split blocks"], made
    assert "cache entry gone" in caplog.text and "compiled in two tiers instead" in caplog.text


def test_another_graph_or_setting_is_another_whole_compile(gpu_rule):
    """The note names the graph and what it is compiled under: a model of another size, a
    training graph against an inference one, or another default dtype finds nothing noted."""
    def later_of(model, grad=True):
        with torch.set_grad_enabled(grad):
            gm, examples = captured(model, torch.randint(0, 64, (2, 8)))
            return inductor_backend._whole_later(gm, examples, None)
    base = later_of(gpt(2).train())
    assert tiers.whole_key(base) == tiers.whole_key(later_of(gpt(2).train()))
    tiers.note_whole_cached(base)
    assert os.path.exists(tiers._marker(base))
    others = [later_of(gpt(3).train()), later_of(gpt(2).train(), grad=False)]
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        others.append(later_of(gpt(2).train()))
    finally:
        torch.set_default_dtype(dtype)
    keys = [tiers.whole_key(o) for o in others]
    assert None not in keys and len(set(keys) | {tiers.whole_key(base)}) == 4
    assert not any(os.path.exists(tiers._marker(o)) for o in others)


def test_a_graph_loaded_from_bytegraphs_cache_has_the_key_it_had_when_traced(gpu_rule, monkeypatch, tmp_path):
    """A later run usually loads its frames from bytegraph's persistent cache instead of tracing
    them: the graph is the same, its objects are not shared alike (the pickled rows differed),
    and the key must not tell them apart, or no later run would find the note."""
    import logging
    keys = []

    def look(later, label="graph"):
        keys.append(tiers.whole_key(later))
        return None
    monkeypatch.setattr(tiers, "whole_from_caches", look)
    monkeypatch.setattr(inductor_backend.tiers, "tiered", lambda quick, later, label: quick)
    x = torch.randint(0, 64, (2, 8))
    with bytegraph.config.patch(persistent_cache=True, cache_dir=str(tmp_path / "bytegraph"),
                                log_topics=["cache"]):
        records = []
        handler = logging.Handler()
        handler.emit = records.append
        logging.getLogger("bytegraph.cache").addHandler(handler)
        try:
            for _ in range(2):
                model = gpt(2).train()
                out = bytegraph.compile(model, backend="inductor")(x)
                assert_same(model(x), out, atol=1e-5)
                bytegraph.reset()
        finally:
            logging.getLogger("bytegraph.cache").removeHandler(handler)
    assert any("loaded from the persistent cache" in r.getMessage() for r in records)
    assert len(keys) == 2 and keys[0] is not None and keys[0] == keys[1], keys


_KEY_IN_A_NEW_PROCESS = """
import sys, torch
sys.path.insert(0, {tests!r})
from bytegraph.backends import regions
regions.on_cuda = lambda gm: True
import test_tiers
gm, examples = test_tiers.captured(test_tiers.gpt(2).train(), torch.randint(0, 64, (2, 8)))
from bytegraph.backends import inductor, tiers
print(tiers.whole_key(inductor._whole_later(gm, examples, None)))
"""


def test_the_whole_compiles_key_is_the_same_in_another_process():
    """Two fresh processes with other string hashing (so sets iterate in other orders) work out
    the same key for the same graph, which differs from another graph's: otherwise a later run
    would never find the note. (Fresh processes both: a test worker's settings may have been
    moved by earlier tests, and the key reads them.)"""
    import subprocess
    keys = []
    for seed, layers in (("1", 2), ("2", 2), ("3", 3)):
        code = _KEY_IN_A_NEW_PROCESS.format(tests=os.path.dirname(__file__)).replace("gpt(2)", f"gpt({layers})")
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        keys.append(out.stdout.strip().splitlines()[-1])
    assert keys[0] == keys[1] != keys[2] and len(keys[0]) == 32, keys


@pytest.mark.parametrize("values_from", ["fakes run again", "the traced graph"])
def test_a_step_under_autocast_is_compiled_again_from_aot_autograds_cache(monkeypatch, tmp_path, values_from):
    """The child's whole compile and this process's at the switch: the second is AOTAutograd's
    cache hit, with a ``with torch.autocast`` block and tensor methods in the graph, and gives
    the first one's results (and eager's, to bf16's precision). Here, the nodes' example values
    come from the graph the record was written from, where it is given, with no run on fakes."""
    from torch._dynamo.utils import counters      # torch's own cache counters, read here only
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    w = torch.randn(16, 16, requires_grad=True)

    def step(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = (x @ w).relu()
        return y.float().transpose(0, 1).sum(1)

    x = torch.randn(8, 16)
    gm, examples = captured(step, x)
    assert any("autocast" in str(n.target) for n in gm.graph.nodes)
    assert any(n.op == "call_method" for n in gm.graph.nodes)
    record = tiers.GraphRecord(gm, examples)
    settings = tiers._settings()
    before = dict(counters["aot_autograd"])
    mode = tiers._fake_mode()
    child = [spec.fake(mode) for spec in record.state_specs]
    tiers.compile_record(record, child, inductor_backend.compile_fx_whole, None, settings, mode)
    hits = counters["aot_autograd"]["autograd_cache_hit"]
    source = None
    if values_from == "the traced graph":
        source = gm

        def no_second_run(*args):
            raise AssertionError("the graph was run on fakes again")
        monkeypatch.setattr(tiers, "_note_example_values", no_second_run)
    here = tiers.compile_record(record, record.state_tensors, inductor_backend.compile_fx_whole, None, settings,
                                source=source)
    assert counters["aot_autograd"]["autograd_cache_hit"] == hits + 1, (before, dict(counters["aot_autograd"]))
    assert counters["aot_autograd"]["autograd_cache_bypass"] == before.get("autograd_cache_bypass", 0)
    (got,) = here(*examples)
    assert_same(step(x), got, atol=0.1)
    got.sum().backward()
    grad = w.grad.clone()
    w.grad = None
    step(x).sum().backward()
    assert torch.allclose(grad, w.grad, atol=0.5, rtol=0.05)


def test_blocks_that_cannot_be_shared_are_split_for_the_quick_tier(gpu_rule, monkeypatch):
    """Where the shared blocks fail to compile (torchao's float8 weights under autocast: torch
    reaches a subclass op undecomposed inside ``invoke_subgraph``), the quick tier splits the
    graph at its blocks instead, each distinct block compiled once, with the quick tier's
    cheaper Inductor settings; the whole compile keeps the caller's settings."""
    from bytegraph.backends.aot import aot_eager
    parts, made = [], []

    def compile_part(gm, examples, config_patches=None):
        parts.append(config_patches)
        return aot_eager(gm, examples)
    monkeypatch.setattr(inductor_backend, "_with_shared_blocks", lambda *a: None)
    monkeypatch.setattr(inductor_backend, "inductor_whole", compile_part)
    monkeypatch.setattr(inductor_backend.tiers, "tiered", lambda quick, later, label: made.append((later, label)) or quick)
    model = gpt(3).train()
    reference = copy.deepcopy(model)
    x = torch.randint(0, 64, (2, 8))
    losses = train_steps(model, bytegraph.compile(model, backend="inductor"), x, 3)
    for got, want in zip(losses, train_steps(reference, reference, x, 3)):
        assert_same(want, got, atol=1e-5)
    ((later, label),) = made
    assert label == "split blocks"
    # Three blocks, one compiled; the parts before and after it.
    assert len(parts) == 3 and all(p == inductor_backend.QUICK_TIER_PATCHES for p in parts), parts
    assert later.config_patches == {}


def adamw_updates(model, update, steps, switch_at=None):
    """``steps`` foreach AdamW updates of ``model`` through ``update(opt)`` (a compiled or plain
    ``opt.step()``), each after gradients drawn from the step's seed; at ``switch_at``, waits
    for the background compiles."""
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, foreach=True)
    for i in range(steps):
        torch.manual_seed(i)
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        update(opt)
        if i == switch_at:
            assert bytegraph.wait_for_background_compiles(300)
    return opt


def test_an_optimizer_update_in_lanes_switches_to_the_whole_update_and_equals_eager(gpu_rule, monkeypatch):
    """An optimizer's foreach update compiled in lanes (backends/lanes.py) is a quick tier too:
    a child compiles the update whole, and once it has, steps call that (one call a step
    instead of one per chunk). Parameters and optimizer state equal eager's before and after."""
    made = []
    real_tiered = tiers.tiered
    monkeypatch.setattr(inductor_backend.tiers, "tiered", lambda *a: made.append(real_tiered(*a)) or made[-1])
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(8)])     # 16 lanes
    reference = copy.deepcopy(model)
    update = bytegraph.compile(lambda opt: opt.step(), backend="inductor")
    opt = adamw_updates(model, update, 6, switch_at=2)
    expected = adamw_updates(reference, lambda opt: opt.step(), 6)
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(p, q, atol=1e-6)
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.allclose(opt.state[p][name], expected.state[q][name], atol=1e-6), name
    (tiered,) = made
    assert tiered.label == "lanes" and tiered.error is None and tiered.call is tiered.whole


def test_not_tiered_when_switched_off(gpu_rule, monkeypatch):
    made = []
    monkeypatch.setattr(inductor_backend.tiers, "tiered", lambda *a: made.append(a) or a[0])
    x = torch.randint(0, 64, (2, 8))
    with bytegraph.config.patch(background_whole_compile=False):
        model = gpt(2)
        out = bytegraph.compile(model, backend="inductor")(x)
        assert_same(model(x), out, atol=1e-5)
    assert made == []
    bytegraph.reset()
    model = gpt(2)
    out = bytegraph.compile(model, backend="inductor")(x)
    assert_same(model(x), out, atol=1e-5)
    assert len(made) == 1


def test_not_possible_under_a_dispatch_mode_or_with_the_caches_off():
    from torch.utils._python_dispatch import TorchDispatchMode
    gm, examples = captured(gpt(1), torch.randint(0, 64, (2, 8)))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(regions, "on_cuda", lambda gm: True)
        assert tiers.possible(gm, examples)

        class Passing(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                return func(*args, **(kwargs or {}))
        with Passing():
            assert not tiers.possible(gm, examples)
        from torch._inductor import config as inductor_config
        with inductor_config.patch(fx_graph_cache=False):
            assert not tiers.possible(gm, examples)
    assert not tiers.possible(gm, examples)       # on the CPU


def test_the_settings_carried_to_the_child_change_nothing_where_they_already_hold():
    # torch's older switch (allow_tf32) rewrites the newer one (fp32_precision) when set, even to
    # its current value, and the caches' keys read the newer one: set, "none" became "ieee" and
    # no key of the child matched this process's.
    before = tiers._settings()
    fp32 = getattr(torch.backends.cuda.matmul, "fp32_precision", None)
    tiers._apply_settings(tiers._loads(tiers._dumps(before)))
    assert getattr(torch.backends.cuda.matmul, "fp32_precision", None) == fp32
    assert tiers._settings() == before


def test_the_settings_carried_to_the_child_set_what_differs(monkeypatch):
    # Inductor's key reads the thread count (C++ kernels) and the default dtype: a child left at
    # its own defaults asked for other keys than a test worker running on one thread.
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    monkeypatch.setattr(torch.utils.deterministic, "fill_uninitialized_memory",
                        torch.utils.deterministic.fill_uninitialized_memory)
    wanted = dict(tiers._settings(), threads=threads + 1, default_dtype=torch.float64,
                  fill_uninitialized_memory=not torch.utils.deterministic.fill_uninitialized_memory)
    try:
        tiers._apply_settings(wanted)
        assert tiers._settings() == wanted
    finally:
        torch.set_num_threads(threads)
        torch.set_default_dtype(dtype)


def test_a_record_compiled_with_its_source_graphs_values_and_no_cache_equals_eager(monkeypatch, tmp_path):
    """Nothing in the caches (a whole compile that misses them): the record is traced through
    AOTAutograd and Inductor with the source graph's example values on its nodes, which belong
    to another fake mode than the compile's inputs, and gives eager's outputs and gradients."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    model = gpt(2).train()
    x = torch.randint(0, 64, (2, 8))
    gm, examples = captured(model, x)
    record = tiers.GraphRecord(gm, examples)

    def no_second_run(*args):
        raise AssertionError("the graph was run on fakes again")
    monkeypatch.setattr(tiers, "_note_example_values", no_second_run)
    here = tiers.compile_record(record, record.state_tensors, inductor_backend.compile_fx_whole, None,
                                tiers._settings(), source=gm)
    (got,) = here(*examples)
    expected = model(x)
    assert_same(expected, got, atol=1e-5)
    got.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    expected.sum().backward()
    for n, p in model.named_parameters():
        assert torch.allclose(grads[n], p.grad, atol=1e-5), n
