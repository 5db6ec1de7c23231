"""The transformed function: call the compiled graph, rebuild what the frame returned.

It is generated Python source with a ``linecache`` entry, so tracebacks,
``inspect.getsource`` and ``pdb`` show real lines.
"""
import ast
import linecache
import types

import torch
import torch.fx as fx

from ..backends._common import draws_random, is_random, updates_running_stats, writes, written
from ..backends.regions import is_state_node
from ..guards import builder as g
from ..errors import Unsupported
from ..guards.sources import AttrSource, ClosureSource, GlobalSource
from ..debug.counting import count_ops
from ..residual import (copy_inputs, enter_inference_mode, exit_inference_mode, graph_raised, inference_depth,
                        leave_inference_blocks, put_inputs_back, replay_warning)
from ..trace.context import DELETED
from ..values.base import ConstantValue, DictValue, IteratorValue, ListValue, ObjectValue, TensorValue, holds_values
from ..values import arrays
from .rebuild import Namespace, Rebuilder, array_input_name, graph_value_exprs, tensors_in


def finish_graph(tx, ns, live_values, compile_graph):
    """Close the graph over the tensors in ``live_values``; return (lines calling it, exprs, gm or None).

    ``exprs`` maps each tensor/symbolic int in ``live_values`` to the Python
    expression that produces it after the graph has run.
    """
    exprs, outputs = graph_value_exprs(ns, tensors_in(live_values, []), tx.graph.inputs, tx.graph.state_root)
    # Array arguments whose tensor is used after the graph even if the graph does not read it.
    used = set(exprs.values())
    referenced = [i for i in tx.graph.inputs if i.array_mode is not None and array_input_name(i) in used]
    gm = tx.graph.output(outputs)
    guard_input_aliasing(tx, gm)
    guard_container_aliasing(tx)
    lines, write_back = array_input_lines(tx, ns, referenced)
    if count_ops(gm) == 0:
        return lines, exprs, None
    left = _state_left(gm, tx.entry_grad_mode)
    state_lines = left[1] if left is not None else []
    if left is not None and left[0]:
        # Nothing but grad-mode and autocast switches (an optimizer's step entered no_grad, a
        # resume function left a `with torch.autocast` block): no graph to compile (AOTAutograd
        # refuses a graph that changes autocast and does nothing else); what they leave is set.
        return lines + state_lines, exprs, None
    ns.ns["__compiled_fn"] = compile_graph(gm, tx.graph.example_inputs())
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


# Graph nodes that must not run twice (besides those drawing random numbers, ``draws_random``:
# the generator moves on): autocast switches, seeding, collectives (other processes wait for each
# one). (Grad mode is set back to the frame's on entry before it runs again.)
_NOT_TWICE = ("seed", "rng", "autocast", "all_reduce", "all_gather", "reduce_scatter", "broadcast",
              "all_to_all", "wait_tensor", "barrier")


def restart_plan(gm):
    """Can ``gm`` be run again after it raised, with nothing left of the failed run?

    A list of the placeholder and get_attr nodes to copy before each call and put back after a
    failure when it can (empty when it writes none of them in place). None when it cannot: it
    writes such a tensor that needs grad, its sizes, or running statistics (batch norm in
    training); draws random numbers, switches autocast state or calls a collective; or writes
    such a tensor and has no op expected to fail (``_may_fail_on_values``; an op before the
    write counts as well as one after it). Copying costs on every call, so only a graph with
    such an op pays it (an optimizer step writes every parameter and has none)."""
    given = None    # storage -> the placeholder and get_attr nodes over it (at the first write)
    copied = {}
    may_fail = False
    seen = {}     # (op, target) -> _traits (a graph calls a few targets many times)
    for m in gm.modules():
        if not isinstance(m, torch.fx.GraphModule):
            continue
        for node in m.graph.nodes:
            if node.op == "call_module" and not isinstance(m.get_submodule(node.target), torch.fx.GraphModule):
                return None   # a module called as a leaf: what it does is not in the graph
            if node.op not in ("call_function", "call_method"):
                continue
            if is_state_node(node) and node.target is not torch._C._set_grad_enabled:
                return None
            try:
                traits = seen.get((node.op, node.target))
                if traits is None:
                    traits = seen[node.op, node.target] = _traits(node)
            except TypeError:    # an unhashable target
                traits = _traits(node)
            name, never_twice, maybe_random = traits
            if never_twice or maybe_random and draws_random(node):
                return None
            if m is gm and not may_fail:
                may_fail = _may_fail_on_values(node, name, gm)
            if not writes(node):
                continue
            if m is not gm or updates_running_stats(node):
                # (a normalization layer's running statistics: a copy of every layer's on every
                # training step would cost a CNN ~5 µs a tensor; such a graph is not rerun)
                return None
            if given is None:
                given = _given_by_storage(gm)
            for n in _written_inputs(node, given):
                if n is None or name.rsplit(".", 1)[-1] in _METADATA_WRITERS \
                        or n.op == "get_attr" and not isinstance(n.meta.get("real_tensor"), torch.Tensor):
                    return None
                fake = n.meta.get("example_value")
                if not isinstance(fake, torch.Tensor) or fake.requires_grad:
                    return None
                copied[n] = True
    if copied and not may_fail:
        return None
    return list(copied)


def _traits(node):
    """What ``restart_plan`` needs of a node that depends on its target alone: (its lower-case
    name, must not run twice, may draw random numbers)."""
    name = _target_name(node.target)
    never_twice = any(word in name for word in _NOT_TWICE) or "distributed" in name or "c10d" in name
    maybe_random = is_random(node) or node.target is torch.nn.functional.scaled_dot_product_attention
    return name, never_twice, maybe_random


def _target_name(target):
    return (target if isinstance(target, str)
            else f"{getattr(target, '__module__', '')}.{getattr(target, '__name__', '')}").lower()


def _given_by_storage(gm):
    given = {}
    for n in gm.graph.nodes:
        fake = n.meta.get("example_value") if n.op in ("placeholder", "get_attr") else None
        if isinstance(fake, torch.Tensor):
            given.setdefault(fake.untyped_storage()._cdata, []).append(n)
    return given


def _written_inputs(node, given):
    """The nodes of ``given`` (storage -> placeholder and get_attr nodes) over whose storage
    ``node`` writes; None for a written value whose storage is unknown."""
    found = []
    for arg in written(node):
        fake = arg.meta.get("example_value")
        if not isinstance(fake, torch.Tensor):
            return [None]
        found += given.get(fake.untyped_storage()._cdata, [])
    return found


# Ops whose failure depends on the values they are given, not only on shapes and dtypes (which
# the trace checked): indices out of range, singular or indefinite matrices, class targets.
_FAILING_ON_VALUES = ("index", "gather", "scatter", "take", "embedding", "nll_loss", "cross_entropy",
                      "one_hot", "bincount", "linalg", "inverse", "cholesky", "solve", "_assert", "histc",
                      "repeat_interleave", "unpool", "ctc_loss")
# In-place ops that change a tensor's sizes or strides, which copying values back does not undo.
_METADATA_WRITERS = {"resize_", "resize_as_", "set_", "as_strided_", "t_", "transpose_", "squeeze_",
                     "unsqueeze_", "swapdims_", "swapaxes_", "detach_", "requires_grad_"}


def _may_fail_on_values(node, name, gm):
    """May ``node`` (its target's lower-case ``name``) raise for some values of tensors whose
    shapes and dtypes the trace has checked?"""
    short = name.rsplit(".", 1)[-1]
    if short in ("getitem", "setitem"):     # with a tensor of indices
        index = []
        fx.node.map_arg(node.args[1:2], index.append)
        return any(isinstance(n.meta.get("example_value"), torch.Tensor) for n in index)
    if any(word in short for word in ("div", "remainder", "fmod")):   # integers by zero
        out = node.meta.get("example_value")
        return isinstance(out, torch.Tensor) and not (out.is_floating_point() or out.is_complex())
    if short in ("lu", "put", "put_") or any(word in name for word in _FAILING_ON_VALUES):
        return True
    # A higher-order op's body (checkpoint, cond, a traced function): anything may be inside.
    return any(a.op == "get_attr" and isinstance(getattr(gm, a.target, None), torch.fx.GraphModule)
               for a in node.all_input_nodes)


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


_INFERENCE_NODES = (enter_inference_mode, exit_inference_mode)


def _state_left(gm, entry_grad_mode):
    """(does ``gm`` do nothing but switch grad mode and autocast?, lines setting the grad mode
    and autocast state it leaves for the code after it), or None where that cannot be read off
    its nodes.

    A compiled graph need not switch anything when it runs (AOTAutograd's does not: the switches
    decided how it was traced), so what a graph leaves behind is set again after it: the grad
    mode of its last ``_set_grad_enabled``, and the autocast state of a ``set_autocast_state``
    (the end of a ``with torch.autocast`` block entered before a resume function began; without
    this line, autocast stayed on after such a function returned). ``with`` blocks inside the
    graph end in it and leave nothing."""
    only_states = True
    grad = entry_grad_mode
    autocast = {}       # device -> (enabled, dtype, cache) set last
    depth = 0           # autocast blocks open
    inference = []      # grad mode at the start of each inference_mode block open
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        if node.target in _INFERENCE_NODES:
            # A `with torch.inference_mode()` block ends in the graph too, and its end puts grad
            # mode back as it was at its start.
            if node.target is _INFERENCE_NODES[0]:
                inference.append(grad)
            elif not inference:
                return None
            else:
                grad = inference.pop()
            continue
        if not is_state_node(node):
            only_states = False
            continue
        name = node.target.__name__
        if name == "_enter_autocast":
            depth += 1
        elif name == "_exit_autocast":
            depth -= 1
        elif any(isinstance(a, torch.fx.Node) for a in node.args):
            return None
        elif name == "_set_grad_enabled":
            grad = node.args[0]
        elif depth:
            return None     # a block's state changed inside another block: not from `with` code
        else:
            autocast[node.args[0]] = node.args[1:]
    if depth or inference:
        return None
    lines = [] if grad == entry_grad_mode else [f"torch._C._set_grad_enabled({grad!r})"]
    for device, (enabled, dtype, cache) in autocast.items():
        lines += [f"torch.set_autocast_enabled({device!r}, {enabled!r})",
                  f"torch.set_autocast_dtype({device!r}, {dtype!r})",
                  f"torch.set_autocast_cache_enabled({cache!r})"]
    return only_states, lines


def guard_input_aliasing(tx, gm):
    """A graph that mutates tensor inputs was traced for one aliasing of its tensor inputs (the same
    tensor twice, views of one storage, or none): guard that later calls alias them the same way,
    as a backend that functionalizes the graph (AOTAutograd) relies on it. Graphs that mutate no
    input (an optimizer's, whose parameters and state are module state) need no such guard; the
    check is one pass over the inputs' storages (``storage_groups``), not one per pair."""
    tensors = [i for i in tx.graph.inputs if isinstance(i.example, torch.Tensor) and not i.scalar]
    if len(tensors) < 2 or not _mutates_inputs(gm, [i.node for i in tensors]):
        return
    guard_array_overlap(tx)
    tensors = [i for i in tensors if i.array_mode is None]
    if len(tensors) >= 2:
        groups = g.storage_groups([i.example for i in tensors])
        tx.guards.add(g.STORAGE_GROUPS, None, ([i.source for i in tensors], groups), detail="input storage")


def _mutates_inputs(gm, placeholders, nodes=None, unknown=False):
    """Does a node that mutates (of ``nodes``, by default all of ``gm``'s) write to (a view of)
    one of ``placeholders``? ``unknown``: what a written value is unknown counts as yes."""
    storages = set()
    for p in placeholders:
        fake = p.meta.get("example_value")
        if isinstance(fake, torch.Tensor):
            storages.add(fake.untyped_storage()._cdata)
    for node in gm.graph.nodes if nodes is None else nodes:
        if not writes(node):
            continue
        for arg in written(node):
            fake = arg.meta.get("example_value")
            if isinstance(fake, torch.Tensor) and fake.untyped_storage()._cdata in storages \
                    or unknown and not isinstance(fake, torch.Tensor):
                return True
    return False


def guard_array_overlap(tx):
    """An np.ndarray input of a graph that mutates must not overlap another array or tensor input in
    memory (each is its own tensor in the graph, so the graph could not see one change through the
    other): guard that they do not; inputs that overlap now run eagerly."""
    inputs = tx.graph.inputs
    for i, a in enumerate(inputs):
        for b in inputs[i + 1:]:
            if a.array_mode is None and b.array_mode is None:
                continue
            x = a.array if a.array_mode is not None else a.example
            y = b.array if b.array_mode is not None else b.example
            if not g.memory_apart(x, y):
                raise Unsupported(f"{a.source.name()} and {b.source.name()} overlap in memory and the graph changes "
                                  "arrays in place; that is not traced")
            tx.guards.add(g.ARRAYS_APART, a.source, b.source, detail=b.source.name())


def guard_container_aliasing(tx):
    """A container the trace changed was distinct from every other container it read: guard
    that later calls do not pass the same list (say) through two sources."""
    for m in tx.mutated.values():
        for other in tx.existing_containers.values():
            if other is not m and other.source is not None and _kind(other) is _kind(m):
                tx.guards.add(g.NOT_ALIAS, m.source, other.source, detail=other.source.name())


def _kind(container):
    # Without reading a constant's value (that would guard it).
    return type(container._value) if isinstance(container, ConstantValue) else type(container)


def emit(name, params, body, ns, stands_for=None):
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
    (``trace.attrs.set_attr``; modules' stores are replayed through their hook instead)?"""
    if not isinstance(obj, ObjectValue) or isinstance(obj.obj, (torch.nn.Module, type, types.ModuleType)):
        return False
    return isinstance(type(obj.obj).__setattr__, types.FunctionType)


def replay_side_effects(tx, rb, live=()):
    """Lines doing, for real, the side effects the trace recorded.

    Everything is read before anything changes: first the objects to change
    (through their sources), then the new contents and stored values and the
    ``live`` values the caller will use afterwards (so a source re-read after
    the effects cannot see the new state), then the effects themselves:
    containers updated in place (identity kept), attributes, globals, cells;
    last, live iterators remade over containers (over the containers read before).
    """
    if not tx.has_side_effects():
        return []
    ns = rb.ns
    # 1. The objects to change, as they are on entry.
    for v in tx.mutated.values():
        rb.bind(v)
    for obj, _, _ in tx.attr_stores.values():
        rb.bind(obj)
    for obj, _, _ in tx.item_stores.values():
        rb.bind(obj)
    cells = {key: rb.temp(_cell_expr(ns, cell.source)) for key, (cell, _) in tx.cell_stores.items()}
    # 2. Everything computed from the traced values.
    contents = {}
    for key, v in tx.mutated.items():
        if isinstance(v, ListValue):
            contents[key] = rb.temp(f"[{', '.join(rb.expr(i) for i in v.items)}]")
        elif isinstance(v, DictValue):
            body = ", ".join(f"{rb.key(k)}: {rb.expr(i)}" for k, i in v.items.items())
            contents[key] = rb.temp(f"{{{body}}}")
        elif holds_values(v.value):
            contents[key] = rb.temp(rb._holding(v.value))
        else:
            contents[key] = ns.ref(frozenset(v.value), "set")
    stored = [value for _, _, value in tx.attr_stores.values() if value is not DELETED]
    stored += [value for _, value in tx.global_stores.values() if value is not DELETED]
    stored += [value for _, value in tx.cell_stores.values()]
    stored += [value for _, _, value in tx.item_stores.values() if value is not DELETED]
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
    lines = list(rb.lines)
    rb.lines.clear()
    # 3. The effects. Warnings first: what follows them in eager cannot have changed what they show.
    for message, category, filename, lineno, module, module_globals in tx.warnings:
        lines.append(f"{ns.ref(replay_warning, 'replay_warning')}({ns.ref(message, 'warning')}, "
                     f"{ns.ref(category, 'warning_category')}, {filename!r}, {lineno!r}, {module!r}, "
                     f"{ns.ref(module_globals, 'module_globals')})")
    for key, v in tx.mutated.items():
        target = rb.expr(v)
        if isinstance(v, ListValue):
            lines.append(f"{target}[:] = {contents[key]}")
        else:
            lines += [f"{target}.clear()", f"{target}.update({contents[key]})"]
    for obj, name, value in tx.attr_stores.values():
        if value is DELETED:
            lines.append(f"del {rb.expr(obj)}.{name}")
        elif _setattr_traced(obj):
            # The trace ran the class's own __setattr__ and recorded the plain store it ended
            # with: do that store, not the hook a second time.
            lines.append(f"{ns.ref(object.__setattr__, 'object_setattr')}({rb.expr(obj)}, {name!r}, {rb.expr(value)})")
        else:
            lines.append(f"{rb.expr(obj)}.{name} = {rb.expr(value)}")
    for source, value in tx.global_stores.values():
        if value is DELETED:
            # The trace checked that the name exists (it may have been made by this trace).
            if isinstance(source, GlobalSource):
                table, key = "G", source.global_name
            else:
                table, key = ns.source(source.base), source.index
            lines.append(f"{table}.pop({key!r}, None)")
        else:
            lines.append(f"{ns.source(source)} = {rb.expr(value)}")
    for key, (_, value) in tx.cell_stores.items():
        lines.append(f"{cells[key]}.cell_contents = {rb.expr(value)}")
    for obj, key, value in tx.item_stores.values():
        lines.append(f"{rb.expr(obj)}.pop({key!r}, None)" if value is DELETED
                     else f"{rb.expr(obj)}[{key!r}] = {rb.expr(value)}")
    for v in remade:
        try:
            rb.bind(v)
        except Unsupported:
            pass
    lines += rb.lines
    rb.lines.clear()
    return lines


def _cell_expr(ns, source):
    """Python for the cell object whose contents ``source`` reads."""
    if isinstance(source, ClosureSource):
        return f"__closure[{source.index}]"
    if isinstance(source, AttrSource) and source.attr == "cell_contents":
        return ns.source(source.base)
    raise Unsupported(f"cannot assign to the closure cell read through {source.name()}")


def side_effect_values(tx):
    """Values the effects store: their tensors must come out of the graph."""
    out = [value for _, _, value in tx.attr_stores.values() if value is not DELETED]
    # Tensors made in the graph that get an attribute (``t.grad = g``, ``t.requires_grad_()``).
    out += [obj for obj, _, _ in tx.attr_stores.values() if isinstance(obj, TensorValue)]
    out += [v for v in tx.mutated.values() if not isinstance(v, ConstantValue) or holds_values(v.value)]
    out += [value for _, value in tx.global_stores.values() if value is not DELETED]
    out += [value for _, value in tx.cell_stores.values()]
    return out


def generate(name, params, tx, returned, fn_globals, compile_graph):
    """(function, source, graph or None) for a frame traced to its return."""
    ns = Namespace(fn_globals)
    lines, exprs, gm = finish_graph(tx, ns, [returned] + side_effect_values(tx), compile_graph)
    rb = Rebuilder(ns, exprs, tx.guards)
    effects = replay_side_effects(tx, rb, [returned])
    result = rb.expr(returned)
    run, src = emit(name, params, lines + effects + rb.lines + [f"return {result}"], ns)
    return run, src, gm
