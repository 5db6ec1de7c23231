"""Compile regions: torch.compiler.nested_compile_region (a function, or a module class's forward)
as one invoke_subgraph node per call, the region traced once per input signature and stamped out
for the other calls; config.nest_repeated_blocks does the same for repeated blocks unmarked.
Values and gradients equal eager's."""
import contextlib
import re

import pytest
import torch

import bytegraph
from bytegraph.backends.registry import lookup_backend
from bytegraph.graph.higher_order import invoke_region
from bytegraph.guards.builder import GuardList
from bytegraph.testing import CompileCounter
from helpers import assert_traced
from test_higher_order import BACKENDS, _x, check


class Block(torch.nn.Module):
    def __init__(self, d=8, scale=1.0):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.fc = torch.nn.Linear(d, d)
        self.scale = scale

    def forward(self, x):
        return x + self.fc(self.ln(x)).relu() * self.scale


class RegionBlock(Block):
    forward = torch.compiler.nested_compile_region(Block.forward)


def _regions(gm):
    """(number of region calls, number of distinct region graphs) in ``gm``."""
    calls = [n for n in gm.graph.nodes if n.target is invoke_region]
    return len(calls), len({n.args[0].target for n in calls})


@pytest.mark.parametrize("backend", BACKENDS)
def test_marked_forward_values_and_grads(backend):
    model = torch.nn.Sequential(*[RegionBlock() for _ in range(4)])
    cnt = check(lambda x: model(x), _x(3, 8), backend=backend)
    assert _regions(cnt.graphs[0]) == (4, 1)


def test_traced_once_under_no_grad():
    model = torch.nn.Sequential(*[RegionBlock() for _ in range(5)])

    def fn(x):
        with torch.no_grad():
            return model(x)

    cnt = check(fn, torch.randn(3, 8), grads=False)
    assert _regions(cnt.graphs[0]) == (5, 1)


def test_marked_function_per_signature():
    w = torch.randn(4, 4)

    @torch.compiler.nested_compile_region
    def mlp(x, bias):
        return torch.tanh(x @ w + bias)

    def fn(a, b, c):
        return mlp(mlp(a, b), b), mlp(c, 1.0)

    cnt = check(fn, torch.randn(2, 4), torch.randn(4), torch.randn(3, 4), grads=False)
    # (2, 4) with a tensor bias twice; (3, 4) with a float bias: another signature
    assert _regions(cnt.graphs[0]) == (3, 2)


def test_instances_that_differ_are_traced_apart():
    model = torch.nn.Sequential(RegionBlock(scale=1.0), RegionBlock(scale=2.0), RegionBlock(scale=2.0))

    def fn(x):
        with torch.no_grad():
            return model(x)

    cnt = check(fn, torch.randn(3, 8), grads=False)
    assert _regions(cnt.graphs[0]) == (3, 2)
    cnt = CompileCounter(lookup_backend("eager"))
    compiled = bytegraph.compile(fn, backend=cnt)
    x = torch.randn(3, 8)
    compiled(x)
    model[2].scale = 3.0        # read by a stamped-out call: guarded there, so it compiles again
    assert torch.allclose(compiled(x), fn(x))
    assert cnt.frame_count == 2


def _without_bias(m):
    m.fc = torch.nn.Linear(8, 8, bias=False)


def _hooked(m):
    m.register_forward_hook(lambda mod, args, out: out * 0.5)


_MUTATIONS = {
    "constant": lambda m: setattr(m.ln, "eps", 0.25),
    "parameter": lambda m: setattr(m.fc, "weight", torch.nn.Parameter(torch.randn(8, 8))),
    "parameter_layout": lambda m: setattr(m.fc, "weight", torch.nn.Parameter(torch.randn(8, 8).t())),
    "submodule_structure": _without_bias,
    "submodule_class": lambda m: setattr(m, "ln", torch.nn.Identity()),
    "hook": _hooked,
    # a hook on a submodule of the layer (its hook tables are watched per module)
    "submodule_hook": lambda m: m.fc.register_forward_pre_hook(lambda mod, args: (args[0] * 2,)),
    # another shape (linear's bias broadcasts)
    "parameter_shape": lambda m: setattr(m.fc, "bias", torch.nn.Parameter(torch.randn(1))),
    # (the parameters keep their identity; what the graph was built for is checked when the
    # module epoch moves, with the metadata taken when the layer was traced or stamped)
    "parameter_requires_grad": lambda m: m.fc.requires_grad_(False),
}


def _no_grad_compiled(model):
    """(``model`` called under no_grad, that compiled with a counting eager backend, the counter)."""
    def fn(x):
        with torch.no_grad():
            return model(x)

    cnt = CompileCounter(lookup_backend("eager"))
    return fn, bytegraph.compile(fn, backend=cnt), cnt


@pytest.mark.parametrize("mutation", list(_MUTATIONS))
def test_a_changed_stamped_layer_compiles_again(mutation):
    # Layers after the first are stamped out of its record; a change to one of them after the
    # compile is caught by that layer's own guards: a new graph, eager's result.
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[RegionBlock() for _ in range(4)])
    fn, compiled, cnt = _no_grad_compiled(model)
    x = torch.randn(3, 8)
    assert torch.allclose(compiled(x), fn(x))
    assert cnt.frame_count == 1 and _regions(cnt.graphs[0]) == (4, 1)
    _MUTATIONS[mutation](model[2])
    assert torch.allclose(compiled(x), fn(x), atol=1e-6)
    assert cnt.frame_count == 2
    x = torch.randn(3, 8)       # other values: the new graph computes them, rather than its first answer
    assert torch.allclose(compiled(x), fn(x), atol=1e-6)
    assert cnt.frame_count == 2


def test_stamped_layers_with_inputs_of_other_sizes():
    # A miss with another input size compares the sizes the guards observed (a walked layer's
    # parts listed when first asked): the next graph is dynamic in that size, eager's values.
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[RegionBlock() for _ in range(5)])
    fn, compiled, cnt = _no_grad_compiled(model)
    for rows in (3, 5, 7, 2):
        x = torch.randn(rows, 8)
        assert torch.allclose(compiled(x), fn(x), atol=1e-6)
    assert cnt.frame_count == 2
    model[3].fc.weight.data.mul_(2.0)      # values only: the same graph, eager's values
    x = torch.randn(4, 8)
    assert torch.allclose(compiled(x), fn(x), atol=1e-6)
    assert cnt.frame_count == 2


def test_a_hook_added_where_stamped_layers_had_hooks_compiles_again():
    # Each layer's fc has a hook when compiled (its hook table, not empty, cannot be swapped for
    # one that tells of changes): a hook added to a later layer's fc is still seen.
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[RegionBlock() for _ in range(5)])
    for block in model:
        block.fc.register_forward_hook(lambda mod, args, out: out + 1.0)

    def fn(x):
        with torch.no_grad():
            return model(x)

    cnt = CompileCounter(lookup_backend("eager"))
    compiled = bytegraph.compile(fn, backend=cnt)
    x = torch.randn(3, 8)
    assert torch.allclose(compiled(x), fn(x), atol=1e-6)
    model[3].fc.register_forward_hook(lambda mod, args, out: out * 3.0)
    assert torch.allclose(compiled(x), fn(x), atol=1e-6)
    assert cnt.frame_count == 2


@contextlib.contextmanager
def _walks(walk):
    """Layers stamped by a walk (``walk``) or each the general way."""
    from bytegraph.trace.nn import region_stamps
    build = region_stamps.build
    if not walk:
        region_stamps.build = lambda *args: None
    try:
        bytegraph.reset()
        yield
    finally:
        region_stamps.build = build


def _guards_and_explain(mutation, walk):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[RegionBlock() for _ in range(5)])
    with _walks(walk):

        def fn(x):
            with torch.no_grad():
                return model(x)

        compiled = bytegraph.compile(fn, backend="eager")
        x = torch.randn(3, 8)
        assert torch.allclose(compiled(x), fn(x))
    (entry,) = compiled._bytegraph_cache.entries
    assert isinstance(entry.guards, GuardList) == walk      # layers kept as one guard entry each, or not
    guards = sorted(re.sub("0x[0-9a-f]+", "0x", g.describe()) for g in entry.guards)   # (another model's addresses)
    _MUTATIONS[mutation](model[4])
    assert torch.allclose(compiled(x), fn(x), atol=1e-6)
    (why,) = compiled._bytegraph_cache.recompile_reasons
    assert "[4]" in why
    return guards, re.sub("0x[0-9a-f]+", "0x", why)


@pytest.mark.parametrize("mutation", ["constant", "parameter", "hook", "submodule_hook", "parameter_shape",
                                      "parameter_requires_grad"])
def test_a_walked_layer_has_the_guards_and_messages_of_a_stamped_one(mutation):
    # Layers from the third on are stamped by a walk over their objects and keep their guards
    # as one entry: the same guards, one by one, and the same reason on a miss, as the general stamp.
    assert _guards_and_explain(mutation, walk=True) == _guards_and_explain(mutation, walk=False)


def test_aot_graph_has_invoke_subgraph():
    from bytegraph.backends.aot import aot_autograd
    seen = []

    def fw(gm, example_inputs):
        seen.extend(n.target for n in gm.graph.nodes if n.op == "call_function")
        return gm

    model = torch.nn.Sequential(*[RegionBlock() for _ in range(3)])
    x = _x(2, 8)
    out = bytegraph.compile(model, backend=aot_autograd(fw), fullgraph=True)(x)
    assert torch.allclose(out, model(x))
    assert torch.ops.higher_order.invoke_subgraph in seen


def test_region_with_side_effect_breaks():
    log = []

    @torch.compiler.nested_compile_region
    def noisy(x):
        log.append(1)
        return x * 2

    def fn(x):
        return noisy(x) + 1

    with pytest.raises(bytegraph.errors.Unsupported, match="changes Python state outside itself"):
        bytegraph.compile(fn, backend="eager", fullgraph=True)(torch.ones(2))
    log.clear()
    bytegraph.reset()
    out = bytegraph.compile(fn, backend="eager")(torch.ones(2))
    assert_traced()     # broken at the region, which runs natively
    assert torch.equal(out, fn(torch.ones(2))) and log == [1, 1]


def test_region_returning_its_input_breaks():
    @torch.compiler.nested_compile_region
    def same(x):
        return x

    with pytest.raises(bytegraph.errors.Unsupported, match="returns one of its inputs"):
        bytegraph.compile(lambda x: same(x) * 2, backend="eager", fullgraph=True)(torch.ones(2))


@pytest.mark.parametrize("nest", [False, True])
def test_nest_repeated_blocks(nest):
    model = torch.nn.Sequential(*[Block() for _ in range(4)])

    def fn(x):
        with torch.no_grad():
            return model(x)

    x = torch.randn(3, 8)
    cnt = CompileCounter(lookup_backend("eager"))
    with bytegraph.config.patch(nest_repeated_blocks=nest):
        out = bytegraph.compile(fn, backend=cnt, fullgraph=True)(x)
    assert torch.allclose(out, fn(x))
    assert _regions(cnt.graphs[0]) == ((4, 1) if nest else (0, 0))


def test_keyword_arguments_and_constants_in_results():
    @torch.compiler.nested_compile_region
    def layer(x, mask=None, *, scale=1.0):
        y = x * scale if mask is None else x.masked_fill(mask, 0.0) * scale
        return y.sin(), None, (y.cos(),)

    def fn(x, m):
        a, _, (b,) = layer(x, scale=2.0)
        c, none, _ = layer(a, mask=m, scale=2.0)
        d, _, _ = layer(b, mask=m, scale=2.0)
        return c + d, none

    x = torch.randn(4)
    cnt = check(fn, x, x > 0, grads=False)
    assert _regions(cnt.graphs[0]) == (3, 2)


def test_torch_compiled_module_called_inside():
    lin = torch.nn.Linear(3, 3)
    compiled_lin = torch.compile(lin)       # torch.compile's OptimizedModule: its module is traced

    def fn(x):
        return compiled_lin(x).relu()

    check(fn, _x(2, 3))


class SharedNormBlock(torch.nn.Module):
    """A layer holding a module that every layer holds (one LayerNorm object for all)."""

    def __init__(self, norm, d=8):
        super().__init__()
        self.norm = norm
        self.fc = torch.nn.Linear(d, d)

    def forward(self, x):
        return x + self.fc(self.norm(x)).relu()


class RegionSharedNormBlock(SharedNormBlock):
    forward = torch.compiler.nested_compile_region(SharedNormBlock.forward)


def _shared_norm_model():
    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(8)
    return torch.nn.Sequential(*[RegionSharedNormBlock(norm) for _ in range(4)])


def test_layers_sharing_a_module_are_stamped_out():
    # Layers after the first find the shared LayerNorm already read (through model[0].norm):
    # their plans send the reads through it where the first layer's went; one region graph.
    model = _shared_norm_model()

    def fn(x):
        with torch.no_grad():
            return model(x)

    cnt = check(fn, torch.randn(3, 8), grads=False)
    assert _regions(cnt.graphs[0]) == (4, 1)


def test_a_changed_shared_module_compiles_again():
    model = _shared_norm_model()

    def fn(x):
        with torch.no_grad():
            return model(x)

    cnt = CompileCounter(lookup_backend("eager"))
    compiled = bytegraph.compile(fn, backend=cnt)
    x = torch.randn(3, 8)
    assert torch.allclose(compiled(x), fn(x))
    model[3].norm.weight = torch.nn.Parameter(torch.randn(8))   # the one LayerNorm of every layer
    assert torch.allclose(compiled(x), fn(x), atol=1e-6)
    assert cnt.frame_count == 2
    model[1].norm = torch.nn.LayerNorm(8, eps=0.5)               # layer 1 alone gets its own
    assert torch.allclose(compiled(x), fn(x), atol=1e-6)
    assert cnt.frame_count == 3


def test_a_buffer_reassigned_elsewhere_leaves_the_walk_on():
    # Another module whose compiled forward gives a buffer a new tensor: its buffer is read as an
    # input from then on; layers that hold no such module are still stamped by the walk.
    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("n", torch.zeros(()))

        def forward(self, x):
            self.n = self.n + 1
            return x + self.n

    counter = Counter()
    out = bytegraph.compile(counter, backend="eager")(torch.ones(2))
    assert torch.equal(out, torch.full((2,), 2.0)) and counter.n.item() == 1
    assert _guards_and_explain("constant", walk=True) == _guards_and_explain("constant", walk=False)
    assert counter.n.item() == 1     # (kept alive to here)


class _OtherParameter(torch.nn.Parameter):
    pass


_BEFORE = {
    "requires_grad": lambda m: m.fc.weight.requires_grad_(False),
    "stride": lambda m: setattr(m.fc, "weight", torch.nn.Parameter(torch.randn(8, 8).t())),
    "storage_offset": lambda m: setattr(m.fc, "weight", torch.nn.Parameter(torch.randn(72)[8:].view(8, 8))),
    "dtype": lambda m: m.register_buffer("extra", torch.zeros(2, dtype=torch.float64)),
    "no_bias": _without_bias,
    "forward": lambda m: setattr(m.ln, "forward", lambda x: x * 2.0),
    "constant": lambda m: setattr(m.ln, "eps", 0.25),
    "constant_type": lambda m: setattr(m, "scale", 1),
    "tuple_to_list": lambda m: setattr(m.ln, "normalized_shape", [8]),
    "parameter_class": lambda m: setattr(m.fc, "bias", _OtherParameter(torch.randn(8))),
}


def _assert_operands_as_traced(gm):
    # Each region call's operands have the metadata its region graph was traced with.
    for n in gm.graph.nodes:
        if n.target is invoke_region:
            sub = getattr(gm, n.args[0].target)
            inputs = [p.meta.get("example_value") for p in sub.graph.nodes if p.op == "placeholder"]
            operands = [a.meta.get("example_value") for a in n.args[2:]]
            assert len(inputs) == len(operands)
            for a, b in zip(inputs, operands):
                assert (a.dtype, a.shape, a.stride(), a.storage_offset(), a.requires_grad) == \
                    (b.dtype, b.shape, b.stride(), b.storage_offset(), b.requires_grad)


@pytest.mark.parametrize("change", list(_BEFORE))
def test_a_walked_layer_unlike_the_others_when_compiled(change):
    # Layers from the third on are compared with the layer the walk was made from (their tensors
    # by torch's C++ tensor checker, their metadata then taken from that layer's): a layer that
    # differs is stamped the general way, eager's values, and its guards hold its own metadata (an
    # unrelated change to a watched module makes the detailed checks run: they pass, no new graph).
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[RegionBlock() for _ in range(6)])
    _BEFORE[change](model[3])
    fn, compiled, cnt = _no_grad_compiled(model)
    x = torch.randn(3, 8)
    assert torch.allclose(compiled(x), fn(x), atol=1e-6)
    assert cnt.frame_count == 1
    _assert_operands_as_traced(cnt.graphs[0])
    model[0].note = 1.0
    model[4].ln.note = 2.0
    x = torch.randn(3, 8)
    assert torch.allclose(compiled(x), fn(x), atol=1e-6)
    assert cnt.frame_count == 1
    model[3].fc.weight = torch.nn.Parameter(torch.randn(8, 8))     # the walked layers' own guards
    model[5].fc.weight.requires_grad_(False)
    assert torch.allclose(compiled(x), fn(x), atol=1e-6)
    assert cnt.frame_count == 2


def test_walked_layers_match_their_general_stamps_metadata():
    # The metadata a walked layer's identity guards keep (taken from the layer the walk was made
    # from) is each tensor's own: the same as a general stamp takes.
    def metas(walk):
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[RegionBlock() for _ in range(5)])
        with _walks(walk):
            fn, compiled, cnt = _no_grad_compiled(model)
            x = torch.randn(3, 8)
            assert torch.allclose(compiled(x), fn(x))
        (entry,) = compiled._bytegraph_cache.entries
        return [(re.sub("0x[0-9a-f]+", "0x", g.describe()), tuple((k, str(getattr(g.meta, k))) for k in g.meta.__slots__))
                for g in entry.guards if g.meta is not None and "[4]" in g.source.name()]

    walked = metas(True)
    assert walked and walked == metas(False)


def test_a_layer_with_an_empty_entry_where_the_others_have_a_buffer_is_not_walked():
    # A walked layer's tables must name the same entries, empty (None) where the walk's layer's
    # are, also where the forward does not read them: layer 3 is stamped the general way.
    from bytegraph.guards.layers import LAYER_MATCH
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[RegionBlock() for _ in range(6)])
    for block in model:
        block.fc.register_buffer("spare", torch.zeros(1))
    model[3].fc.spare = None
    fn, compiled, cnt = _no_grad_compiled(model)
    x = torch.randn(3, 8)
    assert torch.allclose(compiled(x), fn(x), atol=1e-6)
    (entry,) = compiled._bytegraph_cache.entries
    walked = {g.source.name() for g in entry.guards._set.entries() if g.kind is LAYER_MATCH}
    assert {"model[2]", "model[4]", "model[5]"} <= walked and "model[3]" not in walked
