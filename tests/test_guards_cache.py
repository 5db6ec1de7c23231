"""Guards and the cache: what recompiles, what does not, the cache size limit, reset(),
and errors for bad uses of the public API."""
import copy
import warnings

import pytest
import torch
import torch.nn as nn

import bytegraph
from bytegraph.testing import CompileCounter
from helpers import assert_same, compile_counted


def t(*shape):
    return torch.randn(*shape)


def counted(fn, backend="eager"):
    """``(compiled, counter)``: ``fn`` compiled with a CompileCounter over ``backend``."""
    from bytegraph.backends.registry import lookup_backend
    cnt = CompileCounter(None if backend == "eager" else lookup_backend(backend))
    return bytegraph.compile(fn, backend=cnt), cnt


# ---------------------------------------------------------------- recompilation

def test_same_inputs_do_not_recompile():
    def f(x, n):
        return x * n + 1

    compiled, cnt = compile_counted(f, fullgraph=True)
    for _ in range(3):
        x = t(3, 4)          # new tensor object, same metadata
        assert_same(f(x, 2), compiled(x, 2))
    assert cnt.frame_count == 1


def test_shape_change_recompiles():
    def f(x):
        return x.sum(-1) * x.shape[0]

    compiled, cnt = compile_counted(f)
    a, b = t(2, 3), t(4, 3)
    assert_same(f(a), compiled(a))
    assert cnt.frame_count == 1
    assert_same(f(b), compiled(b))
    assert cnt.frame_count == 2
    assert_same(f(a), compiled(a))
    assert cnt.frame_count == 2, "going back to the first shape must hit the cache"


def test_shape_change_recompiles_static():
    def f(x):
        return x.view(x.shape[0] * x.shape[1]) + 1

    compiled, cnt = compile_counted(f, dynamic=False)
    for shape in [(2, 3), (3, 3), (2, 3), (4, 1), (3, 3)]:
        x = t(*shape)
        assert_same(f(x), compiled(x))
    assert cnt.frame_count == 3


def test_dtype_change_recompiles():
    def f(x):
        return x * 2 + 1

    compiled, cnt = compile_counted(f)
    x = t(4)
    assert_same(f(x), compiled(x))
    xd = x.double()
    out = compiled(xd)
    assert out.dtype == torch.float64
    assert_same(f(xd), out)
    assert cnt.frame_count == 2
    xi = torch.arange(4)
    assert_same(f(xi), compiled(xi))
    assert cnt.frame_count == 3


def test_requires_grad_change_recompiles():
    def f(x):
        return x.sin() * 2

    compiled, cnt = compile_counted(f)
    x = t(4)
    out = compiled(x)
    assert not out.requires_grad
    xr = x.clone().requires_grad_()
    out = compiled(xr)
    assert out.requires_grad, "output must require grad when the input does"
    assert cnt.frame_count == 2
    out.sum().backward()
    assert_same(xr.grad, 2 * x.cos())


def test_python_int_argument_value_change_recompiles():
    def f(x, n):
        return x * n + n

    compiled, cnt = compile_counted(f, dynamic=False)
    x = t(3)
    assert_same(f(x, 2), compiled(x, 2))
    assert_same(f(x, 3), compiled(x, 3))
    assert cnt.frame_count == 2
    x = t(3)       # other values: the graph reused must compute, not repeat its first answer
    assert_same(f(x, 2), compiled(x, 2))
    assert cnt.frame_count == 2


def test_python_int_used_in_control_flow_recompiles():
    def f(x, n):
        for _ in range(n):
            x = x + 1
        return x

    compiled, cnt = compile_counted(f)
    x = t(3)
    assert_same(f(x, 2), compiled(x, 2))
    assert_same(f(x, 5), compiled(x, 5))
    assert cnt.frame_count == 2


def test_bool_and_none_argument_change_recompiles():
    def f(x, flag, bias):
        y = x.relu() if flag else x.sigmoid()
        return y if bias is None else y + bias

    compiled, cnt = compile_counted(f)
    x = t(3)
    b = t(3)
    calls = [(True, None), (False, None), (True, b), (True, None), (False, None)]
    for i, (flag, bias) in enumerate(calls):
        x = t(3) if i >= 3 else x      # the graphs reused get other values
        assert_same(f(x, flag, bias), compiled(x, flag, bias))
    assert cnt.frame_count == 3


def test_string_argument_change_recompiles():
    def f(x, act):
        if act == "relu":
            return x.relu()
        return x.tanh()

    compiled, cnt = compile_counted(f)
    x = t(4)
    assert_same(f(x, "relu"), compiled(x, "relu"))
    assert_same(f(x, "tanh"), compiled(x, "tanh"))
    assert cnt.frame_count == 2


G_FACTOR = 2
G_FLAG = True


def _uses_globals(x):
    if G_FLAG:
        return x * G_FACTOR
    return x - G_FACTOR


def test_global_value_change_recompiles():
    global G_FACTOR, G_FLAG
    compiled, cnt = compile_counted(_uses_globals)
    x = t(3)
    try:
        assert_same(x * 2, compiled(x))
        G_FACTOR = 5
        assert_same(x * 5, compiled(x))  # the result reflects the new global value
        assert cnt.frame_count == 2
        G_FLAG = False
        assert_same(x - 5, compiled(x))
        assert cnt.frame_count == 3
        G_FACTOR, G_FLAG = 2, True
        assert_same(x * 2, compiled(x))
        assert cnt.frame_count == 3
    finally:
        G_FACTOR, G_FLAG = 2, True


G_WEIGHT = torch.ones(3)


def _uses_global_tensor(x):
    return x * G_WEIGHT


def test_global_tensor_mutation_and_rebinding_are_seen():
    global G_WEIGHT
    compiled, cnt = compile_counted(_uses_global_tensor)
    x = t(3)
    old = G_WEIGHT
    try:
        assert_same(x, compiled(x))
        G_WEIGHT.mul_(3)                    # in place: same object, new values
        assert_same(x * 3, compiled(x))
        G_WEIGHT = torch.full((3,), -1.0)   # rebinding: a new object
        assert_same(-x, compiled(x))
        # The global tensor is a graph input: new values, or a new tensor alike, need no graph.
        assert cnt.frame_count == 1
    finally:
        G_WEIGHT = old
        old.fill_(1)


def test_closure_value_change_is_seen():
    def make():
        k = 2

        def f(x):
            return x * k

        def set_k(v):
            nonlocal k
            k = v

        return f, set_k

    f, set_k = make()
    compiled, cnt = compile_counted(f)
    x = t(3)
    assert_same(x * 2, compiled(x))
    set_k(7)
    assert_same(x * 7, compiled(x))
    assert cnt.frame_count == 2     # the cell's new contents fail its guard: one recompile


def test_attribute_change_on_object_is_seen():
    class Cfg:
        scale = 2

    cfg = Cfg()

    def f(x):
        return x * cfg.scale

    compiled, cnt = compile_counted(f)
    x = t(3)
    assert_same(x * 2, compiled(x))
    cfg.scale = 4
    assert_same(x * 4, compiled(x))
    assert cnt.frame_count == 2


@pytest.mark.parametrize("owner", ["namespace", "object", "module"])
@pytest.mark.parametrize("probe", ["hasattr", "read alone in try"])
def test_an_attribute_found_then_deleted_is_seen(owner, probe):
    # The attribute's value is never used, only that it exists: that must be guarded (the
    # generator's `moving` family found `if hasattr(o, 'extra'): print(o.extra)` raising).
    import types
    o = {"namespace": types.SimpleNamespace, "object": type("Obj", (), {}), "module": nn.Module}[owner]()

    def has_extra():
        if probe == "hasattr":
            return hasattr(o, "extra")
        try:
            o.extra
            return True
        except AttributeError:
            return False

    def f(x):
        if has_extra():
            print("extra", o.extra)
            return x + 1
        return x - 1

    compiled, cnt = counted(f)
    for extra in (None, 7, None, 8):
        x = t(3)     # other values on each call: a graph that answered an earlier call's outputs fails
        if extra is None:
            o.__dict__.pop("extra", None)
        else:
            o.extra = extra
        assert_same(f(x), compiled(x))
    # Absent, then present (the value is printed at a break, not guarded): 2 graphs.
    assert cnt.frame_count == 2


@pytest.mark.parametrize("probe", ["hasattr", "getattr default", "class answer"])
def test_each_attribute_name_of_one_object_is_guarded(probe):
    # Guards on an attribute's presence on one object, one per name: the second name's guard
    # was once dropped as a duplicate of the first's.
    class Obj:
        a = 1.0
        b = 2.0

    o = Obj()

    def read(name):
        if probe == "hasattr":
            return 10.0 if hasattr(o, name) else 0.0
        if probe == "getattr default":
            return getattr(o, name, 0.5)
        return getattr(o, name)

    names = ("a", "b") if probe == "class answer" else ("c", "d")

    def f(x):
        return x + read(names[0]) + 100 * read(names[1])

    compiled, cnt = counted(f)
    for changed in (None, names[1], names[0], None):
        x = t(3)     # other values on each call
        for n in names:
            o.__dict__.pop(n, None)
        if probe != "class answer":
            for n in names:
                setattr(o, n, 3.0)
        if changed is not None:
            if probe == "class answer":
                setattr(o, changed, 7.0)       # the object's own value over its class's
            else:
                delattr(o, changed)
        assert_same(f(x), compiled(x))
    assert cnt.frame_count == 3     # three different states of the two names


@pytest.mark.parametrize("patch", ["module method", "object method", "base shadowed", "staticmethod",
                                   "classmethod", "submodule forward", "compiled module forward"])
def test_a_method_replaced_on_the_class_after_compiling_is_run(patch):
    # The trace calls the method it found on the class; replacing it there (or shadowing a
    # base's in a subclass) afterwards must run the new one, as eager does.
    class Base:
        def helper(self, x):
            return x + 1

    class Helper(Base):
        @staticmethod
        def scale(x):
            return x * 2

        @classmethod
        def offset(cls, x):
            return x - 3

    class Inner(nn.Module):
        def forward(self, x):
            return x * 5

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.h = Helper()
            self.inner = Inner()

        def twice(self, x):
            return x * 2

        def forward(self, x):
            return self.twice(x) + self.h.helper(x) + self.h.scale(x) + Helper.offset(x) + self.inner(x)

    m = M()
    compiled, cnt = counted(m)
    x = t(3)
    assert_same(m(x), compiled(x))
    owner, name, new = {
        "module method": (M, "twice", lambda self, x: x * 7),
        "object method": (Base, "helper", lambda self, x: x + 11),
        "base shadowed": (Helper, "helper", lambda self, x: x - 100),
        "staticmethod": (Helper, "scale", staticmethod(lambda x: x * 13)),
        "classmethod": (Helper, "offset", classmethod(lambda cls, x: x + 17)),
        "submodule forward": (Inner, "forward", lambda self, x: x * 19),
        "compiled module forward": (M, "forward", lambda self, x: x * 23),
    }[patch]
    setattr(owner, name, new)
    assert_same(m(x), compiled(x))
    assert cnt.frame_count == 2     # compiled again for the new method


@pytest.mark.parametrize("change", ["set then hasattr", "deleted then getattr default", "deleted then hasattr"])
def test_an_attribute_the_trace_changes_then_probes_compiles_once(change):
    # Whether the object has the attribute is the trace's own doing here, not a fact about the
    # object passed in: guarding it on the input failed on every later call.
    class Rec:
        def __init__(self):
            self.meta = 1

    def f(rec, x):
        if change == "set then hasattr":
            rec.extra = 2
            return x + (1 if hasattr(rec, "extra") else 0)
        del rec.meta
        if change == "deleted then hasattr":
            return x + (1 if hasattr(rec, "meta") else 0)
        return x + getattr(rec, "meta", 5)

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = bytegraph.compile(f, backend=backend)
    for _ in range(3):
        r1, r2, x = Rec(), Rec(), t(3)
        assert_same(f(r1, x), compiled(r2, x))
        assert vars(r1) == vars(r2)
    assert len(graphs) == 1


@pytest.mark.parametrize("name", ["__call__", "__add__", "__len__", "__enter__"])
def test_a_special_method_replaced_on_the_class_after_compiling_is_run(name):
    # Special methods are looked up on the class too; the persistent cache (on by default) must
    # not bring back the entry traced with the old one either.
    class Op:
        def __call__(self, x):
            return x + 1

        def __add__(self, other):
            return other * 2

        def __len__(self):
            return 3

        def __enter__(self):
            return 4

        def __exit__(self, *exc):
            return False

    op = Op()

    def f(x):
        with op as k:
            return op(x) + (op + x) + len(op) + k

    compiled, cnt = counted(f)
    x = t(3)
    assert_same(f(x), compiled(x))
    new = {"__call__": lambda self, x: x + 100, "__add__": lambda self, other: other * 200,
           "__len__": lambda self: 3000, "__enter__": lambda self: 40000}[name]
    setattr(Op, name, new)
    assert_same(f(x), compiled(x))
    assert cnt.frame_count == 2     # compiled again for the new method


def test_layers_appended_after_compiling_are_run():
    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(2, 2)])
            self.scales = nn.ParameterList([nn.Parameter(torch.ones(2))])
            self.heads = nn.ModuleDict({"a": nn.Linear(2, 2)})

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            for p in self.scales:
                x = x * p
            for name in self.heads:
                x = self.heads[name](x)
            return x

    torch.manual_seed(0)
    m = Stack()
    compiled, cnt = counted(m)
    x = t(1, 2)
    assert_same(m(x), compiled(x))
    m.layers.append(nn.Linear(2, 2))
    assert_same(m(x), compiled(x))
    m.scales.append(nn.Parameter(torch.full((2,), 3.0)))
    assert_same(m(x), compiled(x))
    m.heads["b"] = nn.Linear(2, 2)
    assert_same(m(x), compiled(x))
    assert cnt.frame_count == 4     # one graph per state of the containers


@pytest.mark.parametrize("which", ["submodule", "compiled module"])
def test_a_forward_set_on_the_instance_is_run(which):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            return self.lin(x)

    m = M()
    compiled, cnt = counted(m)
    x = t(1, 2)
    assert_same(m(x), compiled(x))
    (m.lin if which == "submodule" else m).forward = lambda x: x * 3
    assert_same(x * 3, compiled(x))
    assert cnt.frame_count == 2     # compiled again for the instance's forward


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_autocast_dtype_change_recompiles(backend):
    def f(x):
        return x @ x

    compiled, cnt = counted(f, backend)
    for dtype in (torch.bfloat16, torch.float16, torch.bfloat16):
        x = t(3, 3)     # other values on each call
        with torch.autocast("cpu", dtype=dtype):
            assert_same(f(x), compiled(x))
    assert cnt.frame_count == 2     # one graph per autocast dtype


def test_a_float_zero_changing_sign_recompiles():
    import math

    def f(x, s, pair):
        return x + math.copysign(1.0, s) + x * s + math.copysign(1.0, pair[0])

    compiled, cnt = counted(f)
    for s in (0.0, -0.0, 0.0):
        x = t(2)
        out, expected = compiled(x, s, (s,)), f(x, s, (s,))
        assert_same(expected, out)
        assert_same(1 / expected, 1 / out)
    assert cnt.frame_count == 2     # 0.0 and -0.0


def test_an_attribute_set_on_the_object_over_its_class_or_getattr_is_seen():
    class Defaults:
        def __getattr__(self, name):
            return 3.0

    class Helper:
        def scale(self, x):
            return x * 3

    cfg, helper = Defaults(), Helper()

    def f(x):
        return x * cfg.scale + helper.scale(x)

    compiled, cnt = counted(f)
    x = t(2)
    assert_same(f(x), compiled(x))
    cfg.scale = 11.0
    assert_same(f(x), compiled(x))
    helper.scale = lambda x: x * 7
    assert_same(f(x), compiled(x))
    assert cnt.frame_count == 3     # one graph per change


def test_a_question_about_torch_state_is_asked_again_on_every_call():
    def f(x):
        return x * 2 if torch.are_deterministic_algorithms_enabled() else x * 3

    compiled, cnt = counted(f)
    try:
        for on in (False, True, False):
            x = t(2)     # other values on each call
            torch.use_deterministic_algorithms(on)
            assert_same(f(x), compiled(x))
    finally:
        torch.use_deterministic_algorithms(False)
    assert cnt.frame_count == 2     # one graph per answer


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_torch_function_mode_entered_or_left_recompiles(backend):
    from torch.overrides import TorchFunctionMode

    class AddIsMul(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in (torch.add, torch.Tensor.add, torch.Tensor.__add__):
                func = torch.mul
            return func(*args, **(kwargs or {}))

    def f(x):
        return x + 3

    compiled, cnt = counted(f, backend)
    x = torch.full((2,), 2.0)
    assert_same(f(x), compiled(x))
    with AddIsMul():
        assert_same(f(x), compiled(x))
    x = torch.full((2,), -1.5)     # other values: the first graph runs again on them
    assert_same(f(x), compiled(x))
    assert cnt.frame_count == 2     # without the mode and under it


def test_the_default_device_for_factories_is_guarded():
    def f(x):
        return torch.ones(2) * x.sum()

    compiled, cnt = counted(f, "aot_eager")
    x = t(2)
    assert_same(f(x), compiled(x))
    try:
        torch.set_default_device("meta")
        assert compiled(x).device.type == "meta"
    finally:
        torch.set_default_device(None)
    x = t(2)     # other values: the first graph runs again on them
    assert_same(f(x), compiled(x))
    assert cnt.frame_count == 2     # one graph per default device


class DropBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.bn(x))


def test_train_eval_switch_recompiles_with_correct_behaviour():
    torch.manual_seed(0)
    mod = DropBN()
    ref = copy.deepcopy(mod)
    cnt = CompileCounter()
    compiled = bytegraph.compile(mod, backend=cnt)
    x = torch.randn(64, 4) * 3 + 1

    # eval: running stats (fresh: mean 0, var 1), dropout inactive
    mod.eval(), ref.eval()
    assert_same(ref(x), compiled(x))
    assert cnt.frame_count == 1

    # train: batch statistics, running stats updated, dropout active
    mod.train(), ref.train()
    out = compiled(x)
    assert cnt.frame_count == 2
    ref_bn = ref.bn(x)                 # updates ref's running stats like the compiled call did
    kept = out != 0
    assert 0.2 < kept.float().mean().item() < 0.8, "dropout(0.5) must drop about half in training mode"
    assert_same(out[kept], (ref_bn * 2)[kept], rtol=1e-4, atol=1e-5)
    assert_same(mod.bn.running_mean, ref.bn.running_mean)
    assert_same(mod.bn.running_var, ref.bn.running_var)
    assert mod.bn.num_batches_tracked.item() == 1

    # back to eval: the first graph is reused, with the updated running stats
    mod.eval(), ref.eval()
    assert_same(ref(x), compiled(x))
    assert cnt.frame_count == 2


def test_train_eval_switch_via_wrapper_methods():
    mod = DropBN()
    cnt = CompileCounter()
    compiled = bytegraph.compile(mod, backend=cnt)
    x = t(8, 4)
    compiled.eval()
    assert_same(mod(x), compiled(x))
    compiled.train()
    compiled(x)
    assert cnt.frame_count == 2


def test_grad_mode_change_recompiles():
    def f(x, w):
        return x @ w

    compiled, cnt = compile_counted(f)
    x, w = t(2, 3), t(3, 3).requires_grad_()
    out = compiled(x, w)
    assert out.requires_grad
    with torch.no_grad():
        out = compiled(x, w)
        assert not out.requires_grad
    assert cnt.frame_count == 2
    x = t(2, 3)
    assert_same(x @ w, compiled(x, w))
    assert cnt.frame_count == 2


def test_list_length_change_recompiles():
    def f(xs):
        out = xs[0]
        for x in xs[1:]:
            out = out + x
        return out

    compiled, cnt = compile_counted(f)
    two, three = [t(2), t(2)], [t(2), t(2), t(2)]
    assert_same(f(two), compiled(two))
    assert_same(f(three), compiled(three))
    assert cnt.frame_count == 2


def test_noncontiguous_input_gives_correct_result():
    def f(x):
        return x.view(-1) if x.is_contiguous() else x.reshape(-1) * 2

    compiled, cnt = compile_counted(f)
    x = t(3, 4)
    assert_same(f(x), compiled(x))
    xt = t(4, 3).t()
    assert_same(f(xt), compiled(xt))
    assert cnt.frame_count == 2


def test_layout_guard_tells_apart_strides_of_sizes_one_and_empty_tensors():
    # The guard checks a contiguous layout with is_contiguous() where every size is at least
    # 2; a size-1 dim (any stride passes is_contiguous) or an empty tensor keeps exact strides.
    def f(x):
        return x * 2, x.stride()

    for base, other in [(t(3, 4), t(4, 3).t()),
                        (t(3, 1), t(3, 7).as_strided((3, 1), (1, 7))),
                        (t(1, 4), t(8, 4).as_strided((1, 4), (9, 1))),
                        (t(0, 4), torch.empty(4, 0).t())]:
        assert base.shape == other.shape and base.stride() != other.stride()
        compiled, cnt = compile_counted(f, dynamic=False)
        assert_same(f(base), compiled(base))
        assert_same(f(other), compiled(other))
        assert cnt.frame_count == 2


# ---------------------------------------------------------------- cache size limit

def test_cache_size_limit_falls_back_to_eager_with_one_warning():
    bytegraph.config.cache_size_limit = 2

    def shape_sensitive(activations):
        return activations.sum(0) + activations.shape[0]

    compiled, cnt = compile_counted(shape_sensitive, dynamic=False)
    inputs = [t(n, 3) for n in (1, 2, 3, 4, 5)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x in inputs:
            assert_same(shape_sensitive(x), compiled(x))
        # cached shapes still work (on other values), and nothing is compiled or warned again
        for x in inputs[:2] + inputs[3:]:
            x = t(*x.shape)
            assert_same(shape_sensitive(x), compiled(x))
    assert cnt.frame_count == 2
    assert len(caught) == 1, [str(w.message) for w in caught]
    message = str(caught[0].message)
    assert "activations" in message, message
    assert "shape_sensitive" in message, message


def test_cache_size_limit_counts_per_function():
    bytegraph.config.cache_size_limit = 1

    def g1(x):
        return x + 1

    def g2(x):
        return x - 1

    c1, n1 = compile_counted(g1, dynamic=False)
    c2, n2 = compile_counted(g2, dynamic=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for shape in [(2,), (3,)]:
            x = t(*shape)
            assert_same(g1(x), c1(x))
            assert_same(g2(x), c2(x))
    assert n1.frame_count == 1 and n2.frame_count == 1


def test_reset_clears_caches():
    def f(x):
        return x * 3

    compiled, cnt = compile_counted(f)
    x = t(3)
    assert_same(f(x), compiled(x))
    x = t(3)
    assert_same(f(x), compiled(x))
    assert cnt.frame_count == 1
    bytegraph.reset()
    assert_same(f(x), compiled(x))
    assert cnt.frame_count == 2


def test_reset_clears_cache_limit_state():
    bytegraph.config.cache_size_limit = 1

    def f(x):
        return x * 3

    compiled, cnt = compile_counted(f, dynamic=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled(t(2))
        compiled(t(3))
    assert cnt.frame_count == 1
    bytegraph.reset()
    compiled(t(3))
    assert cnt.frame_count == 2


# ---------------------------------------------------------------- API errors and the registry

def test_unknown_backend_name():
    def f(x):
        return x

    with pytest.raises(bytegraph.BytegraphError) as info:
        bytegraph.compile(f, backend="nope")
    assert "nope" in str(info.value)
    assert "eager" in str(info.value), "the message should list the known backends"


def test_compile_non_callable():
    with pytest.raises(bytegraph.BytegraphError):
        bytegraph.compile(3)
    with pytest.raises(bytegraph.BytegraphError):
        bytegraph.compile("not a function", backend="eager")


def test_config_unknown_key():
    with pytest.raises(bytegraph.ConfigError) as info:
        bytegraph.config.no_such_key = 1
    assert isinstance(info.value, AttributeError)
    assert isinstance(info.value, bytegraph.BytegraphError)
    with pytest.raises(AttributeError):
        bytegraph.config.no_such_key_either


def test_config_wrong_type():
    before = bytegraph.config.cache_size_limit
    with pytest.raises(bytegraph.ConfigError):
        bytegraph.config.cache_size_limit = "x"
    assert bytegraph.config.cache_size_limit == before
    bytegraph.config.cache_size_limit = 3
    assert bytegraph.config.cache_size_limit == 3


def test_list_backends():
    names = bytegraph.list_backends()
    for name in ("eager", "aot_eager", "inductor"):
        assert name in names


def test_register_backend_makes_name_usable():
    seen = []

    @bytegraph.register_backend
    def counting_backend_for_tests(gm, example_inputs):
        seen.append(gm)
        return gm.forward

    assert "counting_backend_for_tests" in bytegraph.list_backends()

    def f(x):
        return x.cos() + 1

    compiled = bytegraph.compile(f, backend="counting_backend_for_tests")
    x = t(3)
    assert_same(f(x), compiled(x))
    assert len(seen) == 1
    assert isinstance(seen[0], torch.fx.GraphModule)


def test_callable_backend_receives_graph_and_example_inputs():
    received = []

    def backend(gm, example_inputs):
        received.append((gm, list(example_inputs)))
        return gm.forward

    def f(x, y):
        return x * y

    x, y = t(2), t(2)
    assert_same(f(x, y), bytegraph.compile(f, backend=backend)(x, y))
    assert len(received) == 1
    gm, ex = received[0]
    assert isinstance(gm, torch.fx.GraphModule)
    assert all(isinstance(e, torch.Tensor) for e in ex)
    assert [tuple(e.shape) for e in ex] == [(2,), (2,)]


def test_backend_output_is_used():
    # The callable the backend returns is what runs, on every call.
    calls = []

    def backend(gm, example_inputs):
        def run(*args):
            calls.append(len(args))
            return gm.forward(*args)
        return run

    def f(x):
        return x + 1

    compiled = bytegraph.compile(f, backend=backend)
    x = t(2)
    assert_same(x + 1, compiled(x))
    compiled(t(2))
    assert len(calls) == 2


@pytest.mark.parametrize("change", [
    "function defaults", "function kwdefaults", "function code", "method defaults", "staticmethod defaults",
    "classmethod defaults", "super method", "property getter", "property setter", "__call__ defaults",
    "submodule forward defaults"])
def test_a_function_changed_in_place_after_compiling_is_run_as_it_is_now(change):
    # The function object stays, its defaults or code change (IPython's autoreload sets
    # `__code__` on an edit), or a class gets another property: eager runs what is there now.
    def helper(x, k=2, *, m=1):
        return x * k + m

    class Base:
        def method(self, x, k=1):
            return x * k

        @staticmethod
        def static(x, k=2):
            return x + k

        @classmethod
        def klass(cls, x, k=3):
            return x - k

        @property
        def prop(self):
            return 3.0

    class Obj(Base):
        def __init__(self):
            self._v = 0.0

        def method(self, x, k=1):
            return super().method(x, k) + 1

        @property
        def v(self):
            return self._v

        @v.setter
        def v(self, value):
            self._v = value * 2

        def __call__(self, x, k=2):
            return x * k

    class Inner(nn.Module):
        def forward(self, x, k=2):
            return x * k

    obj, inner = Obj(), Inner()

    def f(x):
        obj.v = 3.0
        return (helper(x) + obj.method(x) + obj.static(x) + obj.klass(x) + obj.prop + obj.v
                + obj(x) + inner(x))

    compiled, cnt = counted(f)
    x = t(3)
    assert_same(f(x), compiled(x))

    def other(x, k=5, *, m=7):
        return x - k * m
    if change == "function defaults":
        helper.__defaults__ = (4,)
    elif change == "function kwdefaults":
        helper.__kwdefaults__ = {"m": 10}
    elif change == "function code":
        helper.__code__ = other.__code__
    elif change == "method defaults":
        Obj.method.__defaults__ = (5,)
    elif change == "staticmethod defaults":
        Base.static.__defaults__ = (20,)
    elif change == "classmethod defaults":
        Base.klass.__func__.__defaults__ = (30,)
    elif change == "super method":
        Base.method = lambda self, x, k=1: x * 100
    elif change == "property getter":
        Base.prop = property(lambda self: 10.0)
    elif change == "property setter":
        Obj.v = property(Obj.v.fget, lambda self, value: setattr(self, "_v", value * 10))
    elif change == "__call__ defaults":
        Obj.__call__.__defaults__ = (7,)
    else:
        Inner.forward.__defaults__ = (9,)
    assert_same(f(x), compiled(x))
    assert cnt.frame_count == 2     # compiled again for the changed function


@pytest.mark.parametrize("kind", ["function", "module forward"])
def test_defaults_of_the_compiled_function_are_read_when_it_is_called(kind):
    # The compiled wrapper has the function's parameters; one left to its default gets the
    # default the function has at the call, as calling the function itself does.
    def f(x, k=2, *, m=1):
        return x * k + m

    class M(nn.Module):
        def forward(self, x, k=2, *, m=1):
            return x * k + m

    target = f if kind == "function" else M()
    compiled, cnt = counted(target)
    x = t(3)
    fn = f if kind == "function" else M.forward
    assert_same(target(x), compiled(x))
    fn.__defaults__ = (5,)
    assert_same(target(x), compiled(x))
    fn.__kwdefaults__ = {"m": 3}
    assert_same(target(x), compiled(x))
    assert_same(target(x, 4, m=2), compiled(x, 4, m=2))
    # The first graph, one after k's default changed and one after m's (each then symbolic,
    # automatic dynamic), which the explicit call hits too.
    assert cnt.frame_count == 3
    fn.__defaults__ = None      # k is required now
    with pytest.raises(TypeError):
        target(x)
    with pytest.raises(TypeError, match="'k'"):
        compiled(x)


def _asks_inside_its_own_blocks(x):
    # As torchao's Float8Linear does: a question about the state that the code set itself.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        if torch.is_autocast_cpu_enabled():
            x = x.to(torch.get_autocast_cpu_dtype()) * 2
    with torch.no_grad():
        if not torch.is_grad_enabled():
            x = x + 1
    return x.float() * torch.is_grad_enabled()


@pytest.mark.parametrize("grad", [True, False])
def test_state_the_code_sets_itself_is_not_guarded_at_the_call(grad):
    # A guard on the answer inside the block would compare it with the state at the next call's
    # start and recompile on every call; the state at the start is what is guarded.
    compiled, cnt = counted(_asks_inside_its_own_blocks)
    with torch.set_grad_enabled(grad):
        for _ in range(3):
            x = t(4)
            assert_same(_asks_inside_its_own_blocks(x), compiled(x))
    assert cnt.frame_count == 1
    with torch.set_grad_enabled(not grad):    # the state at the call changed: compiled again
        x = t(4)
        assert_same(_asks_inside_its_own_blocks(x), compiled(x))
    assert cnt.frame_count == 2
