"""Optimizers and whole training steps compiled: parameters, optimizer state and losses equal eager's.

torch's optimizers wrap their step in compiler helpers (a profiler range, grad mode set in a
``_use_grad_for_differentiable`` wrapper with ``torch._dynamo.graph_break()`` around the update,
``torch._disable_dynamo`` on ``zero_grad``); trace/torch_api/torch_wrappers.py decides each. The update itself is
one graph per optimizer state layout (the first step, which creates the state, and the rest).
"""
import copy
import functools

import pytest
import torch
import torch.nn as nn

import bytegraph
from bytegraph.backends.registry import lookup_backend
from bytegraph.debug import records
from bytegraph.testing import CompileCounter

# The compiled step takes the "capturable" path of Adam-like optimizers (tensors where eager uses
# Python numbers): the same update up to rounding.
RTOL, ATOL = 1e-4, 1e-5

OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "sgd_nesterov": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    "sgd_foreach": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=True),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01),
    "adam_foreach": lambda p: torch.optim.Adam(p, lr=0.01, foreach=True, amsgrad=True),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
    "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=0.01, foreach=True),
    "adamw_fused": lambda p: torch.optim.AdamW(p, lr=0.01, fused=True),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=0.01),
    "rmsprop_foreach": lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.5, centered=True, foreach=True),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=0.1),
    "adagrad_foreach": lambda p: torch.optim.Adagrad(p, lr=0.1, foreach=True),
}


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2))


def _assert_same_state(eager_model, eager_opt, model, opt):
    for (name, a), b in zip(eager_model.named_parameters(), model.parameters()):
        assert torch.allclose(a, b, rtol=RTOL, atol=ATOL), name
    assert len(eager_opt.state) == len(opt.state)
    for pa, pb in zip(eager_model.parameters(), model.parameters()):
        sa, sb = eager_opt.state[pa], opt.state[pb]
        assert sa.keys() == sb.keys()
        for key in sa:
            a, b = torch.as_tensor(sa[key]), torch.as_tensor(sb[key])
            assert a.dtype == b.dtype, key
            assert torch.allclose(a, b.to(a.device), rtol=RTOL, atol=ATOL), key


@functools.lru_cache(maxsize=None)
def _torch_compile_graphs_per_step(name, steps=4, compile_step=True):
    """The graphs torch.compile (the reference) has made after each step of ``_run_steps``."""
    import torch._dynamo
    count = [0]

    def backend(gm, example_inputs):
        count[0] += 1
        return gm.forward

    model = _model()
    opt = OPTIMIZERS[name](model.parameters())
    torch._dynamo.reset()
    try:
        if compile_step:
            step = torch.compile(opt.step, backend=backend)
        else:
            def update():
                opt.step()
            step = torch.compile(update, backend=backend)
        x = torch.randn(5, 4)
        after = []
        for _ in range(steps):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            step()
            after.append(count[0])
    finally:
        torch._dynamo.reset()
    return after


def _run_steps(make_opt, backend, steps=4, compile_step=True):
    eager_model = _model()
    model = copy.deepcopy(eager_model)
    eager_opt, opt = make_opt(eager_model.parameters()), make_opt(model.parameters())
    cnt = CompileCounter(lookup_backend(backend))
    if compile_step:
        step = bytegraph.compile(opt.step, backend=cnt)
    else:
        def update():
            opt.step()
        step = bytegraph.compile(update, backend=cnt)
    x = torch.randn(5, 4)
    graphs_after = []
    for _ in range(steps):
        for m, o, s in ((eager_model, eager_opt, eager_opt.step), (model, opt, step)):
            o.zero_grad()
            m(x).pow(2).sum().backward()
            s()
        _assert_same_state(eager_model, eager_opt, model, opt)
        graphs_after.append(cnt.frame_count)
    return cnt, graphs_after


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_step_equals_eager(name):
    cnt, graphs_after = _run_steps(OPTIMIZERS[name], "eager")
    # The graphs after each step are torch.compile's: one update graph (SGD with momentum: one
    # more for the first step, which makes the buffers); a fused step runs natively: none.
    assert graphs_after == _torch_compile_graphs_per_step(name), graphs_after
    _assert_fused_step_broke(name)


def _assert_fused_step_broke(name):
    """A fused step compiled nothing because the trace met it, not because nothing was traced."""
    if "fused" in name:
        from bytegraph.debug import records
        assert any("a fused optimizer kernel) runs natively" in (r.break_reason or "") for r in records.frames)


@pytest.mark.parametrize("name", ["adam", "adam_foreach", "adamw", "adamw_foreach", "rmsprop", "rmsprop_foreach",
                                  "adagrad"])
def test_first_step_compiles_the_graph_every_step_uses(name):
    # The state an optimizer makes on its first step (_init_group) is made natively before the
    # trace, so the first step's graph is the update every later step runs: one compile in all.
    cnt, graphs_after = _run_steps(OPTIMIZERS[name], "eager")
    assert graphs_after == [1, 1, 1, 1], graphs_after


@pytest.mark.parametrize("name", ["sgd_momentum", "adam", "adamw_foreach", "adamw_fused", "rmsprop"])
def test_optimizer_step_through_aot_autograd(name):
    cnt, graphs_after = _run_steps(OPTIMIZERS[name], "aot_eager")
    assert graphs_after == _torch_compile_graphs_per_step(name), graphs_after
    _assert_fused_step_broke(name)


@pytest.mark.parametrize("name", ["sgd_momentum", "adamw_foreach"])
def test_optimizer_step_inside_a_compiled_function(name):
    cnt, graphs_after = _run_steps(OPTIMIZERS[name], "eager", compile_step=False)
    assert graphs_after == _torch_compile_graphs_per_step(name, compile_step=False), graphs_after


def test_step_update_is_one_graph_of_tensor_ops():
    """After the first step the update of every parameter is in one graph (not run eagerly)."""
    eager_model, model = _model(), _model()
    eager_opt = torch.optim.SGD(eager_model.parameters(), lr=0.1, momentum=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    cnt = CompileCounter()
    step = bytegraph.compile(opt.step, backend=cnt)
    x = torch.randn(5, 4)
    for _ in range(3):
        for m, o, run in ((eager_model, eager_opt, eager_opt.step), (model, opt, step)):
            o.zero_grad()
            m(x).sum().backward()
            run()
        _assert_same_state(eager_model, eager_opt, model, opt)     # the updates are eager's, each step
    # First step: momentum buffers cloned from the grads; then buf.mul_().add_() and p.add_().
    assert cnt.frame_count == 2
    ops = [n.target for n in cnt.graphs[-1].graph.nodes if n.op == "call_method"]
    assert ops.count("add_") >= 2 * 4 and ops.count("mul_") == 4, ops


@pytest.mark.parametrize("set_to_none", [True, False])
@pytest.mark.parametrize("foreach", [False, True])
def test_zero_grad_traced(set_to_none, foreach):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=foreach)
    model(torch.randn(3, 4)).sum().backward()
    grads = [p.grad for p in model.parameters()]
    cnt = CompileCounter()

    def clear():
        opt.zero_grad(set_to_none=set_to_none)
        return 1

    compiled = bytegraph.compile(clear, backend=cnt, fullgraph=True)
    assert compiled() == 1
    if set_to_none:
        assert all(p.grad is None for p in model.parameters())
    else:
        assert all(p.grad is g and not g.any() for p, g in zip(model.parameters(), grads))
    # Again, on the other state (grads None, or zero): still right.
    model(torch.randn(3, 4)).sum().backward()
    compiled()
    assert all((p.grad is None) if set_to_none else not p.grad.any() for p in model.parameters())


def _train_step(model, opt, set_to_none=True):
    def step(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)
        return loss
    return step


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("name", ["sgd_momentum", "adamw_foreach", "adamw_fused"])
def test_whole_training_step(name, backend):
    """Forward, loss, backward, step and zero_grad in one compiled function: the graph breaks at
    backward() (as torch.compile's does); losses and parameters after 5 steps equal eager."""
    eager_model = _model()
    model = copy.deepcopy(eager_model)
    eager_opt, opt = OPTIMIZERS[name](eager_model.parameters()), OPTIMIZERS[name](model.parameters())
    cnt = CompileCounter(lookup_backend(backend))
    eager_step = _train_step(eager_model, eager_opt)
    step = bytegraph.compile(_train_step(model, opt), backend=cnt)
    torch.manual_seed(1)
    for i in range(5):
        x, y = torch.randn(3, 4), torch.randn(3, 2)
        expected, actual = eager_step(x, y), step(x, y)
        assert torch.allclose(expected, actual, rtol=RTOL, atol=ATOL), i
        _assert_same_state(eager_model, eager_opt, model, opt)
        assert all(p.grad is None for p in model.parameters())
        if i == 1:
            graphs = cnt.frame_count
    assert cnt.frame_count == graphs   # nothing recompiled after the second step
    # As torch.compile's: forward and loss, then the update (SGD with momentum: one more for the
    # first step, which makes the buffers; fused: the update runs natively).
    assert graphs == {"sgd_momentum": 3, "adamw_foreach": 2, "adamw_fused": 1}[name], graphs
    # The forward and loss are one graph; the update (after its first step) another.
    fwd = [gm for gm in cnt.graphs if any(n.target is torch.nn.functional.mse_loss for n in gm.graph.nodes)]
    assert len(fwd) == 1


def test_whole_step_breaks_only_where_torch_compile_does():
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, foreach=True)
    step = _train_step(model, opt)
    x, y = torch.randn(3, 4), torch.randn(3, 2)
    step(x, y)
    explained = bytegraph.explain(step)(x, y)
    reasons = [b.reason for b in explained.break_reasons]
    assert any("backward" in r for r in reasons), reasons
    assert all("backward" in r or "graph_break()" in r for r in reasons), reasons


def test_library_wrappers_in_user_code():
    """profiling ranges and torch's "am I compiled" queries (torch's own "run without the compiler"
    wrappers are met in every optimizer test: Optimizer.zero_grad is one)."""
    def helper(x):
        return x.sin()

    def f(x):
        with torch.autograd.profiler.record_function("my range"):
            y = helper(x) + 1
        if torch.compiler.is_compiling() and not torch.jit.is_scripting():
            y = y * 2
        return y

    cnt = CompileCounter()
    x = torch.randn(4)
    out = bytegraph.compile(f, backend=cnt, fullgraph=True)(x)
    assert torch.allclose(out, (x.sin() + 1) * 2)
    assert cnt.frame_count == 1


def test_torch_dynamo_graph_break_is_kept():
    import torch._dynamo   # the user's own code imports it

    def f(x):
        y = x + 1
        torch._dynamo.graph_break()
        return y * 2

    cnt = CompileCounter()
    x = torch.randn(3)
    assert torch.allclose(bytegraph.compile(f, backend=cnt)(x), (x + 1) * 2)
    assert cnt.frame_count == 2
    with pytest.raises(bytegraph.errors.Unsupported, match="graph_break"):
        bytegraph.compile(f, backend="eager", fullgraph=True)(x)


def test_after_torch_compile_patched_the_optimizers():
    """torch.compile, once run in the process, wraps optimizer methods (``_init_group``...) in
    torch.compiler.disable; bytegraph still traces them (they are torch's code), while a user's own
    torch.compiler.disable is honoured."""
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(1))   # patches torch.optim
    _run_steps(OPTIMIZERS["adam"], "eager", steps=2)

    @torch.compiler.disable
    def opaque(x):
        return x.cos()

    def f(x):
        return opaque(x + 1) * 2

    cnt = CompileCounter()
    x = torch.randn(3)
    assert torch.allclose(bytegraph.compile(f, backend=cnt)(x), (x + 1).cos() * 2)
    assert cnt.frame_count == 2


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("name", ["sgd_momentum", "sgd_foreach", "adam", "adamw_foreach", "rmsprop", "adagrad"])
def test_lr_scheduler_costs_no_compile_per_value(name, backend):
    """A scheduler changes the float lr every step: after it first changes, lr is an input of the
    graph (a 0-d tensor), so 30 steps cost 2 compiles (the step that creates the state, then one
    for all later values). Parameters stay equal to eager's."""
    eager_model = _model()
    model = copy.deepcopy(eager_model)
    eager_opt, opt = OPTIMIZERS[name](eager_model.parameters()), OPTIMIZERS[name](model.parameters())
    scheds = [torch.optim.lr_scheduler.ExponentialLR(o, 0.9) for o in (eager_opt, opt)]
    cnt = CompileCounter(lookup_backend(backend))
    step = bytegraph.compile(opt.step, backend=cnt)
    x = torch.randn(5, 4)
    for i in range(30):
        for m, o, s, sched in ((eager_model, eager_opt, eager_opt.step, scheds[0]), (model, opt, step, scheds[1])):
            m(x).pow(2).sum().backward()
            s()
            o.zero_grad()
            sched.step()
        if i % 10 == 0:
            _assert_same_state(eager_model, eager_opt, model, opt)
    _assert_same_state(eager_model, eager_opt, model, opt)
    assert cnt.frame_count == 2, cnt.frame_count    # torch.compile's 2 as well


def test_lr_scheduler_in_whole_training_step():
    eager_model = _model()
    model = copy.deepcopy(eager_model)
    eager_opt = torch.optim.AdamW(eager_model.parameters(), lr=0.01, foreach=True)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, foreach=True)
    scheds = [torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.05, total_steps=20) for o in (eager_opt, opt)]
    cnt = CompileCounter()
    eager_step, step = _train_step(eager_model, eager_opt), bytegraph.compile(_train_step(model, opt), backend=cnt)
    torch.manual_seed(1)
    for i in range(12):
        x, y = torch.randn(3, 4), torch.randn(3, 2)
        assert torch.allclose(eager_step(x, y), step(x, y), rtol=RTOL, atol=ATOL)
        for sched in scheds:
            sched.step()     # OneCycleLR moves lr and betas[0] every step
        _assert_same_state(eager_model, eager_opt, model, opt)
    # Forward and loss, the update's first step and its later ones (torch.compile's 3 as well).
    assert cnt.frame_count == 3, cnt.frame_count


@pytest.mark.parametrize("read_state_first", [False, True])
def test_first_step_with_gradients_set_in_the_same_trace(read_state_first):
    # The gradients are stores the trace has not done yet when the optimizer makes its state
    # (and the state may already have been read): the state is then made in the graph, and
    # what comes out is eager's.
    cnt = CompileCounter()

    def run(step):
        model = _model()
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        fn = step(model, opt)
        for i in range(3):
            fn(torch.full((1,), float(i + 1)))
        return model, opt

    def make(compiled):
        def build(model, opt):
            def step(scale):
                seen = len(opt.state) if read_state_first else 0
                for j, p in enumerate(model.parameters()):
                    if j != 1:          # one parameter never gets a gradient: no state for it
                        p.grad = torch.ones_like(p) * scale
                opt.step()
                return seen
            return bytegraph.compile(step, backend=cnt) if compiled else step
        return build

    eager_model, eager_opt = run(make(False))
    model, opt = run(make(True))
    _assert_same_state(eager_model, eager_opt, model, opt)
    # the first step (state made in the graph), the later ones; reading len(opt.state) first
    # adds one for its value changing from 0 to 2 (torch.compile makes as many: 2, 3)
    assert cnt.frame_count == (3 if read_state_first else 2)


def test_two_param_groups_equal_eager():
    # The second group's state is made after the trace has read the optimizer's state (for the
    # first group): it is made in the graph, and the next step compiles once more.
    def make(params):
        params = list(params)
        return torch.optim.AdamW([{"params": params[:2]}, {"params": params[2:], "lr": 0.05}], lr=0.01,
                                 foreach=True)
    cnt, graphs_after = _run_steps(make, "aot_eager")
    # WORSE than torch.compile's one graph (the second group's state made in the graph), correct.
    assert graphs_after == [1, 2, 2, 2], graphs_after


def test_a_fused_optimizer_step_runs_natively_without_compiling_torchs_frames():
    # Its update is one kernel per group: tracing torch's step only made frames and guards.
    from bytegraph.debug import records
    torch.manual_seed(0)
    model, ref = nn.Linear(4, 3), nn.Linear(4, 3)
    ref.load_state_dict(model.state_dict())
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, fused=True)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.01, fused=True)

    def step(m, o, x):
        m(x).pow(2).sum().backward()
        o.step()
        o.zero_grad()

    start = len(records.frames)
    compiled = bytegraph.compile(step)
    for i in range(3):
        x = torch.randn(5, 4) * (i + 1)
        compiled(model, opt, x)
        step(ref, ref_opt, x)
        _assert_same_state(ref, ref_opt, model, opt)
    frames = records.frames[start:]
    assert any("AdamW.step() of a fused optimizer runs natively" in (r.break_reason or "") for r in frames)
    assert not any("torch/optim" in (r.filename or "") for r in frames), [r.filename for r in frames]


@pytest.mark.parametrize("foreach", [None, False])
def test_clip_grad_norm_in_a_whole_training_step_is_traced(foreach):
    """clip_grad_norm_ groups the gradients by device and dtype in a dict of the gradients
    themselves (torch._C._group_tensors_by_device_and_dtype): traced, not a break, and the
    clipped update equals eager's."""
    def make(model, opt):
        def step(x, y):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05, foreach=foreach)
            opt.step()
            opt.zero_grad()
            return loss, norm
        return step
    eager_model = _model()
    model = copy.deepcopy(eager_model)
    eager_opt, opt = OPTIMIZERS["adamw_foreach"](eager_model.parameters()), OPTIMIZERS["adamw_foreach"](model.parameters())
    cnt = CompileCounter()
    eager_step, step = make(eager_model, eager_opt), bytegraph.compile(make(model, opt), backend=cnt)
    torch.manual_seed(1)
    for i in range(4):
        x, y = torch.randn(3, 4), torch.randn(3, 2)
        (loss_e, norm_e), (loss_c, norm_c) = eager_step(x, y), step(x, y)
        assert norm_e > 0.05          # clipping changes the update
        assert torch.allclose(loss_e, loss_c, rtol=RTOL, atol=ATOL) and torch.allclose(norm_e, norm_c, rtol=RTOL), i
        _assert_same_state(eager_model, eager_opt, model, opt)
    # forward and loss (a break at backward()), the clipping and the update's first step and its
    # later ones (torch.compile's 3 as well)
    assert cnt.frame_count == 3
    reasons = [b.reason for b in bytegraph.explain(make(model, opt))(x, y).break_reasons]
    assert not any("clip" in r or "mul_" in r or "holding tensors" in r for r in reasons), reasons


def test_grad_scaler_step_equals_eager():
    """GradScaler: scale, backward, unscale_, clip, step, update. Its per-optimizer state is
    keyed by id(optimizer) and its per-device tensors by torch.device; unscale_ is traced (its
    _MultiDeviceReplicator is a plain class of torch's), step() breaks where it reads whether an
    inf was found (.item(), as under torch.compile). SGD shows a doubled unscale at once."""
    def make(model, opt, scaler):
        def step(x, y):
            loss = torch.nn.functional.mse_loss(model(x), y)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            return loss
        return step
    eager_model = _model()
    model = copy.deepcopy(eager_model)
    eager_opt, opt = OPTIMIZERS["sgd_momentum"](eager_model.parameters()), OPTIMIZERS["sgd_momentum"](model.parameters())
    eager_scaler, scaler = (torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=2) for _ in range(2))
    eager_step = make(eager_model, eager_opt, eager_scaler)
    cnt = CompileCounter()
    step = bytegraph.compile(make(model, opt, scaler), backend=cnt)
    torch.manual_seed(1)
    for i in range(5):
        x, y = torch.randn(3, 4), torch.randn(3, 2)
        assert torch.allclose(eager_step(x, y), step(x, y), rtol=RTOL, atol=ATOL), i
        _assert_same_state(eager_model, eager_opt, model, opt)
        assert eager_scaler.get_scale() == scaler.get_scale(), i    # grows every 2 steps without infs
    assert cnt.frame_count == 4     # torch.compile's 4 as well
    reasons = [b.reason for b in bytegraph.explain(make(model, opt, scaler))(x, y).break_reasons]
    assert not any("class" in r or "values" in r for r in reasons), reasons


@pytest.mark.parametrize("foreach", [None, False])
def test_clip_grad_value_in_a_whole_training_step_is_traced(foreach):
    """clip_grad_value_ (README: training steps with clip_grad_norm_/clip_grad_value_): traced
    into the update's graph, no break of its own, and the clipped update equals eager's."""
    def make(model, opt):
        def step(x, y):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_value_(model.parameters(), 0.01, foreach=foreach)
            opt.step()
            opt.zero_grad()
            return loss
        return step
    eager_model = _model()
    model = copy.deepcopy(eager_model)
    eager_opt, opt = OPTIMIZERS["sgd_momentum"](eager_model.parameters()), OPTIMIZERS["sgd_momentum"](model.parameters())
    cnt = CompileCounter()
    eager_step, step = make(eager_model, eager_opt), bytegraph.compile(make(model, opt), backend=cnt)
    torch.manual_seed(1)
    for i in range(4):
        x, y = torch.randn(3, 4), torch.randn(3, 2)
        assert torch.allclose(eager_step(x, y), step(x, y), rtol=RTOL, atol=ATOL), i
        assert all(p.grad is None for p in model.parameters())
        _assert_same_state(eager_model, eager_opt, model, opt)
    # Forward and loss; clipping; the update on the first step (which makes the momentum buffers)
    # and on later ones: 4 graphs, as torch.compile makes (the optimizer's own graph_break()s
    # split the step).
    assert cnt.frame_count == 4, cnt.frame_count
    reasons = [b.reason for b in bytegraph.explain(make(model, opt))(x, y).break_reasons]
    assert all("backward" in r or "graph_break()" in r for r in reasons), reasons


@pytest.mark.parametrize("name", ["adamw_foreach", "adam", "rmsprop_foreach"])
def test_state_made_on_the_first_step_is_followed_by_identity(name):
    """The state the first compiled step makes is read by identity, as the state found made is:
    a state tensor changed in place is seen by the next step, one replaced (a load_state_dict)
    recompiles; both equal eager."""
    eager_model = _model()
    model = copy.deepcopy(eager_model)
    eager_opt, opt = OPTIMIZERS[name](eager_model.parameters()), OPTIMIZERS[name](model.parameters())
    cnt = CompileCounter(lookup_backend("eager"))
    step = bytegraph.compile(opt.step, backend=cnt)
    x = torch.randn(5, 4)

    def both():
        for m, o, s in ((eager_model, eager_opt, eager_opt.step), (model, opt, step)):
            o.zero_grad()
            m(x).pow(2).sum().backward()
            s()
        _assert_same_state(eager_model, eager_opt, model, opt)
    before = len(records.frames)
    for _ in range(3):
        both()
    graphs = cnt.frame_count
    state_guards = [g for r in records.frames[before:] for g in r.guards
                    if g.source is not None and any(k in g.source.name() for k in ("exp_avg", "square_avg"))]
    assert state_guards and all(g.kind == "ID_MATCH" for g in state_guards)
    for o in (eager_opt, opt):              # in place: the same objects
        for state in o.state.values():
            for key, value in state.items():
                if key != "step" and torch.is_tensor(value):
                    value.mul_(0.5)
    both()
    assert cnt.frame_count == graphs
    saved = copy.deepcopy(eager_opt.state_dict())
    eager_opt.load_state_dict(saved)         # new state tensors
    opt.load_state_dict(copy.deepcopy(saved))
    both()
    both()
    assert cnt.frame_count > graphs
