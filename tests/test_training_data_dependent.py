"""Training through ops whose output shapes depend on data, and gradients eager leaves as None.

Every test runs the same function or module eagerly and compiled and compares the
forward values, the loss and every ``.grad`` (``None`` against ``None``, tensors by value).
"""
import copy

import pytest
import torch

import bytegraph
from bytegraph.backends.registry import lookup_backend
from bytegraph.testing import CompileCounter
from helpers import refill, torch_compile_graphs

BACKENDS = ["eager", "aot_eager"]


@pytest.fixture(autouse=True)
def graphs_are_compiled(monkeypatch):
    """A backend's fallback to running a graph uncompiled would hide a missed graph break."""
    def refuse(backend_name, gm, exc, restore):
        raise AssertionError(f"backend {backend_name} ran a graph uncompiled: {exc}")

    monkeypatch.setattr("bytegraph.backends.aot.run_uncompiled", refuse)
    monkeypatch.setattr("bytegraph.backends.inductor.run_uncompiled", refuse)


def _leaves(args):
    return [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]


def _fresh(args):
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            a = a.detach().clone().requires_grad_(a.requires_grad)
        out.append(a)
    return out


def _assert_grads_equal(expected, actual, what):
    assert len(expected) == len(actual)
    for i, (e, a) in enumerate(zip(expected, actual)):
        if e is None or a is None:
            assert e is None and a is None, f"{what}[{i}]: eager grad {e!r}, compiled grad {a!r}"
        else:
            assert torch.allclose(e, a, rtol=1e-4, atol=1e-5), f"{what}[{i}]: {e} != {a}"


def _assert_same_outputs(expected, actual):
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    actual = actual if isinstance(actual, (tuple, list)) else (actual,)
    assert len(expected) == len(actual)
    for e, a in zip(expected, actual):
        if isinstance(e, torch.Tensor):
            assert e.shape == a.shape and e.dtype == a.dtype, (e, a)
            assert torch.allclose(e.detach(), a.detach(), rtol=1e-4, atol=1e-5), (e, a)
            assert e.requires_grad == a.requires_grad
        else:
            assert e == a


def check_fn(fn, args, backend, loss=lambda out: out[0].sum() if isinstance(out, tuple) else out.sum(),
             calls=2, **compile_kwargs):
    """fn(*args) eagerly and compiled: equal outputs, losses and grads of every tensor argument
    that requires grad, over ``calls`` forward/backward rounds (grads accumulate across them;
    the arguments get other values before each later round, ``refill``). The first call must
    compile a graph where torch.compile makes one."""
    eager_args, compiled_args = _fresh(args), _fresh(args)
    cnt = CompileCounter(lookup_backend(backend))
    compiled = bytegraph.compile(fn, backend=cnt, **compile_kwargs)
    for i in range(calls):
        if i:
            refill(eager_args, seed=i)
            refill(compiled_args, seed=i)
        torch.manual_seed(0)
        out_e = fn(*eager_args)
        torch.manual_seed(0)
        out_c = compiled(*compiled_args)
        _assert_same_outputs(out_e, out_c)
        loss_e, loss_c = loss(out_e), loss(out_c)
        assert torch.allclose(loss_e, loss_c, rtol=1e-4, atol=1e-5), (loss_e, loss_c)
        loss_e.backward()
        loss_c.backward()
        _assert_grads_equal([a.grad for a in _leaves(eager_args)], [a.grad for a in _leaves(compiled_args)],
                            "argument grad")
        if i == 0:
            _assert_compiled_where_torch_does(cnt, fn, args, compile_kwargs)
    return cnt


def _assert_compiled_where_torch_does(cnt, fn, args, compile_kwargs):
    """No graph at all is right only where torch.compile makes none either (asked only then);
    and no frame ran eagerly whole: each was traced to a graph or a break (a data-dependent op
    runs natively between graphs)."""
    from bytegraph.debug import records
    whole = [f"{r.name}: {r.fallback_reason}" for r in records.frames if r.fallback_reason]
    assert not whole, "frames ran eagerly whole:\n" + "\n".join(whole)
    if cnt.frame_count == 0:
        torch.manual_seed(0)
        made = torch_compile_graphs(fn, tuple(_fresh(args)), dynamic=compile_kwargs.get("dynamic"))
        assert made == 0, f"no graph compiled where torch.compile makes {made}"


def _model_grads(model):
    return [p.grad for p in model.parameters()]


def check_module(make, inputs, backend, loss, steps=2, optimizer=None):
    """A module trained eagerly and compiled: equal outputs, losses, parameter and input grads,
    and (with ``optimizer``) equal parameters after each step."""
    torch.manual_seed(0)
    eager_model = make()
    compiled_model = copy.deepcopy(eager_model)
    cnt = CompileCounter(lookup_backend(backend))
    compiled = bytegraph.compile(compiled_model, backend=cnt)
    opt_e = optimizer(eager_model.parameters()) if optimizer else None
    opt_c = optimizer(compiled_model.parameters()) if optimizer else None
    eager_inputs, compiled_inputs = _fresh(inputs), _fresh(inputs)
    for step in range(steps):
        if step:
            refill(eager_inputs, seed=step)
            refill(compiled_inputs, seed=step)
        if opt_e is not None:
            opt_e.zero_grad(set_to_none=True)
            opt_c.zero_grad(set_to_none=True)
        out_e = eager_model(*eager_inputs)
        out_c = compiled(*compiled_inputs)
        _assert_same_outputs(out_e, out_c)
        loss_e, loss_c = loss(out_e), loss(out_c)
        assert torch.allclose(loss_e, loss_c, rtol=1e-4, atol=1e-5), (loss_e, loss_c)
        loss_e.backward()
        loss_c.backward()
        _assert_grads_equal(_model_grads(eager_model), _model_grads(compiled_model), "parameter grad")
        _assert_grads_equal([a.grad for a in _leaves(eager_inputs)], [a.grad for a in _leaves(compiled_inputs)],
                            "input grad")
        if opt_e is not None:
            opt_e.step()
            opt_c.step()
            for pe, pc in zip(eager_model.parameters(), compiled_model.parameters()):
                assert torch.allclose(pe, pc, rtol=1e-5, atol=1e-6)
        if step == 0:
            _assert_compiled_where_torch_does(cnt, copy.deepcopy(eager_model), inputs, {})
    return cnt


def _x():
    torch.manual_seed(1)
    return torch.randn(12)


def _w():
    torch.manual_seed(2)
    return torch.randn(12, requires_grad=True)


# --- A. data-dependent output shapes -------------------------------------------------------

def f_bool_mask(x, w):
    y = x * w
    z = y[y > 0]
    return (z * 2).sum() + y.sum()


def f_masked_select(x, w):
    y = torch.tanh(x * w)
    z = torch.masked_select(y, x > 0)
    return z.pow(2).sum()


def f_nonzero(x, w):
    y = x * w
    idx = torch.nonzero(y > 0)
    return (y[idx.squeeze(1)] * w[idx.squeeze(1)]).sum()


def f_nonzero_tuple(x, w):
    y = (x * w).view(3, 4)
    rows, cols = torch.nonzero(y > 0, as_tuple=True)
    return (y[rows, cols] + rows.float()).sum()


def f_argwhere(x, w):
    y = x * w
    idx = torch.argwhere(y < 0)
    return (y[idx[:, 0]] ** 2).sum()


def f_where_one_arg(x, w):
    y = x * w
    (idx,) = torch.where(y > 0)
    return (y[idx] * 3).sum()


def f_unique(x, w):
    keys = (x * 2).round().clamp(-2, 2)
    uniq, inverse, counts = torch.unique(keys, return_inverse=True, return_counts=True)
    pooled = torch.zeros(uniq.shape[0]).index_add(0, inverse, x * w)
    return (pooled / counts).sum() + uniq.sum()


def f_repeat_interleave(x, w):
    counts = (x > 0).long() + 1
    y = torch.repeat_interleave(x * w, counts)
    return (y * torch.arange(y.shape[0])).sum()


def f_mask_write_scalar(x, w):
    y = x * w
    y[y > 0] = 0.0
    return y.sum()


def f_mask_write_tensor(x, w):
    y = x * 2
    y[x > 0] = w[0]             # the value needs grad: its gradient sums over the mask
    return (y * w).sum()


def f_mask_write_gathered(x, w):
    y = x * w
    m = y > 0
    y[m] = w[m] * 3
    return y.sum()


def f_index_fill_tensor(x, w):
    idx = torch.tensor([1, 3, 5])
    return (x * w).index_fill(0, idx, w[0]).sum()


def f_item(x, w):
    scale = (x * w).abs().max().item()
    return (x * w / scale).sum()


def f_tolist(x, w):
    sizes = (x[:3].abs() * 2).long().tolist()
    return sum((w[:s + 1] * x[:s + 1]).sum() for s in sizes)


DATA_DEPENDENT = [f_bool_mask, f_masked_select, f_nonzero, f_nonzero_tuple, f_argwhere, f_where_one_arg,
                  f_unique, f_repeat_interleave, f_mask_write_scalar, f_mask_write_tensor,
                  f_mask_write_gathered, f_index_fill_tensor, f_item, f_tolist]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", DATA_DEPENDENT, ids=lambda f: f.__name__)
def test_data_dependent_training(fn, backend):
    check_fn(fn, (_x(), _w()), backend)


@pytest.mark.parametrize("fn", [f_bool_mask, f_unique, f_mask_write_tensor], ids=lambda f: f.__name__)
def test_data_dependent_training_inductor(fn):
    check_fn(fn, (_x(), _w()), "inductor")


def test_data_dependent_op_breaks_and_resumes():
    """The op runs natively between two graphs: one before it, one after it."""
    cnt = check_fn(f_bool_mask, (_x(), _w()), "aot_eager")
    assert cnt.frame_count == 2
    ops = [n.target for gm in cnt.graphs for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.mul in ops or any(getattr(t, "__name__", "") == "mul" for t in ops)


def test_static_mask_write_stays_in_the_graph():
    """y[mask] = constant has a static-shape backward: no graph break."""
    cnt = check_fn(f_mask_write_scalar, (_x(), _w()), "aot_eager")
    assert cnt.frame_count == 1


def f_size_from_torch_div(x, w):
    # Longformer/LED chunking: a size made by torch.div on Python ints (a tensor whose value the
    # fake tensor knows) given to view; the backward check's copies must keep that value.
    n = torch.div(x.size(0), 4, rounding_mode="trunc")
    return (x * w).view(n, 4).sum(1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_size_from_a_tensor_of_python_numbers_stays_in_the_graph(backend):
    cnt = check_fn(f_size_from_torch_div, (_x(), _w()), backend)
    assert cnt.frame_count == 1


@pytest.mark.parametrize("fn, op, line", [
    (f_bool_mask, "aten.nonzero", "z = y[y > 0]"),
    (f_masked_select, "aten.masked_select", "z = torch.masked_select(y, x > 0)"),
    (f_unique, "aten._unique2", "torch.unique(keys, return_inverse=True, return_counts=True)"),
    (f_repeat_interleave, "aten.repeat_interleave", "y = torch.repeat_interleave(x * w, counts)"),
    (f_mask_write_tensor, "aten.nonzero", "y[x > 0] = w[0]"),
])
def test_fullgraph_names_the_op_and_line(fn, op, line):
    with pytest.raises(bytegraph.Unsupported) as info:
        bytegraph.compile(fn, backend="aot_eager", fullgraph=True)(_x(), _w())
    text = str(info.value)
    assert op in text
    assert f'File "{__file__}", line {fn.__code__.co_firstlineno}' not in text    # the op's own line, not the def
    frame = info.value.user_stack[-1]
    assert frame.filename == __file__ and frame.name == fn.__name__
    assert line in frame.line and line in text
    assert f'File "{__file__}", line {frame.lineno}' in text


def test_fullgraph_item_is_unsupported():
    with pytest.raises(bytegraph.Unsupported) as info:
        bytegraph.compile(f_item, backend="aot_eager", fullgraph=True)(_x(), _w())
    assert "item" in str(info.value) and "scale = (x * w).abs().max().item()" in str(info.value)


def test_backend_failure_on_data_dependent_backward_runs_the_graph_uncompiled(monkeypatch):
    """Without the tracer's backward check, AOTAutograd meets the data-dependent backward
    itself; the graph then runs uncompiled, with eager's results."""
    from bytegraph.backends import _common
    from bytegraph.graph import data_dependent
    monkeypatch.setattr(data_dependent.BackwardCheck, "needed", classmethod(lambda cls, *a: None))
    monkeypatch.setattr("bytegraph.backends.aot.run_uncompiled", _common.run_uncompiled)
    cnt = check_fn(f_mask_write_tensor, (_x(), _w()), "aot_eager")
    assert cnt.frame_count == 1


class _Discriminator(torch.nn.Module):
    """ELECTRA-style: token logits, loss only over the non-padding positions."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(20, 8)
        self.proj = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 1)

    def forward(self, ids, labels):
        h = torch.relu(self.proj(self.embed(ids)))
        logits = self.head(h).squeeze(-1)
        active = ids != 0
        return torch.nn.functional.binary_cross_entropy_with_logits(logits[active], labels[active])


class _SpecMask(torch.nn.Module):
    """wav2vec2-style: masked time steps replaced by a learned embedding."""

    def __init__(self):
        super().__init__()
        self.masked_spec_embed = torch.nn.Parameter(torch.rand(6))
        self.proj = torch.nn.Linear(6, 6)

    def forward(self, hidden, mask_time):
        hidden = self.proj(hidden)
        hidden[mask_time] = self.masked_spec_embed.to(hidden.dtype)
        return hidden.pow(2).mean()


@pytest.mark.parametrize("backend", BACKENDS)
def test_electra_style_masked_loss(backend):
    torch.manual_seed(3)
    ids = torch.randint(0, 20, (2, 7))
    ids[:, -2:] = 0
    labels = torch.randint(0, 2, (2, 7)).float()
    check_module(_Discriminator, (ids, labels), backend, loss=lambda out: out,
                 optimizer=lambda p: torch.optim.AdamW(p, lr=0.1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_wav2vec2_style_time_masking(backend):
    torch.manual_seed(4)
    hidden = torch.randn(2, 5, 6)
    mask_time = torch.rand(2, 5) > 0.5
    check_module(_SpecMask, (hidden, mask_time), backend, loss=lambda out: out,
                 optimizer=lambda p: torch.optim.AdamW(p, lr=0.1))


# --- B. gradients eager leaves as None -----------------------------------------------------

class _Branches(torch.nn.Module):
    """Parameters reaching the loss, only an auxiliary output, nothing, or only no_grad code."""

    def __init__(self):
        super().__init__()
        self.main = torch.nn.Linear(4, 4)
        self.aux = torch.nn.Linear(4, 4)
        self.frozen = torch.nn.Linear(4, 4)
        self.unused = torch.nn.Linear(4, 4)
        self.detached = torch.nn.Parameter(torch.randn(4))
        self.picked = torch.nn.Parameter(torch.randn(4))
        self.zeroed = torch.nn.Parameter(torch.randn(4))

    def forward(self, x, u, v):
        with torch.no_grad():
            h = self.frozen(x)
        main = self.main(x) + h + u * 2 + self.detached.detach() + self.zeroed * 0
        index = self.picked.argmax()          # integer: no gradient path
        aux = self.aux(x) + v + index
        return main, aux


def _branch_inputs():
    torch.manual_seed(5)
    return (torch.randn(3, 4), torch.randn(3, 4, requires_grad=True), torch.randn(3, 4, requires_grad=True))


@pytest.mark.parametrize("backend", BACKENDS + ["inductor"])
def test_none_grads_of_parameters_and_inputs_outside_the_loss(backend):
    check_module(_Branches, _branch_inputs(), backend, loss=lambda out: out[0].sum())


@pytest.mark.parametrize("backend", BACKENDS)
def test_none_grads_with_adamw_steps(backend):
    """AdamW decays a zero gradient but skips a None one: parameters must stay equal."""
    check_module(_Branches, _branch_inputs(), backend, loss=lambda out: out[0].pow(2).mean(), steps=3,
                 optimizer=lambda p: torch.optim.AdamW(p, lr=0.05, weight_decay=0.1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_auxiliary_output_in_the_loss_gets_grads(backend):
    check_module(_Branches, _branch_inputs(), backend, loss=lambda out: out[1].sum())


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_weighted_output_gives_zero_grads_not_none(backend):
    check_module(_Branches, _branch_inputs(), backend, loss=lambda out: out[0].sum() + 0 * out[1].sum())


@pytest.mark.parametrize("backend", BACKENDS)
def test_second_backward_accumulates_like_eager(backend):
    """Backward through the main output, then through the auxiliary one (same graph), then
    the main one again: each .grad appears and accumulates as in eager."""
    torch.manual_seed(0)
    eager_model = _Branches()
    compiled_model = copy.deepcopy(eager_model)
    cnt = CompileCounter(lookup_backend(backend))
    compiled = bytegraph.compile(compiled_model, backend=cnt)
    inputs_e, inputs_c = _fresh(_branch_inputs()), _fresh(_branch_inputs())
    out_e, out_c = eager_model(*inputs_e), compiled(*inputs_c)
    assert cnt.frame_count == 1      # the forward, one graph (as torch.compile)
    for k in (0, 1, 0):
        out_e[k].pow(2).sum().backward(retain_graph=True)
        out_c[k].pow(2).sum().backward(retain_graph=True)
        _assert_grads_equal(_model_grads(eager_model), _model_grads(compiled_model), f"after output {k}")
        _assert_grads_equal([a.grad for a in _leaves(inputs_e)], [a.grad for a in _leaves(inputs_c)],
                            f"input grads after output {k}")


def f_partial(x, w1, w2, w3):
    a = x * w1
    b = (x + 1) * w2
    c = a * w3
    return a + 1, b, c


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pick", [(0,), (1,), (2,), (0, 1), (1, 2)])
def test_none_grads_of_tensor_inputs(backend, pick):
    check_fn(f_partial, (_x(), _w(), _w(), _w()), backend, loss=lambda out: sum(out[i].sum() for i in pick))


def f_break_between(x, w1, w2):
    a = x * w1
    b = x * w2
    print("", end="")         # a graph break: a and b are live outputs of the first graph
    return a.sum(), b


@pytest.mark.parametrize("backend", BACKENDS)
def test_none_grads_across_a_graph_break(backend):
    cnt = check_fn(f_break_between, (_x(), _w(), _w()), backend, loss=lambda out: out[0])
    assert cnt.frame_count == 2


def test_gates_name_the_outputs_each_input_reaches():
    """Every input needing grad is gated with the outputs it reaches (also when that is every
    output: the node may run with no output gradient at all, see the test after this one)."""
    from bytegraph.backends import grad_presence
    seen = []

    def spy(gm, example_inputs):
        seen.append(grad_presence.plan(gm))
        return gm.forward

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    bytegraph.compile(model, backend=spy)(torch.randn(2, 4))
    branches = _Branches()
    bytegraph.compile(branches, backend=spy)(*_branch_inputs())
    assert {g[1] for g in seen[0].gated} == set(model.parameters())
    gated = {name for name, p in branches.named_parameters() if any(g[1] is p for g in seen[1].gated)}
    # Every parameter in the graph reaches one output or none; "unused" is not in the graph.
    assert gated == {"main.weight", "main.bias", "aux.weight", "aux.bias", "frozen.weight", "frozen.bias",
                     "detached", "picked", "zeroed"}
    # Placeholders x, u, v: u reaches the first output only, v the second only.
    assert sorted((g[0], sorted(g[2])) for g in seen[1].gated if g[0] is not None) == [(1, [0]), (2, [1])]


@pytest.mark.parametrize("backend", BACKENDS)
def test_none_grads_when_a_later_graph_passes_none_to_every_output(backend):
    # A graph whose outputs only reach graphs that drop their gradients (x0 is not in the loss):
    # autograd still runs its node, with None for every output, and AOTAutograd filled zeros
    # into x0.grad (found by the program generator).
    def f(x0, x1, n, w):
        t1 = x0.abs().clone()
        n3 = n

        def inner4(u, k=2):
            if x1.max() > 0.3:      # a graph break inside the nested function
                pass
            return u * k + x1 - n3
        t5 = inner4(w)
        x0 = x0 + t1.clamp(-1.0, 1.0)
        f10 = n * 0.25
        t11 = w.sin()
        for i12 in range(1):
            t11 = inner4(t11, k=i12 + 1)
        return (torch.maximum(t11, t11 * 0.5), f10)

    torch.manual_seed(208)
    x0, x1, w = (torch.randn(3, 3, requires_grad=True) for _ in range(3))
    check_fn(f, (x0, x1, -2, w), backend, loss=lambda out: out[0].sum())


def test_eager_backend_is_untouched():
    check_module(_Branches, _branch_inputs(), "eager", loss=lambda out: out[0].sum())


def f_views(x, w1, w2, base):
    h = x * w1
    return h.view(3, 4), base.view(4, 3), (x * w2).t() if x.dim() == 2 else (x * w2)[2:]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pick", [(0,), (1,), (2,), (1, 2)])
def test_none_grads_with_view_outputs(backend, pick):
    """Outputs that are views of an intermediate or of an input (AOTAutograd regenerates them
    outside its node)."""
    base = torch.randn(12, requires_grad=True)
    check_fn(f_views, (_x(), _w(), _w(), base), backend, loss=lambda out: sum(out[i].sum() for i in pick))


def f_mutates_input(a, w1, w2):
    a.add_(w1)          # (mul_ would need the old value saved; AOTAutograd fails on that, as in torch.compile)
    return a * 2, w2 * 3


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pick", [(0,), (1,)])
def test_none_grads_when_the_graph_mutates_an_input(backend, pick):
    base = torch.randn(12, requires_grad=True)
    w1, w2 = _w(), _w()

    def run(fn):
        b, v1, v2 = base.detach().clone().requires_grad_(), w1.detach().clone().requires_grad_(), \
            w2.detach().clone().requires_grad_()
        a = b * 1.5                     # not a leaf, so it may be changed in place
        out = fn(a, v1, v2)
        sum(out[i].sum() for i in pick).backward()
        return out, [b.grad, v1.grad, v2.grad]

    out_e, grads_e = run(f_mutates_input)
    cnt = CompileCounter(lookup_backend(backend))
    out_c, grads_c = run(bytegraph.compile(f_mutates_input, backend=cnt))
    _assert_same_outputs(out_e, out_c)
    _assert_grads_equal(grads_e, grads_c, "grad")
    assert cnt.frame_count == 1      # f_mutates_input has no break: one graph


def f_changes_an_input_between_breaks(x0, x1):
    t = (x0 * 2).clone()
    print("", end="")          # a graph break: t goes in as an input of the next graph
    t *= 2                     # which changes it in place and has no other result
    print("", end="")
    return x1 * 3, torch.sigmoid(t)


@pytest.mark.parametrize("backend", BACKENDS)
def test_none_grads_when_a_graph_only_changes_an_input(backend):
    # The middle graph's one differentiable result is the input it changed: AOTAutograd's node
    # for it runs with no gradient (the last graph passed None on) and filled zeros into
    # x0.grad, where eager leaves None (found by the program generator).
    cnt = check_fn(f_changes_an_input_between_breaks, (_w(), _w()), backend, loss=lambda out: out[0].sum())
    assert cnt.frame_count == 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_none_grads_with_dynamic_shapes(backend):
    check_fn(f_partial, (_x(), _w(), _w(), _w()), backend, loss=lambda out: out[1].sum(), dynamic=True)


class _NormWithAux(torch.nn.Module):
    """Buffers updated in training (a mutated graph input) next to an auxiliary head."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(4, 4)
        self.norm = torch.nn.BatchNorm1d(4)
        self.aux = torch.nn.Linear(4, 2)

    def forward(self, x):
        h = self.norm(self.body(x))
        return h.relu(), self.aux(x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_none_grads_next_to_buffer_updates(backend):
    torch.manual_seed(6)
    check_module(_NormWithAux, (torch.randn(5, 4),), backend, loss=lambda out: out[0].sum(),
                 optimizer=lambda p: torch.optim.AdamW(p, lr=0.1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_backward_through_two_calls(backend):
    """The loss uses the main output of one call and the auxiliary output of another."""
    torch.manual_seed(0)
    eager_model = _Branches()
    compiled_model = copy.deepcopy(eager_model)
    cnt = CompileCounter(lookup_backend(backend))
    compiled = bytegraph.compile(compiled_model, backend=cnt)
    inputs_e, inputs_c = _fresh(_branch_inputs()), _fresh(_branch_inputs())
    # the second call with other values (the same shapes and requires_grad)
    other_e = _fresh([a * 1.5 - 0.25 if isinstance(a, torch.Tensor) else a for a in inputs_e])
    other_c = _fresh(other_e)
    first_e, second_e = eager_model(*inputs_e), eager_model(*other_e)
    first_c, second_c = compiled(*inputs_c), compiled(*other_c)
    assert cnt.frame_count == 1      # the forward, one graph, hit on the second call (as torch.compile)
    (first_e[0].sum() + second_e[1].sum()).backward()
    (first_c[0].sum() + second_c[1].sum()).backward()
    _assert_grads_equal(_model_grads(eager_model), _model_grads(compiled_model), "parameter grad")
    _assert_grads_equal([a.grad for a in _leaves(inputs_e) + _leaves(other_e)],
                        [a.grad for a in _leaves(inputs_c) + _leaves(other_c)], "input grad")


def _positive(y):
    return y[y > 0]


def f_nested_mask(x, w):
    y = torch.sin(x * w)
    z = _positive(y) * 2
    return z.sum() + (y * w).sum()


@pytest.mark.parametrize("backend", BACKENDS)
def test_data_dependent_op_inside_an_inlined_helper(backend):
    check_fn(f_nested_mask, (_x(), _w()), backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [f_bool_mask, f_unique, f_mask_write_tensor], ids=lambda f: f.__name__)
def test_data_dependent_training_with_dynamic_shapes(fn, backend):
    check_fn(fn, (_x(), _w()), backend, dynamic=True)


def f_dead_unique_before_a_break(x, y, w):
    unused = torch.relu(torch.unique(x.round()).sum())   # never read again: its backward never runs

    def inner(u, k=2):
        print(f"inner={y.sum().item():.3f}")
        return u * k + y
    h = inner(w.clamp(-1.0, 1.0))
    return x * 0.5, h.abs()


@pytest.mark.parametrize("backend", BACKENDS)
def test_dead_result_of_an_op_without_derivative_gets_no_gradient(backend, capsys):
    # Through AOTAutograd a dead local kept as a graph output sent a zero gradient into
    # torch.unique's backward, which does not exist (NotImplementedError where eager trains).
    check_fn(f_dead_unique_before_a_break, (_x().requires_grad_(), _x() + 1, _w()), backend,
             loss=lambda out: out[0].sum() + out[1].sum())


def test_numbers_a_break_hands_each_layer_are_symbolic_once_layers_differ():
    # An MoE-style layer reads counts with .tolist() (a break) and uses them with its own
    # weights after it, so its resumed function has one entry per layer. The counts differ
    # between layers and between calls: compiled static per layer, every layer recompiled on
    # the next call (jetmoe: 6 new graphs on its second call, torch.compile 1).
    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = torch.nn.Linear(8, 8)
            self.out = torch.nn.Linear(8, 8)

        def forward(self, x):
            h = self.gate(x)
            counts = (h > 0).sum(0).tolist()
            return self.out(h) * (counts[0] + 1)

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Layer() for _ in range(6)])
    cnt = CompileCounter()
    compiled = bytegraph.compile(model, backend=cnt)
    made = []
    for _ in range(4):
        x = torch.randn(16, 8)
        expected = model(x)
        assert torch.allclose(compiled(x), expected, atol=1e-6)
        made.append(cnt.frame_count)
    # At most the first layer's entry (compiled before any other layer was seen) compiles again.
    assert made[-1] - made[0] <= 1, made
