"""The transformed function: call the compiled graph, rebuild what the frame returned.

It is generated Python source with a ``linecache`` entry, so tracebacks,
``inspect.getsource`` and ``pdb`` show real lines.
"""
from __future__ import annotations

import ast
import linecache
import types
from typing import Callable

import torch
import torch.fx as fx
from torch.utils._device import DeviceContext

from ..graph_facts import restart_plan, state_left
from ..guards import probes
from ..errors import Unsupported
from ..guards.sources import AttrSource, ClosureSource, GlobalSource
from ..debug.counting import count_ops
from ..residual import (without_function_subclasses, without_torch_function, copy_inputs, enter_inference_mode, graph_raised, inference_depth,
                        leave_inference_blocks, put_inputs_back, replay_warning)
from ..trace.core.context import DELETED, TraceContext
from ..values.base import (ConstantValue, DictValue, IteratorValue, ListValue, ObjectValue, TensorValue, Value,
                           holds_values)
from ..values import arrays
from .added_guards import guard_finished_graph
from .rebuild import Namespace, Rebuilder, array_input_name, graph_value_exprs, tensors_in


def finish_graph(tx: TraceContext, ns: Namespace, live_values: list, compile_graph: Callable):
    """Close the graph over the tensors in ``live_values``; return (lines calling it, exprs, gm or None).

    ``exprs`` maps each tensor/symbolic int in ``live_values`` to the Python
    expression that produces it after the graph has run.
    """
    exprs, outputs = graph_value_exprs(ns, tensors_in(live_values, []), tx.graph.inputs, tx.graph.state_root)
    # Array arguments whose tensor is used after the graph even if the graph does not read it.
    used = set(exprs.values())
    referenced = [i for i in tx.graph.inputs if i.array_mode is not None and array_input_name(i) in used]
    gm = tx.graph.output(outputs)
    guard_finished_graph(tx, gm)
    lines, write_back = array_input_lines(tx, ns, referenced)
    if count_ops(gm) == 0:
        return lines, exprs, None
    left = _state_lines(gm, tx.entry_grad_mode)
    state_lines = left[1] if left is not None else []
    if left is not None and left[0]:
        # Nothing but grad-mode and autocast switches (an optimizer's step entered no_grad, a
        # resume function left a `with torch.autocast` block): no graph to compile (AOTAutograd
        # refuses a graph that changes autocast and does nothing else); what they leave is set.
        return lines + state_lines, exprs, None
    ns.ns["__compiled_fn"] = compile_graph(gm, tx.graph.example_inputs())
    if tx.graph.modes_around_call:
        ns.ns["__compiled_fn"] = without_torch_function(ns.ns["__compiled_fn"])
    elif tx.graph.function_subclass_inputs:
        ns.ns["__compiled_fn"] = without_function_subclasses(ns.ns["__compiled_fn"])
    ns.ns["__scalar"] = scalar_tensor

    def arg(i):
        if i.array_mode is not None:
            return array_input_name(i)
        return f"__scalar({ns.source(i.source)})" if i.scalar else ns.source(i.source)
    args = ", ".join(arg(i) for i in tx.graph.inputs)
    call = [f"__out = __compiled_fn({args})"]
    if any(n.target is enter_inference_mode for n in gm.graph.nodes):
        # A graph failing inside a `with torch.inference_mode()` block leaves it, as eager does.
        call = [f"__depth = {ns.ref(inference_depth, 'inference_depth')}()", "try:", "    " + call[0],
                "except BaseException:", f"    {ns.ref(leave_inference_blocks, 'leave_inference')}(__depth)",
                "    raise"]
    copied = restart_plan(gm) if not lines else None
    if copied is not None:
        # Side effects traced before an op that fails at run time (a singular matrix, an index
        # out of range) come after the graph: on an exception, the wrapper runs the frame natively,
        # from inputs as they were (those the graph writes before such an op are copied first).
        exprs_of = {i.node: arg(i) for i in tx.graph.inputs}
        tensors = "(" + "".join(f"{exprs_of[n]}, " if n.op == "placeholder"
                                else f"{ns.ref(n.meta['real_tensor'], 'state')}, " for n in copied) + ")"
        before = [f"__saved = {ns.ref(copy_inputs, 'copy_inputs')}({tensors})"] if copied else []
        put_back = [f"    {ns.ref(put_inputs_back, 'put_inputs_back')}({tensors}, __saved)"] if copied else []
        call = before + ["try:"] + ["    " + line for line in call] + ["except Exception as __e:"] + put_back + [
                # (a grad-mode block the graph was inside when it failed is left)
                f"    {ns.ref(torch._C._set_grad_enabled, 'set_grad_enabled')}({tx.entry_grad_mode!r})",
                f"    {ns.ref(graph_raised, 'graph_raised')}(__e)"]
    kept = _stored_outputs(tx, outputs)
    if kept:
        ns.ns["__own_memory"] = own_memory
        call.append(f"__out = __own_memory(__out, {kept!r})")
    return lines + call + state_lines + write_back, exprs, gm


def _stored_outputs(tx, outputs):
    """Indices of graph outputs the side effects store into objects that outlive the call, when
    the backend may replay CUDA graphs: their memory belongs to the graph's pool, which the next
    call overwrites (an optimizer's state made on its first step, ``self.cache = y``)."""
    if not getattr(tx.options, "marks_invocations", False):
        return ()
    position = {v.node: i for i, v in enumerate(outputs)}
    stored = tensors_in(side_effect_values(tx), [])
    return tuple(sorted({position[v.node] for v in stored
                         if type(v) is TensorValue and v.node in position}))


def own_memory(outputs, indices):
    """``outputs`` with the tensors at ``indices`` copied out of the memory the graph returned them in."""
    outputs = list(outputs)
    for i in indices:
        if isinstance(outputs[i], torch.Tensor) and outputs[i].is_cuda:
            outputs[i] = outputs[i].clone()
    return outputs


def array_input_lines(tx, ns, referenced=()):
    """(lines making the tensors that np.ndarray arguments are traced as, lines writing the graph's
    in-place changes back into arrays it got copies of)."""
    make, back = [], []
    inputs = [i for i in tx.graph.inputs if i.array_mode is not None]
    inputs += [i for i in referenced if i not in inputs]
    for inp in inputs:
        name = array_input_name(inp)
        convert = arrays.array_to_tensor if inp.array_mode == arrays.SHARE else arrays.array_to_tensor_copy
        make.append(f"{name} = {ns.ref(convert, convert.__name__)}({ns.source(inp.source)})")
        if inp.mutated():
            if not inp.writeable:
                raise Unsupported(f"{inp.source.name()} is read-only; the graph would change it in place")
            if inp.array_mode == arrays.COPY:
                back.append(f"{ns.ref(arrays.write_back, 'write_back')}({ns.source(inp.source)}, {name})")
    return make, back


def scalar_tensor(value):
    """A float input of the graph as the 0-d float64 tensor it is there (graph/scalars.py)."""
    return torch.tensor(value, dtype=torch.float64)


def _state_lines(gm, entry_grad_mode):
    """(does ``gm`` do nothing but switch grad mode and autocast?, lines setting the grad mode
    and autocast state it leaves for the code after it), or None where that cannot be read off
    its nodes (``graph_facts.state_left``).

    A compiled graph need not switch anything when it runs (AOTAutograd's does not: the switches
    decided how it was traced), so what a graph leaves behind is set again after it: the grad
    mode of its last ``_set_grad_enabled``, and the autocast state of a ``set_autocast_state``
    (the end of a ``with torch.autocast`` block entered before a resume function began; without
    this line, autocast stayed on after such a function returned)."""
    left = state_left(gm, entry_grad_mode)
    if left is None:
        return None
    only_states, grad, autocast = left
    lines = [] if grad == entry_grad_mode else [f"torch._C._set_grad_enabled({grad!r})"]
    for device, (enabled, dtype, cache) in autocast.items():
        lines += [f"torch.set_autocast_enabled({device!r}, {enabled!r})",
                  f"torch.set_autocast_dtype({device!r}, {dtype!r})",
                  f"torch.set_autocast_cache_enabled({cache!r})"]
    return only_states, lines


def emit(name: str, params: list[str], body: list[str], ns: Namespace, stands_for: tuple | None = None):
    """Define the generated function ``name``; return (function, source).

    Without ``stands_for`` its code is named ``<bytegraph name>`` (with a linecache entry, for
    tracebacks and the debug tools). With ``stands_for = (code, lineno)`` it is compiled as if
    every line were line ``lineno`` of the user's function ``code``: a step function standing
    for the user's frame at a graph break, so what the native step calls sees that frame as its
    caller (the location ``warnings.warn`` and logging report, tracebacks)."""
    src = f"def {name}({', '.join(params)}):\n" + "".join(f"    {line}\n" for line in body if line)
    if stands_for is None:
        filename = f"<bytegraph {name}>"
        linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
        exec(compile(src, filename, "exec"), ns.ns)
        return ns.ns[name], src
    code, lineno = stands_for
    text = linecache.getline(code.co_filename, lineno).rstrip()
    end = len(text.encode())       # columns count UTF-8 bytes
    start = end - len(text.lstrip().encode())     # the whole line: tracebacks show it unmarked
    tree = ast.parse(src)
    for node in ast.walk(tree):
        if "lineno" in node._attributes:
            node.lineno = node.end_lineno = lineno
            node.col_offset, node.end_col_offset = start, end
    exec(compile(tree, code.co_filename, "exec"), ns.ns)
    fn = ns.ns[name]
    fn.__code__ = fn.__code__.replace(co_name=code.co_name, co_qualname=code.co_qualname)
    return fn, src


def _setattr_traced(obj):
    """Is ``obj`` an object whose class's Python ``__setattr__`` the trace runs on stores
    (``trace.python.attrs.set_attr``; modules' stores are replayed through their hook instead)?"""
    if not isinstance(obj, ObjectValue) or isinstance(obj.obj, (torch.nn.Module, type, types.ModuleType)):
        return False
    return isinstance(type(obj.obj).__setattr__, types.FunctionType)


def replay_side_effects(tx: TraceContext, rb: Rebuilder, live=()) -> list[str]:
    """Lines doing, for real, the side effects the trace recorded.

    Everything is read before anything changes (``_read_before_effects``): first the objects
    to change (through their sources), then the new contents and stored values and the
    ``live`` values the caller will use afterwards (so a source re-read after the effects
    cannot see the new state); then the effects themselves (``_effect_lines``): containers
    updated in place (identity kept), attributes, globals, cells; last, live iterators
    remade over containers (over the containers read before).
    """
    if not tx.effects.has_any():
        return []
    cells, contents, remade = _read_before_effects(tx, rb, live)
    lines = list(rb.lines)
    rb.lines.clear()
    lines += _effect_lines(tx, rb, cells, contents)
    for v in remade:
        try:
            rb.bind(v)
        except Unsupported:
            pass
    lines += rb.lines
    rb.lines.clear()
    return lines


def _read_before_effects(tx, rb, live):
    """Bind (in ``rb``'s lines) everything the effects and the caller read: (cell expressions
    by store key, new contents of each mutated container by key, the live iterators to remake
    after the effects)."""
    ns = rb.ns
    # 1. The objects to change, as they are on entry.
    for v in tx.effects.mutated.values():
        rb.bind(v)
    for obj, _, _ in tx.effects.attr_stores.values():
        rb.bind(obj)
    for obj, _, _ in tx.effects.item_stores.values():
        rb.bind(obj)
    for it in tx.effects.advanced_iterators():
        rb.bind(it)
    cells = {key: rb.temp(_cell_expr(ns, cell.source)) for key, (cell, _) in tx.effects.cell_stores.items()}
    # 2. Everything computed from the traced values.
    contents = {}
    for key, v in tx.effects.mutated.items():
        if isinstance(v, ListValue):
            contents[key] = rb.temp(f"[{', '.join(rb.expr(i) for i in v.items)}]")
        elif isinstance(v, DictValue):
            body = ", ".join(f"{rb.key(k)}: {rb.expr(i)}" for k, i in v.items.items())
            contents[key] = rb.temp(f"{{{body}}}")
        elif holds_values(v.value):
            contents[key] = rb.temp(rb._holding(v.value))
        else:
            contents[key] = ns.ref(frozenset(v.value), "set")
    stored = tx.effects.stored_values()
    # An iterator remade over containers iterates them as the effects leave them (and a
    # dict or set iterator made before they change would fail): its containers are read
    # now, the iterator itself is made after the effects.
    remade = [v for v in live if isinstance(v, IteratorValue) and v.remake is not None]
    remade_ids = {id(v) for v in remade}
    read_now = [a for v in remade for a in v.remake[1]] + [v for v in live if id(v) not in remade_ids]
    for v in stored + read_now:
        try:
            rb.bind(v)
        except Unsupported:
            if v in stored:
                raise
            # A live value the caller may not need; it reports the failure if it does.
    return cells, contents, remade


def _effect_lines(tx, rb, cells, contents):
    """3. The effects, over what ``_read_before_effects`` bound. Warnings first: what follows
    them in eager cannot have changed what they show."""
    ns = rb.ns
    lines = []
    for message, category, filename, lineno, module, module_globals in tx.effects.warnings:
        lines.append(f"{ns.ref(replay_warning, 'replay_warning')}({ns.ref(message, 'warning')}, "
                     f"{ns.ref(category, 'warning_category')}, {filename!r}, {lineno!r}, {module!r}, "
                     f"{ns.ref(module_globals, 'module_globals')})")
    for key, v in tx.effects.mutated.items():
        target = rb.expr(v)
        if isinstance(v, ListValue):
            lines.append(f"{target}[:] = {contents[key]}")
        else:
            lines += [f"{target}.clear()", f"{target}.update({contents[key]})"]
    for obj, name, value in tx.effects.attr_stores.values():
        if value is DELETED:
            lines.append(f"del {rb.expr(obj)}.{name}")
        elif _setattr_traced(obj):
            # The trace ran the class's own __setattr__ and recorded the plain store it ended
            # with: do that store, not the hook a second time.
            lines.append(f"{ns.ref(object.__setattr__, 'object_setattr')}({rb.expr(obj)}, {name!r}, {rb.expr(value)})")
        else:
            lines.append(f"{rb.expr(obj)}.{name} = {rb.expr(value)}")
    for source, value in tx.effects.global_stores.values():
        if value is DELETED:
            # The trace checked that the name exists (it may have been made by this trace).
            if isinstance(source, GlobalSource):
                table, key = "G", source.global_name
            else:
                table, key = ns.source(source.base), source.index
            lines.append(f"{table}.pop({key!r}, None)")
        else:
            lines.append(f"{ns.source(source)} = {rb.expr(value)}")
    for key, (_, value) in tx.effects.cell_stores.items():
        lines.append(f"{cells[key]}.cell_contents = {rb.expr(value)}")
    for obj, key, value in tx.effects.item_stores.values():
        lines.append(f"{rb.expr(obj)}.pop({key!r}, None)" if value is DELETED
                     else f"{rb.expr(obj)}[{key!r}] = {rb.expr(value)}")
    for it in tx.effects.advanced_iterators():
        lines.append(f"{ns.ref(take_items, 'take_items')}({rb.expr(it)}, {it.pos})")
    return lines


def take_items(it, n):
    """Take ``n`` items from the real iterator ``it``, as the trace took them from its value."""
    for _ in range(n):
        next(it)


def _cell_expr(ns, source):
    """Python for the cell object whose contents ``source`` reads."""
    if isinstance(source, ClosureSource):
        return f"__closure[{source.index}]"
    if isinstance(source, AttrSource) and source.attr == "cell_contents":
        return ns.source(source.base)
    raise Unsupported(f"cannot assign to the closure cell read through {source.name()}")


def side_effect_values(tx):
    """Values the effects store: their tensors must come out of the graph."""
    effects = tx.effects
    out = effects.stored_values()
    # Tensors made in the graph that get an attribute (``t.grad = g``, ``t.requires_grad_()``).
    out += [obj for obj, _, _ in effects.attr_stores.values() if isinstance(obj, TensorValue)]
    out += [v for v in effects.mutated.values() if not isinstance(v, ConstantValue) or holds_values(v.value)]
    return out


def generate(name: str, params: list[str], tx: TraceContext, returned: Value, fn_globals: dict,
             compile_graph: Callable) -> tuple[Callable, str, fx.GraphModule | None]:
    """(function, source, graph or None) for a frame traced to its return."""
    ns = Namespace(fn_globals)
    lines, exprs, gm = finish_graph(tx, ns, [returned] + side_effect_values(tx), compile_graph)
    rb = Rebuilder(ns, exprs, tx.guards)
    effects = replay_side_effects(tx, rb, [returned])
    result = rb.expr(returned)
    modes = mode_stack_lines(tx, rb)
    if modes:
        result = rb.temp(result)   # read before the stack changes (a mode read through it)
    run, src = emit(name, params, lines + effects + rb.lines + modes + [f"return {result}"], ns)
    return run, src, gm


def mode_stack_lines(tx, rb):
    """Lines making the real TorchFunctionMode stack what the trace's is now (``tx.graph.
    function_modes``): the modes around the call it left popped, those it entered pushed. The
    graph ran before them, with no mode (its nodes are what the modes made of the calls)."""
    entry, now = tx.graph.modes_at_entry, tx.graph.function_modes
    kept = 0
    while kept < min(len(entry), len(now)) and entry[kept] is now[kept]:
        kept += 1
    if kept == len(entry) == len(now):
        return []
    if any(isinstance(m, DeviceContext) for m in probes.modes_around_call()):
        # The frames compiled under the modes pushed here would compile under them: the modes
        # are set aside while a frame compiles only with no device context among them.
        raise Unsupported("a TorchFunctionMode entered or left in the compiled function while a device context "
                          "(with torch.device(...), torch.set_default_device) is active is not supported yet",
                          hint="without fullgraph=True the frame runs eagerly")
    pop = rb.ns.ref(torch._C._pop_torch_function_stack, "pop_mode")
    push = rb.ns.ref(torch._C._push_on_torch_function_stack, "push_mode")
    # (rb.expr may bind the modes in rb.lines: the caller puts these lines after those)
    exprs = [rb.expr(m) for m in now[kept:]]
    return [f"{pop}()"] * (len(entry) - kept) + [f"{push}({e})" for e in exprs]
