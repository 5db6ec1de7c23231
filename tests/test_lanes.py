"""Foreach lanes (backends/lanes.py): an optimizer's foreach update split into chunks of a layer's
parameters, each distinct chunk compiled once; parameters and optimizer state equal eager's."""
import copy

import pytest
import torch
import torch.nn.functional as F

import bytegraph
from bytegraph.backends import lanes
from bytegraph.backends.aot import aot_eager
from bytegraph.demo.models import GPTConfig, TinyGPT
from helpers import splitting_backend


def gpt(n_layer):
    torch.manual_seed(0)
    return TinyGPT(GPTConfig(n_layer=n_layer, n_embd=32, n_head=4, block_size=8, vocab_size=64, dropout=0.0))


def lanes_backend(parts, outers):
    """A backend splitting by lanes, each chunk compiled with aot_eager (and recorded)."""
    return splitting_backend(lanes.compile_by_lanes, parts, outers)


OPTIMIZERS = {
    "sgd_nesterov": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, foreach=True),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=True),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, foreach=True),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=1e-2, momentum=0.5, foreach=True),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=1e-2, lr_decay=0.01, foreach=True),
}


def _same_fresh_grads(model, ref, seed):
    """Random gradients (from ``seed``), the same on ``model`` and its eager copy ``ref``."""
    torch.manual_seed(seed)
    for p, q in zip(model.parameters(), ref.parameters()):
        p.grad = torch.randn_like(p)
        q.grad = p.grad.clone()


def _same_params_and_state(model, ref, opt, opt_ref):
    """``model``'s parameters and ``opt``'s state equal the eager copies'."""
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)
        for key, value in opt_ref.state[q].items():
            torch.testing.assert_close(opt.state[p][key], value, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_update_compiled_a_layer_at_a_time_equals_eager(name):
    model = gpt(5)
    ref = copy.deepcopy(model)
    opt, opt_ref = OPTIMIZERS[name](model.parameters()), OPTIMIZERS[name](ref.parameters())

    def step(o):
        o.step()
        o.zero_grad(set_to_none=True)

    parts, outers = [], []
    compiled = bytegraph.compile(step, backend=lanes_backend(parts, outers))
    for i in range(4):
        _same_fresh_grads(model, ref, seed=i)
        compiled(opt)
        step(opt_ref)
        _same_params_and_state(model, ref, opt, opt_ref)
    # (SGD's first step, making its momentum buffers, is a graph of its own.)
    split = [o for o in outers if o is not None]
    assert 1 <= len(split) <= 2
    # The parameters before the first block, one chunk for all five blocks, those after.
    n_layer_params = len(list(model.h[0].parameters()))
    for gm in split:
        assert sum(b - a == n_layer_params for a, b in gm.meta["bytegraph_chunks"]) >= 4
        assert gm.meta["bytegraph_parts"] <= 3
    assert sum(gm.meta["bytegraph_parts"] for gm in split) == len(parts)


def test_a_training_step_with_its_optimizer_by_lanes_equals_eager():
    # (SGD: Adam's update divides by the root of tiny squared gradients, e.g. of the attention's
    # key bias, whose gradient is rounding noise in eager and compiled alike.)
    model = gpt(4)
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, foreach=True)

    def step(m, o, x, y):
        loss = F.cross_entropy(m(x).flatten(0, 1), y.flatten())
        loss.backward()
        o.step()
        o.zero_grad(set_to_none=True)
        return loss

    parts, outers = [], []
    compiled = bytegraph.compile(step, backend=lanes_backend(parts, outers))
    for i in range(3):
        torch.manual_seed(i)
        x, y = torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8))
        torch.testing.assert_close(compiled(model, opt, x, y), step(ref, opt_ref, x, y), rtol=1e-5, atol=1e-5)
    assert any(o is not None for o in outers)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-4)


def test_chunks_are_whole_periods_of_the_longest_repeat():
    sig = ["emb", "pos"] + ["w", "b", "w2", "b2"] * 6 + ["norm", "head"]
    assert lanes.chunks(sig) == [(0, 2), (2, 10), (10, 18), (18, 26), (26, 28)]
    assert lanes.chunks(["a"] * 32) == [(0, 8), (8, 16), (16, 24), (24, 32)]
    assert len(lanes.chunks(["a"] * 1000)) <= lanes.MAX_CHUNKS + 1          # at most 16, and the rest
    deep = ["emb"] + ["q", "k", "v", "o"] * 48 + ["head"]                    # 48 layers: 3 a chunk
    assert lanes.chunks(deep) == [(0, 1)] + [(1 + 12 * k, 13 + 12 * k) for k in range(16)] + [(193, 194)]
    assert lanes.chunks([str(i) for i in range(40)]) is None
    assert lanes.chunks(["x"] * 12 + ["y"]) is None         # one chunk of 8 only: nothing repeats


def test_at_most_lane_max_chunks_chunks_of_whole_periods():
    sig = ["emb", "pos"] + ["w", "b", "w2", "b2"] * 12 + ["norm", "head"]     # 12 layers of 4
    assert lanes.chunks(sig, max_chunks=4) == [(0, 2)] + [(2 + 12 * k, 14 + 12 * k) for k in range(4)] + [(50, 52)]
    assert lanes.chunks(sig, max_chunks=2) == [(0, 2), (2, 26), (26, 50), (50, 52)]
    assert lanes.chunks(sig, max_chunks=1) is None          # one chunk: compiled whole


def test_an_update_in_fewer_larger_chunks_equals_eager():
    from bytegraph.config import config
    model = gpt(6)
    ref = copy.deepcopy(model)
    opt, opt_ref = OPTIMIZERS["adamw"](model.parameters()), OPTIMIZERS["adamw"](ref.parameters())
    parts, outers = [], []
    before = config.lane_max_chunks
    config.lane_max_chunks = 2
    try:
        compiled = bytegraph.compile(lambda o: o.step(), backend=lanes_backend(parts, outers))
        for i in range(3):
            torch.manual_seed(i)
            for p, q in zip(model.parameters(), ref.parameters()):
                p.grad = torch.randn_like(p)
                q.grad = p.grad.clone()
            compiled(opt)
            opt_ref.step()
            for p, q in zip(model.parameters(), ref.parameters()):
                torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)
    finally:
        config.lane_max_chunks = before
        bytegraph.reset()
    split = [o for o in outers if o is not None]
    assert split and all(sum(1 for a, b in o.meta["bytegraph_chunks"] if b - a > 2) == 2 for o in split)


def _graph(fn, *args):
    graphs = []
    bytegraph.compile(fn, backend=lambda gm, ex: graphs.append(gm) or gm.forward)(*args)
    bytegraph.reset()
    return graphs[0]


def _tensors(n=32):
    torch.manual_seed(0)
    return [torch.randn(4 if i % 2 else 3) for i in range(n)]


def test_lane_values_returned_by_the_graph_come_out_of_their_chunk():
    def f(xs):
        ys = torch._foreach_mul(xs, 2.0)
        torch._foreach_add_(ys, 1.0)
        return ys[3], ys[20] * 3

    xs = _tensors()
    parts, outers = [], []
    got = bytegraph.compile(f, backend=lanes_backend(parts, outers))(xs)
    # Lanes 3 and 20 do more than the others: chunks of eight around them, compiled apart.
    assert outers[0] is not None and outers[0].meta["bytegraph_parts"] == len(parts) < 4
    for g, w in zip(got, f(xs)):
        torch.testing.assert_close(g, w)


def _mixes_lanes(xs):
    ys = torch._foreach_mul(xs, 2.0)
    return ys[0] + ys[2]


def _shared_write(xs, lr):
    lr.mul_(0.5)
    torch._foreach_mul_(xs, lr)


def _same_tensor_twice(xs):
    torch._foreach_add_(xs + [xs[0]], 1.0)


def _views_of_one_tensor(xs):
    torch._foreach_add_(xs, 1.0)


def _lane_writes_shared(xs, lr):
    torch._foreach_mul_(xs, lr)            # every lane reads lr...
    for x in xs:
        lr.add_(x.sum() * 0.01)            # ...and each lane then writes it: chunks would reorder


def _random_per_lane(xs):
    torch._foreach_mul_(xs, 0.5)
    for x in xs:
        x.add_(torch.randn_like(x))        # chunks would draw in another order than the whole graph
    for x in xs:
        x.mul_(torch.rand_like(x))


@pytest.mark.parametrize("fn", [_mixes_lanes, _shared_write, _same_tensor_twice, _views_of_one_tensor,
                                _lane_writes_shared, _random_per_lane])
def test_graphs_that_are_not_independent_lanes_are_compiled_whole(fn):
    args = (_tensors(),) if fn not in (_shared_write, _lane_writes_shared) else (_tensors(), torch.tensor(2.0))
    if fn is _views_of_one_tensor:
        args = (list(torch.randn(32, 4).unbind(0)),)
    gm = _graph(fn, *args)
    assert lanes.compile_by_lanes(gm, [], lambda g, e: g.forward) is None


@pytest.mark.filterwarnings("ignore")
def test_inductor_compiles_the_optimizer_update_by_lanes(monkeypatch):
    from bytegraph.backends import inductor as inductor_module
    compiles = []
    monkeypatch.setattr(inductor_module, "inductor_whole",
                        lambda gm, examples, **kw: compiles.append(gm) or aot_eager(gm, examples))
    model = gpt(4)
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2, foreach=True)
    for p, q in zip(model.parameters(), ref.parameters()):
        p.grad = torch.randn_like(p)
        q.grad = p.grad.clone()
    bytegraph.compile(opt.step, backend="inductor")()
    opt_ref.step()
    # Three distinct chunks, each compiled once: the parameters before the blocks, one block's
    # (the same update for all 4 layers), the ones after (torch.compile has no such split).
    assert len(compiles) == 3
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q)


# --- generated foreach programs: split by lanes, compared with eager ---------------------------

from hypothesis import given, settings, strategies as st  # noqa: E402

_OPS = ["add_scalar", "mul_lists", "out_of_place", "addcmul", "lerp", "sqrt_abs", "per_lane", "shared_tensor",
        "mix_two_lanes", "return_lane", "family2", "family2_out", "lane_writes_shared"]


def _program(ops, n):
    """A function of (xs, ys, scale, us) doing ``ops`` on the lists (``us``: lists of another
    length, a second family); what it returns."""
    def fn(xs, ys, scale, us):
        out = []
        for op, arg in ops:
            if op == "add_scalar":
                torch._foreach_add_(xs, arg)
            elif op == "mul_lists":
                torch._foreach_mul_(ys, xs)
            elif op == "out_of_place":
                zs = torch._foreach_mul(xs, arg)
                torch._foreach_add_(ys, zs)
            elif op == "addcmul":
                torch._foreach_addcmul_(xs, ys, ys, value=arg)
            elif op == "lerp":
                torch._foreach_lerp_(ys, xs, arg)
            elif op == "sqrt_abs":
                zs = torch._foreach_abs(ys)
                torch._foreach_sqrt_(zs)
                torch._foreach_add_(xs, zs)
            elif op == "per_lane":
                for i in range(n):
                    ys[i].mul_(arg).add_(xs[i])
            elif op == "shared_tensor":
                torch._foreach_mul_(xs, scale * arg)
            elif op == "mix_two_lanes":
                out.append(xs[0].sum() + ys[n - 1].sum())
            elif op == "return_lane":
                out.append(ys[int(arg * 10) % n] * 2)
            elif op == "lane_writes_shared":
                for i in range(n):
                    scale.add_(xs[i].mean() * 0.01)
            elif op == "family2":
                torch._foreach_mul_(us, arg)
                torch._foreach_add_(us, 1.0)
            elif op == "family2_out":
                vs = torch._foreach_abs(us)
                torch._foreach_sqrt_(vs)
                torch._foreach_add_(us, vs)
        return out
    return fn


@settings(max_examples=25, deadline=None)
@given(period=st.integers(1, 4), repeats=st.integers(16, 20), before=st.integers(0, 2), after=st.integers(0, 2),
       ops=st.lists(st.tuples(st.sampled_from(_OPS), st.sampled_from([0.5, 0.25, 1.5])), min_size=1, max_size=6),
       seed=st.integers(0, 1000))
def test_generated_foreach_programs_split_by_lanes_equal_eager(period, repeats, before, after, ops, seed):
    shapes = [(2 + k,) if k % 2 else (k + 1, 2) for k in range(period)]
    repeats = max(2, repeats // period)    # 16-20 lanes or more in the repeated run
    layout = [(7,)] * before + shapes * repeats + [(3, 3)] * after
    n = len(layout)
    torch.manual_seed(seed)
    xs = [torch.randn(s) for s in layout]
    ys = [torch.randn(s) for s in layout]
    scale = torch.tensor(0.5)
    us = [torch.randn(5 if k % 3 else 6) for k in range(n + 7)]
    fn = _program(ops, n)
    xs_ref, ys_ref, us_ref = [t.clone() for t in xs], [t.clone() for t in ys], [t.clone() for t in us]
    scale_ref = scale.clone()
    expected = fn(xs_ref, ys_ref, scale_ref, us_ref)
    parts, outers = [], []
    got = bytegraph.compile(fn, backend=lanes_backend(parts, outers))(xs, ys, scale, us)
    bytegraph.reset()
    assert len(got) == len(expected)
    for g, w in zip(got, expected):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, equal_nan=True)
    for a, b in zip(xs + ys + us + [scale], xs_ref + ys_ref + us_ref + [scale_ref]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_two_parameter_groups_are_two_families_of_lanes():
    # nanoGPT's AdamW: matrices decayed, biases and norms not; each group is lists of its own length.
    model = gpt(6)
    ref = copy.deepcopy(model)

    def groups(m):
        params = list(m.parameters())
        return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]

    opt = torch.optim.AdamW(groups(model), lr=1e-2, foreach=True)
    opt_ref = torch.optim.AdamW(groups(ref), lr=1e-2, foreach=True)
    parts, outers = [], []
    compiled = bytegraph.compile(opt.step, backend=lanes_backend(parts, outers))
    for i in range(3):
        _same_fresh_grads(model, ref, seed=i)
        compiled()
        opt_ref.step()
        _same_params_and_state(model, ref, opt, opt_ref)
    split = [o for o in outers if o is not None]
    assert split, "the update was compiled whole"
    n_matrices = sum(p.dim() >= 2 for p in model.parameters())
    n_vectors = sum(p.dim() < 2 for p in model.parameters())
    # Both families are chunked: more chunks than families, fewer compiles than chunks.
    chunks = split[-1].meta["bytegraph_chunks"]
    assert sum(b - a for a, b in chunks) == n_matrices + n_vectors
    assert len(chunks) > 2 and split[-1].meta["bytegraph_parts"] < len(chunks)


@pytest.mark.parametrize("tensor_lr", [False, True])
def test_the_outer_function_binds_state_once_and_follows_lr_changes(tensor_lr):
    # The split update runs as a plain function (regions.outer_function) holding the optimizer's
    # state tensors it read once, not fx's code reading each from the module per call: two groups,
    # the learning rate changed between steps (AdamW's float: the update is compiled again; SGD's
    # tensor: changed in place, read by the bound tensor), values against eager after each step.
    model = gpt(5)
    ref = copy.deepcopy(model)

    def groups(m):
        params = list(m.parameters())
        lr = (lambda v: torch.tensor(v)) if tensor_lr else (lambda v: v)
        return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1, "lr": lr(1e-2)},
                {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0, "lr": lr(3e-3)}]

    make = (lambda g: torch.optim.SGD(g, momentum=0.9, foreach=True)) if tensor_lr else \
        (lambda g: torch.optim.AdamW(g, foreach=True))     # (AdamW takes a tensor lr only if capturable)
    opt, opt_ref = make(groups(model)), make(groups(ref))
    parts, outers = [], []
    compiled = bytegraph.compile(opt.step, backend=lanes_backend(parts, outers))
    for i in range(5):
        _same_fresh_grads(model, ref, seed=i)
        if i == 3:
            for o in (opt, opt_ref):
                for g in o.param_groups:
                    if tensor_lr:
                        g["lr"].mul_(0.25)
                    else:
                        g["lr"] = g["lr"] * 0.25
        compiled()
        opt_ref.step()
        _same_params_and_state(model, ref, opt, opt_ref)
    split = [o for o in outers if o is not None]
    assert split, "the update was compiled whole"
    for outer in split:
        assert outer.forward.__name__ == "run_lanes_outer"       # the generated function, not fx's
        assert "self." not in outer.forward._bytegraph_source
