"""A progress line for long backend compiles, on a terminal only.

When a backend compile has run for ``AFTER_SECONDS`` and stderr is a TTY, a line says which
graph of which frame is compiling, with which backend, how long it has taken, and how many
of the graphs seen so far are done; it is rewritten in place every second and closed with the
time taken. Nothing is printed when stderr is not a terminal (logs, CI, pipes) or when the
compile is quick.
"""
import contextlib
import sys
import threading
import time

AFTER_SECONDS = 2.0
EVERY_SECONDS = 1.0

_counts = {"started": 0, "done": 0}


@contextlib.contextmanager
def backend_compile(frame_name, backend_name, stream=None):
    """Around one backend compile of a graph of ``frame_name``."""
    stream = sys.stderr if stream is None else stream
    _counts["started"] += 1
    number = _counts["started"]
    if not _is_tty(stream):
        try:
            yield
        finally:
            _counts["done"] += 1
        return
    t0 = time.perf_counter()
    stop = threading.Event()
    shown = []

    def show():
        if stop.wait(AFTER_SECONDS):
            return
        while True:
            seconds = time.perf_counter() - t0
            text = (f"\rbytegraph: compiling graph {number} ({frame_name}) with {backend_name}: "
                    f"{seconds:.0f}s [{_counts['done']}/{_counts['started']} graphs done]")
            _write(stream, text)
            shown.append(len(text))
            if stop.wait(EVERY_SECONDS):
                return

    thread = threading.Thread(target=show, name="bytegraph-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        _counts["done"] += 1
        if shown:
            seconds = time.perf_counter() - t0
            text = (f"\rbytegraph: compiled graph {number} ({frame_name}) with {backend_name} in {seconds:.1f}s "
                    f"[{_counts['done']}/{_counts['started']} graphs done]")
            _write(stream, text.ljust(max(shown)) + "\n")


def _is_tty(stream):
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _write(stream, text):
    try:
        stream.write(text)
        stream.flush()
    except (OSError, ValueError):
        pass


def reset():
    _counts["started"] = _counts["done"] = 0
