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
import types
from functools import lru_cache

from bytecode import Bytecode, CompilerFlags, Instr, Label

NULL_SLOT = None   # marks a stack slot holding CALL's NULL (pushed by the prologue, not passed)


@lru_cache(maxsize=1024)
def resume_code(code, offset, stack_layout, live, name):
    """Code object resuming ``code`` at ``offset``.

    ``stack_layout`` is a tuple with one entry per stack slot (bottom first):
    ``NULL_SLOT`` or the parameter name that carries the slot's value.
    ``live`` are the local names passed after the stack parameters.
    """
    bc = Bytecode.from_code(code, conserve_exception_block_stackdepth=True)
    raw = [i for i in dis.get_instructions(code) if i.opname not in ("EXTENDED_ARG",)]
    instrs = [x for x in bc if isinstance(x, Instr)]
    if len(raw) != len(instrs):
        raise ValueError(f"cannot map instructions of {code.co_name} ({len(raw)} vs {len(instrs)})")
    k = next(j for j, d in enumerate(raw) if d.offset == offset)
    target = instrs[k]
    label = Label()
    bc.insert(next(j for j, x in enumerate(bc) if x is target), label)
    resume_at = next(j for j, x in enumerate(bc) if isinstance(x, Instr) and x.name == "RESUME")
    lineno = target.lineno
    prologue = []
    for slot in stack_layout:
        if slot is NULL_SLOT:
            prologue.append(Instr("PUSH_NULL", lineno=lineno))
        else:
            prologue.append(Instr("LOAD_FAST", slot, lineno=lineno))
    prologue.append(Instr("JUMP_FORWARD", label, lineno=lineno))
    bc[resume_at + 1:resume_at + 1] = prologue
    params = [s for s in stack_layout if s is not NULL_SLOT] + list(live)
    bc.argnames = params
    bc.argcount = len(params)
    bc.posonlyargcount = 0
    bc.kwonlyargcount = 0
    bc.flags &= ~(CompilerFlags.VARARGS | CompilerFlags.VARKEYWORDS)
    bc.name = name
    if hasattr(bc, "qualname"):
        bc.qualname = name
    # The original stack size bounds ours: the prologue only rebuilds a depth the code had.
    return bc.to_code(stacksize=code.co_stacksize + len(stack_layout) + 1,
                      compute_exception_stack_depths=False)


def make_resume_function(fn, code, offset, stack_layout, live, name):
    new_code = resume_code(code, offset, tuple(stack_layout), tuple(live), name)
    return types.FunctionType(new_code, fn.__globals__, name, None, fn.__closure__)
