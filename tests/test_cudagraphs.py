"""CUDA graphs: the ``cudagraphs`` backend and ``mode="reduce-overhead"``, compared with eager.

On a machine without CUDA only the fallback cases run (a graph on the CPU runs as it is).
"""
import pytest
import torch
import torch.nn as nn

import bytegraph

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _mlp(device):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)).to(device)


def test_cpu_graph_runs_without_cuda_graphs():
    model = _mlp("cpu")
    compiled = bytegraph.compile(model, backend="cudagraphs")
    for _ in range(3):
        x = torch.randn(4, 16)
        torch.testing.assert_close(compiled(x), model(x), rtol=0, atol=0)


@cuda
@pytest.mark.parametrize("how", ["cudagraphs", "reduce-overhead"])
def test_inference_replays_equal_eager(how):
    model = _mlp("cuda").eval()
    compiled = (bytegraph.compile(model, backend="cudagraphs") if how == "cudagraphs"
                else bytegraph.compile(model, mode="reduce-overhead"))
    with torch.no_grad():
        for step in range(5):
            x = torch.randn(4, 16, device="cuda") * (step + 1)
            out = compiled(x).clone()   # a later replay reuses the output's memory
            torch.testing.assert_close(out, model(x))


def _generation():
    from torch._dynamo.mutation_guard import GenerationTracker   # what CUDA graph trees read
    return GenerationTracker.generation


def _breaking(x):
    y = x.sin()
    print("break")          # two graphs per call: the generation moves once per call
    return y.cos() + 1


@pytest.mark.parametrize("backend", ["cudagraphs", "callable", "eager"])
def test_each_top_level_call_starts_one_cuda_graph_generation(backend, capsys):
    compiled = bytegraph.compile(_breaking, backend=(lambda gm, ex: gm) if backend == "callable" else backend)
    module = bytegraph.compile(nn.Linear(3, 3), backend=(lambda gm, ex: gm) if backend == "callable" else backend)
    x = torch.randn(3)
    compiled(x)
    module(x)
    before = _generation()
    for _ in range(3):
        torch.testing.assert_close(compiled(x), _breaking(x))
        module(x)
    # Named backends that never replay CUDA graphs leave the counter alone.
    assert _generation() - before == (0 if backend == "eager" else 6)


@cuda
def test_reduce_overhead_replays_while_the_caller_keeps_the_last_output():
    from torch._inductor import cudagraph_trees
    model = _mlp("cuda").eval()
    compiled = bytegraph.compile(model, mode="reduce-overhead")
    x = torch.randn(4, 16, device="cuda")
    with torch.no_grad():
        expected = model(x)
        out = None
        for _ in range(8):
            out = compiled(x)          # the previous output is still alive here
            torch.testing.assert_close(out, expected)
    # One recording, replayed: not a new recording (or an uncaptured run) per call.
    recorded = cudagraph_trees.get_manager(torch.cuda.current_device()).new_graph_id().id
    assert recorded <= 2


class _Remembers(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.last = None

    def forward(self, x):
        y = self.lin(x).relu()
        self.last = y * 2              # kept by the module after the call
        return y.sum()


@cuda
@pytest.mark.parametrize("how", ["cudagraphs", "reduce-overhead"])
def test_outputs_stored_in_objects_survive_later_replays(how):
    ref, model = _Remembers().cuda(), _Remembers().cuda()
    model.load_state_dict(ref.state_dict())
    compiled = (bytegraph.compile(model, backend="cudagraphs") if how == "cudagraphs"
                else bytegraph.compile(model, mode="reduce-overhead"))
    kept = []
    with torch.no_grad():
        for step in range(5):
            x = torch.randn(4, 16, device="cuda")
            torch.testing.assert_close(compiled(x), ref(x))
            kept.append((model.last, ref.last))
    for got, want in kept:             # earlier calls' stored tensors are not overwritten
        torch.testing.assert_close(got, want)


@cuda
@pytest.mark.parametrize("how", ["cudagraphs", "reduce-overhead"])
def test_training_steps_equal_eager(how):
    ref, model = _mlp("cuda"), _mlp("cuda")
    compiled = (bytegraph.compile(model, backend="cudagraphs") if how == "cudagraphs"
                else bytegraph.compile(model, mode="reduce-overhead"))
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        torch.manual_seed(step)
        x, y = torch.randn(4, 16, device="cuda"), torch.randn(4, 8, device="cuda")
        for m, o in ((ref, opt_ref), (compiled, opt)):
            o.zero_grad()
            loss = ((m(x) - y) ** 2).mean()
            loss.backward()
            o.step()
        for p, q in zip(ref.parameters(), model.parameters()):
            torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5)


@cuda
def test_input_written_in_place_is_not_replayed_over_a_copy():
    def f(x, y):
        x.add_(y)
        return x * 2

    compiled = bytegraph.compile(f, backend="cudagraphs")
    for _ in range(3):
        x, y = torch.randn(8, device="cuda"), torch.randn(8, device="cuda")
        x_ref = x.clone()
        out = compiled(x, y)
        expected = f(x_ref, y)
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(x, x_ref)   # the caller's tensor got the write


@cuda
def test_parameter_replaced_between_calls():
    model = _mlp("cuda").eval()
    compiled = bytegraph.compile(model, backend="cudagraphs")
    x = torch.randn(4, 16, device="cuda")
    with torch.no_grad():
        for _ in range(3):
            compiled(x)
        model[0].weight.data = torch.randn_like(model[0].weight)
        torch.testing.assert_close(compiled(x).clone(), model(x))


# --- the decision logic, on any machine ----------------------------------------------------------

from bytegraph.backends import cudagraphs as cg   # noqa: E402


def test_pointer_watch_warns_then_stops_when_static_inputs_move_every_call():
    watch = cg.PointerWatch("forward")
    assert watch.observe([1, 2]) == "replay"
    assert watch.observe([1, 2]) == "replay"          # in place: nothing to say
    actions = [watch.observe([1, 100 + i]) for i in range(cg.MOVED_STOP_AFTER)]
    assert actions[:cg.MOVED_WARN_AFTER - 1] == ["replay"] * (cg.MOVED_WARN_AFTER - 1)
    assert actions[cg.MOVED_WARN_AFTER - 1] == "warn" and actions.count("warn") == 1
    assert actions[-1] == "stop" and watch.moved == [1]


def test_pointer_watch_forgives_an_occasional_move():
    watch = cg.PointerWatch("forward")
    for i in range(50):
        # moves once every 3 calls (a parameter reloaded now and then): never a warning
        assert watch.observe([i // 3]) == "replay"


class _FakeReplay:
    def __init__(self, error=None):
        self.error = error
        self.calls = 0

    def __call__(self, args):
        self.calls += 1
        args.clear()          # the tree empties the list it is given
        if self.error is not None:
            raise self.error
        return ["replayed"]


def test_guarded_replay_falls_back_when_recording_fails():
    ran = []

    def run(args):
        ran.append(list(args))
        return ["ran"]

    replay = _FakeReplay(RuntimeError("operation not permitted when stream is capturing"))
    guarded = cg.GuardedReplay(replay, run, 0, "forward")
    assert guarded([1, 2]) == ["ran"] and ran == [[1, 2]]    # the inputs it was given, not an empty list
    assert guarded([3]) == ["ran"] and replay.calls == 1       # and never tries again


def test_guarded_replay_lets_user_errors_through():
    guarded = cg.GuardedReplay(_FakeReplay(RuntimeError("shape mismatch")), lambda args: ["ran"], 0, "forward")
    with pytest.raises(RuntimeError, match="shape mismatch"):
        guarded([1])


def test_guarded_replay_warns_about_moving_parameters():
    guarded = cg.GuardedReplay(_FakeReplay(), lambda args: ["ran"], 1, "forward")
    with pytest.warns(UserWarning, match="changed address"):
        for _ in range(cg.MOVED_WARN_AFTER + 1):
            guarded([torch.randn(2), torch.randn(2)])
    results = [guarded([torch.randn(2)]) for _ in range(cg.MOVED_STOP_AFTER)]
    assert results[-1] == ["ran"] and not guarded.enabled


def test_watch_static_inputs_in_reduce_overhead():
    params = [torch.randn(3)]
    run = cg.watch_static_inputs(lambda *a: "out", params, "reduce-overhead")
    for _ in range(3):
        assert run() == "out"
    with pytest.warns(UserWarning, match="reduce-overhead"):
        for _ in range(cg.MOVED_WARN_AFTER + 1):
            params[0] = torch.randn(3)
            run()


def test_written_inputs_and_devices_of_an_aten_graph():
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(p, x):
        p.add_(1)
        return x * 2

    gm = make_fx(f, tracing_mode="fake")(torch.randn(3), torch.randn(3))
    assert cg._written_inputs(gm) == {0}
    assert cg._devices(gm)[1] == "tensors on cpu, not on a CUDA device"
    assert cg.is_capture_failure(RuntimeError("CUDA error: operation not permitted when stream is capturing"))
    assert not cg.is_capture_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


@cuda
@pytest.mark.parametrize("how", ["cudagraphs", "reduce-overhead"])
def test_optimizer_step_replays_equal_eager(how):
    ref, model = _mlp("cuda"), _mlp("cuda")
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=0.01, foreach=True)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, foreach=True)
    step = (bytegraph.compile(opt.step, backend="cudagraphs") if how == "cudagraphs"
            else bytegraph.compile(opt.step, mode="reduce-overhead"))
    for i in range(5):
        torch.manual_seed(i)
        x = torch.randn(4, 16, device="cuda")
        for m, o, s in ((ref, opt_ref, opt_ref.step), (model, opt, step)):
            o.zero_grad()
            m(x).pow(2).sum().backward()
            s()
        for p, q in zip(ref.parameters(), model.parameters()):
            torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5)
