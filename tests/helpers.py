"""Shared helpers for the differential tests: run a function eagerly and compiled, compare.

``check(fn, *args, **kwargs)`` is the workhorse:

* runs ``fn`` eagerly on fresh copies of the inputs (the reference),
* compiles it with a fresh ``CompileCounter`` backend (``fullgraph=True`` when one
  graph is expected) and runs it on other fresh copies,
* compares results with ``bytegraph.testing.same`` (values, strides, device, which
  outputs are views of which inputs, and ``requires_grad`` of every output tensor), and
  compares the inputs afterwards (so in-place mutation of inputs must be reproduced),
* asserts the number of graphs (and of call nodes when ``ops`` is given),
* calls the compiled function a second time on inputs of the same shapes, dtypes and
  ``requires_grad`` with other values (``fresh_input``), compares with eager on those, and
  asserts that nothing was recompiled (a cache hit; a graph that kept anything of the first
  call's values, or answers every call alike, fails here).

Every helper fails when a frame fell back to eager after an internal error (tests run with
``config.suppress_errors`` off, tests/conftest.py, so such an error is normally raised).
"""
import torch

import bytegraph
from bytegraph.debug import records
from bytegraph.testing import CompileCounter, same

__all__ = ["check", "check_program", "run_observed", "assert_same_run", "clone_input", "fresh_input", "assert_same",
           "compile_counted", "torch_compile_graphs", "assert_no_internal_errors", "assert_compiled", "assert_traced", "CompileCounter",
           "same"]


def clone_input(value, _memo=None):
    """A deep copy of a test input: tensors get new storage with the same size,
    stride, dtype and requires_grad; lists/tuples/dicts are copied (a tensor or container
    found twice is copied once, so the copy has the same repeats); anything else (ints,
    modules, functions, ...) is shared."""
    memo = {} if _memo is None else _memo
    if id(value) in memo:
        return memo[id(value)]
    if isinstance(value, torch.Tensor):
        with torch.no_grad():
            out = torch.empty_strided(value.size(), value.stride(), dtype=value.dtype,
                                      device=value.device)
            out.copy_(value)
        out.requires_grad_(value.requires_grad)
    elif type(value) is list:
        out = memo[id(value)] = []
        out.extend(clone_input(v, memo) for v in value)
    elif type(value) is tuple:
        out = tuple(clone_input(v, memo) for v in value)
    elif type(value) is dict:
        out = memo[id(value)] = {}
        out.update((k, clone_input(v, memo)) for k, v in value.items())
    else:
        return value
    memo[id(value)] = out
    return out


def fresh_input(value, seed=1, single=False):
    """A test input of the same structure, shapes, strides, dtypes and ``requires_grad`` with
    other values (``refill``); a new object, as ``clone_input``. Deterministic for a ``seed``."""
    value = clone_input(value)
    refill(value, seed, single=single)
    return value


def refill(value, seed=1, single=False):
    """Give the tensors in ``value`` (nested lists, tuples, dicts) other values, in place:
    floating tensors scaled elementwise by factors in [0.5, 1.5) (signs and zeros kept, so
    sign-dependent control flow and masks keep their shapes); integer and bool tensors permuted
    (the same values, so indices stay in range), ascending ones kept as they are (offsets,
    boundaries). Tensors of one element are left as they are (they often decide a Python branch
    or a loop's length) unless ``single``: then floating ones are scaled too. Deterministic for
    a ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    seen = set()
    for _, t in _tensors(value):
        if t.numel() == 0 or (t.numel() == 1 and not (single and (t.dtype.is_floating_point or t.dtype.is_complex))):
            continue
        if t.layout != torch.strided or id(t) in seen:
            continue
        seen.add(id(t))
        with torch.no_grad():
            if t.dtype.is_floating_point or t.dtype.is_complex:
                factors = torch.rand(t.shape, generator=gen, dtype=torch.float64) + 0.5
                t.copy_(t * factors.to(t.device))
            else:
                flat = t.reshape(-1)
                ascending = t.dtype != torch.bool and bool((flat[1:] >= flat[:-1]).all())
                if not ascending:
                    order = torch.randperm(flat.numel(), generator=gen).to(t.device)
                    t.copy_(flat[order].reshape(t.shape))


def internal_error_fallbacks():
    """Frames that ran eagerly because bytegraph failed inside (rather than a graph break)."""
    return [f"{r.name} ({r.filename}:{r.firstlineno}): {r.fallback_reason}" for r in records.frames
            if r.fallback_reason and r.fallback_reason.startswith("internal error")]


def assert_no_internal_errors():
    fallbacks = internal_error_fallbacks()
    assert not fallbacks, "frames fell back to eager after an internal error:\n" + "\n".join(fallbacks)


def assert_compiled(cnt):
    """What the test ran was compiled, not run eagerly: at least one graph, and no frame fell
    back to eager (for tests whose point is that a construct resumes after its break, where the
    number of graphs follows from the inputs' branches rather than being the point)."""
    fallbacks = [f"{r.name}: {r.fallback_reason}" for r in records.frames if r.fallback_reason]
    assert cnt.frame_count >= 1 and not fallbacks, (
        f"{cnt.frame_count} graph(s); frames run eagerly:\n" + "\n".join(fallbacks))


def _tensors(value, path="out"):
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _tensors(v, f"{path}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _tensors(v, f"{path}[{k!r}]")


def assert_same(expected, actual, rtol=1e-5, atol=1e-6, what="result", inputs=None):
    """``same`` plus a readable message, plus equal ``requires_grad`` on every tensor.
    ``inputs=(eager_inputs, compiled_inputs)``: outputs must alias inputs as eager's do."""
    assert same(expected, actual, rtol=rtol, atol=atol), (
        f"{what} differs between eager and compiled\n  eager:    {expected!r}\n  compiled: {actual!r}"
        + _layout_note(expected, actual))
    if inputs is not None:
        from bytegraph.testing import aliasing
        eager_alias, compiled_alias = aliasing(expected, inputs[0]), aliasing(actual, inputs[1])
        assert eager_alias == compiled_alias, (
            f"{what}: outputs share storage with other inputs than in eager (output place -> input places)\n"
            f"  eager:    {eager_alias}\n  compiled: {compiled_alias}")
    exp_flags = [(p, t.requires_grad) for p, t in _tensors(expected)]
    act_flags = [(p, t.requires_grad) for p, t in _tensors(actual)]
    assert exp_flags == act_flags, f"requires_grad of {what} differs: eager {exp_flags}, compiled {act_flags}"


def _layout_note(expected, actual):
    """Strides and devices of the tensors, when they are what differs."""
    exp, act = dict(_tensors(expected)), dict(_tensors(actual))
    notes = [f"  {p}: eager stride {t.stride()} on {t.device}, compiled stride {act[p].stride()} on {act[p].device}"
             for p, t in exp.items() if isinstance(act.get(p), torch.Tensor) and act[p].shape == t.shape
             and (act[p].stride() != t.stride() or act[p].device != t.device)]
    return ("\n" + "\n".join(notes)) if notes else ""


def compile_counted(fn, fullgraph=False, dynamic=None):
    """``(compiled_fn, counter)`` with a fresh CompileCounter backend."""
    cnt = CompileCounter()
    return bytegraph.compile(fn, backend=cnt, fullgraph=fullgraph, dynamic=dynamic), cnt


def check(fn, *args, graphs=1, ops=None, fullgraph=None, dynamic=None, rtol=1e-5, atol=1e-6,
          check_inputs=True, fresh=True, **kwargs):
    """Differential test of ``fn(*args, **kwargs)``: eager vs compiled. See module docstring.

    ``fresh=False``: the second call gets the same values again (for functions whose inputs
    must hold particular values that ``fresh_input`` would not keep; say why at the call).
    ``fresh="single"``: tensors of one element get other values too (``refill(single=True)``),
    for functions that take no Python decision on them.
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
    assert_no_internal_errors()
    assert_same(expected, actual, rtol, atol, inputs=((eager_args, eager_kwargs), (comp_args, comp_kwargs)))
    if check_inputs:
        assert_same(eager_args, comp_args, rtol, atol, what="positional inputs after the call")
        assert_same(eager_kwargs, comp_kwargs, rtol, atol, what="keyword inputs after the call")
    assert cnt.frame_count == graphs, f"expected {graphs} graph(s), got {cnt.frame_count}"
    if graphs == 0 and not fullgraph:
        assert_traced()
    if ops is not None:
        assert cnt.op_count == ops, (
            f"expected {ops} call node(s) in the graph, got {cnt.op_count}:\n"
            + "\n".join(str(g.graph) for g in cnt.graphs))

    # Second call, inputs alike (shapes, dtypes, requires_grad) with other values: must hit the
    # cache and give what eager gives on those values.
    single = fresh == "single"
    new_args, new_kwargs = ((fresh_input(args, single=single), fresh_input(kwargs, single=single)) if fresh
                            else (args, kwargs))
    eager_args, eager_kwargs = clone_input(new_args), clone_input(new_kwargs)
    expected2 = fn(*eager_args, **eager_kwargs)
    comp_args, comp_kwargs = clone_input(new_args), clone_input(new_kwargs)
    actual2 = compiled(*comp_args, **comp_kwargs)
    assert_no_internal_errors()
    assert_same(expected2, actual2, rtol, atol, what="result of the second call (other values)",
                inputs=((eager_args, eager_kwargs), (comp_args, comp_kwargs)))
    if check_inputs:
        assert_same(eager_args, comp_args, rtol, atol, what="positional inputs after the second call")
        assert_same(eager_kwargs, comp_kwargs, rtol, atol, what="keyword inputs after the second call")
    assert cnt.frame_count == graphs, (
        f"recompiled on the second call with inputs alike: {cnt.frame_count} graphs, expected {graphs}")
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


def check_program(fn, make, graphs=1, fullgraph=None, calls=2, rtol=1e-5, atol=1e-6, traced=True):
    """Differential test of a program with effects: eager vs compiled, on everything users see.

    ``make()`` returns ``(args, kwargs, observe)``: fresh inputs and fresh program
    state (it resets any globals/objects the program touches), and ``observe()``
    returns a snapshot of that state after the call (or ``observe`` is None).
    Eager and compiled runs are compared on the return value, the exception
    escaping (type and message), printed output, the observed state and the
    inputs afterwards. The compiled function is called ``calls`` times (each on
    fresh state from ``make``; from the second call on, the tensors ``make`` gives get other
    values, ``fresh_input``, and eager runs again on them); the number of graphs must be
    ``graphs`` after all calls (so later calls hit the cache); with none, a frame must have been
    traced to a break (``assert_traced``; ``traced=False`` where the frame falls back whole, the
    test checking the reason itself). Returns the CompileCounter.
    """
    if fullgraph is None:
        fullgraph = graphs == 1
    compiled, cnt = compile_counted(fn, fullgraph=fullgraph)
    for i in range(calls):
        call_make = make if i == 0 else _freshened(make, seed=i)
        expected = run_observed(fn, call_make)
        assert_same_run(expected, run_observed(compiled, call_make), f"(call {i + 1})", rtol, atol)
        assert_no_internal_errors()
    assert cnt.frame_count == graphs, f"expected {graphs} graph(s), got {cnt.frame_count}"
    if graphs == 0 and not fullgraph and traced:
        assert_traced()
    return cnt


def assert_traced():
    """A run that compiled no graph was still traced: a frame broke for a reason the tracer
    found (a raise, an unsupported call), rather than every frame being left to run unread."""
    frames = [(r.name, r.break_reason, r.fallback_reason) for r in records.frames]
    assert any(reason for _, reason, _ in frames), f"no frame was traced to a break: {frames}"


def _freshened(make, seed):
    """``make`` whose tensors have other values (the same ones on every call of it): each
    ``make()``'s tensors are replaced by copies with other values (``refill``) inside the
    containers ``make()`` returned (a tuple is rebuilt), so ``observe`` sees what the function
    was given; the tensors ``make()`` returned are not changed (they may be shared)."""
    def fresh_make():
        args, kwargs, observe = make()
        memo = {}
        args, kwargs = _fresh_tensors(args, memo), _fresh_tensors(kwargs, memo)
        refill(list(memo.values()), seed)
        return args, kwargs, observe
    return fresh_make


def _fresh_tensors(value, memo):
    if isinstance(value, torch.Tensor):
        if id(value) not in memo:
            memo[id(value)] = clone_input(value)
        return memo[id(value)]
    if type(value) is list:
        value[:] = [_fresh_tensors(v, memo) for v in value]
        return value
    if type(value) is tuple:
        return tuple(_fresh_tensors(v, memo) for v in value)
    if type(value) is dict:
        for k in value:
            value[k] = _fresh_tensors(value[k], memo)
        return value
    return value


def torch_compile_fullgraph_count(fn, *args):
    """Graphs torch.compile (the reference) makes of ``fn(*args)`` with ``fullgraph=True``, the
    arguments passed as they are (``torch_compile_graphs`` clones them, which makes tensor
    subclasses such as DTensor plain tensors)."""
    import torch._dynamo
    count = [0]

    def backend(gm, example_inputs):
        count[0] += 1
        return gm.forward
    torch._dynamo.reset()
    try:
        torch.compile(fn, backend=backend, fullgraph=True)(*args)
    finally:
        torch._dynamo.reset()
    return count[0]


def torch_compile_graphs(fn, *calls, dynamic=None, kwargs=None, per_call=False, before_each=None,
                         with_kwargs=False):
    """How many graphs torch.compile (the reference) makes of ``fn`` over ``calls`` (argument
    tuples, each cloned; ``with_kwargs``: ``(args, kwargs)`` pairs; ``kwargs`` for every call),
    counted by a backend that runs each graph as it is. ``per_call``: the count after each call, a list.
    ``before_each()`` runs before every call (state the function changes put back). An
    exception the function raises (as in eager) ends that call only."""
    import torch._dynamo
    count = [0]
    after = []

    def backend(gm, example_inputs):
        count[0] += 1
        return gm.forward

    torch._dynamo.reset()
    try:
        compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
        for call in calls:
            args, call_kwargs = call if with_kwargs else (call, {})
            if before_each is not None:
                before_each()
            try:
                compiled(*clone_input(args), **clone_input({**(kwargs or {}), **call_kwargs}))
            except Exception:   # noqa: BLE001 - the graphs made before it count
                pass
            after.append(count[0])
    finally:
        torch._dynamo.reset()
    return after if per_call else count[0]


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


def run_ranks(script, tmp, world=2, timeout=300):
    """``tests/<script>`` run as ``world`` processes of one gloo group (each given its rank, the
    world size, a store file and its results file, in ``tmp``); per rank, the results it wrote
    ({check: {"ok", "detail", "error"}}). A rank that wrote none fails the test with its log."""
    import json
    import os
    import subprocess
    import sys
    import pytest
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(os.path.abspath(bytegraph.__file__)))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    procs, logs = [], []
    for rank in range(world):
        log = open(tmp / f"rank{rank}.log", "w")
        procs.append(subprocess.Popen([sys.executable, os.path.join(here, script), str(rank), str(world),
                                       str(tmp / "store"), str(tmp / f"rank{rank}.json")],
                                      stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(tmp)))
        logs.append(log)
    try:
        for proc in procs:
            proc.wait(timeout=timeout)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        for log in logs:
            log.close()
    results = []
    for rank in range(world):
        out = tmp / f"rank{rank}.json"
        if not out.exists():
            pytest.fail(f"rank {rank} wrote no results (exit code {procs[rank].returncode}):\n"
                        + (tmp / f"rank{rank}.log").read_text()[-4000:])
        results.append(json.loads(out.read_text()))
    return results


def rank_details(results, name):
    """The ``detail`` of check ``name`` on every rank, after asserting that each ran it and passed."""
    details = []
    for rank, per_rank in enumerate(results):
        assert name in per_rank, f"rank {rank} did not run {name}"
        r = per_rank[name]
        assert r["ok"], f"rank {rank}: {name} failed:\n{r['error']}"
        details.append(r["detail"])
    return details
