"""The interpreter: runs a frame's bytecode on symbolic values (``tracer.trace_frame``), one room
per thing it interprets (docs/architecture.md)."""
