"""Counting what a graph holds, for reports (profiler, testing, demo) and codegen's empty-graph check."""

_CALLS = ("call_function", "call_method", "call_module")


def count_ops(gm, nested=False, skip=()):
    """Number of call nodes (functions, methods, modules) in a GraphModule. ``nested``: also
    those of the subgraphs its nodes run (a vmap's or cond's body held as a submodule), so a
    graph holding a higher-order op counts the work inside it, as one that inlines it does.
    ``skip``: names of targets not counted."""
    n = 0
    for node in gm.graph.nodes:
        if node.op not in _CALLS:
            continue
        if not skip or getattr(node.target, "__name__", node.target) not in skip:
            n += 1
        if nested:
            for arg in node.args:
                body = _submodule(gm, arg)
                if body is not None:
                    n += count_ops(body, nested=True, skip=skip)
    return n


def _submodule(gm, arg):
    target = getattr(arg, "target", None)
    if getattr(arg, "op", None) != "get_attr" or not isinstance(target, str):
        return None
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part, None)
    return obj if hasattr(obj, "graph") and hasattr(obj.graph, "nodes") else None
