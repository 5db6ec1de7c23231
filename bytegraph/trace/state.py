"""Process-wide tracing flag, read by ``bytegraph.is_compiling()``."""
tracing = False
