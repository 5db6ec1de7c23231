"""A pytest plugin that breaks bytegraph on purpose, in memory, for ``scripts/mutate.py``.

Loaded with ``-p bytegraph_mutations`` (``scripts/`` on ``PYTHONPATH``); the break is chosen by
the environment variable ``BYTEGRAPH_MUTATION`` (one of ``MUTATIONS``). The package itself has
no hook for this: each break replaces one of its functions, as a bug there would.

Every break counts, per test item, how often it changed what bytegraph did (``fired``): a frame
that ran eagerly instead of being traced, a graph call answered from the memo, a guard that
would have failed and passed, a trace whose side effects were dropped, a resume function that
was skipped. The count goes into the item's ``user_properties`` (and so into ``--junitxml``),
so the runner can tell the items a break reached from the items it never touched. An item
marked ``mutation_blind`` for the break (it cannot notice it, and says why) gets the property
``mutation_blind``; the runner counts it apart.

A break can make a test loop forever (a memoised graph answering a ``while`` condition the
same way every time): each item fails after ``BYTEGRAPH_MUTATION_TIMEOUT`` seconds (default 60).
"""
import os
import signal

import pytest

MUTATIONS = {
    "dead_tracer": "every frame not compiled with fullgraph=True runs eagerly",
    "memo_graph": "every compiled graph returns its first call's outputs forever",
    "no_guards": "every guard passes",
    "no_side_effects": "side effects traced in a frame are not done after its graph",
    "skip_resume": "a resume function after a graph break returns None at once (the rest of the frame is skipped)",
}

_fired = [0]


def _fire():
    _fired[0] += 1


def _dead_tracer():
    from bytegraph.errors import Unsupported
    from bytegraph.runtime import compile_frame as cf
    real = cf._compile

    def dead(c, fn, frame_args, compiler):
        if compiler.fullgraph:
            return real(c, fn, frame_args, compiler)
        _fire()
        err = Unsupported("mutation dead_tracer: the frame was not traced")
        err.user_stack = [cf.function_entry(fn)]
        return cf._fallback(c, err)
    cf._compile = dead


def _memo_graph():
    from bytegraph.runtime import compile_frame as cf
    real = cf._Compile.compile_graph

    def compile_graph(self, gm, example_inputs):
        compiled = real(self, gm, example_inputs)
        memo = []

        def remembered(*args, **kwargs):
            if memo:
                _fire()
                return memo[0]
            out = compiled(*args, **kwargs)
            memo.append(out)
            return out
        return remembered
    cf._Compile.compile_graph = compile_graph


def _no_guards():
    from bytegraph.runtime import compile_frame as cf
    real = cf.compile_guards

    def compile_guards(guards, params, fn_globals, name="guard", hit=True):
        check, explain, source = real(guards, params, fn_globals, name=name, hit=hit)

        def passes(*args):
            if check(*args) is None:
                _fire()
            return hit
        passes.__dict__.update(getattr(check, "__dict__", {}))
        return passes, explain, source
    cf.compile_guards = compile_guards


def _no_side_effects():
    from bytegraph.codegen import breaks, transformed
    real = transformed.replay_side_effects

    def replay_side_effects(tx, rb, live=()):
        if tx.effects.has_any():
            _fire()
            return []
        return real(tx, rb, live)
    transformed.replay_side_effects = replay_side_effects
    breaks.replay_side_effects = replay_side_effects


def _skip_resume():
    from bytegraph.codegen import breaks

    def resume_wrapper(compiler, fn, code, offset, layout, live):
        def skipped(*args):
            _fire()
            return None
        return skipped
    breaks._resume_wrapper = resume_wrapper


_APPLY = {"dead_tracer": _dead_tracer, "memo_graph": _memo_graph, "no_guards": _no_guards,
          "no_side_effects": _no_side_effects, "skip_resume": _skip_resume}


def pytest_configure(config):
    name = os.environ.get("BYTEGRAPH_MUTATION", "")
    if not name:
        return
    if name not in _APPLY:
        raise pytest.UsageError(f"BYTEGRAPH_MUTATION={name!r}: not one of {', '.join(_APPLY)}")
    _APPLY[name]()


def _blind(item):
    """Does the item say (``@pytest.mark.mutation_blind("memo_graph", reason=...)``) that it cannot
    notice the break applied now?"""
    name = os.environ.get("BYTEGRAPH_MUTATION", "")
    return any(name in mark.args for mark in item.iter_markers("mutation_blind"))


class MutationTimeout(BaseException):
    """Not an Exception: code that catches those (the tests' own helpers, bytegraph) lets it pass."""


def _timed_out(signum, frame):
    raise MutationTimeout(f"the test ran longer than {_timeout()} s under the mutation")


def _timeout():
    return int(os.environ.get("BYTEGRAPH_MUTATION_TIMEOUT", "60"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _fired[0] = 0
    mutated = bool(os.environ.get("BYTEGRAPH_MUTATION"))
    if mutated:
        previous = signal.signal(signal.SIGALRM, _timed_out)
        signal.alarm(_timeout())
    try:
        return (yield)
    finally:
        if mutated:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.when == "teardown":
        item.user_properties.append(("mutation_fired", _fired[0]))
        if _blind(item):
            item.user_properties.append(("mutation_blind", 1))
        report.user_properties = list(item.user_properties)
    return report
