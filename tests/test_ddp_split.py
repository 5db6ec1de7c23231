"""The DDP graph splitter on its own (no process group): where pieces end, and that the pieces
compute what the whole graph computes, gradients included. tests/test_distributed.py runs it
under a real DDP on 2 processes."""
import copy

import torch

import bytegraph
from bytegraph.backends import ddp as ddp_split
from bytegraph.backends.aot import aot_eager
from bytegraph.testing import CompileCounter


class Layer(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = torch.nn.Linear(d, d)

    def forward(self, x):
        return torch.relu(self.fc(x))


class Tied(torch.nn.Module):
    """An embedding whose weight the head reuses: its gradient is ready only after the first op."""

    def __init__(self, vocab=20, d=16, depth=4):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.layers = torch.nn.ModuleList([Layer(d) for _ in range(depth)])
        self.head = torch.nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx):
        x = self.emb(idx)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _graph(model, *args):
    counter = CompileCounter()
    bytegraph.compile(model, backend=counter, fullgraph=True)(*args)
    return counter.graphs[0], counter.example_inputs[0]


def _managed(model):
    return {id(p): name for name, p in model.named_parameters()}


def _layer_bytes(d=16):
    return (d * d + d) * 4


def test_pieces_fill_buckets_from_the_end():
    model = Tied()
    idx = torch.randint(0, 20, (3, 5))
    gm, _ = _graph(model, idx)
    cap = 2 * _layer_bytes()
    pieces = ddp_split.plan(gm, [cap, cap], _managed(model))
    names = [p.params for p in pieces]
    # Walking back from the output: layers 3 and 2 fill the first bucket, layers 1 and 0 the
    # next; the tied embedding/head weight counts where it is first used (the embedding).
    assert names[-1] == ["layers.2.fc.weight", "layers.2.fc.bias", "layers.3.fc.weight", "layers.3.fc.bias"]
    assert names[-2] == ["layers.0.fc.weight", "layers.0.fc.bias", "layers.1.fc.weight", "layers.1.fc.bias"]
    assert names[0] == ["emb.weight"]
    assert all(p.nbytes >= cap for p in pieces[1:])
    # Every compute node is in exactly one piece, in graph order.
    compute = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    assert [n for p in pieces for n in p.nodes] == compute


def test_first_bucket_cap_and_preamble_merge():
    model = torch.nn.Sequential(*[Layer(16) for _ in range(4)])
    x = torch.randn(2, 16)
    gm, _ = _graph(model, x)
    small, big = _layer_bytes(), 3 * _layer_bytes()
    pieces = ddp_split.plan(gm, [small, big], _managed(model))
    assert [len(p.params) for p in pieces] == [6, 2]     # first bucket: one layer; then the rest
    assert pieces[-1].cap == small and pieces[0].cap == big
    # A cap no bucket reaches: one piece, which the backend gets whole.
    assert len(ddp_split.plan(gm, [10 ** 9], _managed(model))) == 1


def test_unmanaged_parameters_do_not_count():
    model = torch.nn.Sequential(*[Layer(16) for _ in range(4)])
    gm, _ = _graph(model, torch.randn(2, 16))
    managed = {k: v for k, v in _managed(model).items() if not v.startswith(("2.", "3."))}
    pieces = ddp_split.plan(gm, [_layer_bytes()], managed)
    assert [p.params for p in pieces] == [["0.fc.weight", "0.fc.bias"], ["1.fc.weight", "1.fc.bias"]]


def test_split_pieces_compute_the_same_values_and_gradients():
    torch.manual_seed(0)
    model = Tied()
    twin = copy.deepcopy(model)
    idx = torch.randint(0, 20, (3, 5))
    gm, examples = _graph(model, idx)
    pieces = ddp_split.plan(gm, [_layer_bytes()], _managed(model))
    assert len(pieces) >= 4
    counter = CompileCounter(aot_eager)
    run = ddp_split.compile_pieces(gm, examples, pieces, counter)
    assert counter.frame_count == len(pieces)
    # Each piece's example inputs are fake tensors of one fake mode (its inputs' meta values).
    modes = {t.fake_mode for ex in counter.example_inputs for t in ex if isinstance(t, torch.Tensor)}
    assert len(modes) == 1
    (out,) = run(idx)
    expected = twin(idx)
    assert torch.allclose(out, expected, atol=1e-6)
    out.sum().backward()
    expected.sum().backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), name


def test_split_description_names_pieces_and_the_switch():
    model = torch.nn.Sequential(*[Layer(16) for _ in range(4)])
    gm, _ = _graph(model, torch.randn(2, 16))
    cap = _layer_bytes()
    pieces = ddp_split.plan(gm, [cap], _managed(model))
    text = ddp_split.DDPSplit("Sequential.forward", pieces, [cap]).describe()
    assert "split into 4 graphs at DDP bucket boundaries" in text
    assert "optimize_ddp = False" in text
    assert "Graph 1: 2 ops" in text and "0.fc.weight" in text


def test_no_active_ddp_no_split():
    assert ddp_split.active_ddp_module() is None
    counter = CompileCounter()
    model = torch.nn.Sequential(*[Layer(16) for _ in range(4)])
    bytegraph.compile(model, backend=counter)(torch.randn(2, 16))
    assert counter.frame_count == 1


def test_optimize_ddp_setting_checked():
    assert bytegraph.config.optimize_ddp is True
    try:
        bytegraph.config.optimize_ddp = "no"
    except bytegraph.errors.ConfigError as e:
        assert "optimize_ddp" in str(e)
    else:
        raise AssertionError("a str was accepted for optimize_ddp")


class Regions(torch.nn.Module):
    """A no_grad block, an autocast block and a chunk whose pieces are read later: no cut inside."""

    def __init__(self, d=16):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(d, d) for _ in range(6)])
        self.wide = torch.nn.Linear(d, 2 * d)

    def forward(self, x):
        x = self.layers[0](x)
        with torch.no_grad():
            y = self.layers[1](x) * 2
            y = self.layers[2](y)
        x = x + y
        a, b = self.wide(x).chunk(2, dim=-1)
        x = self.layers[3](torch.relu(a))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            z = self.layers[4](x)
        x = x + z.float() + b
        return self.layers[5](x)


def test_no_cut_inside_state_regions_or_between_tuple_and_items():
    torch.manual_seed(0)
    model = Regions()
    twin = copy.deepcopy(model)
    x = torch.randn(3, 16)
    gm, examples = _graph(model, x)
    pieces = ddp_split.plan(gm, [1], _managed(model))     # every parameter wants its own piece
    assert len(pieces) >= 3
    for piece in pieces:
        grad_modes = [n.args[0] for n in piece.nodes if n.target is torch._C._set_grad_enabled]
        assert grad_modes in ([], [False, True]), grad_modes
        enters = sum(n.target is torch.amp._enter_autocast for n in piece.nodes)
        exits = sum(n.target is torch.amp._exit_autocast for n in piece.nodes)
        assert enters == exits
        members = set(piece.nodes)
        for n in piece.nodes:
            if not isinstance(n.meta.get("example_value"), (torch.Tensor, torch.SymInt)):
                assert all(u in members or u.op == "output" for u in n.users), n
    run = ddp_split.compile_pieces(gm, examples, pieces, aot_eager)
    (out,) = run(x)
    expected = twin(x)
    assert torch.allclose(out, expected, atol=1e-2)
    out.sum().backward()
    expected.sum().backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            assert torch.allclose(p.grad, q.grad, atol=1e-2), name


def test_module_runs_natively_around_its_compiled_forward():
    """How DDP's wrapped module and FSDP2 modules run: hooks natively, forward compiled, and the
    instance left as it was (a forward set on the instance is compiled in its place)."""
    from bytegraph.residual import call_with_compiled_forward
    from bytegraph.runtime.dispatch import Compiler

    model = Layer(16)
    seen = []
    model.register_forward_pre_hook(lambda m, args: seen.append(bytegraph.is_compiling()))
    x = torch.randn(2, 16)
    counter = CompileCounter()
    compiler = Compiler(counter, backend_name="counter", fullgraph=False, dynamic=None)
    out = call_with_compiled_forward(compiler, model, lambda: model(x))
    assert torch.allclose(out, torch.relu(model.fc(x)))
    assert seen == [False] and counter.frame_count == 1 and "forward" not in model.__dict__

    def doubled(self, x):
        return 2 * torch.relu(self.fc(x))

    own = doubled.__get__(model)
    model.forward = own
    out = call_with_compiled_forward(compiler, model, lambda: model(x))
    assert torch.allclose(out, 2 * torch.relu(model.fc(x)))
    assert counter.frame_count == 2 and model.__dict__["forward"] is own
