"""Process-wide tracing flag, read by ``bytegraph.is_compiling()``."""
tracing = False


def is_compiling():
    """True while bytegraph is tracing (always False in the code it produces)."""
    return tracing
