"""The transformed function: call the compiled graph, rebuild what the frame returned.

It is generated Python source with a ``linecache`` entry, so tracebacks,
``inspect.getsource`` and ``pdb`` show real lines.
"""
import linecache

from ..testing import count_ops
from .rebuild import Namespace, Rebuilder, graph_value_exprs, tensors_in


def finish_graph(tx, ns, live_values, compile_graph):
    """Close the graph over the tensors in ``live_values``; return (lines calling it, exprs, gm or None).

    ``exprs`` maps each tensor/symbolic int in ``live_values`` to the Python
    expression that produces it after the graph has run.
    """
    exprs, outputs = graph_value_exprs(ns, tensors_in(live_values, []), tx.graph.inputs, tx.graph.state_root)
    gm = tx.graph.output(outputs)
    if count_ops(gm) == 0:
        return [], exprs, None
    ns.ns["__compiled_fn"] = compile_graph(gm, tx.graph.example_inputs())
    args = ", ".join(ns.source(i.source) for i in tx.graph.inputs)
    return [f"__out = __compiled_fn({args})"], exprs, gm


def emit(name, params, body, ns):
    """Define the generated function ``name`` with a linecache entry; return (function, source)."""
    src = f"def {name}({', '.join(params)}):\n" + "".join(f"    {line}\n" for line in body if line)
    filename = f"<bytegraph {name}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    exec(compile(src, filename, "exec"), ns.ns)
    return ns.ns[name], src


def replay_side_effects(tx, rb):
    """Lines doing, for real, the attribute stores the trace recorded (in program order)."""
    lines = []
    for obj, name, value in tx.attr_stores.values():
        target = rb.expr(obj)
        lines.append(f"{target}.{name} = {rb.expr(value)}")
    return lines


def side_effect_values(tx):
    return [value for _, _, value in tx.attr_stores.values()]


def generate(name, params, tx, returned, fn_globals, compile_graph):
    """(function, source, graph or None) for a frame traced to its return."""
    ns = Namespace(fn_globals)
    lines, exprs, gm = finish_graph(tx, ns, [returned] + side_effect_values(tx), compile_graph)
    rb = Rebuilder(ns, exprs)
    stores = replay_side_effects(tx, rb)
    result = rb.expr(returned)
    run, src = emit(name, params, lines + rb.lines + stores + [f"return {result}"], ns)
    return run, src, gm
