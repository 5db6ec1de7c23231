"""config.replay_record_enabled: an internal tracing error writes a record; bytegraph.replay
retraces that frame in a fresh process and meets the same error."""
import os
import subprocess
import sys

import pytest
import torch

import bytegraph
import replay_fault

# These tests are about the eager fallback after an internal error itself.
pytestmark = pytest.mark.suppress_errors

OFFSET = 0.5


def helper(t):
    return t * 3


def deliberately_failing(x, n=2, *rest, scale=1.0, **extra):
    return helper(x) * scale + n + OFFSET + len(rest) + len(extra)


@pytest.fixture
def recording(tmp_path):
    bytegraph.config.replay_record_enabled = True
    bytegraph.config.replay_record_dir = str(tmp_path)
    replay_fault.install()
    yield tmp_path
    replay_fault.uninstall()
    bytegraph.config.replay_record_enabled = False
    bytegraph.config.replay_record_dir = ""


def fresh_python(code):
    tests = os.path.dirname(__file__)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(bytegraph.__file__)), tests]))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_replay_reproduces_an_internal_error_in_a_fresh_process(recording):
    x = torch.randn(3)
    args, kwargs = (x, 4, "a", "b"), {"scale": 2.0, "tag": 1}
    compiled = bytegraph.compile(deliberately_failing, backend="eager")
    # The error is suppressed: the frame runs eagerly, with the same result.
    torch.testing.assert_close(compiled(*args, **kwargs), deliberately_failing(*args, **kwargs))
    (record,) = list(recording.iterdir())
    assert record.name == "replay_deliberately_failing_1.pt"
    out = fresh_python(f"import replay_fault, bytegraph; replay_fault.install(); bytegraph.replay({str(record)!r})")
    assert out.returncode == 1
    assert "replay_fault.DeliberateTracerBug: the tracer failed on deliberately_failing" in out.stderr
    assert "bytegraph/runtime/compile_frame.py" in out.stderr      # raised from inside bytegraph
    # Without the fault, the replayed frame compiles and gives the recorded call's result:
    # the function, the globals it read, the arguments and defaults were all recorded.
    out = fresh_python(f"import bytegraph; print(bytegraph.replay({str(record)!r}).tolist())")
    assert out.returncode == 0, out.stderr
    expected = deliberately_failing(*args, **kwargs)
    assert [round(v, 4) for v in eval(out.stdout)] == [round(v, 4) for v in expected.tolist()]


def test_the_fallback_reason_names_the_record(recording, capsys):
    explained = bytegraph.explain(deliberately_failing)(torch.randn(2))
    (reason,) = explained.break_reasons
    assert "internal error while tracing: DeliberateTracerBug" in reason.reason
    assert f"replay record: {recording}" in reason.reason


def test_no_record_when_off(tmp_path):
    replay_fault.install()
    try:
        bytegraph.config.replay_record_dir = str(tmp_path)
        bytegraph.compile(deliberately_failing, backend="eager")(torch.randn(2))
    finally:
        replay_fault.uninstall()
        bytegraph.config.replay_record_dir = ""
    assert list(tmp_path.iterdir()) == []


def test_replay_of_something_else_is_a_clear_error(tmp_path):
    path = tmp_path / "x.pt"
    torch.save({"a": 1}, path)
    with pytest.raises(bytegraph.BytegraphError, match="is not a bytegraph replay record"):
        bytegraph.replay(str(path))
    with pytest.raises(bytegraph.BytegraphError, match="no record at"):
        bytegraph.replay(str(tmp_path / "missing.pt"))


def test_a_replay_traces_even_when_the_persistent_cache_holds_the_frame(recording, tmp_path):
    # A replay without the fault saves the frame in the persistent cache; a replay after it must
    # still trace (and meet the fault), not load the frame from disk.
    compiled = bytegraph.compile(deliberately_failing, backend="eager")
    compiled(torch.randn(3))
    (record,) = list(recording.iterdir())
    cache = tmp_path / "cache"
    setup = f"import os; os.environ['BYTEGRAPH_CACHE_DIR'] = {str(cache)!r}; import bytegraph; "
    out = fresh_python(setup + f"print(bytegraph.replay({str(record)!r}).tolist())")
    assert out.returncode == 0, out.stderr
    out = fresh_python(setup + f"import replay_fault; replay_fault.install(); bytegraph.replay({str(record)!r})")
    assert out.returncode == 1
    assert "DeliberateTracerBug" in out.stderr
