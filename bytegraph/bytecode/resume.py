"""Resume functions: a copy of a function's code that starts at a chosen instruction.

``resume_function(fn_code, ...)`` builds (and caches) a code object whose
parameters are the values that were on the stack at the break followed by the
live locals; a short prologue pushes the stack values back and jumps to the
instruction, and from there the original code runs unchanged (exception table
included), so ``try``/``with`` handlers and loops behave as in the original.

Built with the ``bytecode`` package (it assembles 3.11-3.14 code objects with
exception tables). Per the lessons recorded in the design brief, it is loaded
with ``conserve_exception_block_stackdepth=True`` and emitted with
``compute_exception_stack_depths=False``.
"""
import dis
import sys
from functools import lru_cache

from bytecode import Bytecode, CellVar, CompilerFlags, FreeVar, Instr, Label

from . import analysis, versions

NULL_SLOT = None   # marks a stack slot holding CALL's NULL (pushed by the prologue, not passed)
# A stack slot named so holds what an except or finally handler saved on entry (the exception
# handled before it); its parameter carries the exception handled from there on instead. The
# prologue enters the handler again with it (PUSH_EXC_INFO: the slot gets the exception handled
# at the call, which is what it was at the original call), and a hand-over leaves it
# (POP_EXCEPT), passing on the exception it handled.
HANDLED_PREFIX = "__handled"


def is_handled_slot(s):
    return s is not NULL_SLOT and s.startswith(HANDLED_PREFIX)


def handled_exception():
    """The exception being handled where this is called (3.11 has no ``sys.exception()``)."""
    return sys.exc_info()[1]


@lru_cache(maxsize=1024)
def resume_code(code, offset, stack_layout, live, name):
    """(code object resuming ``code`` at ``offset``, its offset map).

    ``stack_layout`` is a tuple with one entry per stack slot (bottom first):
    ``NULL_SLOT`` or the parameter name that carries the slot's value.
    ``live`` are the local names passed after the stack parameters.
    The offset map takes an offset of the new code to the offset in ``code`` of
    the instruction it was copied from (None: prologue, or the second half of a
    split superinstruction, where nothing may resume).
    """
    bc, target, origins = _load_at(code, offset)
    label = Label()
    bc.insert(next(j for j, x in enumerate(bc) if x is target), label)
    _enter_at(bc, label, stack_layout, target.lineno)
    _cells_from_closure(bc)
    _set_parameters(bc, stack_layout, live, name)
    # The original stack size bounds ours: the prologue only rebuilds a depth the code had.
    new_code = bc.to_code(stacksize=code.co_stacksize + len(stack_layout) + 3,
                          compute_exception_stack_depths=False)
    return new_code, _offset_map(bc, new_code, origins)


def _load_at(code, offset):
    """The code as a ``Bytecode`` list, the instruction found at ``offset``, and where each
    instruction came from (see ``_origin``)."""
    bc = Bytecode.from_code(code, conserve_exception_block_stackdepth=True)
    raw = [i for i in dis.get_instructions(code) if i.opname != "EXTENDED_ARG"]
    instrs = [x for x in bc if isinstance(x, Instr)]
    if len(raw) != len(instrs):
        raise ValueError(f"cannot map instructions of {code.co_name} ({len(raw)} vs {len(instrs)})")
    # id -> (instruction, offset): holding the instruction keeps its id from being reused.
    origins = {id(x): (x, d.offset) for x, d in zip(instrs, raw)}
    k = next(j for j, d in enumerate(raw) if d.offset == offset)
    target = instrs[k]
    _explicit_super(bc, code, origins)
    # Copied code renumbers its locals (parameters first), and a superinstruction can only
    # name locals 0-15: assemble each as its two plain instructions.
    j = 0
    while j < len(bc):
        x = bc[j]
        if isinstance(x, Instr) and x.name in versions.SUPERINSTRUCTIONS:
            first, second = versions.SUPERINSTRUCTIONS[x.name]
            a = Instr(first, x.arg[0], location=x.location)
            b = Instr(second, x.arg[1], location=x.location)
            origins[id(a)], origins[id(b)] = (a, origins[id(x)][1]), (b, None)
            bc[j:j + 1] = [a, b]
            if x is target:
                target = a
            j += 1
        j += 1
    return bc, target, origins


# Instructions added by _explicit_super in front of a super() call: a step function that runs
# that call copies them with it.
SUPER_ARGUMENTS = "super() arguments"


def _explicit_super(bc, code, origins):
    """Zero-argument ``super()`` in copied code, made explicit: CPython finds its arguments in
    the running frame (the first local and the ``__class__`` cell), and a copy's first local
    is whatever it takes first (a stack value). ``LOAD_SUPER_ATTR`` (which loads both itself)
    gets its two-argument form; a plain ``super()`` call gets ``__class__`` and the first
    argument pushed and passed (``analysis.live_locals`` keeps that argument live)."""
    if not analysis.zero_argument_super(code):
        return
    first = code.co_varnames[0]
    self_arg = CellVar(first) if first in code.co_cellvars else first
    j = 0
    while j < len(bc):
        x = bc[j]
        if isinstance(x, Instr) and x.name == "LOAD_SUPER_ATTR" and not x.arg[1]:
            x.arg = (x.arg[0], True, x.arg[2])
        elif isinstance(x, Instr) and x.name == "LOAD_GLOBAL" and x.arg[1] == "super":
            k = j + 1
            while k < len(bc) and isinstance(bc[k], Instr) and bc[k].name in versions.CALL_SETUP \
                    and bc[k].arg in (0, None):
                k += 1
            call = bc[k] if k < len(bc) else None
            if isinstance(call, Instr) and call.name == "CALL" and call.arg == 0 \
                    and all(isinstance(y, Instr) for y in bc[j + 1:k]):
                for y in bc[j + 1:k + 1]:
                    if y.name in ("PRECALL", "CALL"):
                        y.arg = 2
                loads = [Instr("LOAD_DEREF", FreeVar("__class__"), location=x.location),
                         Instr("LOAD_DEREF" if isinstance(self_arg, CellVar) else "LOAD_FAST", self_arg,
                               location=x.location)]
                for y in loads:
                    origins[id(y)] = (y, SUPER_ARGUMENTS)
                bc[j + 1:j + 1] = loads
                j += 2
        j += 1


def _cells_from_closure(bc):
    """Make the code's cell variables free variables, ahead of its own: code copied from the
    middle of a function must run over the cells of the call it continues (functions made
    before the break share them, and see what the rest of the call stores in them), so its
    closure is ``(*cells of the cell variables, *the function's closure)``."""
    cells = list(bc.cellvars)
    if not cells:
        return
    free = cells + list(bc.freevars)
    out = []
    for x in bc:
        if isinstance(x, Instr):
            if x.name == "MAKE_CELL" or x.name == "COPY_FREE_VARS":
                continue
            if isinstance(x.arg, CellVar):
                x.arg = FreeVar(x.arg.name)
            elif x.name in ("LOAD_FAST", "LOAD_FAST_CHECK") and x.arg in cells:
                x.arg = FreeVar(x.arg)     # 3.13 loads a cell object (for a closure) with LOAD_FAST
        out.append(x)
    first = next(x for x in out if isinstance(x, Instr))
    out.insert(0, Instr("COPY_FREE_VARS", len(free), location=first.location))
    bc[:] = out
    bc.cellvars = []
    bc.freevars = free


def closure_names(code):
    """The names, in order, of the cells the copied code of ``code`` runs over."""
    return code.co_cellvars + code.co_freevars


def _offset_map(bc, new_code, origins):
    """new offset -> original offset (or None) for every instruction of ``new_code``."""
    new = [i.offset for i in dis.get_instructions(new_code) if i.opname != "EXTENDED_ARG"]
    instrs = [x for x in bc if isinstance(x, Instr)]
    if len(new) != len(instrs):
        raise ValueError(f"assembled code of {new_code.co_name} has {len(new)} instructions, "
                         f"expected {len(instrs)}")
    return {o: _origin(origins, x) for o, x in zip(new, instrs)}


def _origin(origins, instr):
    """The original offset ``instr`` was copied from; None for code we added or a split's half."""
    entry = origins.get(id(instr))
    return entry[1] if entry is not None and entry[0] is instr and entry[1] != SUPER_ARGUMENTS else None


def _enter_at(bc, label, stack_layout, lineno):
    """Prologue after RESUME: push the stack values back and jump to ``label``."""
    resume_at = next(j for j, x in enumerate(bc) if isinstance(x, Instr) and x.name == "RESUME")
    prologue = []
    for s in stack_layout:
        if s is NULL_SLOT:
            prologue.append(Instr("PUSH_NULL", lineno=lineno))
        elif is_handled_slot(s):
            prologue += [Instr("LOAD_FAST", s, lineno=lineno), Instr("PUSH_EXC_INFO", lineno=lineno),
                         Instr("POP_TOP", lineno=lineno)]
        else:
            prologue.append(Instr("LOAD_FAST", s, lineno=lineno))
    prologue.append(Instr("JUMP_FORWARD", label, lineno=lineno))
    bc[resume_at + 1:resume_at + 1] = prologue


def _set_parameters(bc, stack_layout, live, name):
    """Parameters: the stack values (NULLs are pushed, not passed), then the live locals."""
    params = [s for s in stack_layout if s is not NULL_SLOT] + list(live)
    bc.argnames = params
    bc.argcount = len(params)
    bc.posonlyargcount = 0
    bc.kwonlyargcount = 0
    bc.flags &= ~(CompilerFlags.VARARGS | CompilerFlags.VARKEYWORDS)
    bc.qualname = name      # co_name stays the user's function's: what its frames show


CLOSURE_PARAM = "__closure"   # the cells of the call, passed along by generated code


def step_code(code, offset, stack_layout, live, after_layout, after_live, handover, name, exits=(), entries=(),
              jump=None):
    """Code that runs one instruction natively, then hands over to ``handover``.

    It starts like a resume function at ``offset``; right after a copy of that single
    instruction it jumps to a tail placed after all exception ranges, which
    stores the stack (laid out as ``after_layout``) and returns
    ``handover(*stack, *after_live)``. The instruction runs inside the original
    exception handling; what follows runs in the handover's frame, so each
    handler runs at most once. When ``code`` has free variables, the code takes
    the closure as a last parameter ``__closure`` and passes it on to ``handover``
    (resume functions are made over the cells of the call that reaches them). As in a
    resume function, the cell variables of ``code`` are cells of that closure.

    ``exits``: (offset of a ``POP_EXCEPT``, stack layout, live locals, handover) for each place
    where a handler the instruction raises into ends (``analysis.handler_exits``); there the
    code hands over in the same way, so what follows the handler is compiled again.

    ``entries``: (offset of a handler's first instruction, stack layout, live locals, handover)
    for the ``except`` handler the instruction raises into: the code hands over as it enters
    it, the exception on top of the stack, so the handler itself is compiled too.

    ``jump``: (stack layout, live locals, handover) where the instruction is a branch or a
    ``FOR_ITER``: its copy jumps to a tail of its own that hands over there, so the code at
    the jump target (the other side of a branch, the code after an exhausted loop) is compiled
    too, instead of running the original code natively from there.
    """
    takes_closure = bool(closure_names(code))
    bc, target, origins = _load_at(code, offset)
    lineno = target.lineno
    start = Label()
    tail = Label()
    pos = next(j for j, x in enumerate(bc) if x is target)
    first = pos
    while pos + 1 < len(bc) and isinstance(bc[pos + 1], Instr) and id(bc[pos + 1]) in origins \
            and _origin(origins, bc[pos + 1]) is None:
        pos += 1   # the second half of a split superinstruction runs too
    # A CALL's KW_NAMES/PRECALL run with it (else its keywords would be lost).
    while first > 0 and isinstance(bc[first - 1], Instr) and (
            bc[first - 1].name in versions.CALL_SETUP or origins.get(id(bc[first - 1]), (None, None))[1] == SUPER_ARGUMENTS):
        first -= 1
    # The step runs a copy of the instruction, inside the same exception ranges, that alone
    # leads to the hand-over. When it raises, the handler and everything after it run the
    # original code natively to the end: a loop that comes back to the instruction must not
    # hand over, as CPython's own stack there (a LOAD_METHOD pair, say) is not the layout the
    # resume function was made for.
    copies = [x.copy() for x in bc[first:pos + 1] if isinstance(x, Instr)]
    tails = []
    if jump is not None and isinstance(copies[-1].arg, Label):
        jumped = Label()
        branch = copies[-1]
        branch.set(versions.FORWARD_JUMP.get(branch.name, branch.name), jumped)
        padding = [Instr(op, lineno=lineno) for op in versions.FOR_ITER_EXIT_PADDING] \
            if branch.name == "FOR_ITER" else []
        layout, jump_live, jump_handover = jump
        jump_tail = _handover_tail(jumped, layout, jump_live, jump_handover, takes_closure, lineno)
        tails.append(jump_tail[:1] + padding + jump_tail[1:])
    skip = Label()
    bc[first:first] = [Instr("JUMP_FORWARD", skip, lineno=lineno), start, *copies,
                       Instr("JUMP_FORWARD", tail, lineno=lineno), skip]
    _enter_at(bc, start, stack_layout, lineno)
    for target_offset, layout, entry_live, entry_handover in entries:
        at = next((j for j, x in enumerate(bc) if isinstance(x, Instr) and _origin(origins, x) == target_offset),
                  None)
        if at is None:
            continue
        label = Label()
        bc.insert(at, Instr("JUMP_FORWARD", label, lineno=bc[at].lineno))
        tails.append(_handover_tail(label, layout, entry_live, entry_handover, takes_closure, bc[at].lineno))
    for pop_offset, layout, exit_live, exit_handover in exits:
        at = next((j for j, x in enumerate(bc) if isinstance(x, Instr) and x.name == "POP_EXCEPT"
                   and _origin(origins, x) == pop_offset), None)
        if at is None:
            continue
        label = Label()
        bc.insert(at + 1, Instr("JUMP_FORWARD", label, lineno=bc[at].lineno))
        tails.append(_handover_tail(label, layout, exit_live, exit_handover, takes_closure, bc[at].lineno))
    # A NULL cannot be popped; storing it into a spare local is safe (the local becomes unbound).
    if handover is None:
        # The instruction never falls through (a raise or return at the end of the code).
        bc.extend([tail, Instr("LOAD_CONST", None, lineno=lineno), Instr("RETURN_VALUE", lineno=lineno)])
    else:
        tails.insert(0, _handover_tail(tail, after_layout, after_live, handover, takes_closure, lineno))
    for code_tail in tails:
        bc.extend(code_tail)
    _cells_from_closure(bc)
    _set_parameters(bc, stack_layout, list(live) + ([CLOSURE_PARAM] if takes_closure else []), name)
    # A tail pushes no more than it has instructions (the handover, its arguments).
    extra = max([0] + [len(t) for t in tails])
    return bc.to_code(stacksize=code.co_stacksize + len(stack_layout) + extra + 5,
                      compute_exception_stack_depths=False)


def _handover_tail(label, layout, live, handover, takes_closure, lineno):
    """``label``, then the stack (laid out as ``layout``) stored and ``handover(*stack, *live)``
    returned: placed after all exception ranges, so the handover's own exceptions are not
    handled here again."""
    stores = []
    for s in reversed(layout):
        if is_handled_slot(s):
            # Leave the handler: pass on the exception it handles, put back the one before.
            stores += [Instr(op, arg, lineno=lineno) if arg is not None else Instr(op, lineno=lineno)
                       for op, arg in versions.call_sequence(handled_exception, [])]
            stores += [Instr("STORE_FAST", s, lineno=lineno), Instr("POP_EXCEPT", lineno=lineno)]
        else:
            stores.append(Instr("STORE_FAST", "__null" if s is NULL_SLOT else s, lineno=lineno))
    args = [s for s in layout if s is not NULL_SLOT] + list(live)
    if takes_closure:
        args.append(CLOSURE_PARAM)
    call = [Instr(op, arg, lineno=lineno) if arg is not None else Instr(op, lineno=lineno)
            for op, arg in versions.call_sequence(handover, args)]
    return [label] + stores + call + [Instr("RETURN_VALUE", lineno=lineno)]
