"""A 0-d CPU tensor input that a GPU op reads (a learning rate a scheduler moves) is copied to
the GPU in the graph, without blocking, before Inductor sees it (``backends/inductor.py``,
``scalars_to_gpu_without_waiting``). The graphs are built with fake CUDA tensors, so this runs
without a GPU; the GPU's values are checked by ``bench/train_step.py``'s scheduler row."""
import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode

from bytegraph.backends.inductor import scalars_to_gpu_without_waiting


def _graph(build):
    """(GraphModule, fake example inputs) for ``build(graph, mode)``, which adds placeholders
    with example values and returns the output."""
    mode = FakeTensorMode()
    g = fx.Graph()
    examples = []

    def placeholder(name, value):
        n = g.placeholder(name)
        n.meta["example_value"] = value
        examples.append(value)
        return n

    def op(fn, *args, example=None):
        n = g.call_function(fn, args)
        if example is None:
            with mode, torch.no_grad():
                example = fn(*[a.meta["example_value"] if isinstance(a, fx.Node) else a for a in args])
        n.meta["example_value"] = example
        return n

    with mode:
        out = build(placeholder, op, mode)
    g.output(out)
    return fx.GraphModule(torch.nn.Module(), g), examples


def _reads(gm, target):
    node = next(n for n in gm.graph.nodes if n.target is target)
    return [a.op if a.op == "placeholder" else (a.target, a.kwargs.get("device"), a.kwargs.get("non_blocking"))
            for a in node.args if isinstance(a, fx.Node)]


def test_a_gpu_op_reads_a_non_blocking_copy_and_a_cpu_op_the_input():
    def build(placeholder, op, mode):
        x = placeholder("x", torch.empty(4, device="cuda"))
        lr = placeholder("lr", torch.empty((), dtype=torch.float64))
        c = placeholder("c", torch.empty(()))
        return (op(torch.mul, x, lr), op(torch.add, c, lr))
    gm, examples = _graph(build)
    assert scalars_to_gpu_without_waiting(gm, examples) == 1
    assert _reads(gm, torch.mul) == ["placeholder", ("to", torch.device("cuda:0"), True)]
    assert _reads(gm, torch.add) == ["placeholder", "placeholder"]
    copy = next(n for n in gm.graph.nodes if n.target == "to")
    assert copy.meta["example_value"].device == torch.device("cuda:0")
    assert copy.meta["example_value"].dtype == torch.float64
    # placeholders stay first (AOTAutograd reads the inputs in order)
    ops = [n.op for n in gm.graph.nodes]
    assert ops[:3] == ["placeholder"] * 3 and "placeholder" not in ops[3:]


def test_one_copy_serves_every_gpu_op():
    def build(placeholder, op, mode):
        x = placeholder("x", torch.empty(4, device="cuda"))
        lr = placeholder("lr", torch.empty((), dtype=torch.float64))
        return (op(torch.mul, op(torch.mul, x, lr), lr),)
    gm, examples = _graph(build)
    assert scalars_to_gpu_without_waiting(gm, examples) == 1
    assert len([n for n in gm.graph.nodes if n.target == "to"]) == 1


def test_cpu_graphs_and_grad_inputs_are_left_as_they_are():
    def cpu(placeholder, op, mode):
        x = placeholder("x", torch.empty(4))
        lr = placeholder("lr", torch.empty((), dtype=torch.float64))
        return (op(torch.mul, x, lr),)
    gm, examples = _graph(cpu)
    before = gm.code
    assert scalars_to_gpu_without_waiting(gm, examples) == 0
    assert gm.code == before

    def grad(placeholder, op, mode):
        x = placeholder("x", torch.empty(4, device="cuda"))
        w = placeholder("w", torch.empty((), requires_grad=True))
        return (op(torch.mul, x, w, example=torch.empty(4, device="cuda")),)
    gm, examples = _graph(grad)
    assert scalars_to_gpu_without_waiting(gm, examples) == 0


def test_an_op_reading_tensors_of_two_devices_or_unknown_values_is_left():
    def build(placeholder, op, mode):
        x = placeholder("x", torch.empty(4, device="cuda"))
        y = placeholder("y", torch.empty(4))
        lr = placeholder("lr", torch.empty((), dtype=torch.float64))
        u = placeholder("u", torch.empty(4, device="cuda"))
        u.meta["example_value"] = None      # (a value whose device is not known)
        return (op(torch.addcmul, y, x, lr, example=torch.empty(4)), op(torch.mul, u, lr, example=torch.empty(4)))
    gm, examples = _graph(build)
    assert scalars_to_gpu_without_waiting(gm, examples) == 0


def test_a_cpu_training_step_under_a_scheduler_matches_eager():
    import bytegraph

    def run(compile_):
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 8)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=100)
        x = torch.randn(4, 8)

        def step():
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        step = compile_(step)
        losses = []
        for _ in range(4):
            losses.append(step().item())
            sched.step()
        return losses, model.weight.detach().clone()

    eager_losses, eager_w = run(lambda f: f)
    losses, w = run(lambda f: bytegraph.compile(f, backend="inductor"))
    torch.testing.assert_close(losses, eager_losses)
    torch.testing.assert_close(w, eager_w)
