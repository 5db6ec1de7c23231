"""Recompile reasons, the cache-size limits, CompileProfiler, compile_times() and frozen
``bytegraph.run``. Every compiled call is compared with eager."""
import logging
import re
import time
import warnings

import pytest
import torch
import torch.nn as nn

import bytegraph
from bytegraph.debug import records
from bytegraph.testing import CompileCounter
from helpers import assert_same, compile_counted

PHASES = ("bytecode tracing", "fake-tensor propagation", "guard building", "code generation",
          "backend compile")

LR = 0.1


def t(*shape, **kw):
    return torch.randn(*shape, **kw)


def recompile_logs(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "bytegraph.recompiles"]


def expect_recompile(caplog, compiled, fn, first, second, expected, setup=None):
    """Call with ``first`` (compiles), run ``setup``, call with ``second`` (must recompile
    because of ``expected``); results compared with eager; the reason is recorded and logged."""
    with bytegraph.config.patch(log_topics=["recompiles"]):
        assert_same(fn(*first), compiled(*first))
        assert records.recompiles == []
        assert recompile_logs(caplog) == []
        if setup is not None:
            setup()
        assert_same(fn(*second), compiled(*second))
    assert len(records.recompiles) == 1, [r.reason for r in records.recompiles]
    rec = records.recompiles[-1]
    assert expected in rec.reason, f"reason {rec.reason!r} does not contain {expected!r}"
    assert rec.gave_up is False
    assert rec.name.endswith(fn.__name__)
    logs = recompile_logs(caplog)
    assert len(logs) == 1 and expected in logs[0] and fn.__name__ in logs[0], logs
    levels = [r.levelno for r in caplog.records if r.name == "bytegraph.recompiles"]
    assert levels == [logging.DEBUG]
    return rec


# ------------------------------------------------------------ recompile reasons

def test_reason_size(caplog):
    def size_fn(x):
        return x.cos() + 1

    compiled, cnt = compile_counted(size_fn)
    expect_recompile(caplog, compiled, size_fn, (t(4, 3),), (t(8, 3),),
                     "size of x (dim 0): expected 4, got 8")
    assert cnt.frame_count == 2


def test_reason_global_changed(caplog):
    def uses_lr(x):
        return x * LR

    def set_lr():
        globals()["LR"] = 0.2

    compiled, cnt = compile_counted(uses_lr)
    try:
        expect_recompile(caplog, compiled, uses_lr, (t(3),), (t(3),), "global LR changed: 0.1 -> 0.2",
                         setup=set_lr)
        x = t(3)
        assert_same(x * 0.2, compiled(x))
    finally:
        globals()["LR"] = 0.1
    assert cnt.frame_count == 2
    x = t(3)
    assert_same(x * 0.1, compiled(x))        # the first entry is still valid
    assert cnt.frame_count == 2


class TrainFlag(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        if self.training:
            return self.lin(x) * 2
        return self.lin(x) + 1


def test_reason_module_training(caplog):
    mod = TrainFlag()
    cnt = CompileCounter()
    compiled = bytegraph.compile(mod, backend=cnt)
    x = t(2, 3)
    with bytegraph.config.patch(log_topics=["recompiles"]):
        assert_same(mod(x), compiled(x))
        compiled.eval()
        assert mod.training is False
        assert_same(mod(x), compiled(x))
    assert cnt.frame_count == 2
    assert "self.training changed: True -> False" in records.recompiles[-1].reason
    logs = recompile_logs(caplog)
    assert len(logs) == 1 and "self.training changed: True -> False" in logs[0]


def test_reason_dtype(caplog):
    def dtype_fn(x):
        return x * 2 + 1

    x = t(4)
    compiled, cnt = compile_counted(dtype_fn)
    expect_recompile(caplog, compiled, dtype_fn, (x,), (x.double(),),
                     "dtype of x changed: expected torch.float32, got torch.float64")
    assert compiled(x.double()).dtype == torch.float64
    assert cnt.frame_count == 2


def test_reason_grad_mode(caplog):
    def grad_fn(x):
        return x.sin() * 3

    compiled, cnt = compile_counted(grad_fn)
    x = t(4, requires_grad=True)
    with bytegraph.config.patch(log_topics=["recompiles"]):
        assert_same(grad_fn(x), compiled(x))
        with torch.no_grad():
            out = compiled(x)
            assert_same(grad_fn(x), out)
            assert out.requires_grad is False
    assert cnt.frame_count == 2
    rec = records.recompiles[-1]
    assert "grad mode changed: True -> False" in rec.reason
    logs = recompile_logs(caplog)
    assert len(logs) == 1 and "grad mode changed: True -> False" in logs[0]


def test_reason_int_argument(caplog):
    def int_fn(x, n):
        return x * n

    compiled, cnt = compile_counted(int_fn)
    x = t(3)
    expect_recompile(caplog, compiled, int_fn, (x, 2), (x, 3), "n changed: 2 -> 3")


def test_no_recompile_log_without_topic(caplog):
    def quiet(x):
        return x + 1

    compiled, _ = compile_counted(quiet)
    for b in (2, 5):
        x = t(b)
        assert_same(quiet(x), compiled(x))
    assert len(records.recompiles) == 1          # still recorded
    assert recompile_logs(caplog) == []           # but not logged


# ------------------------------------------------------------ cache limits

def test_cache_size_limit_falls_back_to_eager():
    def limited_fn(x):
        return x.sum(0) * 2 + 1

    compiled, cnt = compile_counted(limited_fn, dynamic=False)
    with bytegraph.config.patch(cache_size_limit=2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for b in (2, 3, 4, 5):
                x = t(b, 3)
                assert_same(limited_fn(x), compiled(x))
            assert cnt.frame_count == 2
            # Later calls: correct, no more compiles, no more warnings (cached shapes still hit).
            for b in (6, 2, 3, 4, 7):
                x = t(b, 3)
                assert_same(limited_fn(x), compiled(x))
            assert cnt.frame_count == 2
    ours = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(ours) == 1, [str(w.message) for w in ours]
    msg = str(ours[0].message)
    assert "limited_fn" in msg and "size of" in msg and "cache_size_limit" in msg, msg
    assert "size of x (dim 0): expected 3, got 4" in msg, msg
    assert [r.gave_up for r in records.recompiles] == [False, True]


def test_cache_size_limit_default_is_8():
    assert bytegraph.config.cache_size_limit == 8

    def many(x):
        return x - 1

    compiled, cnt = compile_counted(many, dynamic=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for b in range(1, 12):
            x = t(b)
            assert_same(many(x), compiled(x))
    assert cnt.frame_count == 8
    assert len([w for w in caught if issubclass(w.category, RuntimeWarning)]) == 1


def test_accumulated_cache_size_limit():
    def acc_a(x):
        return x * 2

    def acc_b(x):
        return x * 3

    ca, cnt_a = compile_counted(acc_a, dynamic=False)
    cb, cnt_b = compile_counted(acc_b, dynamic=False)
    with bytegraph.config.patch(accumulated_cache_size_limit=3):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for b in (2, 3):
                x = t(b)
                assert_same(acc_a(x), ca(x))
            x = t(2)
            assert_same(acc_b(x), cb(x))
            assert (cnt_a.frame_count, cnt_b.frame_count) == (2, 1)
            assert caught == []
            # Three entries exist over both frames: the next recompile of either gives up.
            for b in (3, 4, 2, 5):
                x = t(b)
                assert_same(acc_b(x), cb(x))
            x = t(4)
            assert_same(acc_a(x), ca(x))
            assert (cnt_a.frame_count, cnt_b.frame_count) == (2, 1)
    msgs = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(msgs) == 2, msgs
    assert "acc_b" in msgs[0] and "accumulated_cache_size_limit" in msgs[0], msgs
    assert "acc_a" in msgs[1] and "accumulated_cache_size_limit" in msgs[1], msgs


# ------------------------------------------------------------ CompileProfiler

def profiled_fn(x):
    y = x.sin()
    print("profiling")
    return y + 1


def test_compile_profiler_report(capsys):
    with bytegraph.config.patch(cache_size_limit=5):
        with bytegraph.CompileProfiler() as prof:
            assert bytegraph.config.cache_size_limit == 1
            compiled = bytegraph.compile(profiled_fn, backend=prof, dynamic=False)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for b in (3, 4, 5):
                    x = t(b)
                    assert_same(profiled_fn(x), compiled(x))
        assert bytegraph.config.cache_size_limit == 5, "profiler did not restore cache_size_limit"
    out = capsys.readouterr().out
    assert out.count("profiling") == 6          # eager and compiled each printed 3 times
    assert len([w for w in caught if issubclass(w.category, RuntimeWarning)]) == 1

    report = prof.report()
    code = profiled_fn.__code__
    assert "profiled_fn" in report
    assert f"{code.co_filename}:{code.co_firstlineno}" in report, report
    assert "resume_in_profiled_fn" in report, report
    assert "graph break" in report.lower(), report
    assert "print" in report, report
    assert re.search(r"graphs:\s*2\b", report), report       # before and after the print
    assert re.search(r"ops:\s*2\b", report), report          # sin, add
    failed = [line for line in report.splitlines() if "failed guard" in line]
    assert len(failed) == 1, report          # cache limit 1: one recompile attempt, then eager
    assert "size of x (dim 0): expected 3, got 4" in failed[0], report
    assert "profiled_fn" in failed[0]
    assert prof.report() == report           # stable after the block


def test_compile_profiler_restores_limit_on_error():
    before = bytegraph.config.cache_size_limit
    with pytest.raises(ValueError):
        with bytegraph.CompileProfiler():
            assert bytegraph.config.cache_size_limit == 1
            raise ValueError("boom")
    assert bytegraph.config.cache_size_limit == before


def test_compile_profiler_no_recompiles():
    def plain(x):
        return x.relu() * 2

    with bytegraph.CompileProfiler() as prof:
        compiled = bytegraph.compile(plain, backend=prof)
        x = t(3)
        assert_same(plain(x), compiled(x))
        y = t(3)
        assert_same(plain(y), compiled(y))
    report = prof.report()
    assert "plain" in report and "failed guard" not in report
    assert re.search(r"graphs:\s*1\b", report) and re.search(r"ops:\s*2\b", report), report


# ------------------------------------------------------------ compile_times

def timed_fn(x):
    return (x @ x.T).relu().sum(0) + x.mean()


def frame_keys(d, name):
    return [k for k in d if k != "total" and k.split(".")[-1] == name]


def test_compile_times_dict():
    compiled, _ = compile_counted(timed_fn)
    x = t(4, 4)
    start = time.perf_counter()
    out = compiled(x)
    wall = time.perf_counter() - start
    assert_same(timed_fn(x), out)
    d = bytegraph.compile_times(repr="dict")
    assert "total" in d
    keys = frame_keys(d, "timed_fn")
    assert len(keys) == 1, d.keys()
    phases = d[keys[0]]
    for p in PHASES:
        assert p in phases, f"phase {p!r} missing: {phases}"
        assert phases[p] >= 0
    spent = sum(phases[p] for p in PHASES)
    assert 0 < spent <= wall, (spent, wall)
    frames = [k for k in d if k != "total"]
    for p in PHASES:
        assert d["total"][p] == pytest.approx(sum(d[k].get(p, 0.0) for k in frames), abs=1e-9)


def test_compile_times_accumulate_and_total_over_frames():
    def other_fn(x):
        return x.exp() - 1

    c1, _ = compile_counted(timed_fn)
    c2, _ = compile_counted(other_fn)
    for b in (3, 5):
        x = t(b, b)
        assert_same(timed_fn(x), c1(x))
        assert_same(other_fn(x), c2(x))
    d = bytegraph.compile_times(repr="dict")
    frames = [k for k in d if k != "total"]
    assert len(frame_keys(d, "timed_fn")) == 1 and len(frame_keys(d, "other_fn")) == 1, frames
    for p in PHASES:
        assert d["total"][p] == pytest.approx(sum(d[k].get(p, 0.0) for k in frames), abs=1e-9)
    agg = bytegraph.compile_times(repr="dict", aggregate=True)
    assert list(agg) == ["total"]
    for p in PHASES:
        assert agg["total"][p] == pytest.approx(d["total"][p])
    header, rows = bytegraph.compile_times(repr="csv")
    row = [r for r in rows if r[0] == frame_keys(d, "timed_fn")[0]][0]
    assert row[1] == 2                      # compiled twice (automatic dynamic)


def test_compile_times_str_csv_and_reset():
    compiled, _ = compile_counted(timed_fn)
    x = t(3, 3)
    assert_same(timed_fn(x), compiled(x))
    text = bytegraph.compile_times()
    assert isinstance(text, str) and "timed_fn" in text
    for p in PHASES:
        assert p in text
    assert "total" in text
    header, rows = bytegraph.compile_times(repr="csv")
    assert tuple(header[:2]) == ("frame", "compiles") and tuple(header[2:]) == PHASES
    names = [r[0] for r in rows]
    assert any(n.split(".")[-1] == "timed_fn" for n in names) and names[-1] == "total"
    for r in rows:
        assert len(r) == len(header)
        assert all(isinstance(v, float) and v >= 0 for v in r[2:])
    frame_row = [r for r in rows if r[0].split(".")[-1] == "timed_fn"][0]
    assert frame_row[1] == 1 and sum(frame_row[2:]) > 0

    bytegraph.reset()
    d = bytegraph.compile_times(repr="dict")
    assert list(d) == ["total"] and all(v == 0 for v in d["total"].values()), d
    header, rows = bytegraph.compile_times(repr="csv")
    assert len(rows) == 1 and rows[0][0] == "total" and rows[0][1] == 0
    assert "timed_fn" not in bytegraph.compile_times()


def test_compile_times_bad_repr():
    with pytest.raises(bytegraph.BytegraphError):
        bytegraph.compile_times(repr="json")


# ------------------------------------------------------------ frozen run()

class CallCounter(CompileCounter):
    """CompileCounter whose compiled graphs also count how often they run."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __call__(self, gm, example_inputs):
        forward = super().__call__(gm, example_inputs)

        def run(*args):
            self.calls += 1
            return forward(*args)
        return run


def frozen_fn(x):
    return x.cos() * 2 + 1


def test_frozen_run_uses_cache_never_compiles():
    cnt = CallCounter()
    compiled = bytegraph.compile(frozen_fn, backend=cnt)
    x3 = t(3)
    assert_same(frozen_fn(x3), compiled(x3))
    assert (cnt.frame_count, cnt.calls) == (1, 1)
    frames_before = len(records.frames)

    frozen = bytegraph.run(compiled)
    x5 = t(5)
    assert_same(frozen_fn(x5), frozen(x5))             # a miss: runs eagerly
    assert (cnt.frame_count, cnt.calls) == (1, 1), "frozen run compiled or ran a graph on a miss"
    assert len(records.frames) == frames_before and records.recompiles == []
    x3 = t(3)
    assert_same(frozen_fn(x3), frozen(x3))             # a hit: the cached graph runs
    assert (cnt.frame_count, cnt.calls) == (1, 2)
    assert_same(frozen_fn(x5.double()), frozen(x5.double()))
    assert cnt.frame_count == 1

    # Outside run() compiling works again (frozen mode was only for those calls).
    assert_same(frozen_fn(x5), compiled(x5))
    assert cnt.frame_count == 2


def test_frozen_run_of_original_function():
    cnt = CallCounter()
    compiled = bytegraph.compile(frozen_fn, backend=cnt)
    x = t(3)
    compiled(x)
    frozen = bytegraph.run(frozen_fn)                  # the function itself, not the wrapper
    w = t(3)
    assert_same(frozen_fn(w), frozen(w))
    y = t(3)
    assert_same(frozen_fn(y), frozen(y))
    assert cnt.calls == 3 and cnt.frame_count == 1
    z = t(6)
    assert_same(frozen_fn(z), frozen(z))
    assert cnt.frame_count == 1


def test_frozen_run_restores_mode_after_error():
    def may_fail(x):
        return x.view(3) + 1

    cnt = CallCounter()
    compiled = bytegraph.compile(may_fail, backend=cnt)
    compiled(t(3))
    frozen = bytegraph.run(compiled)
    with pytest.raises(RuntimeError):
        frozen(t(4))
    x = t(1, 3)
    assert_same(may_fail(x), compiled(x))
    assert cnt.frame_count == 2, "compiling stayed frozen after an exception in run()"


class SmallNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(3, 8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.mark.parametrize("which", ["optimized", "original"])
def test_frozen_run_module(which):
    net = SmallNet()
    cnt = CallCounter()
    compiled = bytegraph.compile(net, backend=cnt)
    x = t(4, 3)
    assert_same(net(x), compiled(x))
    assert (cnt.frame_count, cnt.calls) == (1, 1)
    frozen = bytegraph.run(compiled if which == "optimized" else net)
    x = t(4, 3)
    assert_same(net(x), frozen(x))
    assert (cnt.frame_count, cnt.calls) == (1, 2), "a cache hit should run the compiled graph"
    y = t(6, 3)
    assert_same(net(y), frozen(y))
    assert (cnt.frame_count, cnt.calls) == (1, 2), "a miss must run eagerly without compiling"
    net.eval()                               # guard on training fails: eager again
    assert_same(net(x), frozen(x))
    assert cnt.frame_count == 1


@pytest.mark.parametrize("enabled_before", [True, False])
def test_cyclic_gc_is_paused_while_a_frame_is_traced_and_put_back_after(monkeypatch, enabled_before):
    import gc
    from bytegraph.runtime import compile_frame
    seen = []
    real = compile_frame.trace_frame

    def watching(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    def breaks(x):
        y = x + 1
        print("break")          # an Unsupported in the first trace, then a trace up to it
        return y * 2

    monkeypatch.setattr(compile_frame, "trace_frame", watching)
    (gc.enable if enabled_before else gc.disable)()
    try:
        x = torch.randn(3)
        torch.testing.assert_close(bytegraph.compile(breaks, backend="eager")(x), breaks(x))
        assert seen and not any(seen)
        assert gc.isenabled() is enabled_before
    finally:
        gc.enable()
