"""Capture of nn.Modules: user modules, torch.nn layers, containers, the module wrapper
returned by ``bytegraph.compile(module)``, compiled bound methods and decorator forms."""
import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import bytegraph
from bytegraph.testing import CompileCounter
from helpers import assert_same, check, clone_input, fresh_input


def t(*shape):
    return torch.randn(*shape)


def check_module(mod, *args, graphs=1, ops=None, rtol=1e-5, atol=1e-6, **kwargs):
    """Compile the module itself (the wrapper) and compare with the eager module."""
    expected = mod(*clone_input(args), **clone_input(kwargs))
    cnt = CompileCounter()
    compiled = bytegraph.compile(mod, backend=cnt, fullgraph=graphs == 1)
    out = compiled(*clone_input(args), **clone_input(kwargs))
    assert_same(expected, out, rtol, atol)
    assert cnt.frame_count == graphs
    if ops is not None:
        assert cnt.op_count == ops
    # Second call: inputs alike (shapes, dtypes, requires_grad) with other values, eager re-run on them.
    args2, kwargs2 = fresh_input(args), fresh_input(kwargs)
    expected2 = mod(*clone_input(args2), **clone_input(kwargs2))
    out2 = compiled(*clone_input(args2), **clone_input(kwargs2))
    assert_same(expected2, out2, rtol, atol, what="second call (other values)")
    assert cnt.frame_count == graphs, "recompiled on inputs alike"
    return compiled, cnt, out


# ---------------------------------------------------------------- user modules

class MLP(nn.Module):
    def __init__(self, d_in=8, hidden=16, d_out=4):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, d_out)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = MLP()
        self.b = MLP(4, 8, 8)
        self.scale = nn.Parameter(torch.tensor(0.5))

    def helper(self, x):
        return x * self.scale

    def forward(self, x):
        return self.helper(self.b(self.a(x))) + self.a.fc1.bias.sum()


def test_user_module_calling_submodules():
    check_module(MLP(), t(3, 8), ops=3)


def test_nested_user_modules_helper_methods_and_parameters():
    check_module(Nested(), t(2, 8))


def test_module_called_as_function_argument_and_via_forward():
    mlp = MLP()

    def f(x):
        return mlp(x) + mlp.forward(x)

    check(f, t(2, 8))


# ---------------------------------------------------------------- torch.nn layers

LAYERS = {
    "linear": (lambda: nn.Linear(6, 3), (4, 6)),
    "linear_nobias": (lambda: nn.Linear(6, 3, bias=False), (2, 5, 6)),
    "conv1d": (lambda: nn.Conv1d(3, 4, kernel_size=3, padding=1), (2, 3, 10)),
    "conv2d": (lambda: nn.Conv2d(3, 4, kernel_size=3, stride=2), (2, 3, 9, 9)),
    "layernorm": (lambda: nn.LayerNorm(6), (2, 3, 6)),
    "batchnorm1d": (lambda: nn.BatchNorm1d(6), (4, 6)),
    "batchnorm2d": (lambda: nn.BatchNorm2d(3), (2, 3, 4, 4)),
    "dropout": (lambda: nn.Dropout(0.5), (4, 6)),
    "relu": (lambda: nn.ReLU(), (4, 6)),
    "gelu": (lambda: nn.GELU(), (4, 6)),
    "gelu_tanh": (lambda: nn.GELU(approximate="tanh"), (4, 6)),
    "silu": (lambda: nn.SiLU(), (4, 6)),
    "tanh": (lambda: nn.Tanh(), (4, 6)),
    "softmax": (lambda: nn.Softmax(dim=-1), (4, 6)),
    "flatten": (lambda: nn.Flatten(), (2, 3, 4)),
}


def _eval_layer(make):
    layer = make().eval()
    for name, buf in layer.named_buffers():
        if name.endswith("running_mean"):
            buf.uniform_(-1, 1)
        elif name.endswith("running_var"):
            buf.uniform_(0.5, 2)
    return layer


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.mutation_blind(
    "memo_graph", reason="dropout in eval returns its input, made again from it after the graph"))
    if n == "dropout" else n for n in sorted(LAYERS)])
def test_nn_layer_in_eval(name):
    make, shape = LAYERS[name]
    check_module(_eval_layer(make), t(*shape), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_nn_layer_inside_user_function(name):
    make, shape = LAYERS[name]
    layer = _eval_layer(make)

    def f(x):
        return layer(x) * 2

    check(f, t(*shape), rtol=1e-4, atol=1e-5)


def test_embedding():
    emb = nn.Embedding(10, 4)

    def f(idx):
        return emb(idx), emb.weight[idx[0]]

    check(f, torch.tensor([[1, 2, 9], [0, 0, 3]]))


def test_embedding_with_padding_idx_module():
    # Not ascending: the second call gets the indices permuted (helpers.refill keeps ascending ones).
    check_module(nn.Embedding(10, 4, padding_idx=0), torch.tensor([3, 0, 5]))


def test_multihead_attention_eval():
    mha = nn.MultiheadAttention(embed_dim=8, num_heads=2, batch_first=True).eval()

    def f(x):
        out, weights = mha(x, x, x, need_weights=False)
        return out, weights

    check(f, t(2, 5, 8), rtol=1e-4, atol=1e-5)


def test_multihead_attention_with_causal_mask():
    mha = nn.MultiheadAttention(embed_dim=8, num_heads=2, batch_first=True).eval()

    def f(x):
        T = x.shape[1]
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        return mha(x, x, x, attn_mask=mask, need_weights=False)[0]

    check(f, t(2, 4, 8), rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- containers

def test_sequential():
    seq = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4), nn.Dropout(0.1)).eval()
    check_module(seq, t(3, 4))

    def f(x):
        return seq[0](x), seq[-2](seq[1](seq[0](x))), len(seq)

    check(f, t(3, 4))


def test_sequential_and_modulelist_slicing():
    seq = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))
    layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    def f(x):
        h = seq[:2](x)
        for layer in layers[1:]:
            x = layer(x)
        return h, x, len(layers[:2])

    check(f, t(3, 4))


def test_identity_layer_inside_function():
    ident = nn.Identity()

    def f(x):
        return ident(x) + 1

    check(f, t(2, 3), ops=1)


class Stack(nn.Module):
    def __init__(self, n=3):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(n)])
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Linear(4, 3)})

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        for i, layer in enumerate(self.layers):
            x = x + i * layer(x)
        x = self.layers[0](x) + self.layers[-1](x)
        outs = {}
        for name, head in self.heads.items():
            outs[name] = head(x)
        outs["sum"] = self.heads["a"](x).sum() + sum([h(x).sum() for h in self.heads.values()])
        return outs, len(self.layers), list(self.heads.keys())


def test_modulelist_and_moduledict():
    check_module(Stack(), t(2, 4), rtol=1e-4, atol=1e-5)


def test_modulelist_zip_with_python_list():
    layers = nn.ModuleList([nn.Linear(3, 3) for _ in range(3)])
    scales = [0.5, 1.0, 2.0]

    def f(x):
        for layer, s in zip(layers, scales):
            x = layer(x) * s
        return x

    check(f, t(2, 3))


# ---------------------------------------------------------------- python attributes and branches

class Configurable(nn.Module):
    def __init__(self, act="gelu", n_layers=2, use_bias=True, residual=False):
        super().__init__()
        self.act = act
        self.n_layers = n_layers
        self.use_bias = use_bias
        self.residual = residual
        self.lin = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.5)
        self.register_buffer("offset", torch.arange(4, dtype=torch.float32))
        self.register_buffer("scratch", torch.ones(4), persistent=False)

    def forward(self, x):
        h = x
        for _ in range(self.n_layers):
            h = self.lin(h)
            if self.act == "gelu":
                h = F.gelu(h)
            elif self.act == "relu":
                h = F.relu(h)
        if self.use_bias:
            h = h + self.offset * self.scratch
        if self.residual:
            h = h + x
        if self.training:
            h = self.drop(h) * 0 + 1
        else:
            h = self.drop(h) - 1
        return h


@pytest.mark.parametrize("kwargs", [dict(), dict(act="relu", n_layers=3, use_bias=False),
                                    dict(act="none", n_layers=1, residual=True)])
def test_python_attribute_branches_and_buffers_eval(kwargs):
    check_module(Configurable(**kwargs).eval(), t(2, 4))


@pytest.mark.mutation_blind("memo_graph", reason="the result is ones whatever the input")
def test_training_branch_in_train_mode():
    # In training mode the branch that does not depend on dropout's randomness is taken. (The
    # result is ones whatever the input: a graph answering its first call's outputs again
    # passes; the point is the branch taken, and the ones are checked.)
    mod = Configurable().train()
    compiled, cnt, out = check_module(mod, t(2, 4))
    assert torch.equal(out, torch.ones(2, 4))


def test_buffer_update_visible_to_compiled_module():
    mod = Configurable().eval()
    cnt = CompileCounter()
    compiled = bytegraph.compile(mod, backend=cnt)
    x = t(2, 4)
    compiled(x)
    with torch.no_grad():
        mod.offset.add_(100.0)
    assert_same(mod(x), compiled(x))
    assert cnt.frame_count == 1     # the buffer is read by the graph, not baked in: no recompile


def test_parameter_update_visible_to_compiled_module():
    mod = MLP()
    cnt = CompileCounter()
    compiled = bytegraph.compile(mod, backend=cnt)
    x = t(2, 8)
    compiled(x)
    with torch.no_grad():
        mod.fc2.weight.mul_(-3.0)
    assert_same(mod(x), compiled(x))
    assert cnt.frame_count == 1     # the weight is read by the graph, not baked in: no recompile


# ---------------------------------------------------------------- a tiny transformer block

class Block(nn.Module):
    def __init__(self, d=16, n_head=2, use_sdpa=False):
        super().__init__()
        self.n_head = n_head
        self.use_sdpa = use_sdpa
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(0.1))
        self.register_buffer("mask", torch.tril(torch.ones(8, 8)).view(1, 1, 8, 8))

    def attn(self, x):
        B, T, C = x.size()
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if self.use_sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return x


@pytest.mark.parametrize("use_sdpa", [False, True])
def test_tiny_transformer_block(use_sdpa):
    block = Block(use_sdpa=use_sdpa).eval()
    check_module(block, t(2, 6, 16), rtol=1e-4, atol=1e-5)


def test_stack_of_blocks_with_embedding():
    class TinyLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(20, 16)
            self.pos = nn.Embedding(8, 16)
            self.blocks = nn.ModuleList([Block() for _ in range(2)])
            self.ln_f = nn.LayerNorm(16)
            self.head = nn.Linear(16, 20, bias=False)

        def forward(self, idx, targets=None):
            b, T = idx.size()
            pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
            x = self.tok(idx) + self.pos(pos)
            for block in self.blocks:
                x = block(x)
            logits = self.head(self.ln_f(x))
            loss = None
            if targets is not None:
                loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
            return logits, loss

    model = TinyLM().eval()
    idx = torch.randint(0, 20, (2, 7))
    check_module(model, idx, rtol=1e-4, atol=1e-5)
    check_module(model, idx, targets=torch.randint(0, 20, (2, 7)), rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- the module wrapper

def test_wrapper_shares_state_with_module():
    mod = Nested()
    mod.note = "hello"
    compiled = bytegraph.compile(mod, backend=CompileCounter())
    assert compiled.state_dict().keys() == mod.state_dict().keys()
    assert compiled.a.fc1.weight is mod.a.fc1.weight
    assert compiled.scale is mod.scale
    assert compiled.note == "hello"
    assert compiled.a is mod.a
    assert compiled.training is mod.training
    assert all(p is q for p, q in zip(compiled.parameters(), mod.parameters()))
    assert len(list(compiled.parameters())) == len(list(mod.parameters()))
    assert [n for n, _ in compiled.named_parameters()] == [n for n, _ in mod.named_parameters()]
    assert isinstance(compiled, nn.Module)


def test_wrapper_writes_and_load_state_dict_go_to_module():
    mod = MLP()
    cnt = CompileCounter()
    compiled = bytegraph.compile(mod, backend=cnt)
    compiled.extra = 5
    assert mod.extra == 5
    other = MLP()
    compiled.load_state_dict(other.state_dict())
    assert torch.equal(mod.fc1.weight, other.fc1.weight)
    x = t(2, 8)
    assert_same(other(x), compiled(x))
    assert cnt.frame_count == 1


_COPIED_GRAPHS = []


def _counting_eager(gm, example_inputs):
    """A backend that copies and pickles as itself (a module function), counting its graphs."""
    _COPIED_GRAPHS.append(gm)
    return gm.forward


def test_wrapper_copies_deepcopy_pickle_torch_save():
    # An EMA copy of a compiled model (copy.deepcopy), a checkpoint of the whole object
    # (torch.save): the copy wraps a copy of the module, compiled with the same arguments.
    import copy
    import io
    import pickle
    mod = MLP()
    _COPIED_GRAPHS.clear()
    compiled = bytegraph.compile(mod, backend=_counting_eager, dynamic=False)
    x = t(2, 8)
    compiled(x)
    assert len(_COPIED_GRAPHS) == 1
    buf = io.BytesIO()
    torch.save(compiled, buf)
    buf.seek(0)
    copies = [copy.deepcopy(compiled), pickle.loads(pickle.dumps(compiled)), torch.load(buf, weights_only=False)]
    with torch.no_grad():
        mod.fc1.weight.add_(1.0)      # the copies keep the weights they were made with
    for c in copies:
        assert type(c) is type(compiled) and c._compile_args == compiled._compile_args
        assert c.fc1.weight is not mod.fc1.weight
        assert_same(c(x), c._orig_mod(x))
        assert not torch.equal(c(x), compiled(x))
    assert_same(compiled(x), mod(x))
    assert len(_COPIED_GRAPHS) == 1 + len(copies)     # each copy compiled its own module, once


def test_wrapper_methods_returning_the_module_return_the_wrapper():
    # model = bytegraph.compile(model).to(device) must stay compiled
    mod = MLP()
    cnt = CompileCounter()
    compiled = bytegraph.compile(mod, backend=cnt)
    assert compiled.to(torch.float64) is compiled and mod.fc1.weight.dtype == torch.float64
    assert compiled.float() is compiled and compiled.cpu() is compiled and compiled.requires_grad_(True) is compiled
    assert compiled.apply(lambda m: None) is compiled
    x = t(2, 8)
    assert_same(mod(x), compiled.double().float()(x))
    assert cnt.frame_count == 1


def test_wrapper_train_eval_forward_to_module():
    mod = Configurable()
    compiled = bytegraph.compile(mod, backend=CompileCounter())
    assert compiled.eval() is compiled
    assert mod.training is False and mod.drop.training is False
    compiled.train()
    assert mod.training is True and mod.drop.training is True


def test_wrapper_runs_forward_hooks():
    mod = MLP()
    seen = []
    mod.register_forward_hook(lambda m, inp, out: seen.append(out.shape))
    cnt = CompileCounter()
    compiled = bytegraph.compile(mod, backend=cnt)
    x = t(2, 8)
    assert_same(mod(x), compiled(x))
    assert seen == [torch.Size([2, 4]), torch.Size([2, 4])]
    assert cnt.frame_count == 1     # the hook traced with the forward (torch.compile: 1)


def test_compile_bound_forward_method():
    mod = MLP()
    cnt = CompileCounter()
    fwd = bytegraph.compile(mod.forward, backend=cnt, fullgraph=True)
    x = t(3, 8)
    assert_same(mod(x), fwd(x))
    x2 = t(3, 8)
    assert_same(mod(x2), fwd(x2))
    assert cnt.frame_count == 1


def test_compile_bound_method_of_user_class():
    block = Block().eval()
    cnt = CompileCounter()
    attn = bytegraph.compile(block.attn, backend=cnt, fullgraph=True)
    x = t(1, 5, 16)
    assert_same(block.attn(x), attn(x), rtol=1e-4, atol=1e-5)
    assert cnt.frame_count == 1


def test_same_module_compiled_twice_independently():
    mod = MLP()
    c1, c2 = CompileCounter(), CompileCounter()
    m1 = bytegraph.compile(mod, backend=c1)
    m2 = bytegraph.compile(mod, backend=c2)
    x = t(2, 8)
    assert_same(mod(x), m1(x))
    assert_same(mod(x), m2(x))
    assert c1.frame_count == 1 and c2.frame_count == 1


def test_deepcopy_of_module_then_compile():
    mod = MLP()
    clone = copy.deepcopy(mod)
    cnt = CompileCounter()
    compiled = bytegraph.compile(clone, backend=cnt)
    x = t(2, 8)
    assert_same(mod(x), compiled(x))
    assert cnt.frame_count == 1


# ---------------------------------------------------------------- decorator forms

def test_bare_decorator_returns_wrapper():
    # Bare form uses the default backend (inductor), which is tested elsewhere; here only
    # check that the decorator form is accepted and keeps the function's identity data.
    @bytegraph.compile
    def scaled(x):
        return x * 2

    assert callable(scaled)
    assert scaled.__name__ == "scaled"


def test_bare_decorator_on_module_class_instance():
    compiled = bytegraph.compile(MLP())
    assert isinstance(compiled, nn.Module)
    assert callable(compiled)


def test_decorator_with_arguments():
    cnt = CompileCounter()

    @bytegraph.compile(backend=cnt)
    def f(x, y):
        return torch.sin(x) + y

    x, y = t(3), t(3)
    assert_same(torch.sin(x) + y, f(x, y))
    assert f.__name__ == "f"
    assert cnt.frame_count == 1


def test_decorator_with_counter_backend_and_fullgraph():
    cnt = CompileCounter()

    @bytegraph.compile(backend=cnt, fullgraph=True)
    def f(x):
        return x.relu() * 3

    x = t(4)
    assert_same(x.relu() * 3, f(x))
    assert cnt.frame_count == 1 and cnt.op_count == 2


def test_decorator_on_forward_method():
    cnt = CompileCounter()

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        @bytegraph.compile(backend=cnt, fullgraph=True)
        def forward(self, x):
            return self.lin(x).relu()

    m = M()
    x = t(2, 3)
    assert_same(F.relu(m.lin(x)), m(x))
    assert cnt.frame_count == 1


def test_disable_returns_function_unchanged():
    def f(x):
        return x + 1

    assert bytegraph.compile(f, backend="eager", disable=True) is f


# ---------------------------------------------------------------- recurrent layers

class _Recurrent(nn.Module):
    def __init__(self, cls, **kw):
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.rnn = cls(8, 16, batch_first=True, **kw)
        self.out = nn.Linear(32 if kw.get("bidirectional") else 16, 4)

    def forward(self, x):
        y = self.rnn(self.inp(x).relu())[0]
        return self.out(y).sum(1)


@pytest.mark.parametrize("cls, kw", [(nn.LSTM, {}), (nn.LSTM, dict(num_layers=2, bidirectional=True)),
                                     (nn.GRU, {}), (nn.RNN, dict(nonlinearity="relu"))])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_recurrent_layers_in_one_graph(cls, kw, backend):
    # RNNBase.forward checks its weights against weak references it keeps to them: read through
    # the reference, the check folds and the fused recurrence is one node of the graph.
    torch.manual_seed(0)
    model = _Recurrent(cls, **kw)
    twin = copy.deepcopy(model)
    compiled = bytegraph.compile(twin, backend=backend, fullgraph=True)   # one graph, or an error
    x = torch.randn(2, 5, 8)
    expected, out = model(x), compiled(x)
    assert_same(expected, out, rtol=1e-5, atol=1e-6)
    expected.pow(2).sum().backward()
    out.pow(2).sum().backward()
    for p, q in zip(model.parameters(), twin.parameters()):
        assert_same(p.grad, q.grad, rtol=1e-4, atol=1e-6)


def test_recurrent_layer_with_a_replaced_weight_recompiles():
    torch.manual_seed(0)
    model = _Recurrent(nn.LSTM)
    cnt = CompileCounter()
    compiled = bytegraph.compile(model, backend=cnt)
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        assert_same(model(x), compiled(x))
        model.rnn.weight_hh_l0 = nn.Parameter(torch.randn_like(model.rnn.weight_hh_l0))
        assert_same(model(x), compiled(x))
        x2 = torch.randn(2, 5, 8)
        assert_same(model(x2), compiled(x2))
    assert cnt.frame_count == 2    # the new weight is another object: one recompile, then none


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("whole", [False, True], ids=["inside a model", "compiled itself"])
def test_recurrent_layer_on_a_gpu_runs_natively(whole):
    # cuDNN's fused kernel is kept: the layer runs natively, as under torch.compile.
    torch.manual_seed(0)
    model = _Recurrent(nn.GRU).cuda()
    twin = copy.deepcopy(model)
    cnt = CompileCounter()
    x = torch.randn(2, 5, 8, device="cuda")
    if whole:
        h = model.inp(x)
        expected, out = model.rnn(h)[0], bytegraph.compile(twin.rnn, backend=cnt)(h)[0]
    else:
        expected, out = model(x), bytegraph.compile(twin, backend=cnt)(x)
    assert torch.equal(expected, out)
    assert cnt.frame_count == (0 if whole else 2)
    from bytegraph.debug import records
    assert any("GRU on a GPU runs natively" in (r.break_reason or r.fallback_reason or "") for r in records.frames)


# ---------------------------------------------------------------- nn.TransformerEncoder's nested path

class _Encoded(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, dropout=0.0), 2)
        self.out = nn.Linear(16, 2)

    def forward(self, x, mask):
        return self.out(self.enc(self.inp(x), src_key_padding_mask=mask))


def _padding_mask():
    return torch.tensor([[False] * 5, [False] * 3 + [True] * 2])


@pytest.mark.parametrize("whole", [False, True], ids=["inside a model", "compiled itself"])
def test_transformer_encoder_with_padding_in_eval_runs_natively(whole):
    # Eager packs the batch into a nested tensor and gives zeros at the padded positions; the
    # layers run on the dense batch under a compiler. The encoder runs natively instead.
    from bytegraph.debug import records
    torch.manual_seed(0)
    model = _Encoded().eval()
    x, mask = torch.randn(2, 5, 8), _padding_mask()
    with torch.no_grad():
        if whole:
            h = model.inp(x)
            expected = model.enc(h, src_key_padding_mask=mask)
            out = bytegraph.compile(model.enc, backend="eager")(h, src_key_padding_mask=mask)
            assert torch.equal(expected[1, 3:], torch.zeros_like(expected[1, 3:]))
        else:
            expected, out = model(x, mask), bytegraph.compile(model, backend="eager")(x, mask)
    assert torch.equal(expected, out)
    reasons = [r.break_reason or r.fallback_reason for r in records.frames]
    assert any(r and r.startswith("nn.TransformerEncoder with a padding mask") for r in reasons)


def test_transformer_encoder_with_padding_in_training_is_one_graph():
    torch.manual_seed(0)
    model = _Encoded().train()
    twin = copy.deepcopy(model)
    x, mask = torch.randn(2, 5, 8), _padding_mask()
    out = bytegraph.compile(twin, backend="aot_eager", fullgraph=True)(x, mask)
    expected = model(x, mask)
    assert_same(expected, out, rtol=1e-5, atol=1e-6)
    expected.sum().backward()
    out.sum().backward()
    for p, q in zip(model.parameters(), twin.parameters()):
        assert_same(p.grad, q.grad, rtol=1e-4, atol=1e-6)
