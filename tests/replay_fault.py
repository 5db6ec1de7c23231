"""A deliberate internal error for tests/test_replay.py: the tracer fails on frames of functions
named ``deliberately_failing`` (installed in the test process and in the fresh process that
replays the record, so the replayed trace meets the same fault)."""
import bytegraph.runtime.compile_frame as compile_frame

_real_trace_frame = compile_frame.trace_frame


class DeliberateTracerBug(Exception):
    pass


def _faulty_trace_frame(fn, *args, **kwargs):
    if fn.__code__.co_name == "deliberately_failing":
        raise DeliberateTracerBug(f"the tracer failed on {fn.__qualname__}")
    return _real_trace_frame(fn, *args, **kwargs)


def install():
    compile_frame.trace_frame = _faulty_trace_frame


def uninstall():
    compile_frame.trace_frame = _real_trace_frame
