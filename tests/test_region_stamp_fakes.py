"""The fakes of a compile region's stamped layers' parameters and buffers (made the quick way,
``graph.call_values.new_fake``): each stands for its own tensor in the graph, and what could go
wrong with them (tied weights, a parameter of another shape, a buffer changed in place, views
of one storage, gradients through AOTAutograd) gives eager's values and gradients."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import bytegraph
from bytegraph.backends.registry import lookup_backend
from bytegraph.graph.call_values import new_fake
from bytegraph.graph.higher_order import invoke_region
from bytegraph.testing import CompileCounter


class GainBlock(torch.nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.fc = torch.nn.Linear(d, d)
        self.gain = torch.nn.Parameter(torch.randn(d))
        self.register_buffer("shift", torch.randn(d))

    def forward(self, x):
        return x + (self.fc(x) * self.gain).relu() + self.shift


class RegionGainBlock(GainBlock):
    forward = torch.compiler.nested_compile_region(GainBlock.forward)


def _model(n=5):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[RegionGainBlock() for _ in range(n)])


def _calls(gm):
    return sum(1 for n in gm.graph.nodes if n.target is invoke_region)


def _state_fakes(gm):
    """(real tensor, fake) of each get_attr node of a tensor."""
    out = []
    for n in gm.graph.nodes:
        if n.op == "get_attr" and isinstance(n.meta.get("example_value"), torch.Tensor):
            out.append((n.meta["real_tensor"], n.meta["example_value"]))
    return out


def _no_grad(model):
    """``model`` under no_grad compiled with a counted eager backend and called once on a fresh
    input, checked against eager: (the function, the compiled one, the counter, the input)."""
    def fn(x):
        with torch.no_grad():
            return model(x)

    cnt = CompileCounter(lookup_backend("eager"))
    compiled = bytegraph.compile(fn, backend=cnt)
    x = torch.randn(3, 8)
    assert torch.allclose(compiled(x), fn(x), atol=1e-6)
    return fn, compiled, cnt, x


def _compiled_step_matches_eager(model, eager, x, backend):
    """``model`` compiled with ``backend`` (counted): one forward and backward, outputs and every
    parameter's gradient checked against ``eager``'s; (the compiled model, its counter)."""
    cnt = CompileCounter(lookup_backend(backend))
    compiled = bytegraph.compile(model, backend=cnt)
    out, ref = compiled(x), eager(x)
    assert torch.allclose(out, ref, atol=1e-5)
    out.sum().backward()
    ref.sum().backward()
    for p, q in zip(model.parameters(), eager.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-5)
    return compiled, cnt


def test_new_fake_is_what_fake_tensor_new_gives():
    mode = FakeTensorMode()
    cpu = torch.device("cpu")
    made = [new_fake(mode, torch.empty(4, 3, device="meta"), cpu, rg) for rg in (False, True, False, True)]
    ref = FakeTensor(mode, torch.empty(4, 3, device="meta"), cpu)
    for f in made:
        assert type(f) is FakeTensor and f.fake_mode is mode and f.device == cpu
        assert f.__dict__ == ref.__dict__
        assert torch._C._dispatch_keys(f) == torch._C._dispatch_keys(ref.requires_grad_(f.requires_grad))
    assert [f.requires_grad for f in made] == [False, True, False, True]
    assert made[1].is_leaf and made[1].grad_fn is None
    assert len({f.untyped_storage()._cdata for f in made}) == 4      # each its own storage
    with mode:
        out = made[0] @ made[1].t() + 1
    assert type(out) is FakeTensor and out.shape == (4, 4) and out.requires_grad
    made[0].nonzero_memo = None          # the memo attributes work as on any fake
    assert made[0].item_memo is None


def test_stamped_layers_state_fakes_map_to_their_own_tensors():
    model = _model(6)
    fn, compiled, cnt, x = _no_grad(model)
    gm = cnt.graphs[0]
    assert _calls(gm) == 6
    pairs = _state_fakes(gm)
    reals = {id(p) for m in model for p in (*m.parameters(), *m.buffers())}
    assert {id(r) for r, _ in pairs} == reals and len(pairs) == len(reals)
    assert len({id(f) for _, f in pairs}) == len(pairs)                  # one fake per tensor
    for real, fake in pairs:
        assert type(fake) is FakeTensor and fake.shape == real.shape and fake.stride() == real.stride()
        assert fake.dtype == real.dtype and fake.requires_grad == real.requires_grad
    for n in gm.graph.nodes:                     # the graph module reads each layer's own tensor
        if n.op == "get_attr" and isinstance(n.meta.get("real_tensor"), torch.Tensor):
            assert getattr(gm, n.target) is n.meta["real_tensor"]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_stamped_layers_gradients(backend):
    model = _model(5)
    eager = _model(5)
    x = torch.randn(3, 8)
    cnt = CompileCounter(lookup_backend(backend))
    compiled = bytegraph.compile(model, backend=cnt)
    for step in range(2):
        out, ref = compiled(x), eager(x)
        assert torch.allclose(out, ref, atol=1e-5)
        out.sum().backward()
        ref.sum().backward()
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            assert p.grad is not None and torch.allclose(p.grad, q.grad, atol=1e-5), (step, name)
    assert cnt.frame_count == 1 and _calls(cnt.graphs[0]) == 5


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_weights_tied_across_layers(backend):
    # Layers 2-4 hold layer 1's fc.weight: one fake, one graph input, gradients summed into it.
    model, eager = _model(5), _model(5)
    for m in (model, eager):
        for i in (2, 3, 4):
            m[i].fc.weight = m[1].fc.weight
    x = torch.randn(3, 8)
    compiled, cnt = _compiled_step_matches_eager(model, eager, x, backend)
    pairs = _state_fakes(cnt.graphs[0])
    tied = [f for r, f in pairs if r is model[1].fc.weight]
    assert len(tied) == 1
    with torch.no_grad():
        model[1].fc.weight.mul_(0.5)
        eager[1].fc.weight.mul_(0.5)
    assert torch.allclose(compiled(x), eager(x), atol=1e-5)
    assert cnt.frame_count == 1


def test_parameter_of_another_shape_compiles_again():
    model = _model(5)
    fn, compiled, cnt, x = _no_grad(model)
    model[3].gain = torch.nn.Parameter(torch.randn(1))        # a stamped layer's: broadcast now
    assert torch.allclose(compiled(x), fn(x), atol=1e-6)
    assert cnt.frame_count == 2
    fakes = {id(r): f for r, f in _state_fakes(cnt.graphs[1])}
    assert fakes[id(model[3].gain)].shape == (1,) and fakes[id(model[4].gain)].shape == (8,)
    model[4].gain = torch.nn.Parameter(torch.randn(8))        # same shape, a new tensor
    assert torch.allclose(compiled(x), fn(x), atol=1e-6)
    assert cnt.frame_count == 3


def test_buffer_changed_in_place_between_calls():
    model = _model(5)
    fn, compiled, cnt, x = _no_grad(model)
    model[4].shift.add_(3.0)
    model[2].gain.data.mul_(-1.0)
    assert torch.allclose(compiled(x), fn(x), atol=1e-6)
    assert cnt.frame_count == 1


def test_buffers_that_are_views_of_one_storage():
    # Each layer's buffer a row of one tensor: a change to that tensor reaches every layer.
    model = _model(5)
    table = torch.randn(5, 8)
    for i, m in enumerate(model):
        m.shift = table[i]
    fn, compiled, cnt, x = _no_grad(model)
    table.mul_(2.0)
    assert torch.allclose(compiled(x), fn(x), atol=1e-6)
    assert cnt.frame_count == 1 and _calls(cnt.graphs[0]) == 5


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_parameters_that_are_views_of_one_storage(backend):
    # Each layer's gain a row of one tensor's storage (as a flat parameter buffer would hold it).
    models = []
    for _ in range(2):
        model = _model(5)
        table = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
        for i, m in enumerate(model):
            m.gain = torch.nn.Parameter(table[i])
        models.append((model, table))
    (model, table), (eager, eager_table) = models
    assert model[0].gain.untyped_storage().data_ptr() == model[3].gain.untyped_storage().data_ptr()
    x = torch.randn(3, 8)
    compiled, cnt = _compiled_step_matches_eager(model, eager, x, backend)
    with torch.no_grad():
        table.mul_(-1.0)
        eager_table.mul_(-1.0)
    assert torch.allclose(compiled(x), eager(x), atol=1e-5)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_transposed_weight_in_a_stamped_layer(backend):
    # A weight that does not span its storage in order (its fake made through _meta_like).
    model, eager = _model(5), _model(5)
    for m in (model, eager):
        w = torch.randn(8, 8, generator=torch.Generator().manual_seed(2))
        m[3].fc.weight = torch.nn.Parameter(w.t())
    assert not model[3].fc.weight.is_contiguous()
    x = torch.randn(3, 8)
    compiled, cnt = _compiled_step_matches_eager(model, eager, x, backend)
    fakes = {id(r): f for r, f in _state_fakes(cnt.graphs[0])}
    assert fakes[id(model[3].fc.weight)].stride() == (1, 8)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_layers_stamped_inside_a_checkpointed_body(backend):
    # The layers' parameters are read from inside a traced body (a subgraph builder): each is
    # the enclosing graph's get_attr, lifted into the body; values and gradients as eager's.
    model, eager = _model(5), _model(5)

    def step(m):
        def fn(x):
            return torch.utils.checkpoint.checkpoint(m, x, use_reentrant=False) * 2
        return fn

    x = torch.randn(3, 8)
    cnt = CompileCounter(lookup_backend(backend))
    compiled = bytegraph.compile(step(model), backend=cnt, fullgraph=True)
    out, ref = compiled(x), step(eager)(x)
    assert torch.allclose(out, ref, atol=1e-5)
    out.sum().backward()
    ref.sum().backward()
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        assert p.grad is not None and torch.allclose(p.grad, q.grad, atol=1e-5), name
    assert cnt.frame_count == 1


def test_stamped_layers_share_the_region_get_attr_and_keep_readable_names():
    model = _model(6)
    fn, compiled, cnt, x = _no_grad(model)
    gm = cnt.graphs[0]
    calls = [n for n in gm.graph.nodes if n.target is invoke_region]
    assert len(calls) == 6 and len({n.args[0] for n in calls}) == 1      # one get_attr node of the region
    names = [n.name for n in gm.graph.nodes]
    assert len(set(names)) == len(names)
    state = [n.target for n in gm.graph.nodes if n.op == "get_attr" and n.target.endswith("fc_weight")]
    assert len(state) == 6 and all(t.isidentifier() and t[-len("_fc_weight"):] == "_fc_weight" for t in state)
    assert [t for t in state if "5" in t] and len(set(state)) == 6
    gm.graph.lint()
