"""Drop-in in fact: torch.compiler's and torch._dynamo's control calls mean the same for bytegraph.

Each scenario is written once with torch's names (``torch.compile``, ``torch.compiler.set_stance``,
``torch._dynamo.mark_dynamic``...) and run three ways: on torch.compile itself (the reference),
under ``bytegraph.patch_torch_compile()`` and, where the names exist without the patch, on
``bytegraph.compile`` / ``bytegraph.set_stance`` directly. A scenario returns what a user
observes: graph counts (a counting backend), whether each result equals eager's, the exceptions
raised. docs/dropin.md lists every call of these APIs in transformers, diffusers, accelerate and
peft, with the test of each here.
"""
import functools
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch._dynamo

import bytegraph
from bytegraph.runtime import persist, stance
from bytegraph.testing import CompileCounter, same
from helpers import fresh_input


class _TorchNames:
    """torch's names, read when used: torch's own unpatched, bytegraph's while patched."""
    compile = property(lambda self: torch.compile)
    set_stance = property(lambda self: torch.compiler.set_stance)


class _BytegraphNames:
    compile = staticmethod(bytegraph.compile)
    set_stance = bytegraph.set_stance


TORCH = _TorchNames()
BYTEGRAPH = _BytegraphNames()


@pytest.fixture(autouse=True)
def clean_state():
    torch._dynamo.reset()
    yield
    bytegraph.unpatch_torch_compile()
    stance.apply(stance.DEFAULT)
    torch.compiler.set_stance("default")
    torch._dynamo.reset()


def on_torch(scenario, api=TORCH):
    torch._dynamo.reset()
    # eager_then_compile's first calls, kept by torch per code location for the process (reset leaves them).
    torch._dynamo.eval_frame._EXAMPLE_INPUTS = None
    try:
        return scenario(api)
    finally:
        torch._dynamo.reset()


def patched(scenario, api=TORCH):
    bytegraph.patch_torch_compile()
    try:
        return scenario(api)
    finally:
        bytegraph.unpatch_torch_compile()
        stance.apply(stance.DEFAULT)
        bytegraph.reset()


def plain(scenario):
    try:
        return scenario(BYTEGRAPH)
    finally:
        stance.apply(stance.DEFAULT)
        bytegraph.reset()


def assert_like_torch(scenario, without_patch=True):
    """The scenario observes the same on torch.compile, patched, and (``without_patch``) on bytegraph's names."""
    reference = on_torch(scenario)
    assert patched(scenario) == reference, "under patch_torch_compile"
    if without_patch:
        assert plain(scenario) == reference, "bytegraph's own names, without the patch"
    return reference


def observe(compiled, fn, *args):
    """Call ``compiled``: True if its result equals eager's, else the kind of exception."""
    try:
        out = compiled(*args)
    except RuntimeError as e:     # torch's and bytegraph's recompile errors are RuntimeErrors
        return f"RuntimeError: {'recompile' if 'ecompil' in str(e) else str(e)[:40]}"
    return same(fn(*args), out)


def sin1(x):
    return x.sin() + 1


# --------------------------------------------------------------------- set_stance

@pytest.mark.parametrize("compiled_first", [False, True])
@pytest.mark.parametrize("name", ["force_eager", "eager_on_recompile", "fail_on_recompile", "eager_then_compile"])
def test_stance_as_context_manager(name, compiled_first):
    def scenario(api):
        def f(x):
            return x.cos() * 2
        cnt = CompileCounter()
        c = api.compile(f, backend=cnt)
        seen = []
        if compiled_first:
            seen.append(observe(c, f, torch.randn(3)))
        with api.set_stance(name):
            for n in (3, 4, 5, 3):
                seen += [observe(c, f, torch.randn(n)), cnt.frame_count]
        seen += [observe(c, f, torch.randn(6)), cnt.frame_count]    # the default again
        return seen
    observed = assert_like_torch(scenario)
    if name == "force_eager":
        assert observed[-1] == 1 + compiled_first, observed


def test_stance_as_function_and_decorator():
    def scenario(api):
        cnt = CompileCounter()
        c = api.compile(sin1, backend=cnt)
        api.set_stance("force_eager")
        seen = [observe(c, sin1, torch.randn(2)), cnt.frame_count]
        api.set_stance("default")
        seen += [observe(c, sin1, torch.randn(2)), cnt.frame_count]

        @api.set_stance("force_eager")
        def outer(x):
            return c(x)
        seen += [same(outer(torch.ones(5)), sin1(torch.ones(5))), cnt.frame_count]
        seen += [observe(c, sin1, torch.randn(7)), cnt.frame_count]   # decorator left the default on
        return seen
    assert assert_like_torch(scenario) == [True, 0, True, 1, True, 1, True, 2]


def test_fail_on_recompile_names_the_guard():
    c = bytegraph.compile(sin1, backend="eager", dynamic=False)
    c(torch.randn(3))
    with bytegraph.set_stance("fail_on_recompile"):
        x = torch.randn(3)
        assert same(c(x), sin1(x))       # compiled code whose guards hold still runs
        with pytest.raises(bytegraph.RecompileError, match="fail_on_recompile.*size of x"):
            c(torch.randn(4))
    assert isinstance(bytegraph.RecompileError("x"), RuntimeError)


def test_fail_on_recompile_lets_frames_without_tensors_run():
    # torch.compile compiles nothing in a frame without tensors, modules, arrays or torch globals:
    # a function reached at a graph break with plain Python values runs, where a new tensor frame raises.
    def helper(n):
        return n * 2

    def f(x, n):
        y = x + 1
        print(end="")        # a graph break: helper runs from the native step
        return y * helper(n)
    cnt = CompileCounter()
    c = bytegraph.compile(f, backend=cnt)
    c(torch.ones(2), 3)
    assert cnt.frame_count == 2      # the code before the break and after it (f's resume)
    with bytegraph.set_stance("fail_on_recompile"):
        x = torch.tensor([-2.0, 5.0])     # other values: the graphs run again on them
        assert same(c(x, 3), f(x, 3))
    assert cnt.frame_count == 2


def test_stance_inside_a_compiled_function_is_an_error():
    def f(x):
        torch.compiler.set_stance("force_eager")
        return x + 1
    with pytest.raises(Exception):
        torch.compile(f, backend="eager")(torch.ones(2))
    torch.compiler.set_stance("default")
    for api, names in ((TORCH, "patched"), (BYTEGRAPH, "plain")):
        def g(x):
            api.set_stance("force_eager")
            return x + 1
        if names == "patched":
            bytegraph.patch_torch_compile()
        try:
            with pytest.raises(bytegraph.BytegraphError, match="cannot be called inside a compiled function"):
                api.compile(g, backend="eager")(torch.ones(2))
        finally:
            bytegraph.unpatch_torch_compile()
        assert stance.current[0] == stance.DEFAULT


def test_skip_guard_eval_unsafe():
    scale = [2.0]

    def scenario(api):
        def f(x):
            return x * scale[0]
        scale[0] = 2.0
        c = api.compile(f, backend="eager")
        seen = []
        with api.set_stance(skip_guard_eval_unsafe=True):
            seen.append(observe(c, f, torch.ones(3)))             # nothing compiled yet: a miss raises
        c(torch.ones(3))
        scale[0] = 5.0
        with api.set_stance(skip_guard_eval_unsafe=True):
            seen.append(c(torch.ones(3)).tolist())                # unsafe: the constant is not checked
            with torch.no_grad():
                seen.append(observe(c, f, torch.ones(3)))         # global state still is
            seen.append(observe(c, f, torch.ones(3, 3)))          # and tensor metadata
        seen.append(c(torch.ones(3)).tolist())                    # all guards again: recompiles
        with api.set_stance(skip_guard_eval_unsafe=True):
            scale[0] = 2.0
            seen.append(c(torch.ones(3)).tolist())                # a differentiating guard: checked
        return seen
    assert assert_like_torch(scenario) == ["RuntimeError: recompile", [2.0] * 3, "RuntimeError: recompile",
                                           "RuntimeError: recompile", [5.0] * 3, [2.0] * 3]


def test_force_backend():
    def scenario(api):
        mine, forced = CompileCounter(), CompileCounter()
        c = api.compile(sin1, backend=mine)
        seen = [observe(c, sin1, torch.randn(3))]
        with api.set_stance(force_backend=forced):
            seen += [observe(c, sin1, torch.randn(3)), observe(c, sin1, torch.randn(3))]
        seen += [observe(c, sin1, torch.randn(3)), mine.frame_count, forced.frame_count]
        return seen
    assert assert_like_torch(scenario) == [True, True, True, True, 1, 1]


def test_force_backend_only_with_the_default_stance():
    with pytest.raises(RuntimeError):
        torch.compiler.set_stance("force_eager", force_backend="eager")
    with pytest.raises(bytegraph.BytegraphError, match="force_backend"):
        bytegraph.set_stance("force_eager", force_backend="eager")
    with pytest.raises(bytegraph.BytegraphError, match="unknown stance"):
        bytegraph.set_stance("eager_forever")


def test_aot_eager_then_compile_warns_once_and_compiles_on_the_second_call():
    cnt = CompileCounter()
    c = bytegraph.compile(sin1, backend=cnt)
    with pytest.warns(RuntimeWarning, match="aot_eager_then_compile"):
        with bytegraph.set_stance("aot_eager_then_compile"):
            for n in (3, 4, 5):
                x = torch.randn(n)
                assert same(c(x), sin1(x))
                assert cnt.frame_count == (n > 3)


def test_stance_set_through_torch_before_the_patch_holds():
    torch.compiler.set_stance("force_eager")
    try:
        cnt = CompileCounter()
        bytegraph.patch_torch_compile()
        torch.compile(sin1, backend=cnt)(torch.ones(2))
        assert cnt.frame_count == 0
    finally:
        bytegraph.unpatch_torch_compile()
        torch.compiler.set_stance("default")


# --------------------------------------------------------------------- marks on tensors

def _sizes_scenario(mark, sizes=(4, 5, 6), dynamic=None, mark_all=True):
    def scenario(api):
        def f(x):
            return x.sin() * x.shape[0]
        cnt = CompileCounter()
        c = api.compile(f, backend=cnt, dynamic=dynamic)
        seen = []
        for i, n in enumerate(sizes):
            x = torch.randn(n, 3)
            if mark_all or i == 0:
                mark(x)
            seen.append(observe(c, f, x))
        return seen + [cnt.frame_count]
    return scenario


@pytest.mark.parametrize("label, mark, dynamic, graphs", [
    ("mark_dynamic", lambda x: torch._dynamo.mark_dynamic(x, 0), None, 1),
    ("mark_dynamic with dynamic=False", lambda x: torch._dynamo.mark_dynamic(x, 0), False, 1),
    ("mark_dynamic in range", lambda x: torch._dynamo.mark_dynamic(x, 0, min=2, max=8), None, 1),
    ("maybe_mark_dynamic", lambda x: torch._dynamo.maybe_mark_dynamic(x, 0), None, 1),
    ("mark_unbacked", lambda x: torch._dynamo.decorators.mark_unbacked(x, 0), None, 1),
    ("mark_static under dynamic=True", lambda x: torch._dynamo.mark_static(x, 0), True, 3),
    ("mark_static", lambda x: torch._dynamo.mark_static(x, 0), None, 3),
    ("mark_dynamic beats mark_static", lambda x: (torch._dynamo.mark_dynamic(x, 0), torch._dynamo.mark_static(x, 0)),
     None, 1),
    ("mark_static_address", lambda x: torch._dynamo.mark_static_address(x), None, 2),
])
def test_torch_marks(label, mark, dynamic, graphs):
    observed = assert_like_torch(_sizes_scenario(mark, dynamic=dynamic))
    assert observed == [True, True, True, graphs], label


def test_mark_dynamic_on_the_first_tensor_only():
    # The graph made for the marked tensor is symbolic: later plain tensors of other sizes use it.
    observed = assert_like_torch(_sizes_scenario(lambda x: torch._dynamo.mark_dynamic(x, 0), mark_all=False))
    assert observed == [True, True, True, 1]


def test_mark_dynamic_on_a_size_one_dim_specializes():
    observed = assert_like_torch(_sizes_scenario(lambda x: torch._dynamo.mark_dynamic(x, 0), sizes=(1, 5, 6)))
    assert observed == [True, True, True, 2]


@pytest.mark.parametrize("mark", ["mark_dynamic", "maybe_mark_dynamic", "mark_static_address"])
def test_marking_inside_a_compiled_function_is_an_error(mark):
    def f(x):
        getattr(torch._dynamo, mark)(x) if mark == "mark_static_address" else getattr(torch._dynamo, mark)(x, 0)
        return x + 1
    with pytest.raises(Exception):
        torch.compile(f, backend="eager")(torch.ones(2))
    with pytest.raises(bytegraph.BytegraphError, match="cannot be called inside a compiled function"):
        bytegraph.compile(f, backend="eager")(torch.ones(2))


# --------------------------------------------------------------------- what is traced

def _graphs_scenario(fn, *args, nodes=True):
    def scenario(api):
        cnt = CompileCounter()
        c = api.compile(fn, backend=cnt)
        # the second call with other values (fresh_input: same shapes, signs kept)
        seen = [observe(c, fn, *args), observe(c, fn, *fresh_input(list(args))), cnt.frame_count]
        if nodes:
            seen.append([getattr(n.target, "__name__", n.target) for g in cnt.graphs for n in g.graph.nodes
                         if n.op == "call_function"])
        return seen
    return scenario


def _cos2(x):
    return x.cos() + 2


@torch.compiler.disable
def _disabled(x):
    return _cos2(x) + 1


@torch.compiler.disable(recursive=False)
def _disabled_frame(x):
    return _cos2(x) + 1


def test_disable():
    observed = assert_like_torch(_graphs_scenario(lambda x: _disabled(x.sin()) * 2, torch.randn(4)))
    assert observed[:3] == [True, True, 2]


def test_disable_not_recursive_compiles_what_it_calls():
    observed = assert_like_torch(_graphs_scenario(lambda x: _disabled_frame(x.sin()) * 2, torch.randn(4)))
    assert observed[:3] == [True, True, 3]


def test_compiling_a_disabled_function_compiles_it():
    # torch.compile looks through torch.compiler.disable's wrapper of what it is handed.
    observed = assert_like_torch(_graphs_scenario(_disabled, torch.randn(4)))
    assert observed[:3] == [True, True, 1]


def test_disable_on_a_method():
    class Cache:
        def __init__(self):
            self.total = torch.zeros(3)

        @torch.compiler.disable
        def update(self, x):
            self.total += x
            return self.total.clone()

    def scenario(api):
        cache, ref = Cache(), Cache()

        def f(x, cache):
            return cache.update(x.sin()) * 2
        cnt = CompileCounter()
        c = api.compile(f, backend=cnt)
        x = torch.randn(3)
        return [same(c(x, cache), f(x, ref)), same(c(x, cache), f(x, ref)), cnt.frame_count]
    assert assert_like_torch(scenario) == [True, True, 2]


def test_allow_in_graph():
    def scaled(x):
        return x * 3 + 1
    torch.compiler.allow_in_graph(scaled)
    observed = assert_like_torch(_graphs_scenario(lambda x: scaled(x.sin()).cos(), torch.randn(4)))
    assert observed == [True, True, 1, ["scaled"]]


def test_allow_in_graph_on_a_module_class():
    # diffusers marks its attention and transformer block classes (maybe_allow_in_graph): their
    # instances are traced into all the same.
    @torch._dynamo.allow_in_graph
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return torch.relu(self.lin(x)) + 1
    model = torch.nn.Sequential(Block(), Block())

    def scenario(api):
        cnt = CompileCounter()
        c = api.compile(model, backend=cnt)
        x = torch.randn(2, 4)
        return [same(c(x), model(x)), cnt.frame_count,
                sorted(getattr(n.target, "__name__", str(n.target)) for n in cnt.graphs[0].graph.nodes
                       if n.op == "call_function")]
    assert assert_like_torch(scenario) == [True, 1, ["add", "add", "linear", "linear", "relu", "relu"]]


def test_transform_getitem_to_index():
    # transformers' masks built with vmap: tensor[scalar tensor] under TransformGetItemToIndex.
    from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex
    table = torch.tensor([0, 0, 1, 1, 2])

    def mask(b, h, q, kv):
        return table[q] >= table[kv]

    def f(x):
        q = kv = torch.arange(5)
        with TransformGetItemToIndex():
            m = torch.vmap(torch.vmap(mask, in_dims=(None, None, None, 0)), in_dims=(None, None, 0, None))(0, 0, q, kv)
        return x.masked_fill(~m, 0)
    assert assert_like_torch(_graphs_scenario(f, torch.randn(5, 5), nodes=False)) == [True, True, 1]


def test_disallow_in_graph():
    op = torch.logaddexp
    torch._dynamo.disallow_in_graph(op)
    try:
        observed = assert_like_torch(_graphs_scenario(lambda x: op(x.sin(), x).cos(), torch.randn(4)))
    finally:
        torch._dynamo.trace_rules._disallowed_callable_ids.remove(id(op))
    assert observed[:3] == [True, True, 2]


def _positives(t):
    return int((t > 0).sum().item())


@torch.compiler.substitute_in_graph(_positives)
def _positives_traced(t):
    return (t > 0).sum()


def test_substitute_in_graph():
    observed = assert_like_torch(_graphs_scenario(lambda x: x * _positives(x), torch.randn(6)))
    assert observed == [True, True, 1, ["gt", "mul"]]


_SETTINGS = {"scale": 2.0}


@torch._dynamo.assume_constant_result
def _scale():
    return _SETTINGS["scale"]


@functools.lru_cache
def _lru_flag():
    return _SETTINGS["scale"] > 1


_lru_flag.__wrapped__._dynamo_marked_constant = True   # transformers' spelling, under lru_cache
_lru_flag.__dict__["_dynamo_marked_constant"] = True


def test_assume_constant_result():
    def scenario(api):
        def f(x):
            return x * _scale() if _lru_flag() else x
        _SETTINGS["scale"] = 2.0
        cnt = CompileCounter()
        c = api.compile(f, backend=cnt)
        seen = [c(torch.ones(2)).tolist(), cnt.frame_count]
        _SETTINGS["scale"] = 3.0     # a constant of the program: not guarded
        seen += [c(torch.full((2,), 3.0)).tolist(), cnt.frame_count]
        _SETTINGS["scale"] = 2.0
        _lru_flag.cache_clear()
        return seen
    assert assert_like_torch(scenario) == [[2.0, 2.0], 1, [6.0, 6.0], 1]


@pytest.mark.parametrize("query", ["is_compiling", "is_dynamo_compiling", "is_exporting"])
def test_is_compiling(query):
    ask = getattr(torch.compiler, query)

    def f(x):
        return x + 1 if ask() else x - 1
    observed = assert_like_torch(_graphs_scenario(f, torch.randn(3)))
    # Compiled, the compiler's branch is taken (eager's result differs), except for is_exporting.
    assert observed[:3] == [query == "is_exporting", query == "is_exporting", 1]
    assert not ask()     # outside, False
    # The compiler's branch taken on every call, with the values of each (not only unlike eager's).
    compiled = bytegraph.compile(f, backend=CompileCounter())
    for x in (torch.randn(3), torch.randn(3)):
        assert same(compiled(x), x - 1 if query == "is_exporting" else x + 1)


def test_graph_break_call():
    def f(x):
        y = x.sin()
        torch._dynamo.graph_break()
        return y.cos()
    assert assert_like_torch(_graphs_scenario(f, torch.randn(3)))[:3] == [True, True, 2]


def test_cudagraph_mark_step_begin():
    def f(x):
        torch.compiler.cudagraph_mark_step_begin()
        return x.sin() * 2
    assert assert_like_torch(_graphs_scenario(f, torch.randn(3)))[:3] == [True, True, 1]

    def scenario(api):   # diffusers' pattern: between calls of a compiled model
        c = api.compile(sin1, backend="eager")
        outs = []
        for k in range(2):
            torch.compiler.cudagraph_mark_step_begin()
            outs.append(observe(c, sin1, torch.full((2,), k + 1.0)))
        return outs
    assert assert_like_torch(scenario) == [True, True]


def test_nested_compile_region_is_pending():
    # docs/dropin.md lists it as pending (the higher-order operators issue): results stay eager's.
    @torch.compiler.nested_compile_region
    def block(x):
        return x.sin() * 2

    def f(x):
        return block(block(x))
    cnt = CompileCounter()
    c = bytegraph.compile(f, backend=cnt)
    x = torch.randn(3)
    assert same(c(x), f(x))
    assert cnt.frame_count == 1      # traced through the region (torch.compile: one graph too)


# --------------------------------------------------------------------- reset, explain, cache artifacts

@pytest.mark.parametrize("reset", ["torch.compiler.reset", "torch._dynamo.reset"])
def test_reset(reset):
    def scenario(api):
        cnt = CompileCounter()
        c = api.compile(sin1, backend=cnt)
        c(torch.ones(2))
        eval(reset)()
        c(torch.ones(2))
        return cnt.frame_count
    assert on_torch(scenario) == patched(scenario) == 2


def test_explain():
    def f(x):
        y = x.sin()
        print(end="")
        return torch.cos(y) + torch.tan(y)

    def scenario(api):
        out = torch._dynamo.explain(f)(torch.randn(3))
        return [out.graph_count, out.graph_break_count, out.op_count, len(out.break_reasons)]
    reference = on_torch(scenario)
    assert patched(scenario) == reference == [2, 1, 3, 1]
    out = bytegraph.explain(f)(torch.randn(3))
    assert [out.graph_count, out.graph_break_count, out.op_count] == reference[:3]


@pytest.mark.parametrize("with_patch", [False, True])
def test_save_and_load_cache_artifacts(tmp_path, caplog, with_patch):
    import logging

    def f(x):
        return (x.sin() * 2).sum(-1)
    if with_patch:
        bytegraph.patch_torch_compile()
    compile_fn = torch.compile if with_patch else bytegraph.compile
    torch.compiler._cache.CacheArtifactManager.clear()
    first, second = tmp_path / "first", tmp_path / "second"
    with bytegraph.config.patch(persistent_cache=True, cache_dir=str(first)):
        compile_fn(f, backend="eager")(torch.ones(3, 4))
        saved = torch.compiler.save_cache_artifacts()
    assert saved is not None and len(saved[1].bytegraph_artifacts) == 1
    bytegraph.reset()
    with bytegraph.config.patch(persistent_cache=True, cache_dir=str(second), log_topics=["cache"]):
        info = torch.compiler.load_cache_artifacts(saved[0])
        assert info.bytegraph_artifacts == saved[1].bytegraph_artifacts
        assert len(list(second.rglob("*" + persist._SUFFIX))) == 1
        caplog.set_level(logging.DEBUG, logger="bytegraph.cache")
        x = torch.randn(3, 4)
        assert same(compile_fn(f, backend="eager")(x), f(x))
    assert any("loaded from the persistent cache" in r.getMessage() for r in caplog.records)


# --------------------------------------------------------------------- torch._dynamo.config

def _recompiles(setting, value, sizes=(4, 5, 6, 7), dynamic=None):
    def scenario(api):
        def f(x):
            return x.sin() * 2
        cnt = CompileCounter()
        with torch._dynamo.config.patch(**{setting: value}), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            c = api.compile(f, backend=cnt, dynamic=dynamic)
            seen = [observe(c, f, torch.randn(n, 2)) for n in sizes]
        return seen + [cnt.frame_count]
    return scenario


@pytest.mark.parametrize("setting, value, dynamic, expected", [
    ("recompile_limit", 2, False, [True, True, True, True, 2]),
    ("cache_size_limit", 2, False, [True, True, True, True, 2]),
    ("automatic_dynamic_shapes", False, None, [True, True, True, True, 4]),
    ("assume_static_by_default", False, None, [True, True, True, True, 1]),
    ("error_on_recompile", True, None, [True, "RuntimeError: recompile", "RuntimeError: recompile",
                                        "RuntimeError: recompile", 1]),
])
def test_config_settings(setting, value, dynamic, expected):
    scenario = _recompiles(setting, value, dynamic=dynamic)
    assert on_torch(scenario) == patched(scenario) == expected
    # The bytegraph.config settings themselves, without the patch.
    name = {"recompile_limit": "cache_size_limit"}.get(setting, setting)
    if hasattr(bytegraph.config, name):
        def own(api):
            with bytegraph.config.patch(**{name: value}), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cnt = CompileCounter()
                c = bytegraph.compile(sin1, backend=cnt, dynamic=dynamic)
                return [observe(c, sin1, torch.randn(n, 2)) for n in (4, 5, 6, 7)] + [cnt.frame_count]
        assert plain(own) == expected


def test_accumulated_recompile_limit():
    def scenario(api):
        cnt = CompileCounter()
        with torch._dynamo.config.patch(accumulated_recompile_limit=2), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fns = [api.compile(lambda x, k=k: x * k, backend=cnt) for k in range(4)]
            return [same(f(torch.ones(2)), torch.ones(2) * k) for k, f in enumerate(fns)] + [cnt.frame_count]
    assert on_torch(scenario) == patched(scenario) == [True, True, True, True, 2]


def test_recompile_limit_argument_of_torch_compile():
    def scenario(api):
        cnt = CompileCounter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            c = api.compile(sin1, backend=cnt, dynamic=False, recompile_limit=1)
            seen = [observe(c, sin1, torch.randn(n)) for n in (2, 3, 4)]
        return seen + [cnt.frame_count]
    assert on_torch(scenario) == patched(scenario) == [True, True, True, 1]


def test_fullgraph_raises_at_the_recompile_limit():
    def scenario(api):
        with torch._dynamo.config.patch(recompile_limit=1), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            c = api.compile(sin1, backend="eager", dynamic=False, fullgraph=True)
            c(torch.ones(2))
            try:
                c(torch.ones(3))
            except Exception:     # torch: FailOnRecompileLimitHit; bytegraph: RecompileError
                return "raised"
            return "ran"
    assert on_torch(scenario) == patched(scenario) == "raised"


def test_settings_carried_into_bytegraph_config_and_given_back():
    before = bytegraph.config.as_dict()
    cnt = CompileCounter()
    with torch._dynamo.config.patch(suppress_errors=True, optimize_ddp=False, recompile_limit=3):
        bytegraph.patch_torch_compile()
        bytegraph.compile(sin1, backend=cnt)(torch.ones(2))     # settings are read before a compile
        assert bytegraph.config.cache_size_limit == 3
        assert bytegraph.config.optimize_ddp is False
        torch._dynamo.config.suppress_errors = False                # changed again: carried again
        bytegraph.compile(sin1, backend="eager")(torch.ones(3))
        assert bytegraph.config.suppress_errors is False
        bytegraph.config.cache_size_limit = 5                        # set on bytegraph: kept
        bytegraph.compile(sin1, backend=cnt)(torch.ones(4))
        assert bytegraph.config.cache_size_limit == 5
        bytegraph.unpatch_torch_compile()
    assert cnt.frame_count == 2     # the compiles read the settings, then compiled (sizes 2 and 4)
    assert bytegraph.config.as_dict() == dict(before, cache_size_limit=5)


@pytest.mark.parametrize("setting, value", [
    ("force_parameter_static_shapes", False), ("optimize_ddp", "python_reducer"),
    ("skip_fwd_side_effects_in_bwd_under_checkpoint", True),
])
def test_settings_without_equivalent_warn_once(setting, value):
    sys.modules["bytegraph.config"]._warned.discard(setting)
    bytegraph.patch_torch_compile()
    cnt = CompileCounter()
    with torch._dynamo.config.patch(**{setting: value}):
        with pytest.warns(RuntimeWarning, match=setting):
            bytegraph.compile(sin1, backend=cnt)(torch.ones(2))
        with warnings.catch_warnings():
            warnings.simplefilter("error")       # once
            bytegraph.compile(sin1, backend=cnt)(torch.ones(3))
    assert cnt.frame_count == 2     # warned, and compiled all the same (each compile a graph)


def test_capture_scalar_outputs_is_carried_and_captures():
    def f(x):
        return x * x.sum().item()

    def scenario(api):
        cnt = CompileCounter()
        with torch._dynamo.config.patch(capture_scalar_outputs=True), warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)     # a real mode now: no warning
            c = api.compile(f, backend=cnt)
            return [observe(c, f, torch.randn(3)), cnt.frame_count]
    assert on_torch(scenario) == [True, 1]
    assert patched(scenario) == [True, 1]      # .item() an unbacked SymFloat in the graph


def test_capture_dynamic_output_shape_ops_is_carried_and_captures():
    def f(x):
        return x[x > 0] * 2

    def scenario(api):
        cnt = CompileCounter()
        with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True), warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            c = api.compile(f, backend=cnt)
            return [observe(c, f, torch.randn(5)), cnt.frame_count]
    assert on_torch(scenario) == patched(scenario) == [True, 1]


def test_inline_inbuilt_nn_modules_is_a_no_op_in_both():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())

    def scenario(api):
        cnt = CompileCounter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch._dynamo.config.patch(inline_inbuilt_nn_modules=False):
                c = api.compile(model, backend=cnt)
                x = torch.randn(2, 3)
                return [same(c(x), model(x)), cnt.frame_count]
    assert on_torch(scenario) == patched(scenario) == [True, 1]


# --------------------------------------------------------------------- library patterns

def test_compiled_module_is_torch_optimized_module_under_patch():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
    bytegraph.patch_torch_compile()
    cnt = CompileCounter()
    compiled = torch.compile(model, backend=cnt)
    from torch._dynamo.eval_frame import OptimizedModule
    assert isinstance(compiled, OptimizedModule) and isinstance(compiled, bytegraph.OptimizedModule)
    assert compiled._orig_mod is model
    # diffusers' unwrap_module / is_compiled_module
    unwrapped = compiled._orig_mod if isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule) else compiled
    assert unwrapped is model
    x = torch.randn(2, 3)
    assert same(compiled(x), model(x))
    assert cnt.frame_count == 1
    assert compiled.training == model.training
    compiled.eval()
    assert not model.training
    assert list(compiled.state_dict()) == list(model.state_dict())
    # Putting the module back (accelerate's extract_model_from_parallel) keeps the tree sound.
    compiled._orig_mod = model
    assert "_orig_mod" not in model._modules
    other = torch.nn.Linear(3, 3)
    compiled._orig_mod = other
    assert compiled._orig_mod is other and same(compiled(x), other(x))
    bytegraph.unpatch_torch_compile()
    assert type(bytegraph.compile(model, backend="eager")) is bytegraph.OptimizedModule


def test_accelerate_unwraps_and_rewraps_a_compiled_model():
    other = pytest.importorskip("accelerate.utils.other")
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
    bytegraph.patch_torch_compile()
    cnt = CompileCounter()
    compiled = torch.compile(model, backend=cnt)
    assert other.is_compiled_module(compiled)
    assert other.extract_model_from_parallel(compiled, keep_torch_compile=False) is model
    kept = other.extract_model_from_parallel(compiled, keep_torch_compile=True)
    assert kept is compiled and kept._orig_mod is model
    x = torch.randn(2, 3)
    assert same(kept(x), model(x))
    assert cnt.frame_count == 1
    assert list(kept.state_dict()) == list(model.state_dict())


def test_accelerate_compile_regions():
    other = pytest.importorskip("accelerate.utils.other")
    blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(3)])
    bytegraph.patch_torch_compile()
    cnt = CompileCounter()
    regions = other.compile_regions(blocks, backend=cnt)
    assert all(other.is_compiled_module(r) for r in regions) and regions.__dict__["_orig_mod"] is blocks
    x = torch.randn(2, 4)
    expected, out = x, x
    for block, compiled in zip(blocks, regions):
        expected, out = block(expected), compiled(out)
    assert same(out, expected)
    # A graph per block: bytegraph guards the block it traced (torch.compile makes 2, its
    # parameters being graph inputs: the second block recompiles, the third reuses that graph).
    assert cnt.frame_count == 3
    # A difference (docs/dropin.md): bytegraph's compiled view hands its module tree over to the module
    # (no "_orig_mod." level), so modules() of a container never meets the view and accelerate's
    # has_compiled_regions says False; unwrapping then keeps the compiled blocks, which compute the same.
    assert not other.has_compiled_regions(regions)


def test_peft_hotswap_sees_compiled_models():
    # peft.utils.hotswap: is_compiled = hasattr(model, "_orig_mod") or getattr(model, "_compiled_call_impl", False)
    model = torch.nn.Linear(3, 3)
    bytegraph.patch_torch_compile()
    assert hasattr(torch.compile(model, backend="eager"), "_orig_mod")
    cnt = CompileCounter()
    model.compile(backend=cnt)
    assert getattr(model, "_compiled_call_impl", False)
    x = torch.randn(2, 3)
    assert same(model(x), torch.nn.functional.linear(x, model.weight, model.bias))
    assert cnt.frame_count == 1


def test_static_cache_pattern():
    # transformers' StaticCache: cache tensors marked with mark_static_address, written in place.
    class StaticCache:
        def __init__(self):
            self.keys = torch.zeros(1, 8, 4)
            torch._dynamo.mark_static_address(self.keys)

        def update(self, pos, k):
            self.keys.index_copy_(1, pos, k)
            return self.keys

    def step(cache, pos, k):
        return cache.update(pos, k).sum(1)

    def scenario(api):
        cache, ref = StaticCache(), StaticCache()
        cnt = CompileCounter()
        c = api.compile(step, backend=cnt)
        seen = []
        for i in range(3):
            k = torch.full((1, 1, 4), float(i + 1))
            pos = torch.tensor([i])
            seen.append(same(c(cache, pos, k), step(ref, pos, k)))
        return seen + [same(cache.keys, ref.keys), cnt.frame_count]
    assert assert_like_torch(scenario) == [True, True, True, True, 1]


def test_static_address_under_cuda_graphs_warns_once():
    if not torch.cuda.is_available():
        pytest.skip("CUDA graphs need a GPU")
    sys.modules["bytegraph.config"]._warned.discard("mark_static_address")
    x = torch.randn(4, device="cuda")
    torch._dynamo.mark_static_address(x)
    with pytest.warns(RuntimeWarning, match="mark_static_address"):
        out = bytegraph.compile(sin1, mode="reduce-overhead")(x)
    assert same(out, sin1(x))


def test_transformers_helpers_under_patch():
    import_utils = pytest.importorskip("transformers.utils.import_utils")

    def f(x):
        return x + 1 if import_utils.is_torchdynamo_compiling() else x - 1
    cnt = CompileCounter()
    bytegraph.patch_torch_compile()
    assert same(torch.compile(f, backend=cnt)(torch.zeros(2)), torch.ones(2))
    assert cnt.frame_count == 1 and not import_utils.is_torchdynamo_compiling()


def test_patch_does_not_import_torch_dynamo():
    code = ("import sys, bytegraph; bytegraph.patch_torch_compile(); import torch\n"
            "torch.compiler.set_stance('force_eager'); torch.compiler.set_stance('default'); torch.compiler.reset()\n"
            "print('torch._dynamo' in sys.modules)\n"
            "import torch._dynamo; print(torch._dynamo.set_stance is bytegraph.set_stance)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]


def test_hit_path_unchanged_by_the_default_stance():
    # The default stance adds nothing to a call: the wrapper scans the same dispatch list.
    cnt = CompileCounter()
    c = bytegraph.compile(sin1, backend=cnt)
    c(torch.ones(2))
    cache = c._bytegraph_cache
    assert len(cache.entries) == cnt.frame_count == 1
    assert cache.dispatch == [e.guard for e in cache.entries]
    with bytegraph.set_stance("force_eager"):
        assert cache.dispatch == []
    assert cache.dispatch == [e.guard for e in cache.entries]


def test_audit_covers_the_installed_libraries():
    """Every use of torch.compiler / torch._dynamo in the installed libraries has a row (docs/dropin.md)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
    try:
        import dropin_audit
    finally:
        sys.path.pop(0)
    found = dropin_audit.audit()
    if not found:
        pytest.skip("none of transformers, diffusers, accelerate, peft is installed")
    missing = {api for uses in found.values() for api in uses if api not in dropin_audit.ROWS}
    assert not missing, f"uses with no row in scripts/dropin_audit.py ROWS (and docs/dropin.md): {missing}"
    tests = {name for name in globals() if name.startswith("test_")}
    for api, (_, _, named) in list(dropin_audit.ROWS.items()) + list(dropin_audit.OTHER_ROWS.items()):
        for test in named.split(", "):
            assert test.split("[")[0].split(" ")[0] in tests, f"row {api} names a test that does not exist: {test}"
