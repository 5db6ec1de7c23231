"""Regional compilation (backends/regions.py): a graph with repeated blocks is split at them and
each distinct block is compiled once; results and gradients are eager's."""
import pytest
import torch
import torch.nn as nn

import bytegraph
from bytegraph.backends import regions
from bytegraph.demo.models import GPTConfig, TinyGPT
from helpers import assert_same, assert_sum_grads_like_eager, splitting_backend


def regional_backend(parts, outer):
    """A backend splitting by regions, each part compiled with aot_eager (and recorded)."""
    return splitting_backend(regions.compile_by_regions, parts, outer)


def gpt(n_layer, **kw):
    torch.manual_seed(0)
    return TinyGPT(GPTConfig(n_layer=n_layer, n_embd=32, n_head=4, block_size=8, vocab_size=64, dropout=0.0, **kw))


def test_repeated_blocks_compiled_once_with_eager_results_and_gradients():
    model = gpt(5)
    parts, outer = [], []
    compiled = bytegraph.compile(model, backend=regional_backend(parts, outer))
    x = torch.randint(0, 64, (2, 8))
    out = compiled(x)
    # Embeddings before, one block for all five, final norm and head after.
    assert len(parts) == 3
    assert outer[0].meta["bytegraph_parts"] == 3
    assert outer[0].code.count("run_part_1(") == 5
    expected = model(x)
    assert_same(expected, out, atol=1e-5)
    assert_sum_grads_like_eager(model, out, expected)


def test_no_split_without_repeats_or_when_switched_off():
    parts, outer = [], []
    model = gpt(1)
    compiled = bytegraph.compile(model, backend=regional_backend(parts, outer))
    x = torch.randint(0, 64, (2, 8))
    assert_same(model(x), compiled(x), atol=1e-5)
    assert outer == [None] and parts == []
    bytegraph.reset()
    with bytegraph.config.patch(regional_compile=False):
        model = gpt(3)
        compiled = bytegraph.compile(model, backend=regional_backend(parts, outer))
        assert_same(model(x), compiled(x), atol=1e-5)
    assert outer[-1] is None


class Wide(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.a = nn.Linear(d_in, d_out)
        self.b = nn.Linear(d_out, d_out)
        self.norm = nn.LayerNorm(d_out)

    def forward(self, x):
        h = torch.relu(self.a(x))
        h = torch.tanh(self.b(h)) * 0.5 + h
        h = self.norm(h)
        return torch.sigmoid(h) * h + h.mean(-1, keepdim=True)


def test_blocks_of_other_shapes_are_compiled_apart():
    model = nn.Sequential(Wide(8, 16), Wide(16, 16), Wide(16, 16), Wide(16, 24), Wide(24, 24))
    parts, outer = [], []
    compiled = bytegraph.compile(model, backend=regional_backend(parts, outer))
    x = torch.randn(3, 8)
    with torch.no_grad():
        assert_same(model(x), compiled(x), atol=1e-5)
    split = outer[0]
    assert split is not None
    # Wide(16,16) twice share one compile; the others differ in shapes.
    assert split.meta["bytegraph_parts"] == len(parts) < 5


def test_dynamic_shapes_compile_whole():
    model = gpt(3)
    parts, outer = [], []
    compiled = bytegraph.compile(model, backend=regional_backend(parts, outer), dynamic=True)
    x = torch.randint(0, 64, (2, 8))
    assert_same(model(x), compiled(x), atol=1e-5)
    assert outer == [None]


@pytest.mark.filterwarnings("ignore")
def test_inductor_compiles_each_block_once(monkeypatch):
    from bytegraph.backends import inductor as inductor_module
    compiles = []
    whole = inductor_module.inductor_whole

    def counting(gm, examples, **kw):
        compiles.append(gm)
        return whole(gm, examples, **kw)

    monkeypatch.setattr(inductor_module, "inductor_whole", counting)
    model = gpt(4).eval()
    compiled = bytegraph.compile(model, backend="inductor")
    x = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        assert_same(model(x), compiled(x), atol=1e-4)
    assert len(compiles) == 3


def test_region_work_counts_the_matrix_products_of_a_block():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    model = gpt(2)
    x = torch.randint(0, 64, (2, 8))
    assert_same(model(x), bytegraph.compile(model, backend=backend)(x), atol=1e-5)
    work = regions.region_flops(graphs[0])
    assert len(work) == 2 and len(set(work.values())) == 1       # two blocks, the same work
    rows, d = 2 * 8, 32
    # q/k/v, the attention projection and the MLP's two linears: 2*rows*d*(3d + d + 4d + 4d);
    # attention scores and their product with v; elementwise ops add a little on top.
    products = 2 * rows * d * 12 * d + 2 * 2 * rows * 8 * d
    flops = next(iter(work.values()))
    assert products <= flops < 1.2 * products
    # On the CPU a graph that will be differentiated is compiled whole (its parts partitioned
    # apart ran slower); without grad it is split (kernels run in the caller's thread).
    assert not regions.worth_splitting(graphs[0])
    with torch.no_grad():
        bytegraph.compile(model, backend=backend)(x)
    assert len(graphs) == 2 and regions.worth_splitting(graphs[1])


def test_a_gpu_graph_is_split_only_when_its_blocks_do_enough_work(monkeypatch):
    graphs = []
    model = gpt(2)
    with torch.no_grad():
        bytegraph.compile(model, backend=lambda gm, ex: graphs.append(gm) or gm.forward)(torch.randint(0, 64, (2, 8)))
    work = max(regions.region_flops(graphs[0]).values())
    monkeypatch.setattr(regions, "on_cuda", lambda gm: True)
    monkeypatch.setattr(regions, "CUDA_MIN_REGION_FLOPS", work + 1)
    assert not regions.worth_splitting(graphs[0])      # launch-bound: compiled whole
    monkeypatch.setattr(regions, "CUDA_MIN_REGION_FLOPS", work)
    assert regions.worth_splitting(graphs[0])


def test_layers_of_a_model_called_from_a_training_step_are_the_regions():
    # The compiled function calls the model, whose forward is traced as a block around its
    # layers: the layers are what repeats, so they are the regions (not the one model call).
    model = gpt(4)

    def step(x):
        return model(x).float().pow(2).mean()

    parts, outer = [], []
    compiled = bytegraph.compile(step, backend=regional_backend(parts, outer))
    x = torch.randint(0, 64, (2, 8))
    loss = compiled(x)
    assert outer[0] is not None and outer[0].meta["bytegraph_parts"] == 3
    assert outer[0].code.count("run_part_1(") == 4
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    expected = step(x)
    expected.backward()
    assert torch.allclose(loss, expected, atol=1e-6)
    for n, p in model.named_parameters():
        assert torch.allclose(grads[n], p.grad, atol=1e-6), n


@pytest.mark.parametrize("state", ["autocast", "no_grad_then_grad", "no_grad_inside_the_head_part"])
def test_parts_are_compiled_under_the_grad_mode_and_autocast_the_graph_sets(state):
    # `with torch.autocast(...)` inside the compiled function is a pair of nodes around the
    # layers; each part must be traced by AOTAutograd under it (bf16 matmuls), and nothing of it
    # may leak out of the call. A block beginning or ending between two non-repeated ops does not
    # cut them apart: the head and the loss after it are one part.
    model = gpt(3)

    def step(x):
        if state == "autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(x)
            return logits.float().log_softmax(-1).mean(), logits.dtype
        if state == "no_grad_inside_the_head_part":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(x)
                with torch.no_grad():
                    scale = logits.abs().amax() + 1
                scaled = logits / scale
            return (scaled.float() @ logits.float().transpose(1, 2)).mean(), scale.requires_grad
        with torch.no_grad():
            frozen = model(x)
        return (model(x) * frozen).mean(), frozen.requires_grad

    parts, outer = [], []
    compiled = bytegraph.compile(step, backend=regional_backend(parts, outer))
    x = torch.randint(0, 64, (2, 8))
    loss, extra = compiled(x)
    assert outer[0] is not None
    if state != "no_grad_then_grad":
        assert outer[0].meta["bytegraph_parts"] == 3      # embeddings, one block, head and loss
    assert torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    expected, expected_extra = step(x)
    expected.backward()
    assert extra == expected_extra
    assert torch.equal(loss, expected) if state == "autocast" else torch.allclose(loss, expected, atol=1e-6)
    for n, p in model.named_parameters():
        assert torch.allclose(grads[n], p.grad, atol=1e-5 if state == "autocast" else 1e-6), n


@pytest.mark.parametrize("grad", [False, True])
def test_a_graph_that_is_differentiated_is_compiled_whole(monkeypatch, grad):
    # A training step (here one that sets autocast itself) split costs AOTAutograd's wrappers
    # per part on every step on a GPU, and slower kernels on the CPU (each part partitioned for
    # its backward alone); without grad the work decides on a GPU, and the CPU splits.
    model = gpt(3)

    def step(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(x).float().mean()

    graphs = []
    with torch.set_grad_enabled(grad):
        bytegraph.compile(step, backend=lambda gm, ex: graphs.append(gm) or gm.forward)(torch.randint(0, 64, (2, 8)))
    assert any(regions.is_state_node(n) for n in graphs[0].graph.nodes)
    assert regions.worth_splitting(graphs[0]) == (not grad)     # on the CPU
    work = max(regions.region_flops(graphs[0]).values())
    monkeypatch.setattr(regions, "on_cuda", lambda gm: True)
    monkeypatch.setattr(regions, "CUDA_MIN_REGION_FLOPS", work)
    assert regions.worth_splitting(graphs[0]) == (not grad)
    monkeypatch.setattr(regions, "CUDA_MIN_REGION_FLOPS", work + 1)
    assert not regions.worth_splitting(graphs[0])


def test_split_model_trained_several_steps_follows_its_parameters_like_eager():
    # The split graph runs as regions.outer_function's generated code, holding the parameters it
    # read once (not fx's code reading them from the module per call): the optimizer's in-place
    # updates, a parameter's data swapped, and a changed lr between steps all reach it.
    import copy
    model = gpt(4)
    ref = copy.deepcopy(model)
    parts, outer = [], []
    compiled = bytegraph.compile(model, backend=regional_backend(parts, outer))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    for i in range(4):
        torch.manual_seed(i)
        x = torch.randint(0, 64, (2, 8))
        if i == 2:
            for o in (opt, opt_ref):
                o.param_groups[0]["lr"] = 3e-3
            with torch.no_grad():
                for m in (model, ref):
                    m.h[1].mlp.c_fc.weight.data = m.h[1].mlp.c_fc.weight.data * 0.5
        out, expected = compiled(x), ref(x)
        assert_same(expected, out, atol=1e-5)
        out.square().mean().backward()
        expected.square().mean().backward()
        for o in (opt, opt_ref):
            o.step()
            o.zero_grad()
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-5, msg=n)
    assert outer[0] is not None and outer[0].forward.__name__ == "run_regions_outer"
    assert "self." not in outer[0].forward._bytegraph_source
