"""Guards flat in depth (guards/stamps.py, guards/coverage.py): facts about the module tree are
checked only after a watched module changed, and every change that would change the trace
still fails a guard. Each test compares compiled against eager after the change."""
import copy
import io
import pickle

import torch
import torch.nn as nn

import bytegraph
from bytegraph.debug import records
from bytegraph.demo.models import GPTConfig, TinyGPT
from bytegraph.guards import stamps
from bytegraph.testing import CompileCounter
from helpers import assert_same


class Layer(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.drop = nn.Dropout(0.5)
        self.scale = 0.5

    def forward(self, x):
        return self.drop(self.norm(self.lin(x))) * self.scale + x


class Stack(nn.Module):
    def __init__(self, n=3, d=8):
        super().__init__()
        self.layers = nn.ModuleList([Layer(d) for _ in range(n)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def compiled_stack(n=3):
    model = Stack(n).eval()
    cnt = CompileCounter()
    return model, bytegraph.compile(model, backend=cnt), cnt


def run_both(model, compiled, x):
    with torch.no_grad():
        expected = model(x)
        actual = compiled(x)
    assert_same(expected, actual)
    return actual


def x8():
    return torch.randn(2, 8)


def test_steady_state_does_not_recompile_and_covers_module_facts():
    model, compiled, cnt = compiled_stack()
    x = x8()
    for _ in range(3):
        run_both(model, compiled, x)
    assert cnt.frame_count == 1
    guard_source = records.frames[-1].guard_source
    # Identity of submodules and parameters is checked in the detail function only.
    fast = guard_source.split("def observe_")[0]
    assert "_parameters" not in fast and "_modules" not in fast
    assert "_parameters['weight']" in guard_source


def test_fast_checks_do_not_grow_with_depth():
    def fast_lines(n):
        bytegraph.reset()
        torch.manual_seed(0)
        model = TinyGPT(GPTConfig(n_layer=n, n_embd=32, block_size=8, vocab_size=64, dropout=0.0)).eval()
        compiled = bytegraph.compile(model, backend="eager")
        idx = torch.randint(0, 64, (1, 8))
        with torch.no_grad():
            assert_same(model(idx), compiled(idx))
        src = records.frames[-1].guard_source
        return src.split("def observe_")[0].count("\n"), src.count("\n")

    fast2, all2 = fast_lines(2)
    fast6, all6 = fast_lines(6)
    assert fast2 == fast6
    assert all6 > all2   # the detailed checks do grow


def test_in_place_parameter_change_does_not_recompile():
    model, compiled, cnt = compiled_stack()
    x = x8()
    run_both(model, compiled, x)
    with torch.no_grad():
        model.layers[1].lin.weight.mul_(2.0)
        model.layers[2].norm.bias.add_(1.0)
    model.load_state_dict({k: v * 0.5 for k, v in model.state_dict().items()})
    run_both(model, compiled, x)
    run_both(model, compiled, x)
    assert cnt.frame_count == 1


def test_replaced_parameter_recompiles():
    model, compiled, cnt = compiled_stack()
    x = x8()
    run_both(model, compiled, x)
    model.layers[1].lin.weight = nn.Parameter(torch.randn(8, 8))
    run_both(model, compiled, x)
    assert cnt.frame_count == 2


def test_parameter_written_straight_into_its_table_recompiles():
    model, compiled, cnt = compiled_stack()
    x = x8()
    run_both(model, compiled, x)
    model.layers[2].lin._parameters["bias"] = nn.Parameter(torch.randn(8))
    run_both(model, compiled, x)
    assert cnt.frame_count == 2


def test_new_forward_hook_recompiles_and_runs():
    model, compiled, cnt = compiled_stack()
    x = x8()
    run_both(model, compiled, x)
    calls = []

    def hook(mod, args, out):
        calls.append(1)
        return out * 3

    handle = model.layers[1].norm.register_forward_hook(hook)
    run_both(model, compiled, x)
    assert calls == [1, 1]   # eager once, compiled once (traced into the graph: it runs... as traced)
    handle.remove()
    run_both(model, compiled, x)
    assert cnt.frame_count == 2   # back to the first entry


def test_backward_hook_on_submodule_recompiles():
    model, compiled, cnt = compiled_stack()
    x = x8()
    run_both(model, compiled, x)
    assert cnt.frame_count == 1
    seen = []
    model.layers[0].lin.register_full_backward_hook(lambda m, gi, go: seen.append(1))
    model.train(False)
    xr = x.clone().requires_grad_(True)
    out = compiled(xr)
    out.sum().backward()
    assert seen, "the backward hook added after compiling did not run"
    assert cnt.frame_count > 1, "not compiled again with the hook"   # how many graphs: the hook's breaks


def test_global_hook_recompiles_and_runs():
    model, compiled, cnt = compiled_stack()
    x = x8()
    run_both(model, compiled, x)
    assert cnt.frame_count == 1
    calls = []
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, a, o: calls.append(type(m).__name__))
    try:
        run_both(model, compiled, x)
        eager_calls = len(calls) // 2
        assert eager_calls > 0 and len(calls) == 2 * eager_calls
    finally:
        handle.remove()
    assert cnt.frame_count > 1, "not compiled again with the global hook"


def test_changed_training_recompiles_and_switching_back_hits():
    model, compiled, cnt = compiled_stack()
    x = x8()
    run_both(model, compiled, x)
    model.train()
    with torch.no_grad():
        out = compiled(x)
    assert cnt.frame_count == 2
    # Dropout is active: some values differ from eval mode's.
    model.eval()
    run_both(model, compiled, x)
    assert cnt.frame_count == 2
    assert out.shape == x.shape


def test_changed_float_attribute_recompiles():
    model, compiled, cnt = compiled_stack()
    x = x8()
    run_both(model, compiled, x)
    model.layers[2].scale = 2.0
    run_both(model, compiled, x)
    assert cnt.frame_count == 2


def test_changed_torch_layer_setting_recompiles():
    model, compiled, cnt = compiled_stack()
    x = x8()
    run_both(model, compiled, x)
    model.layers[0].norm.eps = 0.5
    run_both(model, compiled, x)
    assert cnt.frame_count == 2


def test_swapped_submodule_recompiles():
    model, compiled, cnt = compiled_stack()
    x = x8()
    run_both(model, compiled, x)
    model.layers[1] = Layer().eval()
    run_both(model, compiled, x)
    assert cnt.frame_count == 2
    model.layers[1].lin = nn.Linear(8, 8)
    run_both(model, compiled, x)
    assert cnt.frame_count == 3


def test_module_list_changed_in_place_recompiles():
    model, compiled, cnt = compiled_stack()
    x = x8()
    run_both(model, compiled, x)
    model.layers.insert(0, Layer().eval())     # writes _modules directly
    run_both(model, compiled, x)
    del model.layers[3]
    run_both(model, compiled, x)
    model.layers.pop(0)
    run_both(model, compiled, x)
    assert cnt.frame_count == 4    # every change of the list recompiles once


def test_deleted_attribute_recompiles():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.scale = 3.0

        def forward(self, x):
            return self.lin(x) * getattr(self, "scale", 1.0)

    model = Scaled()
    cnt = CompileCounter()
    compiled = bytegraph.compile(model, backend=cnt)
    x = torch.randn(2, 4)
    run_both(model, compiled, x)
    del model.scale
    run_both(model, compiled, x)
    assert cnt.frame_count == 2
    del model.lin
    with torch.no_grad():
        try:
            model(x)
        except AttributeError as e:
            expected = type(e)
        try:
            compiled(x)
            raised = None
        except AttributeError as e:
            raised = type(e)
    assert raised is expected


def test_dtype_change_through_module_recompiles():
    model, compiled, cnt = compiled_stack()
    x = x8()
    run_both(model, compiled, x)
    model.double()   # parameters keep their identity, change dtype
    run_both(model, compiled, x.double())
    assert cnt.frame_count == 2


def test_requires_grad_through_module_recompiles():
    model, compiled, cnt = compiled_stack()
    x = x8()
    out = compiled(x)
    assert out.requires_grad
    model.requires_grad_(False)
    out = compiled(x)
    assert not out.requires_grad
    assert_same(model(x), out)
    assert cnt.frame_count == 2


def test_class_change_recompiles():
    class Doubled(Layer):
        def forward(self, x):
            return super().forward(x) * 2

    model, compiled, cnt = compiled_stack()
    x = x8()
    run_both(model, compiled, x)
    model.layers[1].__class__ = Doubled
    run_both(model, compiled, x)
    assert cnt.frame_count == 2


def test_module_shared_between_two_compiled_models():
    shared = Layer().eval()
    a = nn.Sequential(Layer().eval(), shared)
    b = nn.Sequential(shared, Layer().eval())
    cnt_a, cnt_b = CompileCounter(), CompileCounter()
    ca, cb = bytegraph.compile(a, backend=cnt_a), bytegraph.compile(b, backend=cnt_b)
    x = x8()
    run_both(a, ca, x)
    run_both(b, cb, x)
    shared.scale = -1.0
    run_both(a, ca, x)
    run_both(b, cb, x)
    assert (cnt_a.frame_count, cnt_b.frame_count) == (2, 2)     # each model's own guard on the shared one
    shared.lin = nn.Linear(8, 8)
    run_both(b, cb, x)
    run_both(a, ca, x)
    assert (cnt_a.frame_count, cnt_b.frame_count) == (3, 3)


def test_unrelated_module_changes_do_not_recompile():
    model, compiled, cnt = compiled_stack()
    x = x8()
    run_both(model, compiled, x)
    other = Layer()
    for i in range(5):
        other.scale = float(i)
        nn.Linear(3, 3)
        run_both(model, compiled, x)
    assert cnt.frame_count == 1


def test_copies_and_pickles_of_watched_modules_are_plain():
    model, compiled, cnt = compiled_stack()
    x = x8()
    run_both(model, compiled, x)
    assert type(model.layers[0]._parameters) is stamps.StampedDict
    clone = copy.deepcopy(model)
    assert type(clone.layers[0]._parameters) is dict
    assert_same(model(x), clone(x))
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert type(loaded.layers[0]._modules) is dict
    assert_same(model(x), loaded(x))
    # A pickled watched table comes back as a plain dict with the same entries.
    table = model.layers[0].lin._parameters
    assert type(table) is stamps.StampedDict
    unpickled = pickle.loads(pickle.dumps(table))
    assert type(unpickled) is dict and unpickled.keys() == {"weight", "bias"}
    assert torch.equal(unpickled["weight"], table["weight"])
    # Watched modules still behave as modules.
    model.layers[0].register_buffer("extra", torch.zeros(1))
    assert "layers.0.extra" in model.state_dict()


def test_module_with_own_setattr_keeps_per_call_checks():
    class Custom(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            object.__setattr__(self, "scale", 2.0)

        def __setattr__(self, name, value):
            object.__setattr__(self, name, value) if name == "scale" else super().__setattr__(name, value)

        def forward(self, x):
            return self.lin(x) * self.scale

    model = Custom()
    cnt = CompileCounter()
    compiled = bytegraph.compile(model, backend=cnt)
    x = torch.randn(2, 4)
    run_both(model, compiled, x)
    model.scale = 5.0     # no bump: the guard on scale is checked on every call
    run_both(model, compiled, x)
    assert cnt.frame_count == 2


def test_watch_module_stamps_tables_and_reports_hooks_as_the_separate_steps():
    # stamps.watch_module (a stamped layer's modules) is watchable, watch and hooks_watched in one
    # pass: the same tables swapped, the same answers, and a change through a swapped table bumps.
    class OwnSetattr(nn.Linear):
        def __setattr__(self, name, value):
            super().__setattr__(name, value)

    for make, hooked in [(lambda: nn.Linear(4, 4), False), (lambda: nn.Linear(4, 4), True),
                         (lambda: OwnSetattr(4, 4), False)]:
        a, b = make(), make()
        for m in (a, b):
            if hooked:
                m.register_forward_hook(lambda mod, args, out: out)
        expected = stamps.watchable(a) and stamps.watch(a) and stamps.hooks_watched(a)
        got = stamps.watch_module(b)
        assert got == (None if not stamps.watchable(b) else expected)
        assert [type(t) for t in a.__dict__.values() if isinstance(t, dict)] == \
            [type(t) for t in b.__dict__.values() if isinstance(t, dict)]
        if got is not None:
            before = stamps.EPOCH[0]
            b.register_forward_pre_hook(lambda mod, args: None)
            b.register_parameter("extra", nn.Parameter(torch.zeros(1)))
            assert stamps.EPOCH[0] == before + 2
