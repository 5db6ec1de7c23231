"""bench/stack_sampler.py: the functions on the sampled thread's stack, by inclusive wall time."""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from stack_sampler import StackSampler  # noqa: E402


def waits_on_an_event(event):
    event.wait(0.3)     # waiting counts as time: nothing runs on this thread meanwhile


def outer(event):
    waits_on_an_event(event)


def test_the_functions_on_the_stack_are_found_with_their_callers_and_waiting_counts():
    with StackSampler(interval=0.002) as sampler:
        outer(threading.Event())
    # All of them: pytest's own frames are on every sample too, tied with the ones asked about.
    top = {entry["function"].split(":", 1)[1]: entry["s"] for entry in sampler.top(1000)}
    assert any(name.endswith("(waits_on_an_event)") for name in top), top
    assert any(name.endswith("(outer)") for name in top), top
    # Both are on every sample taken inside the call: the callee's time is within the caller's.
    inner = next(s for name, s in top.items() if name.endswith("(waits_on_an_event)"))
    caller = next(s for name, s in top.items() if name.endswith("(outer)"))
    assert 0 < inner <= caller


def test_no_samples_no_functions():
    sampler = StackSampler(interval=10)
    with sampler:
        time.sleep(0)
    assert sampler.top(5) == []
