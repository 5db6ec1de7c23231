"""Static TENSOR_MATCH guards of plain tensors checked by one C++ call (``guards/tensor_batch``):
every property the per-tensor Python checks caught is still caught, anywhere in the batch, and a
difference only in dispatch keys (an inference tensor) recompiles too. Each case compares the
compiled function with eager and counts compiles."""
import pytest
import torch

import bytegraph
from bytegraph.backends.registry import lookup_backend
from bytegraph.debug import records
from bytegraph.guards import tensor_batch
from bytegraph.testing import CompileCounter
from helpers import assert_same


def _sum_all(ps, x):
    s = x * 1
    for p in ps:
        s = s + torch.as_tensor(p).sum()
    return s


def _params(n=6):
    torch.manual_seed(0)
    return [torch.randn(4, 3, requires_grad=True) for _ in range(n)]


def _compiled(fn=_sum_all):
    cnt = CompileCounter(lookup_backend("eager"))
    return bytegraph.compile(fn, backend=cnt), cnt


def _guard_text(compiled):
    """The check function's source of the compiled function's one cache entry."""
    (entry,) = compiled._bytegraph_cache.entries
    return str(entry.guard_source).split("def observe_")[0]


def test_many_tensors_are_checked_in_one_call():
    if tensor_batch.TensorGuards is None:
        pytest.skip("this torch has no C++ tensor checker")

    def only_here(ps, x):
        s = x + 0
        for p in ps:
            s = s + p.mean()
        return s
    compiled, cnt = _compiled(only_here)
    ps, x = _params(), torch.randn(3)
    assert_same(only_here(ps, x), compiled(ps, x))
    assert_same(only_here(ps, x), compiled(ps, x))
    check = _guard_text(compiled)
    assert "_check(x, " in check            # the batch call, over the argument and the list items
    assert ".shape ==" not in check and ".requires_grad is" not in check
    assert cnt.frame_count == 1


def test_few_tensors_keep_their_python_checks():
    def two(a, b):
        return a + b
    compiled, cnt = _compiled(two)
    a, b = torch.randn(3), torch.randn(3)
    assert_same(two(a, b), compiled(a, b))
    text = _guard_text(compiled)
    assert "_check(" not in text
    assert "a.shape ==" in text


@pytest.mark.parametrize("where", [0, 3, 5])
@pytest.mark.parametrize("change", [
    lambda p: p.detach().clone(),                              # requires_grad
    lambda p: p.detach().double().requires_grad_(),            # dtype
    lambda p: torch.randn(3, 4, requires_grad=True),           # shape
    lambda p: torch.randn(3, 4).t().requires_grad_(),          # strides (same shape)
    lambda p: torch.randn(4, 3, 1, requires_grad=True)[..., 0],  # same shape/strides... a view
    lambda p: torch.nn.Parameter(p.detach().clone()),          # class
    lambda p: 2.0,                                             # not a tensor
    lambda p: torch.randn(4, requires_grad=True),              # rank
], ids=["requires_grad", "dtype", "shape", "strides", "view", "class", "float", "rank"])
def test_a_changed_tensor_in_the_batch_recompiles_or_matches(where, change):
    compiled, cnt = _compiled()
    ps, x = _params(), torch.randn(3)
    assert_same(_sum_all(ps, x), compiled(ps, x))
    assert_same(_sum_all(ps, x), compiled(ps, x))
    assert cnt.frame_count == 1
    changed = list(ps)
    changed[where] = change(ps[where])
    same_meta = isinstance(changed[where], torch.Tensor) and type(changed[where]) is type(ps[where]) and (
        changed[where].shape, changed[where].stride(), changed[where].dtype, changed[where].requires_grad) == (
        ps[where].shape, ps[where].stride(), ps[where].dtype, ps[where].requires_grad)
    assert_same(_sum_all(changed, x), compiled(changed, x))
    assert cnt.frame_count == (1 if same_meta else 2)
    # the first entry still serves the first inputs
    assert_same(_sum_all(ps, x), compiled(ps, x))
    assert cnt.frame_count == (1 if same_meta else 2)


def test_an_inference_tensor_recompiles_with_a_reason():
    if tensor_batch.TensorGuards is None:
        pytest.skip("this torch has no C++ tensor checker")

    def scaled(ps, x):
        s = x * 2
        for p in ps:
            s = s + p.sum()
        return s
    compiled, cnt = _compiled(scaled)
    ps, x = [torch.randn(2, 2) for _ in range(4)], torch.randn(2)
    assert_same(scaled(ps, x), compiled(ps, x))
    assert_same(scaled(ps, x), compiled(ps, x))
    with torch.inference_mode():
        frozen = [p.clone() for p in ps]
    before = len(records.recompiles)
    assert_same(scaled(frozen, x), compiled(frozen, x))
    assert cnt.frame_count == 2
    reasons = [r.reason for r in records.recompiles[before:]]
    assert reasons and "tensor check failed" in reasons[0] and "dispatch key" in reasons[0]
    assert_same(scaled(ps, x), compiled(ps, x))
    assert_same(scaled(frozen, x), compiled(frozen, x))
    assert cnt.frame_count == 2


def test_parameters_and_optimizer_state_in_a_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    ref.load_state_dict(model.state_dict())
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, foreach=True)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.1, foreach=True)

    def step(m, o, x):
        loss = m(x).square().mean()
        loss.backward()
        o.step()
        o.zero_grad()
        return loss
    compiled = bytegraph.compile(step, backend="eager")
    for i in range(4):
        x = torch.randn(5, 4)
        assert_same(step(ref, ref_opt, x), compiled(model, opt, x), rtol=1e-4, atol=1e-4)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert_same(q, p, rtol=1e-4, atol=1e-4)     # (AdamW's compiled arithmetic rounds apart)
    # a parameter replaced by one of another shape: the step must notice, not reuse
    with torch.no_grad():
        model[2].weight = torch.nn.Parameter(torch.randn(3, 8))
        model[2].bias = torch.nn.Parameter(torch.randn(3))
        ref[2].weight = torch.nn.Parameter(model[2].weight.detach().clone())
        ref[2].bias = torch.nn.Parameter(model[2].bias.detach().clone())
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, foreach=True)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.1, foreach=True)
    for i in range(2):
        x = torch.randn(5, 4)
        assert_same(step(ref, ref_opt, x), compiled(model, opt, x), rtol=1e-4, atol=1e-4)
