"""The ``eager`` backend: run the captured graph as ordinary PyTorch code."""


def eager(gm, example_inputs):
    """Return the graph's generated ``forward`` as the compiled callable.

    The bound ``forward`` is handed back rather than the module itself so
    that each call skips ``nn.Module.__call__`` (hooks, tracing-state checks);
    there is no wrapper of ours in between, so the per-call cost is exactly
    that of the generated Python code. Outputs are whatever the graph's
    output node returns (a tuple or list for graphs from the tracer).
    """
    return gm.forward
