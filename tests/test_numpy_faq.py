"""The FAQ's NumPy section (seeds/faq-current.txt, "Does NumPy work with torch.compile?" and after)
as tests: its code examples (the CUDA ones skip without a GPU), its deviations and fall-backs,
``wrap_numpy``, the switch that turns NumPy tracing off, and the guards on arrays."""
import numpy as np
import pytest
import torch

import bytegraph
from bytegraph.testing import CompileCounter
from numpy_helpers import check_np, same_np

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def numpy_fn(X, Y):
    return np.sum(X[:, :, None] * Y[:, None, :], axis=(-2, -1))


# ------------------------------------------------------------------ "Can I compile NumPy code?"

def test_faq_numpy_fn_returns_ndarray():
    X = np.random.randn(1024, 64)
    Y = np.random.randn(1024, 64)
    cnt = CompileCounter()
    Z = bytegraph.compile(numpy_fn, backend=cnt, fullgraph=True)(X, Y)
    assert isinstance(Z, np.ndarray)
    same_np(numpy_fn(X, Y), Z, rtol=1e-9)
    assert cnt.frame_count == 1


def test_faq_numpy_fn_inductor():
    X = np.random.randn(64, 16)
    Y = np.random.randn(64, 16)
    Z = bytegraph.compile(numpy_fn, fullgraph=True)(X, Y)
    assert isinstance(Z, np.ndarray)
    same_np(numpy_fn(X, Y), Z, rtol=1e-9)


def test_graph_break_inside_numpy_code_materialises_and_continues():
    def fn(X, Y):
        prod = X[:, :, None] * Y[:, None, :]
        print("oops, a graph break!")
        return np.sum(prod, axis=(-2, -1))

    X, Y = np.random.randn(8, 4), np.random.randn(8, 4)
    out = bytegraph.explain(fn)(X, Y)
    assert out.graph_count == 2 and out.graph_break_count == 1
    cnt = check_np(fn, lambda: (X.copy(), Y.copy()), graphs=2)
    assert cnt.frame_count == 2


# -------------------------------------------------------- "execute NumPy code on CUDA / gradients"

@bytegraph.wrap_numpy
def wrapped_numpy_fn(X, Y):
    return np.sum(X[:, :, None] * Y[:, None, :], axis=(-2, -1))


def test_wrap_numpy_tensors_in_and_out_no_copy():
    X, Y = torch.randn(16, 8), torch.randn(16, 8)
    cnt = CompileCounter()
    Z = bytegraph.compile(wrapped_numpy_fn, backend=cnt, fullgraph=True)(X, Y)
    assert isinstance(Z, torch.Tensor)
    torch.testing.assert_close(Z, (X[:, :, None] * Y[:, None, :]).sum((-2, -1)))
    # The tensors are the arrays: one graph over the two inputs, nothing converted.
    assert cnt.frame_count == 1
    assert [n.op for n in cnt.graphs[0].graph.nodes].count("placeholder") == 2


def test_wrap_numpy_gradients_fullgraph():
    X = torch.randn(16, 8, requires_grad=True)
    Y = torch.randn(16, 8)
    Z = bytegraph.compile(wrapped_numpy_fn, backend="aot_eager", fullgraph=True)(X, Y)
    assert isinstance(Z, torch.Tensor) and Z.requires_grad
    Z.sum().backward()
    Xr = X.detach().clone().requires_grad_()
    (Xr[:, :, None] * Y[:, None, :]).sum((-2, -1)).sum().backward()
    torch.testing.assert_close(X.grad, Xr.grad)


def test_wrap_numpy_eager_call_converts():
    X, Y = torch.randn(4, 3), torch.randn(4, 3)
    Z = wrapped_numpy_fn(X, Y)
    assert isinstance(Z, torch.Tensor)
    torch.testing.assert_close(Z, (X[:, :, None] * Y[:, None, :]).sum((-2, -1)).double(), check_dtype=False)


def test_wrap_numpy_with_graph_break():
    @bytegraph.wrap_numpy
    def fn(X, Y):
        prod = X[:, :, None] * Y[:, None, :]
        print("oops, a graph break!")
        return np.sum(prod, axis=(-2, -1))

    X, Y = torch.randn(8, 4), torch.randn(8, 4)
    cnt = CompileCounter()
    Z = bytegraph.compile(fn, backend=cnt)(X, Y)
    assert isinstance(Z, torch.Tensor)
    torch.testing.assert_close(Z, (X[:, :, None] * Y[:, None, :]).sum((-2, -1)))
    assert cnt.frame_count == 2     # before the break and after it


@cuda
def test_faq_cuda_device_context():
    X = np.random.randn(1024, 64)
    Y = np.random.randn(1024, 64)
    f = bytegraph.compile(numpy_fn)
    with torch.device("cuda"):
        Z = f(X, Y)
    assert isinstance(Z, np.ndarray)
    same_np(numpy_fn(X, Y), Z, rtol=1e-6, atol=1e-6)
    # Outside the context the same function runs on the CPU again (the default device is guarded).
    same_np(numpy_fn(X, Y), f(X, Y), rtol=1e-9)


@cuda
def test_faq_cuda_wrap_numpy():
    X = torch.randn(1024, 64, device="cuda")
    Y = torch.randn(1024, 64, device="cuda")
    Z = bytegraph.compile(wrapped_numpy_fn, fullgraph=True)(X, Y)
    assert isinstance(Z, torch.Tensor)
    assert Z.device.type == "cuda"
    torch.testing.assert_close(Z, (X[:, :, None] * Y[:, None, :]).sum((-2, -1)), rtol=1e-4, atol=1e-3)


@cuda
def test_faq_cuda_torch_compiler_wrap_numpy_as_written():
    @bytegraph.compile(fullgraph=True)
    @torch.compiler.wrap_numpy
    def numpy_fn(X, Y):
        return np.sum(X[:, :, None] * Y[:, None, :], axis=(-2, -1))

    X = torch.randn(1024, 64, device="cuda", requires_grad=True)
    Y = torch.randn(1024, 64, device="cuda")
    Z = numpy_fn(X, Y)
    assert isinstance(Z, torch.Tensor)
    assert Z.device.type == "cuda"
    Z.sum().backward()
    assert X.grad is not None and X.grad.device.type == "cuda"


@cuda
def test_faq_cuda_wrap_numpy_gradients():
    X = torch.randn(1024, 64, device="cuda", requires_grad=True)
    Y = torch.randn(1024, 64, device="cuda")
    Z = bytegraph.compile(wrapped_numpy_fn, fullgraph=True)(X, Y)
    assert isinstance(Z, torch.Tensor)
    Z.sum().backward()
    torch.testing.assert_close(X.grad, Y.sum(1, keepdim=True).expand_as(Y).contiguous(), rtol=1e-4, atol=1e-3)


@cuda
def test_faq_cuda_graph_break_with_device_context():
    @bytegraph.wrap_numpy
    def fn(X, Y):
        prod = X[:, :, None] * Y[:, None, :]
        print("oops, a graph break!")
        return np.sum(prod, axis=(-2, -1))

    X = torch.randn(1024, 64, device="cuda")
    Y = torch.randn(1024, 64, device="cuda")
    f = bytegraph.compile(fn)
    with torch.device("cuda"):
        Z = f(X, Y)
    assert isinstance(Z, torch.Tensor)
    assert Z.device.type == "cuda"
    torch.testing.assert_close(Z, (X[:, :, None] * Y[:, None, :]).sum((-2, -1)), rtol=1e-4, atol=1e-3)


@cuda
def test_cuda_device_context_in_place_update_written_back():
    def fn(a):
        a += 1
        return a.sum()

    a = np.zeros((4, 4))
    with torch.device("cuda"):
        s = bytegraph.compile(fn)(a)
    assert s == 16.0 and (a == 1).all()


# ----------------------------------------------------------------------------------- debugging

def test_trace_numpy_off_runs_numpy_natively():
    X, Y = np.random.randn(8, 4), np.random.randn(8, 4)
    with bytegraph.config.patch(trace_numpy=False):
        bytegraph.reset()
        out = bytegraph.explain(numpy_fn)(X, Y)
        assert out.graph_count == 0
        assert any("trace_numpy" in br.reason or "NumPy tracing is off" in br.reason for br in out.break_reasons)
        same_np(numpy_fn(X, Y), bytegraph.compile(numpy_fn, backend="eager")(X, Y))
    bytegraph.reset()


def test_trace_numpy_off_keeps_torch_code_compiled():
    def fn(t, a):
        return torch.sin(t) * 2, a * 2

    t, a = torch.randn(3), np.arange(3.0)
    with bytegraph.config.patch(trace_numpy=False):
        bytegraph.reset()
        cnt = CompileCounter()
        r = bytegraph.compile(fn, backend=cnt)(t, a)
        same_np(fn(t, a), r)
        assert cnt.frame_count == 1
    bytegraph.reset()


# ------------------------------------------------------------------------------------ deviations

def test_numpy_scalars_are_returned_as_numpy_scalars():
    def fn(x):
        return np.sum(x), x[0, 0], np.float32(3), x.max() + 1

    x = np.random.randn(3, 3)
    check_np(fn, lambda: (x.copy(),))
    out = bytegraph.compile(fn, backend="eager", fullgraph=True)(x)
    assert [type(o) for o in out] == [np.float64, np.float64, np.float32, np.float64]


def test_tril_indices_return_a_tuple_as_in_numpy():
    def fn(x):
        return np.tril_indices(3), np.triu_indices_from(x)

    out = bytegraph.compile(fn, backend="eager", fullgraph=True)(np.zeros((3, 3)))
    same_np(fn(np.zeros((3, 3))), out)
    assert type(out[0]) is tuple


def test_negative_strides_are_copies_and_writes_through_them_break():
    def read(x):
        return x[::-1] * 2, np.flip(x, 0).sum(axis=0)

    x = np.random.randn(4, 3)
    check_np(read, lambda: (x.copy(),))

    def write(x):
        r = x[::-1]
        r[0] = 100.0          # eager writes into x through the view
        return x

    out = bytegraph.explain(write)(x.copy())
    assert any("negative-stride" in br.reason for br in out.break_reasons)
    check_np(write, lambda: (x.copy(),), graphs=None)


def test_nep50_promotion():
    def fn(i8, f32):
        return i8 + 1, i8 + 1.5, f32 * 2.0, f32 * np.float64(2.0), i8 / 2, np.uint8(250) + np.uint8(10)

    check_np(fn, lambda: (np.arange(4, dtype=np.int8), np.ones(4, dtype=np.float32)))


# ------------------------------------------------------------------------------- guards on arrays

def test_array_guards_recompile_on_dtype_shape_and_layout():
    def fn(x):
        return x * 2 + 1

    cnt = CompileCounter()
    f = bytegraph.compile(fn, backend=cnt, dynamic=False)
    base = np.arange(12.0).reshape(3, 4)
    inputs = [base, base * 3, base.astype(np.float32), base.reshape(4, 3), base.T, base[:, ::2]]
    expected_graphs = [1, 1, 2, 3, 4, 5]
    for x, n in zip(inputs, expected_graphs):
        same_np(fn(x), f(x))
        assert cnt.frame_count == n


def test_array_subclass_is_not_taken_for_an_array():
    class Sub(np.ndarray):
        pass

    def fn(x):
        return x + 1

    cnt = CompileCounter()
    f = bytegraph.compile(fn, backend=cnt)
    same_np(fn(np.ones(3)), f(np.ones(3)))
    assert cnt.frame_count == 1
    s = np.ones(3).view(Sub)
    r = f(s)
    assert type(r) is Sub and (r == 2).all()


def test_array_guard_explains_the_miss():
    from bytegraph.debug import records

    def fn(x):
        return x * 2

    bytegraph.reset()
    f = bytegraph.compile(fn, backend="eager", dynamic=False)
    f(np.ones((2, 2)))
    f(np.ones((2, 2), dtype=np.float32))
    f(np.ones((2, 2), dtype=np.float32)[:, ::2])
    reasons = [r.reason for r in records.recompiles]
    assert len(reasons) == 2
    assert "dtype of x changed: expected float64, got float32" in reasons[0]
    assert "x" in reasons[1] and ("shape" in reasons[1] or "strides" in reasons[1])


def test_default_device_is_guarded():
    def fn(x):
        return x + 1

    cnt = CompileCounter()
    f = bytegraph.compile(fn, backend=cnt)
    x = np.ones(3)
    same_np(fn(x), f(x))
    x2 = np.arange(3.0)
    with torch.device("cpu"):
        same_np(fn(x2), f(x2))
    assert cnt.frame_count == 1


@pytest.mark.mutation_blind("dead_tracer", reason="writing to a read-only array is left to NumPy, which raises "
                                                  "(the frame runs eagerly by design); the rest is fullgraph")
def test_read_only_array_argument():
    def fn(x):
        return x * 2

    x = np.arange(4.0)
    x.setflags(write=False)
    check_np(fn, lambda: (x,))
    # check_np leaves read-only arrays as they are: a second one with other values here.
    cnt = CompileCounter()
    compiled = bytegraph.compile(fn, backend=cnt, fullgraph=True)
    y = np.arange(4.0) * 3 - 1
    y.setflags(write=False)
    for v in (x, y):
        same_np(fn(v), compiled(v))
    assert cnt.frame_count == 1

    def write(x):
        x += 1
        return x

    with pytest.raises(ValueError, match="read-only"):
        bytegraph.compile(write, backend="eager")(x)


def test_negative_stride_argument_updated_in_place_is_written_back():
    def fn(x):
        x *= 2
        x[0] = -1
        return x.sum()

    base = np.arange(6.0)
    check_np(fn, lambda: (base.copy()[::-1],))


@pytest.mark.mutation_blind("dead_tracer", reason="overlapping arrays updated in place run eagerly by design "
                                                  "(guard_array_overlap): 0 graphs, asserted")
def test_overlapping_array_arguments_with_in_place_update():
    def fn(a, b):
        a += 1
        return a + b

    base = np.arange(8.0)
    check_np(fn, lambda: (lambda x: (x[:6], x[2:]))(base.copy()), graphs=0, fullgraph=False)


def test_numpy_ops_on_int_argument_dynamic():
    def fn(x, n):
        return np.arange(n) * x[:n]

    check_np(fn, lambda: (np.arange(10.0), 4))


def test_returned_negative_stride_views_alias_their_base_as_in_numpy():
    def fn(x):
        return x[::-1], np.flip(x, axis=1), x[:, ::-2], (x * 2)[::-1]

    x = np.arange(12.0).reshape(3, 4)
    out = bytegraph.compile(fn, backend="eager", fullgraph=True)(x)
    same_np(fn(x), out)
    assert all(np.shares_memory(o, x) for o in out[:3])
    assert out[0].strides[0] < 0


def test_torch_compiler_wrap_numpy_is_understood():
    @torch.compiler.wrap_numpy
    def fn(X, Y):
        return np.sum(X[:, :, None] * Y[:, None, :], axis=(-2, -1))

    X = torch.randn(16, 8, requires_grad=True)
    Y = torch.randn(16, 8)
    Z = bytegraph.compile(fn, backend="aot_eager", fullgraph=True)(X, Y)
    assert isinstance(Z, torch.Tensor) and Z.requires_grad
    Z.sum().backward()
    torch.testing.assert_close(X.grad, Y.sum(1, keepdim=True).expand_as(Y))

    def outer(X, Y):
        return fn(X, Y) * 2

    Z2 = bytegraph.compile(outer, backend="eager", fullgraph=True)(X.detach(), Y)
    torch.testing.assert_close(Z2, 2 * (X.detach()[:, :, None] * Y[:, None, :]).sum((-2, -1)))


@pytest.mark.mutation_blind("dead_tracer", reason="a tensor and an array sharing memory, updated in place, run "
                                                  "eagerly by design (0 graphs, asserted); apart, fullgraph")
def test_array_and_tensor_sharing_memory_with_in_place_update():
    def fn(t, a):
        a += 1
        return t * 2

    def make():
        t = torch.arange(4.0)
        return t, t.numpy()

    check_np(fn, make, graphs=0, fullgraph=False)    # sharing memory: eager (guard_array_overlap)
    # Apart, they stay one graph; the guard tells the two cases apart.
    check_np(fn, lambda: (torch.arange(4.0), np.arange(4.0)))
