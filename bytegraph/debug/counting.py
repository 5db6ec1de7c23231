"""Counting what a graph holds, for reports (profiler, testing, demo) and codegen's empty-graph check."""


def count_ops(gm):
    """Number of call nodes (functions, methods, modules) in a GraphModule."""
    return sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))
