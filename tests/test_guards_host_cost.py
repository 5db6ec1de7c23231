"""The cheaper per-call checks of a generated guard (a training step's optimizer checks hundreds of
tensors every call): each still catches what it checks. A 0-dim tensor's sizes and strides by
its rank, a CPU tensor's device by ``is_cpu``, input aliasing by one pass over storage addresses
(``probes.storage_groups``). Every change below makes the compiled function recompile (or run
eagerly) and equal eager."""
import copy

import numpy as np
import pytest
import torch

import bytegraph
from bytegraph.backends.registry import lookup_backend
from bytegraph.guards.probes import storage_groups
from bytegraph.testing import CompileCounter
from helpers import assert_same


def _compiled(fn, backend="aot_eager"):
    cnt = CompileCounter(lookup_backend(backend))
    return bytegraph.compile(fn, backend=cnt), cnt


def _scale_into(a, b, s):
    a.add_(b * s)        # changes an input: the graph is guarded on how its inputs alias
    return a * 1


def _inputs():
    torch.manual_seed(0)
    return torch.randn(4, 3), torch.randn(4, 3), torch.tensor(2.0)


def _compiled_and_run_once():
    """``_scale_into`` compiled, and run once next to eager on ``_inputs()``."""
    compiled, cnt = _compiled(_scale_into)
    _run_both(_scale_into, compiled, _inputs)
    return compiled, cnt


def _run_both(fn, compiled, make):
    """``fn`` and ``compiled`` on two equal sets of inputs from ``make()``: results and inputs equal."""
    eager_in, compiled_in = make(), make()
    assert_same(fn(*eager_in), compiled(*compiled_in))
    assert_same(eager_in, compiled_in, what="inputs after the call")


# ------------------------------------------------------------- 0-dim tensors (sizes by rank)

@pytest.mark.parametrize("change", [
    lambda s: s.reshape(1),                         # rank 0 -> 1 (one element still)
    lambda s: s.reshape(1, 1),
    lambda s: s.double(),                           # dtype
    lambda s: s.clone().requires_grad_(True),       # requires_grad
    lambda s: 2.0,                                  # no longer a tensor
    lambda s: torch.nn.Parameter(s.clone()),        # another class
])
def test_a_0_dim_input_changed_recompiles(change):
    compiled, cnt = _compiled_and_run_once()
    assert cnt.frame_count == 1

    def changed():
        a, b, s = _inputs()
        return a, b, change(s)
    _run_both(_scale_into, compiled, changed)
    assert cnt.frame_count == 2


def test_a_0_dim_input_whose_data_is_swapped_recompiles():
    compiled, cnt = _compiled_and_run_once()

    def swapped():
        a, b, s = _inputs()
        s.data = torch.tensor([2.0, 3.0, 4.0])     # same object, now one dim of 3
        return a, b, s
    _run_both(_scale_into, compiled, swapped)
    assert cnt.frame_count == 2


# ------------------------------------------------------------- the CPU device by is_cpu

def test_a_cpu_input_moved_to_another_device_recompiles():
    def f(a, s):
        return a * s + 1

    compiled, cnt = _compiled(f, backend="eager")
    a, s = torch.randn(3), torch.tensor(2.0)
    assert_same(f(a, s), compiled(a, s))
    meta = a.to("meta")
    expected, actual = f(meta, s.to("meta")), compiled(meta, s.to("meta"))
    assert cnt.frame_count == 2
    assert (actual.device, actual.shape, actual.dtype) == (expected.device, expected.shape, expected.dtype)


def test_only_a_tensor_class_reading_device_as_torch_does_gets_is_cpu():
    class Elsewhere(torch.Tensor):
        @property
        def device(self):          # is_cpu, read from the tensor itself, could disagree
            return torch.device("meta")

    def guard_condition(x):
        from bytegraph.guards.builder import TENSOR_MATCH, Guard, TensorMeta
        from bytegraph.guards.sources import LocalSource

        class Emitter:
            def bind(self, source):
                return "x"

            def render(self, source):
                return "x"

            def const(self, value):
                return "c"
        return TENSOR_MATCH.lines(Guard(TENSOR_MATCH, LocalSource("x"), TensorMeta(x)), Emitter())[0][0]

    assert "x.is_cpu" in guard_condition(torch.randn(2))
    assert "x.is_cpu" in guard_condition(torch.nn.Parameter(torch.randn(2)))
    own = guard_condition(torch.randn(2).as_subclass(Elsewhere))
    assert "is_cpu" not in own and "x.device == c" in own


# ------------------------------------------------------------- input aliasing

def test_inputs_made_to_alias_recompile():
    compiled, cnt = _compiled_and_run_once()

    def same_tensor_twice():
        a, _, s = _inputs()
        return a, a, s
    _run_both(_scale_into, compiled, same_tensor_twice)
    assert cnt.frame_count == 2

    def views_of_one_storage():
        torch.manual_seed(0)
        base = torch.randn(8, 3)
        return base[:4], base[4:], torch.tensor(2.0)
    _run_both(_scale_into, compiled, views_of_one_storage)
    assert cnt.frame_count == 3


def test_an_input_set_to_another_inputs_storage_recompiles():
    compiled, cnt = _compiled_and_run_once()

    def set_to_b():
        a, b, s = _inputs()
        a.set_(b.untyped_storage(), 0, (4, 3), (3, 1))     # same object, b's memory
        return a, b, s
    _run_both(_scale_into, compiled, set_to_b)
    assert cnt.frame_count == 2


def test_an_input_whose_data_becomes_anothers_recompiles():
    compiled, cnt = _compiled_and_run_once()

    def data_of_b():
        a, b, s = _inputs()
        a.data = b          # a now reads and writes b's storage
        return a, b, s
    _run_both(_scale_into, compiled, data_of_b)
    assert cnt.frame_count == 2


def test_arrays_sharing_memory_count_as_aliased_inputs():
    # Two tensors made from one array: two storages of one address (grouped by address)
    compiled, cnt = _compiled_and_run_once()

    def from_one_array():
        arr = np.arange(12, dtype=np.float32).reshape(4, 3)
        return torch.from_numpy(arr), torch.from_numpy(arr), torch.tensor(2.0)
    _run_both(_scale_into, compiled, from_one_array)
    assert cnt.frame_count == 2


def _groups_one_by_one(tensors):
    """storage_groups as a dict pass over every tensor (what the one-pass version must equal)."""
    first = {}
    groups = [first.setdefault(t.untyped_storage().data_ptr(), i) for i, t in enumerate(tensors)]
    shared = {g for i, g in enumerate(groups) if g != i}
    return tuple((g, t.storage_offset()) if g in shared else g for g, t in zip(groups, tensors))


class _OwnStorage(torch.Tensor):
    calls = 0

    def untyped_storage(self):
        _OwnStorage.calls += 1
        return super().untyped_storage()


@pytest.mark.parametrize("make", [
    lambda: [torch.randn(3) for _ in range(5)],
    lambda: (lambda b: [b[0], b[1], torch.randn(2), b[2:]])(torch.randn(4, 2)),
    lambda: (lambda a: [torch.from_numpy(a), torch.randn(3), torch.from_numpy(a)])(np.ones(3, np.float32)),
    lambda: [torch.empty(0), torch.empty(0), torch.randn(2)],
    lambda: (lambda x: [x, x, x.view(2, 3)])(torch.randn(6)),
    # read by data pointer when every offset is 0: views at offset 0 of one storage still group
    lambda: (lambda b: [b.view(2, 4), b[:4], torch.randn(2)])(torch.randn(8)),
    lambda: (lambda b: [torch.nn.Parameter(b), b.detach()[:2], torch.tensor(1.0)])(torch.randn(4)),
    lambda: [torch.tensor(1.0), torch.tensor(2.0), torch.nn.Parameter(torch.randn(3))],
    lambda: [torch.empty(2, device="meta"), torch.empty(3, device="meta")],
    lambda: (lambda b: [b[:0], b[:2]])(torch.randn(4)),
])
def test_storage_groups_equal_a_pass_over_each_tensor(make):
    tensors = make()
    assert storage_groups(tensors) == _groups_one_by_one(tensors)


def test_storage_groups_of_a_tensor_without_storage_raise_as_before():
    tensors = [torch.randn(2, 2).to_sparse(), torch.randn(2)]
    with pytest.raises(RuntimeError) as before:
        _groups_one_by_one(tensors)
    with pytest.raises(type(before.value)):
        storage_groups(tensors)


def test_inputs_viewing_one_storage_at_offset_0_recompile():
    compiled, cnt = _compiled_and_run_once()

    def two_views_at_offset_0():
        torch.manual_seed(0)
        base = torch.randn(12)
        return base.view(4, 3), base[:12].view(4, 3), torch.tensor(2.0)
    _run_both(_scale_into, compiled, two_views_at_offset_0)
    assert cnt.frame_count == 2


def test_storage_groups_call_a_class_own_untyped_storage():
    x = torch.randn(3).as_subclass(_OwnStorage)
    before = _OwnStorage.calls
    assert storage_groups([x, torch.randn(2), x]) == _groups_one_by_one([x, torch.randn(2), x])
    assert _OwnStorage.calls > before


# ------------------------------------------------------------- an optimizer's step, whole

def test_a_compiled_foreach_adamw_step_follows_changes_to_its_tensors():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(3)])
    twin = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, foreach=True)
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=0.1, foreach=True)
    cnt = CompileCounter(lookup_backend("aot_eager"))
    step = bytegraph.compile(lambda: opt.step(), backend=cnt)
    x = torch.randn(2, 4)

    def one_step():
        for m, o, run in ((model, opt, step), (twin, twin_opt, twin_opt.step)):
            o.zero_grad()
            m(x).sum().backward()
            run()
        for p, q in zip(model.parameters(), twin.parameters()):
            assert_same(q, p, atol=1e-5, what="parameter after the step")   # (rounding of the decomposed update)

    for _ in range(3):
        one_step()
    frames = cnt.frame_count
    # a step counter replaced by one of another dtype, an exp_avg by a transposed (non-contiguous) copy
    for o in (opt, twin_opt):
        p = o.param_groups[0]["params"][0]
        o.state[p]["exp_avg"] = o.state[p]["exp_avg"].t().contiguous().t()
    one_step()
    assert cnt.frame_count > frames
    frames = cnt.frame_count
    for m in (model, twin):      # a parameter's data swapped for a new tensor (another storage)
        m[1].bias.data = torch.zeros(4)
    one_step()
    one_step()
