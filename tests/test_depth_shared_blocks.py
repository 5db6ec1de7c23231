"""Repeated blocks as shared subgraphs (backends/subgraphs.py): each instance of a repeated block
becomes an ``invoke_subgraph`` call of one module per distinct block, inside one graph; results
and gradients are eager's, and a block a shared module could not stand in for stays inline."""
import pytest
import torch
from torch._subclasses import FakeTensorMode

import bytegraph
from bytegraph.backends import inductor as inductor_backend
from bytegraph.backends import regions
from bytegraph.backends.aot import aot_eager
from bytegraph.backends.subgraphs import compiling, with_shared_blocks
from bytegraph.demo.models import GPTConfig, TinyGPT
from helpers import assert_same, assert_sum_grads_like_eager

INVOKE = torch.ops.higher_order.invoke_subgraph


def gpt(n_layer, dropout=0.0):
    torch.manual_seed(0)
    return TinyGPT(GPTConfig(n_layer=n_layer, n_embd=32, n_head=4, block_size=8, vocab_size=64, dropout=dropout))


def sharing_backend(shared):
    """Each graph with its blocks shared (recorded in ``shared``; None: nothing shared), run by aot_eager."""
    def backend(gm, example_inputs):
        copy = with_shared_blocks(gm)
        shared.append(copy)
        return aot_eager(copy if copy is not None else gm, example_inputs)
    return backend


def calls(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is INVOKE]


@pytest.mark.parametrize("train", [False, True])
def test_one_shared_module_for_every_layer_with_eager_results_and_gradients(train):
    model = gpt(5).train(train)
    shared = []
    compiled = bytegraph.compile(model, backend=sharing_backend(shared))
    x = torch.randint(0, 64, (2, 8))
    with torch.set_grad_enabled(train):
        out = compiled(x)
        expected = model(x)
    gm = shared[0]
    assert gm.meta["bytegraph_shared_blocks"] == 1
    assert len(calls(gm)) == 5
    assert {c.args[1] for c in calls(gm)} == {"bytegraph_block_0"}
    # Each call passes its own layer's parameters.
    assert len({c.args[3] for c in calls(gm)}) == 5
    assert_same(expected, out, atol=1e-5)
    if train:
        assert_sum_grads_like_eager(model, out, expected)


def test_the_original_graph_is_left_as_it_was():
    graphs = []
    model = gpt(3)
    with torch.no_grad():
        bytegraph.compile(model, backend=lambda gm, ex: graphs.append(gm) or gm.forward)(torch.randint(0, 64, (2, 8)))
    before = graphs[0].code
    copy = with_shared_blocks(graphs[0])
    assert copy is not None and copy is not graphs[0]
    assert graphs[0].code == before and not calls(graphs[0])


def test_nothing_shared_without_repeats_or_when_switched_off():
    shared = []
    bytegraph.compile(gpt(1), backend=sharing_backend(shared))(torch.randint(0, 64, (2, 8)))
    assert shared == [None]
    bytegraph.reset()
    shared.clear()
    bytegraph.config.regional_compile = False
    try:
        model = gpt(3)
        out = bytegraph.compile(model, backend=sharing_backend(shared))(torch.randint(0, 64, (2, 8)))
    finally:
        bytegraph.config.regional_compile = True
    assert shared == [None]
    assert out.shape == (2, 8, 64)


def test_blocks_drawing_random_numbers_stay_inline():
    # Each call of a shared module would draw the same numbers (or in another order).
    shared = []
    bytegraph.compile(gpt(3, dropout=0.1).train(), backend=sharing_backend(shared))(torch.randint(0, 64, (2, 8)))
    assert shared == [None]
    # Dropout outside training draws nothing: shared.
    bytegraph.reset()
    shared.clear()
    with torch.no_grad():
        bytegraph.compile(gpt(3, dropout=0.1).eval(), backend=sharing_backend(shared))(torch.randint(0, 64, (2, 8)))
    assert shared[0] is not None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_training_step_entering_autocast_itself_differentiates_blocks_at_its_dtype(dtype):
    # AOTAutograd traces a shared block's backward after the step's `with torch.autocast` has
    # ended: compiled under `compiling`, at the step's dtype (float16 is not the CPU's default).
    model = gpt(3)
    reference = gpt(3)

    def step(m, x):
        with torch.autocast("cpu", dtype=dtype):
            loss = m(x).float().square().mean()
        loss.backward()
        return loss

    shared = []

    def backend(gm, example_inputs):
        copy = with_shared_blocks(gm)
        shared.append(copy)
        with compiling(copy):
            return aot_eager(copy, example_inputs)

    x = torch.randint(0, 64, (2, 8))
    loss = bytegraph.compile(step, backend=backend)(model, x)
    expected = step(reference, x)
    assert shared[0] is not None and shared[0].meta["bytegraph_autocast_dtypes"] == {"cpu": dtype}
    assert torch.equal(loss, expected)
    for (n, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(p.grad, q.grad), n


def test_a_training_graph_works_out_each_blocks_schema_once_whatever_its_depth(monkeypatch):
    # torch checks a block for input writes on every invoke_subgraph call autograd records, by
    # tracing it again; under `compiling` that is done once per block and operand metadata.
    traced = []
    generate = type(INVOKE).gen_schema

    def counting(self, subgraph, identifier, *operands):
        traced.append(identifier)
        return generate(self, subgraph, identifier, *operands)
    monkeypatch.setattr(type(INVOKE), "gen_schema", counting)

    def run(layers):
        model, reference = gpt(layers), gpt(layers)

        def backend(gm, example_inputs):
            # As Inductor's compile_fx runs AOTAutograd: in a tracing context, where torch
            # keeps the forward and backward graphs it splits each block into.
            copy = with_shared_blocks(gm)
            fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
            with compiling(copy), torch._guards.tracing(torch._guards.TracingContext(fake_mode)):
                return aot_eager(copy, example_inputs)

        x = torch.randint(0, 64, (2, 8))
        out = bytegraph.compile(model, backend=backend)(x)
        expected = reference(x)
        assert_same(expected, out, atol=1e-5)
        out.square().mean().backward()
        expected.square().mean().backward()
        for (n, p), q in zip(model.named_parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=n)
        assert "gen_schema" not in vars(INVOKE)      # nothing kept past the compile
        count = len(traced)
        traced.clear()
        return count

    shallow, deep = run(2), run(6)
    assert 0 < shallow == deep


def test_blocks_under_autocast_of_two_dtypes_are_not_shared():
    model = gpt(4)

    def step(x):
        h = model.wte(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = model.h[1](model.h[0](h))
        with torch.autocast("cpu", dtype=torch.float16):
            h = model.h[3](model.h[2](h))
        return h.float().mean()

    shared = []
    x = torch.randint(0, 64, (2, 8))
    out = bytegraph.compile(step, backend=sharing_backend(shared))(x)
    assert shared == [None]
    assert torch.equal(out, step(x))


def test_blocks_writing_in_place_stay_inline():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(8, 8)
            self.b = torch.nn.Linear(8, 8)

        def forward(self, x):
            h = self.a(x).relu()
            h = self.b(h) + h
            h = h * 2 - 1
            h = torch.tanh(h) + x
            h = h / 3 + 1
            x.add_(1)
            return h.sin() + h.cos()

    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(Block() for _ in range(3))

    def fn(x):
        for b in blocks:
            x = b(x.clone())
        return x

    shared = []
    x = torch.randn(4, 8)
    with torch.no_grad():
        out = bytegraph.compile(fn, backend=sharing_backend(shared))(x)
        assert_same(fn(x), out, atol=1e-6)
    assert shared == [None]


def test_worth_sharing_on_a_gpu_only(monkeypatch):
    graphs = []
    with torch.no_grad():
        bytegraph.compile(gpt(2), backend=lambda gm, ex: graphs.append(gm) or gm.forward)(torch.randint(0, 64, (2, 8)))
    gm = graphs[0]
    assert not regions.worth_sharing(gm, cudagraphs=True)         # the CPU splits instead
    work = max(regions.region_flops(gm).values())
    monkeypatch.setattr(regions, "on_cuda", lambda gm: True)
    monkeypatch.setattr(regions, "CUDA_MIN_REGION_FLOPS", work + 1)
    assert not regions.worth_sharing(gm, cudagraphs=False)        # launch-bound: compiled whole
    assert regions.worth_sharing(gm, cudagraphs=True)             # CUDA graphs hide the calls
    monkeypatch.setattr(regions, "CUDA_MIN_REGION_FLOPS", work)
    assert regions.worth_sharing(gm, cudagraphs=False)


def test_a_training_graph_on_a_gpu_is_shared_only_under_cuda_graphs_or_in_two_tiers(monkeypatch):
    graphs = []
    model = gpt(2).train()
    bytegraph.compile(model, backend=lambda gm, ex: graphs.append(gm) or gm.forward)(torch.randint(0, 64, (2, 8)))
    gm = graphs[0]
    monkeypatch.setattr(regions, "on_cuda", lambda gm: True)
    monkeypatch.setattr(regions, "CUDA_MIN_REGION_FLOPS", 0)
    assert not regions.worth_sharing(gm, cudagraphs=False)        # its steps would pay for the sharing
    assert regions.worth_sharing(gm, cudagraphs=True)
    assert regions.worth_sharing(gm, cudagraphs=False, tiered=True)  # until the whole compile is in


@pytest.mark.parametrize("fails", [False, True])
def test_inductor_compiles_the_shared_graph_without_buffer_reuse_or_falls_back(monkeypatch, fails):
    monkeypatch.setattr(inductor_backend, "worth_sharing", lambda gm, cudagraphs, tiered=False: True)
    monkeypatch.setattr(inductor_backend, "worth_splitting", lambda gm: False)
    compiled_graphs = []

    def whole(gm, example_inputs, config_patches=None):
        compiled_graphs.append((gm, config_patches))
        if fails and calls(gm):
            raise RuntimeError("no invoke_subgraph here")
        return aot_eager(gm, example_inputs)

    monkeypatch.setattr(inductor_backend, "inductor_whole", whole)
    model = gpt(3).train()
    x = torch.randint(0, 64, (2, 8))
    out = bytegraph.compile(model, backend=inductor_backend.inductor)(x)
    assert calls(compiled_graphs[0][0]) and compiled_graphs[0][1] == {"allow_buffer_reuse": False}
    if fails:
        assert len(compiled_graphs) == 2 and not calls(compiled_graphs[1][0])
    else:
        assert len(compiled_graphs) == 1
    expected = model(x)
    assert_same(expected, out, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Inductor on a GPU")
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_inductor_on_a_gpu_trains_like_eager_shared_under_cuda_graphs(monkeypatch, mode):
    monkeypatch.setattr(regions, "CUDA_MIN_REGION_FLOPS", 0)
    model = gpt(4).cuda().train()
    x = torch.randint(0, 64, (2, 8), device="cuda")
    compiled = bytegraph.compile(model, backend="inductor", mode=mode)
    # Gradients set anew each step: under CUDA graphs a gradient kept from one step lives in the
    # graph's pool, which the next replay writes (torch.compile raises there too).
    for _ in range(3):
        model.zero_grad(set_to_none=True)
        out = compiled(x)
        out.float().square().mean().backward()
        out = out.clone()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    expected = model(x)
    expected.float().square().mean().backward()
    assert_same(expected, out, atol=1e-4)
    for n, p in model.named_parameters():
        assert torch.allclose(grads[n], p.grad, atol=1e-4), n


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Inductor on a GPU")
def test_shared_blocks_under_cuda_graphs_infer_like_eager():
    # CUDA graphs replay the whole graph, shared blocks and all, whatever the work per block.
    model = gpt(4).cuda().eval()
    compiled = bytegraph.compile(model, backend="inductor", mode="reduce-overhead")
    with torch.no_grad():
        for seed in range(4):
            x = torch.randint(0, 64, (2, 8), device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
            assert_same(model(x), compiled(x).clone(), atol=1e-4)
