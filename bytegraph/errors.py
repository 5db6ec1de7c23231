"""Every error bytegraph raises derives from BytegraphError."""


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
        self.hint = hint
        self.user_stack = []  # list of traceback.FrameSummary, innermost last
        self.root_index = None  # instruction index in the compiled frame where it happened

    def __str__(self):
        lines = [self.reason]
        if self.user_stack:
            frame = self.user_stack[-1]
            lines.append(f"  at {frame.filename}:{frame.lineno} in {frame.name}")
            if frame.line:
                lines.append(f"    {frame.line.strip()}")
        if self.hint:
            lines.append(f"  hint: {self.hint}")
        return "\n".join(lines)


class BackendError(BytegraphError):
    """A backend was unknown, misused, or failed while compiling a graph."""


class ConfigError(BytegraphError, AttributeError):
    """An unknown setting, or a setting given a value of the wrong type."""
