"""Code for a frame that stops at a graph break.

The transformed function runs the graph captured so far, rebuilds the live
values, performs the one step the tracer could not (a call, a branch on a
tensor, the next step of an opaque iterator, a store), and hands over to a
resume function that continues the original code after that step.
"""
import dis
import types
import weakref

import torch

from ..bytecode import analysis
from ..bytecode.instructions import decode, first_part, is_last_part, offset_after
from ..bytecode.resume import CLOSURE_PARAM, NULL_SLOT, closure_names, resume_code, step_code
from ..bytecode.versions import split_call_prefix
from ..debug import debug_dir, logs
from ..errors import Unsupported
from ..null import NULL
from ..residual import (AutocastExit, Continuation, GradModeExit, exit_inference_mode, route,
                        resolve)
from ..stacks import CUT_FROM, code_name
from ..values.base import CellValue, ExitValue
from ..trace.frame import PendingLocal
from .rebuild import Namespace, Rebuilder
from .transformed import emit, finish_graph, replay_side_effects, side_effect_values

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


def plan_break(fn, index):
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


def generate_break(fn, result, ins, kind, compiler, guard_params, name, is_resume, compile_graph):
    """Source and function for a frame stopped before ``ins``. Returns (run, source, graph)."""
    tx = result.tx
    frame = result.frame
    code = fn.__code__
    rows = decode(code)
    stack = list(frame.stack)
    bound = {n: v for n, v in frame.locals.items()}
    ns = Namespace(fn.__globals__)
    ns.ns.update({"__MethodType": types.MethodType, "__route": route, "__compiler": compiler, "__resolve": resolve,
                  "__Continuation": Continuation, "__GradModeExit": GradModeExit,
                  "__AutocastExit": AutocastExit})
    graph = tx.graph.graph

    # The graph leaves global state as it found it; the code below re-enters what is active.
    active = [v.manager for v in stack if isinstance(v, ExitValue)]
    for mgr in reversed(active):
        if mgr.kind == "autocast":
            graph.create_node("call_function", torch.amp._exit_autocast, (mgr.saved[0],), {})
        elif mgr.kind == "inference_mode" and mgr.saved is not None:
            graph.create_node("call_function", exit_inference_mode, (mgr.saved[0],), {})
    entry_grad = tx.entry_grad_mode
    break_grad = getattr(tx, "break_grad_mode", entry_grad)
    if break_grad != entry_grad:
        graph.create_node("call_function", torch._C._set_grad_enabled, (entry_grad,), {})

    # Locals the rest of the frame never reads are no graph outputs: they would keep tensors
    # alive, and through AOTAutograd send (zero) gradients back into ops eager never
    # differentiates (a dead ``torch.unique(x).sum()`` whose backward does not exist).
    read_later = analysis.live_locals(code, ins.offset)
    live_names = [n for n in code.co_varnames if n in bound and n not in code.co_cellvars and n in read_later]
    live_values = stack + [bound[n] for n in live_names if not isinstance(bound[n], PendingLocal)]
    live_values += [frame.cells[n].contents for n in code.co_cellvars
                    if isinstance(frame.cells.get(n), CellValue) and frame.cells[n].contents is not None]
    lines, tensor_exprs, gm = finish_graph(tx, ns, live_values + side_effect_values(tx), compile_graph)
    rb = Rebuilder(ns, tensor_exprs, tx.guards)
    # Side effects traced before the break happen now, before the native step.
    rb.lines.extend(replay_side_effects(tx, rb, [v for v in live_values
                                                 if v is not NULL and not isinstance(v, ExitValue)]))
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
            # Entered again natively: the resume function leaves it natively (trace/calls.py).
            ctx = f"__ctx{i}"
            rb.lines.append(f"{ctx} = {ns.ref(torch.inference_mode, 'inference_mode')}({mgr.args[0]!r})")
            rb.lines.append(f"{ctx}.__enter__()")
            exits.append((mgr, f"{ctx}.__exit__"))
        else:
            exits.append((mgr, "(lambda *a: None)"))
    exit_exprs = {id(m): e for m, e in exits}
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

    def slot_expr(v):
        if isinstance(v, ExitValue):
            return exit_exprs[id(v.manager)]
        return rb.expr(v)

    def resume(target_offset, new_stack):
        layout, args = [], []
        for i, v in enumerate(new_stack):
            if v is NULL:
                layout.append(NULL_SLOT)
            else:
                layout.append(f"__stack{i}")
                args.append(v if isinstance(v, str) else slot_expr(v))
        live = [n for n in live_names if n in analysis.live_locals(code, target_offset)]
        args += [rb.expr(bound[n]) for n in live]
        if closure_names(code):
            args.append(closure)   # the resume function runs over this call's cells
        ref = ns.ref(_resume_wrapper(compiler, fn, code, target_offset, layout, live), "resume")
        call = "__Continuation" if is_resume else "__resolve"
        return f"return {call}({ref}, ({', '.join(args)}{',' if len(args) == 1 else ''}))"

    next_offset = offset_after(rows, ins.index)
    step = []
    tail = []
    if kind in _CALLS:
        consumed, call_expr = _call_step(frame, ins, stack, slot_expr)
        step.append(f"__r = {call_expr}")
        tail.append(resume(next_offset, stack[:len(stack) - consumed] + ["__r"]))
    elif kind in _BRANCHES:
        test = slot_expr(stack[-1])
        rest = stack[:-1]
        jump_if = kind == "POP_JUMP_IF_TRUE"
        target = rows[ins.target].offset
        step.append(f"__test = bool({test})")
        tail += ["if __test:", "    " + resume(target if jump_if else next_offset, rest)]
        tail.append(resume(next_offset if jump_if else target, rest))
    elif kind in _KEEP_BRANCHES:
        test = slot_expr(stack[-1])
        jump_if = kind == "JUMP_IF_TRUE_OR_POP"
        target = rows[ins.target].offset
        step.append(f"__test = bool({test})")
        keep = resume(target, stack)
        pop = resume(next_offset, stack[:-1])
        tail += ["if __test:", "    " + (keep if jump_if else pop)]
        tail.append(pop if jump_if else keep)
    elif kind == "TO_BOOL":
        step.append(f"__r = bool({slot_expr(stack[-1])})")
        tail.append(resume(next_offset, stack[:-1] + ["__r"]))
    elif kind == "FOR_ITER":
        step.append(f"__it = {slot_expr(stack[-1])}")
        exit_offset = rows[ins.target].offset if ins.target < len(rows) else None
        step += ["try:", "    __item = next(__it)", "except StopIteration:",
                 "    " + resume(exit_offset, stack[:-1])]
        tail.append(resume(next_offset, stack[:-1] + ["__it", "__item"]))
    elif kind == "STORE_ATTR":
        step.append(f"{slot_expr(stack[-1])}.{ins.argval} = {slot_expr(stack[-2])}")
        tail.append(resume(next_offset, stack[:-2]))
    elif kind == "STORE_SUBSCR":
        step.append(f"{slot_expr(stack[-2])}[{slot_expr(stack[-1])}] = {slot_expr(stack[-3])}")
        tail.append(resume(next_offset, stack[:-3]))
    else:
        tail.append(_generic_step(fn, code, ins, stack, live_names, bound, slot_expr, rb, ns, compiler,
                                  is_resume, rows, closure))

    body = lines + rb.lines
    if exits and step:
        body.append("try:")
        body += ["    " + s for s in step]
        body.append("except BaseException as __e:")
        for _, e in reversed(exits):
            body.append(f"    {e}(type(__e), __e, __e.__traceback__)")
        body.append("    raise")
    else:
        body += step
    body += tail
    line = ins.line if ins.line is not None else code.co_firstlineno
    run, src = emit(name, guard_params, body, ns, stands_for=(CUT_FROM.get(code, code), line))
    return run, src, gm


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


def _generic_step(fn, code, ins, stack, live_names, bound, slot_expr, rb, ns, compiler, is_resume, rows,
                  closure):
    """Run the breaking instruction natively in a copy of the code, then resume after it."""
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
    before = [NULL_SLOT if v is NULL else f"__stack{i}" for i, v in enumerate(stack)]
    depth_after = len(stack) + effect
    after = []
    for i in range(depth_after):
        keep = i < len(stack) and (i < depth_after - 1 or effect > 0 and i < len(stack))
        after.append(before[i] if keep and before[i] is NULL_SLOT else f"__h{i}")
    next_offset = offset_after(rows, ins.index)
    after_live, resume_layout = [], []
    if next_offset is not None:
        after_live = [n for n in live_names if n in analysis.live_locals(code, next_offset)]
        resume_layout = [NULL_SLOT if s is NULL_SLOT else f"__stack{i}" for i, s in enumerate(after)]
        handover = Handover.of(_resume_wrapper(compiler, fn, code, next_offset, resume_layout, after_live))
    else:
        handover = None
    live_before = [n for n in live_names if n in analysis.live_locals(code, ins.offset)]
    original, orig_offset = original_offset(code, ins.offset)
    info = RESUME_INFO.get(code)
    origin = info.name if info is not None else code.co_name
    step_name = f"step_in_{_clean(origin)}_at_line_{ins.line}"
    key = (original, orig_offset, tuple(before), tuple(live_before), tuple(after), tuple(after_live), step_name)
    step = handover.steps.get(key) if handover is not None else None
    if step is None:
        step = step_code(original, orig_offset, before, live_before, after, after_live, handover, step_name)
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
    return f"return {call}({step_fn}, ({', '.join(args)}{',' if len(args) == 1 else ''}))"


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
