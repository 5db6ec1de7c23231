"""Tensor subclasses: traceable wrapper subclasses (TwoTensor, a user's int8 weight) as inputs,
parameters, intermediates and outputs; their guards; training through AOTAutograd.

Every test compares the compiled function with eager, subclass by subclass (the class, the
flatten context and every inner tensor), and counts graphs."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch.testing._internal.two_tensor import TwoTensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

import bytegraph
from bytegraph.backends.registry import lookup_backend
from bytegraph.testing import CompileCounter
from helpers import assert_traced, torch_compile_fullgraph_count

aten = torch.ops.aten
BACKENDS = ["eager", "aot_eager"]


def same_training(eager, model, cmodel, make_input, steps=2):
    """``steps`` forward/backward steps of ``eager`` and of ``cmodel`` (compiled ``model``, a copy of
    ``eager``) on the same inputs: equal losses and parameter gradients."""
    for _ in range(steps):
        x = make_input()
        loss_e, loss_c = eager(x), cmodel(x)
        assert_same_tensors(loss_e, loss_c, "loss")
        loss_e.backward()
        loss_c.backward()
        for (name, pe), pc in zip(eager.named_parameters(), model.parameters()):
            assert_same_tensors(pe.grad, pc.grad, f"{name}.grad", rtol=1e-4, atol=1e-5)


def assert_same_tensors(expected, actual, what="out", rtol=1e-5, atol=1e-6):
    """Equal structure, classes, flatten contexts and values (inner tensors one by one)."""
    assert type(actual) is type(expected), f"{what}: {type(actual).__name__} vs eager's {type(expected).__name__}"
    if isinstance(expected, torch.Tensor) and is_traceable_wrapper_subclass(expected):
        names, ctx = expected.__tensor_flatten__()
        assert actual.__tensor_flatten__() == (names, ctx), what
        assert actual.shape == expected.shape and actual.requires_grad == expected.requires_grad, what
        for n in names:
            assert_same_tensors(getattr(expected, n), getattr(actual, n), f"{what}.{n}", rtol, atol)
    elif isinstance(expected, torch.Tensor):
        assert actual.requires_grad == expected.requires_grad, what
        torch.testing.assert_close(actual.detach(), expected.detach(), rtol=rtol, atol=atol, msg=what)
    elif isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected), what
        for i, (e, a) in enumerate(zip(expected, actual)):
            assert_same_tensors(e, a, f"{what}[{i}]", rtol, atol)
    else:
        assert actual == expected, what


def compiled(fn, backend="eager", fullgraph=True):
    cnt = CompileCounter(lookup_backend(backend))
    return bytegraph.compile(fn, backend=cnt, fullgraph=fullgraph), cnt


def check_calls(fn, make, backend="eager", graphs=1, calls=2):
    """``fn(*make())`` eager vs compiled over ``calls`` calls with other values each time (the
    same on both sides), one compile for all of them."""
    cfn, cnt = compiled(fn, backend)
    for seed in range(calls):
        torch.manual_seed(seed)
        expected = fn(*make())
        torch.manual_seed(seed)
        actual = cfn(*make())
        assert_same_tensors(expected, actual)
    assert cnt.frame_count == graphs
    return cnt


def two(*shape, requires_grad=False):
    return TwoTensor(torch.randn(*shape), torch.randn(*shape)).requires_grad_(requires_grad)


# --- TwoTensor: inputs, intermediates, outputs -------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_two_tensor_input_and_output(backend):
    check_calls(lambda x: torch.sin(x) * 2 + 1, lambda: (two(3, 4),), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_tensor_with_plain_tensor_and_matmul(backend):
    check_calls(lambda x, y, w: (x * y + 1) @ w.t(), lambda: (two(3, 4), torch.randn(3, 4), two(5, 4)), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_tensor_made_in_graph(backend):
    def fn(a, b):
        t = TwoTensor(a, b)
        return torch.cos(t).sum(0), type(t * 2) is TwoTensor, isinstance(t, TwoTensor)
    check_calls(fn, lambda: (torch.randn(3, 4), torch.randn(3, 4)), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_tensor_inner_tensors_read_in_graph(backend):
    # Of an input, of an intermediate, and flatten's names.
    def fn(x):
        y = x.relu() * 3
        return x.a + x.b, y.b - 1, y.__tensor_flatten__()[0]
    check_calls(fn, lambda: (two(4),), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_tensor_shapes_views_and_inplace(backend):
    def fn(x):
        y = x.view(-1) * x.shape[0]
        x.add_(1)
        return y.reshape(2, 6).t(), x
    check_calls(fn, lambda: (two(3, 4),), backend)


def test_two_tensor_guards_recompile_on_layout():
    cfn, cnt = compiled(lambda x: x * 2, fullgraph=False)
    cfn(two(3))
    cfn(two(3))
    assert cnt.frame_count == 1
    for other, n in [(two(4), 2), (TwoTensor(torch.randn(6)[::2], torch.randn(6)[::2]), 3),
                     (torch.randn(3), 4), (two(3).double(), 5)]:
        out = cfn(other)
        assert_same_tensors(other * 2, out)
        assert cnt.frame_count == n


class Tagged(TwoTensor):
    """A TwoTensor carrying a tag in its flatten context."""

    def __new__(cls, a, b, tag):
        out = super().__new__(cls, a, b)
        out.tag = tag
        return out

    def __init__(self, a, b, tag):
        super().__init__(a, b)

    def __tensor_flatten__(self):
        return ["a", "b"], self.tag

    @staticmethod
    def __tensor_unflatten__(inner, tag, outer_size, outer_stride):
        return Tagged(inner["a"], inner["b"], tag)

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs):
        tags = {a.tag for a in torch.utils._pytree.tree_leaves(args) if isinstance(a, Tagged)}
        plain = torch.utils._pytree.tree_map_only(Tagged, lambda t: TwoTensor(t.a, t.b), args)
        out = TwoTensor.__torch_dispatch__(func, (TwoTensor,), plain, kwargs)
        return torch.utils._pytree.tree_map_only(TwoTensor, lambda t: Tagged(t.a, t.b, min(tags)), out)

    def scaled(self):
        return self * (2 if self.tag == "double" else 1)


def test_flatten_context_is_guarded():
    cfn, cnt = compiled(lambda x: x.scaled() + 1, fullgraph=False)
    for tag, graphs in [("double", 1), ("double", 1), ("single", 2)]:
        x = Tagged(torch.randn(3), torch.randn(3), tag)
        expected = x.scaled() + 1
        actual = cfn(x)
        assert_same_tensors(expected, actual)
        assert actual.tag == tag
        assert cnt.frame_count == graphs


# --- parameters and training --------------------------------------------------------------------

class TwoLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(two(4, 4))
        self.b = torch.nn.Parameter(torch.randn(4))

    def forward(self, x):
        return torch.relu(F.linear(x, self.w, self.b)).sum()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("x_kind", ["plain", "two"])
def test_two_tensor_parameter_training(backend, x_kind):
    torch.manual_seed(0)
    eager = TwoLinear()
    model = copy.deepcopy(eager)
    cmodel, cnt = compiled(model, backend)
    same_training(eager, model, cmodel, lambda: torch.randn(2, 4) if x_kind == "plain" else two(2, 4))
    assert cnt.frame_count == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_tensor_input_gradients(backend):
    fn = lambda x, y: (x.sin() * x + y).sum()  # noqa: E731
    cfn, cnt = compiled(fn, backend)
    x = two(2, 3, requires_grad=True)
    y = torch.randn(2, 3, requires_grad=True)
    xc = TwoTensor(x.a.detach().clone(), x.b.detach().clone()).requires_grad_()
    yc = y.detach().clone().requires_grad_()
    fn(x, y).backward()
    cfn(xc, yc).backward()
    assert_same_tensors(x.grad, xc.grad, "x.grad")
    assert_same_tensors(y.grad, yc.grad, "y.grad")
    assert cnt.frame_count == 1


# --- a user's int8 weight-only subclass -----------------------------------------------------------

class Int8Weight(torch.Tensor):
    """A weight stored as int8 rows with one float scale per row (weight-only quantization);
    ``transposed`` (its flatten context) says whether it stands for the weight or its ``.t()``."""

    @staticmethod
    def __new__(cls, int_data, scale, transposed=False):
        shape = int_data.shape[::-1] if transposed else int_data.shape
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=scale.dtype, device=int_data.device)

    def __init__(self, int_data, scale, transposed=False):
        self.int_data = int_data
        self.scale = scale
        self.transposed = transposed

    def __repr__(self):
        return f"Int8Weight(shape={tuple(self.shape)}, transposed={self.transposed})"

    def __tensor_flatten__(self):
        return ["int_data", "scale"], self.transposed

    @staticmethod
    def __tensor_unflatten__(inner, transposed, outer_size, outer_stride):
        return Int8Weight(inner["int_data"], inner["scale"], transposed)

    @classmethod
    def quantize(cls, w):
        scale = w.detach().abs().amax(dim=1).clamp(min=1e-8) / 127
        return cls(torch.round(w.detach() / scale[:, None]).clamp(-128, 127).to(torch.int8), scale)

    def dequantize(self):
        w = self.int_data.to(self.scale.dtype) * self.scale[:, None]
        return w.t() if self.transposed else w

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten.detach.default:
            w = args[0]
            return cls(w.int_data, w.scale, w.transposed)
        if func is aten.t.default:
            w = args[0]
            return cls(w.int_data, w.scale, not w.transposed)
        if func in (aten.mm.default, aten.addmm.default):
            bias, (x, w) = (args[0], args[1:3]) if func is aten.addmm.default else (None, args[:2])
            if isinstance(w, Int8Weight) and w.transposed and not isinstance(x, Int8Weight):
                # x @ (q * s).t() == (x @ q.t()) * s: the int8 weight is never dequantized.
                out = torch.mm(x, w.int_data.to(x.dtype).t()) * w.scale
                return out + bias if bias is not None else out
        plain = torch.utils._pytree.tree_map_only(Int8Weight, lambda t: t.dequantize(), (args, kwargs))
        return func(*plain[0], **plain[1])


class QuantLinear(torch.nn.Module):
    def __init__(self, linear):
        super().__init__()
        self.weight = torch.nn.Parameter(Int8Weight.quantize(linear.weight), requires_grad=False)
        self.bias = linear.bias

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class QuantMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = QuantLinear(torch.nn.Linear(8, 16))
        self.down = QuantLinear(torch.nn.Linear(16, 8, bias=False))

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_int8_weight_only_linear(backend):
    model = QuantMLP()
    assert type(model.up.weight) is Int8Weight
    cnt = check_calls(model, lambda: (torch.randn(4, 8),), backend)
    if backend == "eager":
        # The graph calls linear on the subclass (its dispatch decides), no dequantized copy.
        assert [n.target for n in cnt.graphs[0].graph.nodes if n.op == "call_function"].count(F.linear) == 2
    # 3-d activations (linear then goes through matmul's reshapes)
    check_calls(model, lambda: (torch.randn(2, 3, 8),), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_int8_weight_passed_as_argument(backend):
    def fn(x, w):
        return F.linear(x, w).relu(), w.dequantize().sum()
    check_calls(fn, lambda: (torch.randn(3, 8), Int8Weight.quantize(torch.randn(5, 8))), backend)


# --- what is not traced: clean graph breaks, eager's results ---------------------------------------

class Doubling(torch.Tensor):
    """A plain subclass whose __torch_function__ turns sin into cos."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.sin:
            func = torch.cos
        return super().__torch_function__(func, types, args, kwargs or {})


def _breaks_then_matches(fn, make, reason):
    """fullgraph=True raises Unsupported naming ``reason``; without it the result is eager's."""
    cfn, _ = compiled(fn)
    with pytest.raises(bytegraph.Unsupported, match=reason):
        cfn(*make())
    torch.manual_seed(0)
    expected = fn(*make())
    bytegraph.reset()
    cfn, cnt = compiled(fn, fullgraph=False)
    torch.manual_seed(0)
    assert_same_tensors(expected, cfn(*make()))
    assert_traced()     # broken there, rather than the frame left to run unread
    return cnt


# --- __torch_function__ subclasses: the override traced ---------------------------------------

class Logged(torch.Tensor):
    """A plain subclass whose __torch_function__ records each function it is handed."""
    log = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.log.append(getattr(func, "__name__", None))
        return super().__torch_function__(func, types, args, kwargs or {})


class Marked(torch.Tensor):
    """A subclass with no override of its own: torch.Tensor's keeps results of its class."""




def check_logged(fn, make, backend="eager", graphs=1, calls=2):
    """``fn(*make())`` compiled and eager on equal inputs (``make`` seeded alike) over ``calls``
    calls: equal results and classes, equal inputs afterwards (in-place operators), and the
    overrides handed the same functions in the same order; ``graphs`` graphs (one: fullgraph)."""
    cfn, cnt = compiled(fn, backend, fullgraph=graphs == 1)
    for seed in range(calls):
        torch.manual_seed(seed)
        eager_args = make()
        torch.manual_seed(seed)
        args = make()
        Logged.log.clear()
        expected = fn(*eager_args)
        eager_log = list(Logged.log)
        Logged.log.clear()
        actual = cfn(*args)
        assert Logged.log == eager_log, (Logged.log, eager_log)
        assert_same_tensors(expected, actual)
        assert_same_tensors(eager_args, args, "inputs after the call")
    assert cnt.frame_count == graphs
    return cnt


def _logged(*shape, requires_grad=False):
    return torch.randn(*shape, requires_grad=requires_grad).as_subclass(Logged)


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_function_subclass_traced(backend):
    def fn(x, y):
        a = torch.sin(x) + y           # torch function, operator
        b = a.cos() * 2                # method, operator with a number
        c = 2 + -b[1:] + abs(x[0])     # reflected operator, unary operators, subscripts
        d = (x > 0, 0 < x, y <= x, x == 1, x != y)   # comparisons, reflected ones too
        return b, x.shape, F.relu(b) - x, type(b) is Logged, x.dtype, c, d
    check_logged(fn, lambda: (_logged(3, 4), torch.randn(3, 4)), backend)
    assert torch_compile_fullgraph_count(fn, _logged(3, 4), torch.randn(3, 4)) == 1


def test_torch_function_subclass_training_gradients():
    def fn(x, w):
        return (x @ w).tanh().sum()
    cfn, cnt = compiled(fn, "aot_eager")
    for seed in range(2):
        torch.manual_seed(seed)
        x, w = _logged(3, 4, requires_grad=True), torch.randn(4, 2, requires_grad=True)
        Logged.log.clear()
        expected = fn(x, w)
        eager_log = list(Logged.log)
        ge = torch.autograd.grad(expected, (x, w))
        Logged.log.clear()
        actual = cfn(x, w)
        assert Logged.log == eager_log
        gc = torch.autograd.grad(actual, (x, w))
        assert_same_tensors(expected, actual)
        assert_same_tensors(ge, gc, "grads")
    assert cnt.frame_count == 1


def test_subclass_without_override_keeps_its_class():
    def fn(x):
        y = x * 2 + 1
        return y, y.sum(), type(y) is Marked, torch.cat([y, x])
    check_calls(fn, lambda: (torch.randn(3).as_subclass(Marked),))


def test_override_that_changes_the_function():
    # Doubling turns sin into cos: traced, so the graph computes cos.
    def fn(x):
        return torch.sin(x) + 1, x.sin()
    check_calls(fn, lambda: (torch.randn(3).as_subclass(Doubling),))


def test_as_subclass_in_graph():
    def fn(x):
        y = torch.sin(x.as_subclass(Doubling))
        return y * 2, type(y) is Doubling, x.as_subclass(Marked)
    check_calls(fn, lambda: (torch.randn(3),))


def test_torch_function_subclass_guards_recompile():
    cfn, cnt = compiled(lambda x: torch.sin(x) * 2, fullgraph=False)
    for x, graphs in [(torch.randn(3).as_subclass(Doubling), 1), (torch.randn(3).as_subclass(Doubling), 1),
                      (torch.randn(3).as_subclass(Marked), 2), (torch.randn(3), 3)]:
        assert_same_tensors(torch.sin(x) * 2, cfn(x))
        assert cnt.frame_count == graphs


class LoggedTwice(Logged):
    """A subclass of a __torch_function__ class: torch asks it first."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.log.append("twice")
        return super().__torch_function__(func, types, args, kwargs)


class DataReading(torch.Tensor):
    """An override the tracer cannot follow: it reads the data."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs or {})
        if func is torch.Tensor.add and bool(out.sum() > 0):
            return out * 0
        return out


@pytest.mark.parametrize("fn, make, reason", [
    # a reflected special method called by name is not routed through the override: the graph
    # refuses it (operators themselves: tests/test_torch_function.py)
    (lambda x: x.__rsub__(1) * 2, lambda: (_logged(3),), "__torch_function__ is not traced for this operation"),
    (lambda x: torch.sin(x) + 1, lambda: (torch.randn(3).as_subclass(DataReading),), "data"),
    (lambda x, y: torch.sin(x) + y, lambda: (_logged(3), torch.randn(3).as_subclass(LoggedTwice)),
     "several __torch_function__ classes"),
])
def test_torch_function_subclass_what_breaks(fn, make, reason):
    _breaks_then_matches(fn, make, reason)


class SinIsCos(torch.overrides.TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        if func is torch.sin:
            func = torch.cos
        return func(*args, **(kwargs or {}))


def test_torch_function_mode_entered_inside():
    # Traced: one graph computing cos inside the block, sin after it (more: tests/test_torch_function.py).
    def fn(x):
        with SinIsCos():
            y = torch.sin(x)
        return y + torch.sin(x)
    check_calls(fn, lambda: (torch.randn(3),))


def test_pop_of_the_mode_stack_is_not_run_while_tracing():
    # TorchFunctionMode.__exit__ pops the C++ mode stack: asking it while tracing popped it once more.
    calls = []

    def fn(x):
        mode = SinIsCos()
        with mode:
            out = torch.sin(x)
        calls.append(mode.calls)
        return out
    cfn, cnt = compiled(fn, fullgraph=False)
    x = torch.randn(3)
    torch.testing.assert_close(fn(x), torch.cos(x))
    torch.testing.assert_close(cfn(x), torch.cos(x))
    assert torch._C._len_torch_function_stack() == 0
    # The mode entered inside is traced (its __exit__ pops the trace's own stack): one graph,
    # the mode's count as in eager.
    assert cnt.frame_count == 1
    assert calls[0] == calls[1] > 0


class _OwnUnflatten:
    @classmethod
    def __tensor_unflatten__(cls, inner, ctx, outer_size, outer_stride):
        return cls(inner["a"], inner["b"])


class Unreadable(_OwnUnflatten, TwoTensor):
    """A wrapper subclass with a method that reads the data (unknown while tracing)."""

    def biggest(self):
        return max(self.a.tolist())


def test_subclass_method_the_tracer_cannot_follow_breaks():
    def fn(x):
        return x * x.biggest()
    _breaks_then_matches(fn, lambda: (Unreadable(torch.randn(4), torch.randn(4)),), "tolist")


class InheritedUnflatten(TwoTensor):
    """__tensor_unflatten__ inherited from TwoTensor: it makes a TwoTensor, not one of these."""

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs):
        plain = torch.utils._pytree.tree_map_only(InheritedUnflatten, lambda t: TwoTensor(t.a, t.b * 2), args)
        return func(*plain, **(kwargs or {}))


def test_subclass_traced_as_its_base_breaks():
    _breaks_then_matches(lambda x: torch.sin(x) * 2, lambda: (InheritedUnflatten(torch.randn(4), torch.randn(4)),),
                         "__tensor_unflatten__ makes a TwoTensor")


class DataDispatch(_OwnUnflatten, TwoTensor):
    """A wrapper subclass whose __torch_dispatch__ branches on the data."""

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs):
        plain = torch.utils._pytree.tree_map_only(DataDispatch, lambda t: t.a, args)
        out = func(*plain, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.numel() and bool(out.flatten()[0] > 0):
            out = out + 1
        return out


def test_subclass_dispatch_reading_data_breaks():
    _breaks_then_matches(lambda x: torch.sin(x) * 2, lambda: (DataDispatch(torch.randn(4), torch.randn(4)),),
                         "data|raised")


# --- torchao (skipped where it is not installed: `pip install torchao`) ---------------------------

def _torchao():
    return pytest.importorskip("torchao")


@pytest.mark.parametrize("backend", BACKENDS)
def test_torchao_int8_weight_only_linear(backend):
    _torchao()
    from torchao.quantization import quantize_
    try:
        from torchao.quantization import Int8WeightOnlyConfig as config
    except ImportError:
        from torchao.quantization import int8_weight_only as config
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).eval()
    quantize_(model, config())
    assert is_traceable_wrapper_subclass(model[0].weight)
    with torch.no_grad():
        check_calls(model, lambda: (torch.randn(4, 16),), backend)


class QLoRALinear(torch.nn.Module):
    def __init__(self, to_nf4, linear_nf4, d=256, rank=4):
        super().__init__()
        self.linear_nf4 = linear_nf4
        self.weight = torch.nn.Parameter(to_nf4(torch.randn(d, d)), requires_grad=False)
        self.lora_a = torch.nn.Parameter(torch.randn(rank, d) * 0.1)
        self.lora_b = torch.nn.Parameter(torch.randn(d, rank) * 0.1)

    def forward(self, x):
        return (self.linear_nf4(x, self.weight) + x @ self.lora_a.t() @ self.lora_b.t()).pow(2).mean()


@pytest.mark.parametrize("backend", BACKENDS)
def test_torchao_nf4_lora_training(backend):
    _torchao()
    try:
        from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import linear_nf4, to_nf4
    except ImportError:
        from torchao.dtypes.nf4tensor import linear_nf4, to_nf4
    torch.manual_seed(0)
    eager = QLoRALinear(to_nf4, linear_nf4)
    model = copy.deepcopy(eager)
    cmodel, cnt = compiled(model, backend)
    opt_e = torch.optim.SGD([eager.lora_a, eager.lora_b], lr=0.1)
    opt_c = torch.optim.SGD([model.lora_a, model.lora_b], lr=0.1)
    for step in range(2):
        x = torch.randn(8, 256)
        loss_e, loss_c = eager(x), cmodel(x)
        assert_same_tensors(loss_e, loss_c, "loss", rtol=1e-4, atol=1e-5)
        loss_e.backward()
        loss_c.backward()
        for name in ("lora_a", "lora_b"):
            assert_same_tensors(getattr(eager, name).grad, getattr(model, name).grad, name, rtol=1e-4, atol=1e-5)
        opt_e.step()
        opt_c.step()
        opt_e.zero_grad()
        opt_c.zero_grad()
    assert cnt.frame_count == 1


# --- subclass inputs with sizes that change ------------------------------------------------------

def torch_compile_counts(fn, calls):
    """Graphs torch.compile has made after each call of ``calls`` (argument tuples, passed as
    they are: subclass arguments stay subclasses)."""
    import torch._dynamo
    count, after = [0], []

    def backend(gm, example_inputs):
        count[0] += 1
        return gm.forward
    torch._dynamo.reset()
    try:
        compiled_fn = torch.compile(fn, backend=backend)
        for args in calls:
            compiled_fn(*args)
            after.append(count[0])
    finally:
        torch._dynamo.reset()
    return after


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_tensor_automatic_dynamic_sizes(backend):
    # A second size makes the dims that changed symbolic: no graph per size after that.
    def fn(x, y):
        return (x.sin() * x.shape[0] + y).sum(0), x.shape[0]
    cfn, cnt = compiled(fn, backend)
    calls = []
    for n in (3, 4, 5, 7):
        torch.manual_seed(n)
        calls.append((two(n, 2, requires_grad=backend == "aot_eager"), torch.randn(n, 2)))
    counts = []
    for args in calls:
        expected, actual = fn(*args), cfn(*args)
        assert_same_tensors(expected, actual)
        if backend == "aot_eager":
            ge, = torch.autograd.grad(expected[0], args[0], torch.ones_like(expected[0]))
            gc, = torch.autograd.grad(actual[0], args[0], torch.ones_like(actual[0]))
            assert_same_tensors(ge, gc, "grad")
        counts.append(cnt.frame_count)
    assert counts == [1, 2, 2, 2]
    assert torch_compile_counts(fn, calls) == [1, 2, 2, 2]


def test_two_tensor_mark_dynamic():
    def fn(x):
        return x.cos() + x.shape[0], x.view(-1)
    cfn, cnt = compiled(fn)
    for n in (3, 4, 6):
        x = two(n, 5)
        torch._dynamo.mark_dynamic(x, 0)
        assert_same_tensors(fn(x), cfn(x))
    assert cnt.frame_count == 1


def test_dynamic_two_tensor_guards_still_check_layout():
    # Symbolic sizes, but the inner tensors' other sizes, strides and dtype are still guarded.
    cfn, cnt = compiled(lambda x: x * 2, fullgraph=False)
    for x, graphs in [(two(3, 2), 1), (two(4, 2), 2), (two(5, 2), 2), (two(5, 3), 3),
                      (TwoTensor(torch.randn(6, 4)[:, ::2], torch.randn(6, 4)[:, ::2]), 4), (two(6, 2).double(), 5)]:
        assert_same_tensors(x * 2, cfn(x))
        assert cnt.frame_count == graphs


def test_torch_function_subclass_dynamic_sizes():
    def fn(x):
        return torch.sin(x) * x.shape[0]
    cfn, cnt = compiled(fn)
    for n in (3, 4, 5, 8):
        Logged.log.clear()
        x = _logged(n)
        expected, eager_log = fn(x), list(Logged.log)
        Logged.log.clear()
        actual = cfn(x)
        assert Logged.log == eager_log
        assert_same_tensors(expected, actual)
    assert cnt.frame_count == 2
