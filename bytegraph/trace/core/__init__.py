"""What every room of trace/ stands on: the trace context (graph, guards, side effects), the table
of operations reached upward (``ops``), the callable -> handler table, and value basics."""
