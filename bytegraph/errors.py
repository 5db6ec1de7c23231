"""Every error bytegraph raises derives from BytegraphError."""
from .stacks import format_error


class BytegraphError(Exception):
    """Base class of all bytegraph errors."""


class Unsupported(BytegraphError):
    """The tracer met something it cannot put in a graph.

    Inside the tracer this is caught and turned into an eager fallback (or,
    with ``fullgraph=True``, re-raised to the user with the user's line).
    """

    def __init__(self, reason, hint=None):
        super().__init__(reason)
        self.reason = reason
        self.hint = hint if hint is not None else default_hint(reason)
        self.user_stack = []  # list of traceback.FrameSummary, outermost first, the failing line last
        self.root_index = None  # instruction index in the compiled frame where it happened
        # The frame that met this must run eagerly as a whole, not resume after a break here
        # (the operation reads the running frame itself, e.g. locals()).
        self.eager_frame = False
        # the trace frames active where it was met, outermost first (None: not known; empty:
        # inside a handled exception, where breaks move back)
        self.frames = None
        # The root frame given back its state before the breaking row without a second trace
        # (trace.machine.checkpoint): a TraceResult stopped there, for runtime.compile_frame.
        self.stopped = None

    def __str__(self):
        return format_error(self.reason, self.user_stack, self.hint)


def default_hint(reason):
    """The hint for reasons that came without one."""
    return ("without fullgraph=True bytegraph runs this eagerly instead, with the same result; to keep one "
            "graph, change the code that reaches it or move that code out of the compiled function")


class RecompileError(BytegraphError, RuntimeError):
    """A function would compile again where the settings forbid it (``set_stance("fail_on_recompile")``,
    ``config.error_on_recompile``, a miss under ``skip_guard_eval_unsafe``); a RuntimeError, as
    torch.compile's is."""


class BackendError(BytegraphError):
    """A backend was unknown, misused, or failed while compiling a graph."""


class AccuracyError(BackendError):
    """A compiled graph gave results that differ from eager (``BYTEGRAPH_REPRO_LEVEL=4``)."""


class ConfigError(BytegraphError, AttributeError):
    """An unknown setting, or a setting given a value of the wrong type."""
