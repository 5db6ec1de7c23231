"""Code for a frame that stops at a graph break.

The transformed function runs the graph captured so far, rebuilds the live
values, performs the one step the tracer could not (a call, a branch on a
tensor, the next step of an opaque iterator, a store), and hands over to a
resume function that continues the original code after that step.
"""
from __future__ import annotations

import dis
import types
from typing import Callable
import weakref

import torch

from ..bytecode import analysis
from ..bytecode.instructions import Instruction, decode, first_part, is_last_part, offset_after
from ..bytecode.resume import (CLOSURE_PARAM, HANDLED_PREFIX, NULL_SLOT, closure_names, is_handled_slot, resume_code,
                               step_code)
from ..bytecode.versions import split_call_prefix
from ..debug import debug_dir, logs
from ..errors import Unsupported
from ..null import NULL
from ..residual import (AutocastExit, Continuation, GradModeExit, exit_inference_mode, route,
                        resolve)
from ..stacks import CUT_FROM, code_name
from ..values.base import CellValue, ExitValue, SavedExcInfoValue
from ..trace.machine.frame import PendingLocal
from .rebuild import Namespace, Rebuilder
from .transformed import emit, finish_graph, mode_stack_lines, replay_side_effects, side_effect_values

# resume code object -> ResumeInfo
RESUME_INFO = {}


class ResumeInfo:
    """Where a resume code object came from: always the user's original code."""
    __slots__ = ("original", "name", "start", "offsets")

    def __init__(self, original, name, start, offsets):
        self.original = original   # the original code object
        self.name = name           # its function name
        self.start = start         # offset in the original where this resume starts
        self.offsets = offsets     # resume-code offset -> original offset (None: no counterpart)


def original_offset(code, offset):
    """(original code, offset there) for an offset in ``code`` (a resume code or an original)."""
    info = RESUME_INFO.get(code)
    if info is None:
        return code, offset
    orig = info.offsets.get(offset)
    if orig is None:
        raise Unsupported("graph break inside an instruction that the resume code had to split")
    return info.original, orig

_CALLS = {"CALL", "CALL_KW", "CALL_FUNCTION_EX"}
_BRANCHES = {"POP_JUMP_IF_FALSE", "POP_JUMP_IF_TRUE"}
_KEEP_BRANCHES = {"JUMP_IF_FALSE_OR_POP", "JUMP_IF_TRUE_OR_POP"}


def plan_break(fn: types.FunctionType, index: int) -> tuple[str, int]:
    """(kind of native step, index of the row to stop before) for a break at row ``index``.

    A step done in Python ends at row ``index`` and resumes after it, which needs that
    row to end its raw instruction. Every other step ('generic') runs whole raw
    instructions natively in a step function, so it starts at the first row of the
    raw instruction that row ``index`` belongs to.
    """
    code = fn.__code__
    rows = decode(code)
    ins = rows[index]
    name = ins.opname
    if name in _CALLS or name in _BRANCHES or name in _KEEP_BRANCHES or name in (
            "TO_BOOL", "FOR_ITER", "STORE_ATTR", "STORE_SUBSCR"):
        kind = name
    else:
        kind = "generic"
    if analysis.inside_user_handler(code, ins.offset) or not is_last_part(rows, index):
        # Inside try: the step must run inside the original code's exception handling.
        # Mid-instruction (3.13's COMPARE_OP + TO_BOOL...): no resume point after the row.
        kind = "generic"
    if kind == "generic":
        index = first_part(rows, index)
    return kind, index


def generate_break(fn: types.FunctionType, result, ins: Instruction, kind: str, compiler, guard_params: list[str],
                   name: str, is_resume: bool,
                   compile_graph: Callable) -> tuple[Callable, str, torch.fx.GraphModule | None]:
    """Source and function for a frame stopped before ``ins``. Returns (run, source, graph).

    In order: the graph is finished (leaving grad mode and autocast as it found them), the
    live values rebuilt and the side effects replayed, active ``with`` blocks re-entered
    natively, then the native step (``_STEPS``, by ``kind``) and the hand-over to the resume
    function after it."""
    tx = result.tx
    if any(getattr(v, "manager", None) is not None and v.manager.kind == "torch_function_off"
           for v in result.frame.stack if isinstance(v, ExitValue)):
        # The native step and the resume function would run with overrides on.
        raise Unsupported("a graph break inside a `with torch._C.DisableTorchFunction()` (or ...Subclass) block "
                          "is not supported yet")
    frame = result.frame
    code = fn.__code__
    stack = list(frame.stack)
    bound = {n: v for n, v in frame.locals.items()}
    ns = Namespace(fn.__globals__)
    ns.ns.update({"__MethodType": types.MethodType, "__route": route, "__compiler": compiler, "__resolve": resolve,
                  "__Continuation": Continuation, "__GradModeExit": GradModeExit,
                  "__AutocastExit": AutocastExit})
    active = [v.manager for v in stack if isinstance(v, ExitValue)]
    entry_grad = tx.entry_grad_mode
    break_grad = getattr(tx, "break_grad_mode", entry_grad)
    _leave_state_in_graph(tx.graph.graph, active, entry_grad, break_grad)

    live_names, live_values = _live_values(code, frame, ins, stack, bound)
    lines, tensor_exprs, gm = finish_graph(tx, ns, live_values + side_effect_values(tx), compile_graph)
    rb = Rebuilder(ns, tensor_exprs, tx.guards)
    # Side effects traced before the break happen now, before the native step.
    rb.lines.extend(replay_side_effects(tx, rb, [v for v in live_values
                                                 if v is not NULL and not isinstance(v, ExitValue)]))
    exits = _reenter_blocks(active, stack, rb, ns)
    if break_grad != entry_grad:
        rb.lines.append(f"torch._C._set_grad_enabled({break_grad!r})")

    closure = _closure_expr(code, frame, rb)
    # Every live value is read now, before the native step: a value read from a cell, an
    # attribute or a global (``n6 = n`` of a cell ``n``) is the object it was then, even when
    # the step (a call) stores something else there before the resume function gets it.
    for v in stack + [bound[n] for n in live_names]:
        if v is not NULL and not isinstance(v, ExitValue):
            try:
                rb.bind(v)
            except Unsupported:
                pass    # reported where the value is needed, if it is

    if kind != "generic" and any(isinstance(v, SavedExcInfoValue) for v in stack) \
            and first_part(decode(code), ins.index) == ins.index:
        # Inside an except or finally handler: the step runs where the handler is entered
        # again (a step function's prologue), so a call sees the exception it handles. (The
        # second half of an instruction, 3.13's branch after COMPARE_OP + TO_BOOL, tests a
        # value in Python, which no handled exception changes.)
        kind = "generic"
    site = _BreakSite(fn, frame, ins, stack, bound, live_names, rb, ns, compiler, is_resume, closure,
                      {id(m): e for m, e in exits})
    step, tail = _STEPS.get(kind, _generic_step)(site)
    # The step and the resume function run under the modes the trace had on its stack there.
    modes = mode_stack_lines(tx, rb)
    body = lines + rb.lines + modes + _guarded(step, [e for _, e in exits]) + tail
    line = ins.line if ins.line is not None else code.co_firstlineno
    run, src = emit(name, guard_params, body, ns, stands_for=(CUT_FROM.get(code, code), line))
    return run, src, gm


def _leave_state_in_graph(graph, active, entry_grad, break_grad):
    """The graph leaves global state as it found it (the generated code re-enters what is active)."""
    for mgr in reversed(active):
        if mgr.kind == "autocast":
            graph.create_node("call_function", torch.amp._exit_autocast, (mgr.saved[0],), {})
        elif mgr.kind == "inference_mode" and mgr.saved is not None:
            graph.create_node("call_function", exit_inference_mode, (mgr.saved[0],), {})
    if break_grad != entry_grad:
        graph.create_node("call_function", torch._C._set_grad_enabled, (entry_grad,), {})


def _live_values(code, frame, ins, stack, bound):
    """(names of the locals the rest of the frame reads, the values the code after the graph
    needs: the stack, those locals, the cells' contents).

    Locals the rest of the frame never reads are no graph outputs: they would keep tensors
    alive, and through AOTAutograd send (zero) gradients back into ops eager never
    differentiates (a dead ``torch.unique(x).sum()`` whose backward does not exist)."""
    read_later = analysis.live_locals(code, ins.offset)
    live_names = [n for n in code.co_varnames if n in bound and n not in code.co_cellvars and n in read_later]
    live_values = stack + [bound[n] for n in live_names if not isinstance(bound[n], PendingLocal)]
    live_values += [frame.cells[n].contents for n in code.co_cellvars
                    if isinstance(frame.cells.get(n), CellValue) and frame.cells[n].contents is not None]
    return live_names, live_values


def _reenter_blocks(active, stack, rb, ns):
    """Lines (added to ``rb``) entering the active ``with`` blocks again natively; returns
    [(manager, expression of its exit)], what the step's failure and the resume function call."""
    exits = []
    exit_values = {id(v.manager): v for v in stack if isinstance(v, ExitValue)}
    for i, mgr in enumerate(active):
        if mgr.kind == "autocast":
            device_type, dtype, enabled, cache = mgr.args
            ctx = f"__ctx{i}"
            rb.lines.append(f"{ctx} = __AutocastExit.enter({device_type!r}, {ns.ref(dtype)}, "
                            f"{enabled!r}, {cache!r})")
            exits.append((mgr, ctx))
        elif mgr.kind == "autocast_resumed":
            # Entered natively before this segment and still active: pass the same exit on.
            exits.append((mgr, ns.source(exit_values[id(mgr)].source)))
        elif mgr.kind in ("grad", "set_grad"):
            exits.append((mgr, f"__GradModeExit({mgr.saved!r})"))
        elif mgr.kind == "inference_mode" and mgr.saved is not None:
            # Entered again natively: the resume function leaves it natively (trace/callables/calls.py).
            ctx = f"__ctx{i}"
            rb.lines.append(f"{ctx} = {ns.ref(torch.inference_mode, 'inference_mode')}({mgr.args[0]!r})")
            rb.lines.append(f"{ctx}.__enter__()")
            exits.append((mgr, f"{ctx}.__exit__"))
        else:
            exits.append((mgr, "(lambda *a: None)"))
    return exits


def _guarded(step, exits):
    """The step's lines; inside ``with`` blocks, wrapped so a failure leaves them (innermost first)."""
    if not (exits and step):
        return step
    body = ["try:"] + ["    " + s for s in step] + ["except BaseException as __e:"]
    body += [f"    {e}(type(__e), __e, __e.__traceback__)" for e in reversed(exits)]
    return body + ["    raise"]


class _BreakSite:
    """What the native step at a break is written from: the frame's state there, how a stack
    slot reads (``slot_expr``) and how to hand over to the code after an offset (``resume``)."""

    def __init__(self, fn, frame, ins, stack, bound, live_names, rb, ns, compiler, is_resume, closure, exit_exprs):
        self.fn, self.code, self.frame, self.ins = fn, fn.__code__, frame, ins
        self.rows = decode(self.code)
        self.stack, self.bound, self.live_names = stack, bound, live_names
        self.rb, self.ns, self.compiler, self.is_resume, self.closure = rb, ns, compiler, is_resume, closure
        self.exit_exprs = exit_exprs
        self.next_offset = offset_after(self.rows, ins.index)
        self.handled = _handled_exceptions(frame.tx, stack)

    def slot_expr(self, v):
        if isinstance(v, ExitValue):
            return self.exit_exprs[id(v.manager)]
        if isinstance(v, SavedExcInfoValue):
            # The code after the break enters the handler again with the exception it handles
            # (bytecode.resume.HANDLED_PREFIX).
            return self.rb.expr(self.handled[id(v)])
        return self.rb.expr(v)

    def jump_offset(self):
        return self.rows[self.ins.target].offset

    def resume(self, target_offset, new_stack):
        """``return`` of the hand-over to the resume function at ``target_offset`` with ``new_stack``
        (values, or names of locals the step set)."""
        code = self.code
        layout, args = [], []
        for i, v in enumerate(new_stack):
            if v is NULL:
                layout.append(NULL_SLOT)
            else:
                layout.append(f"{HANDLED_PREFIX}{i}" if isinstance(v, SavedExcInfoValue) else f"__stack{i}")
                args.append(v if isinstance(v, str) else self.slot_expr(v))
        live = [n for n in self.live_names if n in analysis.live_locals(code, target_offset)]
        args += [self.rb.expr(self.bound[n]) for n in live]
        if closure_names(code):
            args.append(self.closure)   # the resume function runs over this call's cells
        ref = self.ns.ref(_resume_wrapper(self.compiler, self.fn, code, target_offset, layout, live), "resume")
        call = "__Continuation" if self.is_resume else "__resolve"
        return f"return {call}({ref}, ({', '.join(args)}{',' if len(args) == 1 else ''}))"


# The native steps done in Python, by the kind ``plan_break`` chose: (step lines, hand-over lines).

def _call(site):
    consumed, call_expr = _call_step(site.frame, site.ins, site.stack, site.slot_expr)
    return [f"__r = {call_expr}"], [site.resume(site.next_offset, site.stack[:len(site.stack) - consumed] + ["__r"])]


def _branch(site):
    stack = site.stack
    test = site.slot_expr(stack[-1])
    rest = stack[:-1]
    jump_if = site.ins.opname == "POP_JUMP_IF_TRUE"
    target = site.jump_offset()
    tail = ["if __test:", "    " + site.resume(target if jump_if else site.next_offset, rest)]
    tail.append(site.resume(site.next_offset if jump_if else target, rest))
    return [f"__test = bool({test})"], tail


def _keep_branch(site):
    stack = site.stack
    test = site.slot_expr(stack[-1])
    jump_if = site.ins.opname == "JUMP_IF_TRUE_OR_POP"
    target = site.jump_offset()
    keep = site.resume(target, stack)
    pop = site.resume(site.next_offset, stack[:-1])
    return [f"__test = bool({test})"], ["if __test:", "    " + (keep if jump_if else pop), pop if jump_if else keep]


def _to_bool(site):
    step = [f"__r = bool({site.slot_expr(site.stack[-1])})"]
    return step, [site.resume(site.next_offset, site.stack[:-1] + ["__r"])]


def _for_iter(site):
    stack, ins, rows = site.stack, site.ins, site.rows
    step = [f"__it = {site.slot_expr(stack[-1])}"]
    exit_offset = rows[ins.target].offset if ins.target < len(rows) else None
    step += ["try:", "    __item = next(__it)", "except StopIteration:",
             "    " + site.resume(exit_offset, stack[:-1])]
    return step, [site.resume(site.next_offset, stack[:-1] + ["__it", "__item"])]


def _store_attr(site):
    stack = site.stack
    step = [f"{site.slot_expr(stack[-1])}.{site.ins.argval} = {site.slot_expr(stack[-2])}"]
    return step, [site.resume(site.next_offset, stack[:-2])]


def _store_subscr(site):
    stack = site.stack
    step = [f"{site.slot_expr(stack[-2])}[{site.slot_expr(stack[-1])}] = {site.slot_expr(stack[-3])}"]
    return step, [site.resume(site.next_offset, stack[:-3])]


_STEPS = {**{name: _call for name in _CALLS}, **{name: _branch for name in _BRANCHES},
          **{name: _keep_branch for name in _KEEP_BRANCHES},
          "TO_BOOL": _to_bool, "FOR_ITER": _for_iter, "STORE_ATTR": _store_attr, "STORE_SUBSCR": _store_subscr}


class Handover:
    """Called at the end of a step function: continue in the next resume function."""
    __slots__ = ("wrapper", "steps", "__weakref__")
    _made = weakref.WeakKeyDictionary()   # wrapper -> its Handover (lives as long as the wrapper)

    def __init__(self, wrapper):
        self.wrapper = wrapper
        self.steps = {}    # step code handing over here, per instruction and layouts: made once

    @classmethod
    def of(cls, wrapper):
        handover = cls._made.get(wrapper)
        if handover is None:
            handover = cls._made[wrapper] = cls(wrapper)
        return handover

    def __call__(self, *args):
        return resolve(self.wrapper, args)


def _generic_step(site):
    """Run the breaking instruction natively in a copy of the code, then resume after it."""
    fn, code, ins, stack, rows = site.fn, site.code, site.ins, site.stack, site.rows
    live_names, bound, slot_expr, rb, ns = site.live_names, site.bound, site.slot_expr, site.rb, site.ns
    compiler, is_resume, closure = site.compiler, site.is_resume, site.closure
    raw = next(i for i in analysis._raw(code) if i.offset == ins.offset)
    if ins.opname == "CALL":
        effect = 1 - (ins.arg + 2)
    elif ins.opname == "CALL_KW":
        effect = 1 - (ins.arg + 3)
    elif ins.opname == "CALL_FUNCTION_EX":
        effect = 1 - (3 + (ins.arg & 1))
    elif raw.opname in ("RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE"):
        effect = 0
    else:
        effect = dis.stack_effect(raw.opcode, raw.arg, jump=False) if raw.opcode >= dis.HAVE_ARGUMENT \
            else dis.stack_effect(raw.opcode, jump=False)
    before = [NULL_SLOT if v is NULL else f"{HANDLED_PREFIX}{i}" if isinstance(v, SavedExcInfoValue) else f"__stack{i}"
              for i, v in enumerate(stack)]
    depth_after = len(stack) + effect
    after = []
    for i in range(depth_after):
        keep = i < len(stack) and (i < depth_after - 1 or effect > 0 and i < len(stack))
        after.append(before[i] if keep and (before[i] is NULL_SLOT or is_handled_slot(before[i])) else f"__h{i}")
    next_offset = offset_after(rows, ins.index)
    after_live, handover = _hand_over_at(site, next_offset, after) if next_offset is not None else ([], None)
    live_before = [n for n in live_names if n in analysis.live_locals(code, ins.offset)]
    original, orig_offset = original_offset(code, ins.offset)
    info = RESUME_INFO.get(code)
    origin = info.name if info is not None else code.co_name
    step_name = f"step_in_{_clean(origin)}_at_line_{ins.line}"
    key = (original, orig_offset, tuple(before), tuple(live_before), tuple(after), tuple(after_live), step_name)
    step = handover.steps.get(key) if handover is not None else None
    if step is None:
        exits = _handler_exits(compiler, fn, original, orig_offset, before, live_before)
        entries = _handler_entries(compiler, fn, original, orig_offset, before, live_before)
        step = step_code(original, orig_offset, before, live_before, after, after_live, handover, step_name, exits,
                         entries, _jump_continuation(site, raw, before))
        if handover is not None:
            handover.steps[key] = step
    CUT_FROM[step] = original
    _log_code("STEP FUNCTION", step)
    debug_dir.generated_code("step function", step)
    routed = _callable_slot(ins, stack)
    args = [(f"__route(__compiler, {slot_expr(v)})" if i == routed else slot_expr(v))
            for i, v in enumerate(stack) if v is not NULL]
    args += [rb.expr(bound[n]) for n in live_before]
    if closure_names(code):
        # Made per call over this call's cells; it passes them on to the resume function.
        args.append(closure)
        ns.ns["__FunctionType"] = types.FunctionType
        step_fn = f"__FunctionType({ns.ref(step, 'step')}, G, {step_name!r}, None, {closure})"
    else:
        step_fn = ns.ref(types.FunctionType(step, fn.__globals__, step_name), "step")
    call = "__Continuation" if is_resume else "__resolve"
    return [], [f"return {call}({step_fn}, ({', '.join(args)}{',' if len(args) == 1 else ''}))"]


def _hand_over_at(site, offset, layout):
    """(live locals, handover) for a step that continues at ``offset`` with its stack stored
    under the names of ``layout``: the resume function there."""
    live = [n for n in site.live_names if n in analysis.live_locals(site.code, offset)]
    resume_layout = [s if s is NULL_SLOT or is_handled_slot(s) else f"__stack{i}" for i, s in enumerate(layout)]
    return live, Handover.of(_resume_wrapper(site.compiler, site.fn, site.code, offset, resume_layout, live))


_JUMPING_STEPS = _BRANCHES | _KEEP_BRANCHES | {"FOR_ITER"}


def _jump_continuation(site, raw, before):
    """(stack layout, live locals, handover) at the jump target of a branch or ``FOR_ITER`` run
    as a generic step (inside ``try``), or None: the step hands over there too, so the other side
    of the branch, or the code after the exhausted loop, is compiled as well."""
    ins, rows = site.ins, site.rows
    if ins.opname not in _JUMPING_STEPS or ins.target is None or ins.target >= len(rows) \
            or not is_last_part(rows, ins.index):
        return None
    # At the decoded target an exhausted FOR_ITER has popped its iterator (3.12/3.13's END_FOR
    # included); a branch pops its condition, or keeps it (JUMP_IF_*_OR_POP).
    effect = -1 if ins.opname == "FOR_ITER" else dis.stack_effect(raw.opcode, raw.arg, jump=True)
    layout = [s if s is NULL_SLOT or is_handled_slot(s) else f"__j{i}"
              for i, s in enumerate(before[:len(before) + effect])]
    return (layout, *_hand_over_at(site, rows[ins.target].offset, layout))


def _handled_exceptions(tx, stack):
    """For each slot of ``stack`` where an except or finally handler saved the exception handled
    before it: the exception handled from that slot's level on (the next slot's saved one, or
    the trace's current one). The outermost slot must have saved what the call started with
    (nothing known): the code after the break finds that again where it enters the handler."""
    slots = [v for v in stack if isinstance(v, SavedExcInfoValue)]
    if not slots:
        return {}
    if slots[0].prev is not None:
        raise Unsupported("a graph break inside an exception handler entered while the trace already "
                          "handled another exception is not supported yet")
    current = tx.handled_exception
    return {id(v): (slots[k + 1].prev if k + 1 < len(slots) else current) for k, v in enumerate(slots)}


def _handler_entries(compiler, fn, original, offset, before, live_before):
    """The ``except`` handler the step's instruction raises into, where the step hands over as
    the handler starts (``step_code``'s entries): the handler is traced with the real exception,
    a break inside it resumes inside it (``HANDLED_PREFIX``). Only a handler entered without the
    raising offset pushed (``lasti``: ``with`` exits and cleanups run natively), whose locals read
    are all bound at the instruction."""
    entry = next((e for e in analysis.exception_entries(original) if e.start <= offset < e.end), None)
    if entry is None or entry.lasti or entry.depth > len(before):
        return []
    head = next((i for i in analysis._raw(original) if i.offset >= entry.target), None)
    if head is None or head.opname != "PUSH_EXC_INFO":
        return []
    live = analysis.live_locals(original, entry.target, saves_read=False) - set(closure_names(original))
    if not live <= set(live_before):
        return []
    names = [n for n in original.co_varnames if n in live]
    layout = list(before[:entry.depth]) + [f"__stack{entry.depth}"]
    try:
        wrapper = _resume_wrapper(compiler, fn, original, entry.target, layout, names)
    except (Unsupported, ValueError):      # no resume function there: the handler runs natively
        return []
    return [(entry.target, layout, names, Handover.of(wrapper))]


def _handler_exits(compiler, fn, original, offset, before, live_before):
    """Where the step's instruction, raising, leaves a handler of ``original`` to go on as plain
    code: (``POP_EXCEPT`` offset, stack layout, live locals, handover to the resume function
    after it) for ``step_code``, so that what follows the handler is compiled again instead of
    running natively to the end. A place where a local read after it might not be bound (the
    step's code holds only the locals passed to it, and what it binds) is left out: the code
    runs on natively from there, as before."""
    exits = []
    for pop_offset, after, depth, bound in analysis.handler_exits(original, offset, frozenset(live_before)):
        # A local only an inlined comprehension saves after here need not be bound: unbound,
        # it is saved and put back unbound, as in the original.
        # Cell variables are not passed: both functions run over the call's cells.
        live = analysis.live_locals(original, after, saves_read=False) - set(closure_names(original))
        layout = list(before[:depth])
        if depth > len(before) or NULL_SLOT in layout or not live <= bound:
            continue
        names = [n for n in original.co_varnames if n in live]
        try:
            wrapper = _resume_wrapper(compiler, fn, original, after, layout, names)
        except (Unsupported, ValueError):     # no resume function there: native from there on
            continue
        exits.append((pop_offset, layout, names, Handover.of(wrapper)))
    return exits


def _closure_expr(code, frame, rb):
    """The closure resume and step code run over (``bytecode.resume.closure_names``): a real
    cell per cell variable of the frame, made once, so functions rebuilt over the same trace
    cell share it and see what the rest of the call stores there; then this call's closure.
    Nothing is copied by value, so a variable reassigned after the break (a nonlocal, a loop
    variable a lambda captured, a parameter) is seen by every function closing over it."""
    if not closure_names(code):
        return None
    cells = [rb.cell(frame.cells[n]) for n in code.co_cellvars]
    if code.co_freevars:
        cells.append(f"*{CLOSURE_PARAM}")
    return rb.temp(f"({', '.join(cells)},)")


def _callable_slot(ins, stack):
    """Stack index of the callable a CALL-family instruction calls, or None."""
    if ins.opname == "CALL_FUNCTION_EX":
        top = 2 if ins.arg & 1 else 1
    elif ins.opname == "CALL_KW":
        top = ins.arg + 1
    elif ins.opname == "CALL":
        top = ins.arg
    else:
        return None
    below, above = len(stack) - top - 2, len(stack) - top - 1
    if below < 0:
        return None
    return above if stack[below] is NULL else below


def _call_step(frame, ins, stack, slot_expr):
    """(stack slots consumed, expression performing the call)."""
    if ins.opname == "CALL_FUNCTION_EX":
        has_kw = bool(ins.arg & 1)
        kwargs = stack[-1] if has_kw else None
        args = stack[-2] if has_kw else stack[-1]
        n_top = 2 if has_kw else 1
        below, above = stack[-n_top - 2], stack[-n_top - 1]
        fn, self_value = split_call_prefix(below, above)
        pos = f"({slot_expr(self_value)},) + tuple({slot_expr(args)})" if self_value is not None \
            else f"tuple({slot_expr(args)})"
        kw = f"dict({slot_expr(kwargs)})" if kwargs is not None else "{}"
        return n_top + 2, f"__route(__compiler, {slot_expr(fn)})(*{pos}, **{kw})"
    argc = ins.arg
    if ins.opname == "CALL_KW":
        kwnames = stack[-1].value
        operands = stack[-(argc + 3):-1]
        consumed = argc + 3
    else:
        kwnames = frame.kw_names or ()
        operands = stack[-(argc + 2):]
        consumed = argc + 2
    below, above, *args = operands
    fn, self_value = split_call_prefix(below, above)
    if self_value is not None:
        args = [self_value] + args
    npos = len(args) - len(kwnames)
    operands = [slot_expr(a) for a in args[:npos]] + [f"{k}={slot_expr(a)}" for k, a in zip(kwnames, args[npos:])]
    return consumed, f"__route(__compiler, {slot_expr(fn)})({', '.join(operands)})"


def _resume_wrapper(compiler, fn, code, offset, layout, live):
    """The compiled wrapper of the resume function for ``offset`` of ``code``, built from the
    original code. It takes the closure as its last argument (when there is one): the code
    generated here is cached per code object and shared by every function made from it."""
    original, orig_offset = original_offset(code, offset)
    info = RESUME_INFO.get(code)
    origin = info.name if info is not None else code.co_name
    line = next((r.line for r in decode(original) if r.offset >= orig_offset), original.co_firstlineno)
    name = f"resume_in_{_clean(origin)}_at_line_{line}"
    new_code, offsets = resume_code(original, orig_offset, tuple(layout), tuple(live), name)
    if new_code not in RESUME_INFO:
        RESUME_INFO[new_code] = ResumeInfo(original, origin, orig_offset, offsets)
        CUT_FROM[new_code] = original
        _log_code("RESUME FUNCTION", new_code)
    debug_dir.generated_code("resume function", new_code)
    return compiler.wrapper_for_code(new_code, fn.__globals__)


def _log_code(what, code):
    if logs.enabled("bytecode"):
        logs.get_logger("bytecode").debug("%s %s\n%s", what, code_name(code), dis.Bytecode(code).dis())
def _clean(name):
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)
