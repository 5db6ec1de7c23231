"""Functions that take functions, traced into one graph: custom autograd Functions, activation
checkpointing, torch.func transforms, torch.cond. Results and gradients equal eager's."""
import pytest
import torch
import torch.func as F
from torch.utils import _pytree as pytree
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

import bytegraph
from bytegraph.backends.registry import lookup_backend
from bytegraph.testing import CompileCounter
from helpers import assert_traced, fresh_input

BACKENDS = ["eager", "aot_eager"]


def _leaves(x):
    return [t for t in pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


def _fresh(args):
    return [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]


def check(fn, *args, backend="eager", graphs=1, grads=True, fullgraph=True, rtol=1e-5, atol=1e-6):
    """fn compiled equals fn eager: outputs, and gradients of the inputs (and of the parameters
    of any module passed) through the sum of the outputs. Returns the counter."""
    eager_args, comp_args = _fresh(args), _fresh(args)
    expected = fn(*eager_args)
    cnt = CompileCounter(lookup_backend(backend))
    compiled = bytegraph.compile(fn, backend=cnt, fullgraph=fullgraph)
    actual = compiled(*comp_args)
    exp_leaves, act_leaves = _leaves(expected), _leaves(actual)
    assert len(exp_leaves) == len(act_leaves)
    for e, a in zip(exp_leaves, act_leaves):
        assert e.shape == a.shape and e.dtype == a.dtype
        assert torch.allclose(e, a, rtol=rtol, atol=atol), (e, a)
        assert e.requires_grad == a.requires_grad
    if grads and any(t.requires_grad for t in exp_leaves):
        sum(t.float().sum() for t in exp_leaves if t.requires_grad).backward()
        sum(t.float().sum() for t in act_leaves if t.requires_grad).backward()
        for e, a in zip(eager_args, comp_args):
            if isinstance(e, torch.Tensor) and e.requires_grad:
                assert (e.grad is None) == (a.grad is None)
                if e.grad is not None:
                    assert torch.allclose(e.grad, a.grad, rtol=rtol, atol=atol), (e.grad, a.grad)
    if graphs is not None:
        assert cnt.frame_count == graphs
    # Called again on inputs of the same kind with other values (fresh_input): the same graphs,
    # eager's answers and gradients on those values.
    again = fresh_input(list(args))
    eager_again, comp_again = _fresh(again), _fresh(again)
    frames = cnt.frame_count
    exp_leaves, act_leaves = _leaves(fn(*eager_again)), _leaves(compiled(*comp_again))
    assert len(exp_leaves) == len(act_leaves)
    for e, a in zip(exp_leaves, act_leaves):
        assert torch.allclose(e, a, rtol=rtol, atol=atol), (e, a)
    if grads and any(t.requires_grad for t in exp_leaves):
        sum(t.float().sum() for t in exp_leaves if t.requires_grad).backward()
        sum(t.float().sum() for t in act_leaves if t.requires_grad).backward()
        for e, a in zip(eager_again, comp_again):
            if isinstance(e, torch.Tensor) and e.grad is not None:
                assert a.grad is not None and torch.allclose(e.grad, a.grad, rtol=rtol, atol=atol), (e.grad, a.grad)
    assert cnt.frame_count == frames
    return cnt


def _x(*shape, grad=True):
    return torch.randn(*shape, requires_grad=grad)


# --- torch.autograd.Function ----------------------------------------------------------------------

class ScaledExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        y = torch.exp(x) * scale
        ctx.save_for_backward(y)
        ctx.scale = scale
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        # A custom backward that differs from the true one (x2): it must be the one used.
        return grad * y * 2, None


class MulAdd(torch.autograd.Function):
    """Two tensor inputs, needs_input_grad, a tensor kept on ctx, two outputs."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.a = a
        ctx.save_for_backward(b)
        return a * b, a + b

    @staticmethod
    def backward(ctx, g1, g2):
        (b,) = ctx.saved_tensors
        ga = g1 * b + g2 if ctx.needs_input_grad[0] else None
        gb = g1 * ctx.a + g2 if ctx.needs_input_grad[1] else None
        return ga, gb


class ArgmaxWithValue(torch.autograd.Function):
    """A non-differentiable integer output next to a differentiable one."""

    @staticmethod
    def forward(ctx, x):
        idx = x.argmax(dim=-1)
        value = x.amax(dim=-1)
        ctx.mark_non_differentiable(idx)
        ctx.save_for_backward(x, idx)
        return value, idx

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_value, grad_idx):
        x, idx = ctx.saved_tensors
        out = torch.zeros_like(x)
        out.scatter_(-1, idx.unsqueeze(-1), grad_value.unsqueeze(-1))
        return out


class SetupContextCube(torch.autograd.Function):
    """The setup_context style: forward without ctx."""

    @staticmethod
    def forward(x):
        return x ** 3

    @staticmethod
    def setup_context(ctx, inputs, output):
        (x,) = inputs
        ctx.save_for_backward(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 3 * x ** 2 + 1    # +1: the custom backward is the one used


@pytest.mark.parametrize("backend", BACKENDS)
def test_autograd_function_custom_backward(backend):
    x = _x(3, 4)
    check(lambda x: ScaledExp.apply(x.sin(), 3.0).sum(dim=0), x, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_autograd_function_two_inputs_needs_input_grad(backend):
    a, b = _x(4), _x(4, grad=False)
    check(lambda a, b: MulAdd.apply(a, b), a, b, backend=backend)
    check(lambda a, b: MulAdd.apply(a.cos(), b * a), a, _x(4), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_autograd_function_non_differentiable_output_once_differentiable(backend):
    x = _x(3, 5)
    check(lambda x: ArgmaxWithValue.apply(x * 2), x, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_autograd_function_setup_context(backend):
    check(lambda x: SetupContextCube.apply(x + 1).sum(), _x(5), backend=backend)


def test_autograd_function_in_a_module_reads_parameters():
    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return x * w

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            return g * w, (g * x).sum(0)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4))

        def forward(self, x):
            return Scale.apply(x, self.w).relu()

    torch.manual_seed(0)
    m = M()
    import copy
    m2 = copy.deepcopy(m)
    x = torch.randn(2, 4)
    m(x).sum().backward()
    bytegraph.compile(m2, backend="aot_eager", fullgraph=True)(x).sum().backward()
    assert torch.allclose(m.w.grad, m2.w.grad)


def test_autograd_function_with_unsupported_forward_runs_natively():
    class Printing(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            if x.sum() > 0:      # data-dependent: cannot be traced into a graph
                return x * 2
            return x * 3

        @staticmethod
        def backward(ctx, g):
            return g

    x = _x(3)
    # The graphs around the call, and forward compiled as a frame of its own (autograd calls it
    # natively): its graph up to the branch and the branch taken.
    check(lambda x: Printing.apply(x + 1) + 1, x, graphs=4, fullgraph=False)
    with pytest.raises(bytegraph.errors.Unsupported):
        bytegraph.compile(lambda x: Printing.apply(x), backend="eager", fullgraph=True)(x)


# --- activation checkpointing ----------------------------------------------------------------------

def _block():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8))


@pytest.mark.parametrize("backend", BACKENDS)
def test_checkpoint_one_graph_grads_equal(backend):
    block = _block()
    w = _x(8)

    def f(x):
        y = checkpoint(lambda a: block(a) * w, x, use_reentrant=False)
        return checkpoint(block, y.tanh(), use_reentrant=False).sum()

    x = _x(4, 8)
    check(f, x, backend=backend)
    # parameters' gradients too
    ref = _block()
    ref_w = w.detach().clone().requires_grad_()
    x1, x2 = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    (checkpoint(ref, checkpoint(lambda a: ref(a) * ref_w, x1, use_reentrant=False).tanh(), use_reentrant=False)
     .sum().backward())
    block.zero_grad()
    w.grad = None
    bytegraph.compile(f, backend=backend, fullgraph=True)(x2).backward()
    for p, q in zip(ref.parameters(), block.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6)
    assert torch.allclose(ref_w.grad, w.grad, atol=1e-6)


def test_checkpoint_recomputes_in_backward():
    """The checkpointed body's activations are not kept: the backward graph recomputes them."""
    calls = []

    def counting_backend(gm, example_inputs):
        def run(*args):
            calls.append(1)
            return gm(*args)
        return run

    block = _block()

    def body(a):
        return block(a).sin()

    def f(x):
        return checkpoint(body, x, use_reentrant=False).sum()

    x = _x(4, 8)
    cnt = CompileCounter()
    out = bytegraph.compile(f, backend=cnt, fullgraph=True)(x)
    gm = cnt.graphs[0]
    assert any(n.target.__name__ == "checkpointed" for n in gm.graph.nodes if n.op == "call_function"
               and hasattr(n.target, "__name__"))
    saved = []
    compiled = bytegraph.compile(f, backend="eager", fullgraph=True)
    compiled(x)
    x2 = _x(4, 8)       # other values: the graph runs again (and is what saves the tensors counted)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        out = compiled(x2)
    kept_with = sum(saved)
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        body(x2).sum()
    kept_without = sum(saved)
    assert 0 < kept_with < kept_without, (kept_with, kept_without)
    x_eager = x2.detach().clone().requires_grad_()
    f(x_eager).backward()
    assert torch.allclose(out, f(x2), atol=1e-6)
    out.backward()
    assert torch.allclose(x2.grad, x_eager.grad, atol=1e-6)


def test_checkpoint_with_dropout_keeps_rng():
    torch.manual_seed(0)
    drop = torch.nn.Dropout(0.5)

    def f(x):
        return checkpoint(lambda a: drop(a * 2).sin(), x, use_reentrant=False).sum()

    x = _x(64)
    x1, x2 = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    torch.manual_seed(1)
    f(x1).backward()
    torch.manual_seed(1)
    bytegraph.compile(f, backend="eager", fullgraph=True)(x2).backward()
    assert torch.equal(x1.grad, x2.grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_checkpoint_sequential(backend):
    torch.manual_seed(0)
    seq = torch.nn.Sequential(*[torch.nn.Linear(6, 6) for _ in range(4)])

    def f(x):
        return checkpoint_sequential(seq, 2, x, use_reentrant=False).relu()

    check(f, _x(3, 6), backend=backend)


def test_checkpoint_reentrant_runs_natively():
    block = _block()

    def f(x):
        return checkpoint(block, x, use_reentrant=True) * 2

    check(f, _x(2, 8), graphs=1, fullgraph=False)


# --- torch.func ------------------------------------------------------------------------------------

W = torch.randn(4, 4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["vmap", "vmap_dims", "vmap_nested", "grad", "grad_and_value", "grad_aux",
                                  "jacrev", "jacfwd", "hessian"])
def test_torch_func_transforms(case, backend):
    x = _x(3, 4)
    fns = {
        "vmap": (lambda x: F.vmap(lambda r: r.sin() @ W)(x), (x,)),
        "vmap_dims": (lambda x, y: F.vmap(lambda a, b: a * b.sum(), in_dims=(1, None), out_dims=1)(x, y),
                      (x, _x(5))),
        "vmap_nested": (lambda x: F.vmap(F.vmap(lambda a: a.cos() * 2 + a.shape[0]))(x.reshape(3, 2, 2)), (x,)),
        "grad": (lambda x: F.grad(lambda a: (a.sin() * W[0]).sum())(x), (x,)),
        "grad_and_value": (lambda x: F.grad_and_value(lambda a, b: (a ** 2 * b).sum(), argnums=(0, 1))(x, x * 2),
                           (x,)),
        "grad_aux": (lambda x: F.grad(lambda a: ((a ** 2).sum(), a.mean()), has_aux=True)(x), (x,)),
        "jacrev": (lambda x: F.jacrev(lambda a: a.sin() @ W)(x[0]), (x,)),
        "jacfwd": (lambda x: F.jacfwd(lambda a: a.sin() @ W)(x[0]), (x,)),
        "hessian": (lambda x: F.hessian(lambda a: (a.sin() ** 2).sum())(x[0]), (x,)),
    }
    fn, args = fns[case]
    check(fn, *args, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_functional_call_per_sample_grads(backend):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, xi, yi):
        return (F.functional_call(model, p, (xi[None],)).squeeze() - yi) ** 2

    def per_sample(p, x, y):
        return F.vmap(F.grad(loss), in_dims=(None, 0, 0))(p, x, y)

    x, y = torch.randn(5, 4), torch.randn(5)
    expected = per_sample(params, x, y)
    cnt = CompileCounter(lookup_backend(backend))
    actual = bytegraph.compile(per_sample, backend=cnt, fullgraph=True)(params, x, y)
    assert expected.keys() == actual.keys()
    for k in expected:
        assert torch.allclose(expected[k], actual[k], atol=1e-6), k
    assert cnt.frame_count == 1


def test_functional_call_with_buffers_and_kwargs():
    bn = torch.nn.BatchNorm1d(3).eval()
    state = {"weight": _x(3), "running_mean": torch.randn(3)}

    def f(state, x):
        return F.functional_call(bn, state, (x,), {})

    check(lambda w, m, x: f({"weight": w, "running_mean": m}, x), state["weight"], state["running_mean"], _x(2, 3))
    # the module itself is untouched
    assert torch.equal(bn.running_mean, torch.zeros(3))


# --- torch.cond --------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sign", [1, -1])
def test_cond_tensor_predicate(sign, backend):
    w = _x(4)

    def f(x):
        return torch.cond(x.sum() > 0, lambda a: (a * w).sin(), lambda a: a.cos() + 1, (x,)) * 2

    x = _x(3, 4)
    with torch.no_grad():
        x.abs_().mul_(sign)
    check(f, x, backend=backend)


def test_cond_python_predicate_picks_a_branch():
    def f(x, flag):
        return torch.cond(flag, lambda a: a + 1, lambda a: a - 1, (x,))

    check(f, _x(2), True)
    check(f, _x(2), False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cond_branch_returning_its_input(backend):
    """A branch may return its operand unchanged (the graph returns a copy: the operator's outputs
    must not alias its inputs). Eager torch.cond refuses this, so compare with the branch itself."""
    def f(x):
        return torch.cond(x.sum() > 0, lambda a: a, lambda a: a * 2, (x,))

    compiled = bytegraph.compile(f, backend=backend, fullgraph=True)
    x = torch.randn(3).abs()
    out = compiled(x)
    assert torch.equal(out, x) and out is not x
    assert torch.equal(compiled(-x), -x * 2)


def test_cond_with_side_effect_runs_natively():
    log = []

    def f(x):
        def yes(a):
            log.append(1)
            return a + 1
        return torch.cond(x.sum() > 0, yes, lambda a: a - 1, (x,))

    x = torch.ones(2)
    with pytest.raises(bytegraph.errors.Unsupported, match="changes Python state"):
        bytegraph.compile(f, backend="eager", fullgraph=True)(x)


# --- associative_scan --------------------------------------------------------------------------

def _linear_recurrence(left, right):
    # (a, b) pairs of h_t = a_t * h_{t-1} + b_t: the combine function of Mamba's scan
    return left[0] * right[0], right[0] * left[1] + right[1]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("length", [1, 2, 7, 8])
def test_associative_scan_generic_mode_is_traced_into_one_graph(backend, length):
    # The CPU path (combine_mode="generic"): torch's wrapper is plain torch code over a vmapped
    # combine function, traced as it is (torch.compile makes one graph of it too).
    from torch._higher_order_ops.associative_scan import associative_scan

    def fn(a, b):
        return associative_scan(_linear_recurrence, (a, b), dim=1, combine_mode="generic")[1] * 2

    check(fn, torch.rand(2, length, 3, requires_grad=True), _x(2, length, 3), backend=backend)


def _recurrence_by_loop(a, b, dim):
    # h_t = a_t * h_{t-1} + b_t, one step at a time: the reference the scans must agree with
    h, out = torch.zeros_like(b.select(dim, 0)), []
    for t in range(a.shape[dim]):
        h = a.select(dim, t) * h + b.select(dim, t)
        out.append(h)
    return torch.stack(out, dim)


def _flat_combine(a1, b1, a2, b2):
    return a1 * a2, a2 * b1 + b2


def _scan_by_operator(a, b):
    from torch._higher_order_ops.associative_scan import associative_scan_op
    out = associative_scan_op(_flat_combine, [a.movedim(1, 0), b.movedim(1, 0)], ())
    return out[1].movedim(0, 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_associative_scan_operator_runs_a_traced_combine_body(backend):
    # What the wrapper calls under a compiler in its "pointwise" mode (CUDA): the operator itself,
    # over a flat combine function of left then right slices. Without gradients one node runs the
    # operator on the traced combine body.
    seen = []

    def spy(gm, example_inputs):
        seen.append([n.target for n in gm.graph.nodes if n.op == "call_function"])
        return lookup_backend(backend)(gm, example_inputs)

    a, b = torch.rand(2, 5, 3), torch.randn(2, 5, 3)
    with torch.no_grad():
        actual = bytegraph.compile(_scan_by_operator, backend=spy, fullgraph=True)(a, b)
    assert torch.allclose(_recurrence_by_loop(a, b, 1), actual, atol=1e-6)
    assert torch.ops.higher_order.associative_scan in seen[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_associative_scan_operator_gradients_are_the_recurrences(backend):
    # torch's operator gets d/da of this recurrence wrong in its own backward; where gradients
    # flow, the scan is traced as plain torch code instead, whose gradients are eager's.
    a, b = torch.rand(2, 6, 3, requires_grad=True), _x(2, 6, 3)
    w = torch.randn(2, 6, 3)
    (_recurrence_by_loop(a, b, 1) * w).sum().backward()
    expected = a.grad.clone(), b.grad.clone()
    a.grad = b.grad = None
    out = bytegraph.compile(_scan_by_operator, backend=backend, fullgraph=True)(a, b)
    assert torch.allclose(out, _recurrence_by_loop(a, b, 1), atol=1e-6)
    (out * w).sum().backward()
    assert torch.allclose(a.grad, expected[0], atol=1e-5) and torch.allclose(b.grad, expected[1], atol=1e-5)


def test_associative_scan_combine_reading_an_outer_tensor_breaks_with_the_reason():
    from torch._higher_order_ops.associative_scan import associative_scan_op

    def fn(a, w):
        return associative_scan_op(lambda x, y: (x * y * w,), [a], ())[0]

    a, w = torch.rand(4, 3), torch.rand(3)
    with pytest.raises(bytegraph.Unsupported, match="reads tensors from around it"):
        bytegraph.compile(fn, backend="eager", fullgraph=True)(a, w)
    bytegraph.reset()
    assert torch.equal(bytegraph.compile(fn, backend="eager")(a, w), fn(a, w))
    assert_traced()     # broken there, rather than the frame left to run unread


def _check_against_the_loop(fn, a, b, backend, dim, atol=1e-5):
    w = torch.randn_like(b)
    (_recurrence_by_loop(a, b, dim) * w).sum().backward()
    expected = a.grad.clone(), b.grad.clone()
    a.grad = b.grad = None
    out = bytegraph.compile(fn, backend=backend, fullgraph=True)(a, b)
    assert torch.allclose(out, _recurrence_by_loop(a, b, dim), atol=atol)
    (out * w).sum().backward()
    assert torch.allclose(a.grad, expected[0], atol=atol) and torch.allclose(b.grad, expected[1], atol=atol)
    with torch.no_grad():
        again = bytegraph.compile(fn, backend=backend, fullgraph=True)(a, b)
    assert torch.allclose(again, _recurrence_by_loop(a, b, dim), atol=atol)


@pytest.mark.parametrize("backend", BACKENDS)
def test_associative_scan_pointwise_path_reaches_the_operator(backend):
    # associative_scan(..., combine_mode="pointwise") (CUDA only) hands a flat combine function to
    # torch's _maybe_compile_and_run_fn, which calls it directly under a compiler: the same route,
    # taken here on the CPU.
    from torch._higher_order_ops.associative_scan import associative_scan_op
    from torch._higher_order_ops.utils import _maybe_compile_and_run_fn

    def combine(a1, b1, a2, b2):
        return [a1 * a2, a2 * b1 + b2]      # the same structure as the inputs, as torch checks

    def run(combine_fn, leaves):
        return associative_scan_op(combine_fn, leaves, additional_inputs=())

    def fn(a, b):
        return _maybe_compile_and_run_fn(run, combine, [a, b])[1]

    _check_against_the_loop(fn, torch.rand(6, 2, requires_grad=True), _x(6, 2), backend, 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="combine_mode='pointwise' needs CUDA")
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_associative_scan_pointwise_mode_on_cuda(backend):
    from torch._higher_order_ops.associative_scan import associative_scan

    def fn(a, b):
        return associative_scan(_linear_recurrence, (a, b), dim=1, combine_mode="pointwise")[1]

    a = torch.rand(2, 9, 4, device="cuda", requires_grad=True)
    b = torch.randn(2, 9, 4, device="cuda", requires_grad=True)
    _check_against_the_loop(fn, a, b, backend, 1, atol=1e-4)
