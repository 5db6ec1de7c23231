"""Shared helpers for the differential tests: run a function eagerly and compiled, compare.

``check(fn, *args, **kwargs)`` is the workhorse:

* runs ``fn`` eagerly on fresh copies of the inputs (the reference),
* compiles it with a fresh ``CompileCounter`` backend (``fullgraph=True`` when one
  graph is expected) and runs it on other fresh copies,
* compares results with ``bytegraph.testing.same`` (and ``requires_grad`` of every
  output tensor), and compares the inputs afterwards (so in-place mutation of
  inputs must be reproduced),
* asserts the number of graphs (and of call nodes when ``ops`` is given),
* calls the compiled function a second time with new copies of the same inputs
  and asserts that nothing was recompiled (cache hit) and the result is unchanged.
"""
import torch

import bytegraph
from bytegraph.testing import CompileCounter, same

__all__ = ["check", "check_program", "run_observed", "assert_same_run", "clone_input", "assert_same", "compile_counted",
           "torch_compile_graphs", "CompileCounter", "same"]


def clone_input(value):
    """A deep copy of a test input: tensors get new storage with the same size,
    stride, dtype and requires_grad; lists/tuples/dicts are copied; anything
    else (ints, modules, functions, ...) is shared."""
    if isinstance(value, torch.Tensor):
        with torch.no_grad():
            out = torch.empty_strided(value.size(), value.stride(), dtype=value.dtype,
                                      device=value.device)
            out.copy_(value)
        out.requires_grad_(value.requires_grad)
        return out
    if type(value) is list:
        return [clone_input(v) for v in value]
    if type(value) is tuple:
        return tuple(clone_input(v) for v in value)
    if type(value) is dict:
        return {k: clone_input(v) for k, v in value.items()}
    return value


def _tensors(value, path="out"):
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _tensors(v, f"{path}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _tensors(v, f"{path}[{k!r}]")


def assert_same(expected, actual, rtol=1e-5, atol=1e-6, what="result"):
    """``same`` plus a readable message, plus equal ``requires_grad`` on every tensor."""
    assert same(expected, actual, rtol=rtol, atol=atol), (
        f"{what} differs between eager and compiled\n  eager:    {expected!r}\n  compiled: {actual!r}")
    exp_flags = [(p, t.requires_grad) for p, t in _tensors(expected)]
    act_flags = [(p, t.requires_grad) for p, t in _tensors(actual)]
    assert exp_flags == act_flags, f"requires_grad of {what} differs: eager {exp_flags}, compiled {act_flags}"


def compile_counted(fn, fullgraph=False, dynamic=None):
    """``(compiled_fn, counter)`` with a fresh CompileCounter backend."""
    cnt = CompileCounter()
    return bytegraph.compile(fn, backend=cnt, fullgraph=fullgraph, dynamic=dynamic), cnt


def check(fn, *args, graphs=1, ops=None, fullgraph=None, dynamic=None, rtol=1e-5, atol=1e-6,
          check_inputs=True, **kwargs):
    """Differential test of ``fn(*args, **kwargs)``: eager vs compiled. See module docstring.

    Returns ``(counter, compiled_result)`` for extra assertions.
    """
    eager_args, eager_kwargs = clone_input(args), clone_input(kwargs)
    expected = fn(*eager_args, **eager_kwargs)

    if fullgraph is None:
        fullgraph = graphs == 1
    compiled, cnt = compile_counted(fn, fullgraph=fullgraph, dynamic=dynamic)

    comp_args, comp_kwargs = clone_input(args), clone_input(kwargs)
    grad_mode = torch.is_grad_enabled()
    actual = compiled(*comp_args, **comp_kwargs)
    assert torch.is_grad_enabled() == grad_mode, "the compiled call changed the global grad mode"
    assert_same(expected, actual, rtol, atol)
    if check_inputs:
        assert_same(eager_args, comp_args, rtol, atol, what="positional inputs after the call")
        assert_same(eager_kwargs, comp_kwargs, rtol, atol, what="keyword inputs after the call")
    assert cnt.frame_count == graphs, f"expected {graphs} graph(s), got {cnt.frame_count}"
    if ops is not None:
        assert cnt.op_count == ops, (
            f"expected {ops} call node(s) in the graph, got {cnt.op_count}:\n"
            + "\n".join(str(g.graph) for g in cnt.graphs))

    # Second call, identical (but new) inputs: must hit the cache.
    comp_args, comp_kwargs = clone_input(args), clone_input(kwargs)
    actual2 = compiled(*comp_args, **comp_kwargs)
    assert_same(expected, actual2, rtol, atol, what="result of the second call")
    if check_inputs:
        assert_same(eager_args, comp_args, rtol, atol, what="positional inputs after the second call")
    assert cnt.frame_count == graphs, (
        f"recompiled on the second call with identical inputs: {cnt.frame_count} graphs, expected {graphs}")
    return cnt, actual


def run_observed(fn, make):
    """Call ``fn`` on fresh inputs from ``make()``: (result, exception type and message,
    printed output, observed state, inputs afterwards)."""
    import contextlib
    import io
    args, kwargs, observe = make()
    out = io.StringIO()
    result, exc = None, None
    with contextlib.redirect_stdout(out):
        try:
            result = fn(*args, **kwargs)
        except Exception as e:  # the same exception must escape the compiled function
            exc = (type(e), str(e))
    return result, exc, out.getvalue(), observe() if observe else None, (args, kwargs)


def assert_same_run(expected, actual, what, rtol=1e-5, atol=1e-6):
    """Two ``run_observed`` results agree on everything a user can see."""
    assert actual[1] == expected[1], f"exception differs {what}: eager {expected[1]}, compiled {actual[1]}"
    assert_same(expected[0], actual[0], rtol, atol, what=f"result {what}")
    assert actual[2] == expected[2], (
        f"printed output differs {what}:\n  eager:    {expected[2]!r}\n  compiled: {actual[2]!r}")
    assert_same(expected[3], actual[3], rtol, atol, what=f"observed state {what}")
    assert_same(expected[4], actual[4], rtol, atol, what=f"inputs after the call {what}")


def check_program(fn, make, graphs=1, fullgraph=None, calls=2, rtol=1e-5, atol=1e-6):
    """Differential test of a program with effects: eager vs compiled, on everything users see.

    ``make()`` returns ``(args, kwargs, observe)``: fresh inputs and fresh program
    state (it resets any globals/objects the program touches), and ``observe()``
    returns a snapshot of that state after the call (or ``observe`` is None).
    Eager and compiled runs are compared on the return value, the exception
    escaping (type and message), printed output, the observed state and the
    inputs afterwards. The compiled function is called ``calls`` times (each on
    fresh state from ``make``); the number of graphs must be ``graphs`` after
    all calls (so later calls hit the cache). Returns the CompileCounter.
    """
    if fullgraph is None:
        fullgraph = graphs == 1
    expected = run_observed(fn, make)
    compiled, cnt = compile_counted(fn, fullgraph=fullgraph)
    for i in range(calls):
        assert_same_run(expected, run_observed(compiled, make), f"(call {i + 1})", rtol, atol)
    assert cnt.frame_count == graphs, f"expected {graphs} graph(s), got {cnt.frame_count}"
    return cnt


def torch_compile_graphs(fn, *calls, dynamic=None):
    """How many graphs torch.compile (the reference) makes of ``fn`` over ``calls`` (argument
    tuples, each cloned), counted by a backend that runs each graph as it is."""
    import torch._dynamo
    count = [0]

    def backend(gm, example_inputs):
        count[0] += 1
        return gm.forward

    torch._dynamo.reset()
    try:
        compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
        for args in calls:
            compiled(*clone_input(args))
    finally:
        torch._dynamo.reset()
    return count[0]


def splitting_backend(split, parts, outers):
    """A backend that splits each graph with ``split(gm, example_inputs, compile_part)``
    (``regions.compile_by_regions``, ``lanes.compile_by_lanes``), compiles each part with
    aot_eager and records it in ``parts``; ``outers`` gets the split graph (None: not split)."""
    from bytegraph.backends.aot import aot_eager

    def part_compiler(gm, examples):
        parts.append(gm)
        return aot_eager(gm, examples)

    def backend(gm, example_inputs):
        outer = split(gm, example_inputs, part_compiler)
        outers.append(outer)
        return (outer or gm).forward
    return backend


def assert_sum_grads_like_eager(model, out, expected, atol=1e-5):
    """``out.sum().backward()`` gives ``model``'s parameters the gradients ``expected``'s does."""
    out.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    expected.sum().backward()
    for n, p in model.named_parameters():
        assert torch.allclose(grads[n], p.grad, atol=atol), n
