"""Where a thread's wall time goes, by sampling its stack: a profiler that does not slow what it
measures the way cProfile does (cProfile roughly doubled a first call's time, so its figures could
only be compared with each other) and that counts waiting (a join, a child process, the GPU) as
time, as the user does.

    with StackSampler() as sampler:
        first_call()
    sampler.top(40)    # [{"function": "file.py:12(f)", "s": 1.23}, ...] by inclusive wall time

A daemon thread reads the sampled thread's current frame stack (``sys._current_frames``) every
``interval`` seconds; a function's time is the number of samples with it anywhere on the stack
times the mean interval between samples. Samples are taken under the interpreter lock, so a
thread holding it in C (a long native call) delays them: such time shows, late, where it was
spent."""
import collections
import os
import sys
import threading
import time


class StackSampler:
    def __init__(self, interval=0.005, thread_id=None):
        self.interval = interval
        self.thread_id = threading.get_ident() if thread_id is None else thread_id
        self.samples = []          # one tuple of "file:line(function)" per sample, innermost first
        self._stop = threading.Event()
        self._thread = None
        self._span = 0.0

    def __enter__(self):
        self._stop.clear()
        self._started = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="stack-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._span = time.perf_counter() - self._started
        return False

    def _run(self):
        names = {}
        while not self._stop.wait(self.interval):
            frame = sys._current_frames().get(self.thread_id)
            stack = []
            while frame is not None:
                code = frame.f_code
                name = names.get(code)
                if name is None:
                    name = names[code] = f"{_short(code.co_filename)}:{code.co_firstlineno}({code.co_name})"
                stack.append(name)
                frame = frame.f_back
            self.samples.append(tuple(stack))

    def top(self, n):
        """The ``n`` functions with most inclusive wall time: [{"function", "s"}], most first."""
        if not self.samples:
            return []
        per_sample = self._span / len(self.samples)
        counts = collections.Counter()
        for stack in self.samples:
            counts.update(set(stack))
        return [{"function": name, "s": round(count * per_sample, 3)} for name, count in counts.most_common(n)]


def _short(path):
    """A file's path from its package root (site-packages or the repository), or its name."""
    for marker in ("site-packages" + os.sep, "dist-packages" + os.sep):
        if marker in path:
            return path.split(marker, 1)[1]
    return os.path.relpath(path) if os.path.isabs(path) and not path.startswith("/tmp") else os.path.basename(path)
