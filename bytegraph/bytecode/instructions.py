"""Decoded, normalised instructions: plain data, one list per code object.

``decode(code)`` turns ``dis`` output into ``Instruction`` rows whose opcode
names and jump targets mean the same on every supported Python version.

One raw instruction may become several rows that share its offset (a 3.13
superinstruction, 3.13's COMPARE_OP that converts to bool, LOAD_GLOBAL's NULL,
RETURN_CONST). Native code can only start or stop at a raw instruction's
boundary: ``first_part`` and ``offset_after`` say where those are.

Rows are immutable: ``decode`` is cached, so every trace of a code object shares them.
"""
from __future__ import annotations

import dis
from dataclasses import dataclass
from functools import lru_cache

from . import versions

# Operand bits of MAKE_FUNCTION (3.11, 3.12: which optional parts it pops) and of
# SET_FUNCTION_ATTRIBUTE (3.13: which part it sets), as the ``dis`` documentation gives them.
FUNCTION_DEFAULTS = 0x01
FUNCTION_KWDEFAULTS = 0x02
FUNCTION_ANNOTATIONS = 0x04
FUNCTION_CLOSURE = 0x08

# FORMAT_VALUE's operand (3.11, 3.12): the conversion in its low bits (0 none, 1 str, 2 repr,
# 3 ascii), and whether a format spec is on the stack.
FORMAT_CONVERSION_MASK = 0x03
FORMAT_WITH_SPEC = 0x04


@dataclass(frozen=True, slots=True)
class Instruction:
    opname: str          # normalised name (see versions.RENAMED etc.)
    arg: object          # raw oparg (int) or None
    argval: object       # resolved argument: a name, constant, operator, or None
    offset: int          # byte offset in the original code
    line: int            # source line, or None
    target: int = None   # index of the jump target in the instruction list
    index: int = 0

    def __repr__(self):
        tgt = f" -> {self.target}" if self.target is not None else ""
        return f"{self.index}: {self.opname} {self.argval!r}{tgt} (line {self.line})"


_JUMPS = frozenset({"JUMP", "POP_JUMP_IF_FALSE", "POP_JUMP_IF_TRUE", "POP_JUMP_IF_NONE",
                    "POP_JUMP_IF_NOT_NONE", "FOR_ITER", "JUMP_IF_FALSE_OR_POP",
                    "JUMP_IF_TRUE_OR_POP", "SEND"})


@lru_cache(maxsize=4096)
def decode(code) -> tuple[Instruction, ...]:
    """Normalised instructions of ``code``, with jump targets as list indices."""
    rows = []
    jump_offsets = []
    line = code.co_firstlineno
    for ins in dis.get_instructions(code):
        if ins.positions is not None and ins.positions.lineno is not None:
            line = ins.positions.lineno
        elif ins.starts_line not in (None, False, True):
            line = ins.starts_line
        name = versions.RENAMED.get(ins.opname, ins.opname)
        if name in versions.IGNORED:
            continue
        argval = ins.argval
        if name in versions.SUPERINSTRUCTIONS:
            first, second = versions.SUPERINSTRUCTIONS[name]
            rows.append(Instruction(first, ins.arg, argval[0], ins.offset, line))
            rows.append(Instruction(second, ins.arg, argval[1], ins.offset, line))
            continue
        if name == "CALL_INTRINSIC_1":
            name = versions.INTRINSICS.get(ins.argrepr, "CALL_INTRINSIC_1")
        elif name == "RETURN_CONST":
            rows.append(Instruction("LOAD_CONST", ins.arg, argval, ins.offset, line))
            name, argval = "RETURN_VALUE", None
        elif name == "KW_NAMES":
            argval = versions.kw_names_of(ins, code)
        elif name == "LOAD_GLOBAL" and ins.arg & 1:
            load = Instruction("LOAD_GLOBAL", ins.arg, argval, ins.offset, line)
            null = Instruction("PUSH_NULL", None, None, ins.offset, line)
            rows.extend((load, null) if versions.NULL_AFTER_CALLABLE else (null, load))
            continue
        elif name == "LOAD_ATTR" and versions.LOAD_ATTR_METHOD_FLAG and ins.arg & 1:
            name = "LOAD_METHOD"
        elif name == "COMPARE_OP" and versions.compare_converts_to_bool(ins):
            rows.append(Instruction("COMPARE_OP", ins.arg, argval, ins.offset, line))
            name, argval = "TO_BOOL", None
        elif name == "BINARY_OP":
            argval = ins.argrepr        # the operator's symbol: "+", "+=", "**"...
        elif name in _JUMPS:
            jump_offsets.append(len(rows))
        rows.append(Instruction(name, ins.arg, argval, ins.offset, line))
    if versions.LOAD_FAST_LOADS_CELLS:
        cell_names = set(code.co_cellvars) | set(code.co_freevars)
        plain = _comprehension_loads(rows, cell_names)
        rows = [Instruction("LOAD_CLOSURE", row.arg, row.argval, row.offset, row.line)
                if row.opname == "LOAD_FAST" and row.argval in cell_names and id(row) not in plain else row
                for row in rows]
    by_offset = {}
    for i, row in enumerate(rows):
        by_offset.setdefault(row.offset, i)
    targets = {}
    for i in jump_offsets:
        row = rows[i]
        target = _index_at_or_after(by_offset, row.argval, rows)
        if row.opname == "FOR_ITER":
            target = _skip_loop_end(code, row.argval, rows, target)
        targets[i] = target
    return tuple(Instruction(row.opname, row.arg, row.argval, row.offset, row.line, targets.get(i), i)
                 for i, row in enumerate(rows))


def first_part(rows, index):
    """Index of the first row of the raw instruction that row ``index`` belongs to."""
    offset = rows[index].offset
    while index > 0 and rows[index - 1].offset == offset:
        index -= 1
    return index


def is_last_part(rows, index):
    """True if row ``index`` ends its raw instruction (native code may continue right after it)."""
    return index + 1 >= len(rows) or rows[index + 1].offset != rows[index].offset


def offset_after(rows, index):
    """Offset of the raw instruction after the one row ``index`` belongs to (None at the end)."""
    offset = rows[index].offset
    for row in rows[index + 1:]:
        if row.offset != offset:
            return row.offset
    return None


def _comprehension_loads(rows, cell_names):
    """ids of LOAD_FASTs of a cell name that read an inlined comprehension's own loop variable.

    An inlined comprehension whose variable shadows a cell of the function saves
    the slot (LOAD_FAST_AND_CLEAR) and stores plain values in it until its loop
    ends; unless it makes a cell there itself (MAKE_CELL: the variable is
    captured), its loads of that name read the value, not a cell.
    """
    plain = set()
    for start, row in enumerate(rows):
        if row.opname != "LOAD_FAST_AND_CLEAR" or row.argval not in cell_names:
            continue
        loop = next((r for r in rows[start + 1:] if r.opname == "FOR_ITER"), None)
        if loop is None:
            continue
        region = [r for r in rows[start + 1:] if r.offset < loop.argval]
        if any(r.opname == "MAKE_CELL" and r.argval == row.argval for r in region):
            continue
        plain.update(id(r) for r in region if r.opname == "LOAD_FAST" and r.argval == row.argval)
    return plain


def _index_at_or_after(by_offset, offset, rows):
    # Ignored instructions (NOP, END_FOR...) may sit at a target; take the next kept one.
    if offset in by_offset:
        return by_offset[offset]
    for i, row in enumerate(rows):
        if row.offset >= offset:
            return i
    return len(rows)


def _skip_loop_end(code, target_offset, rows, target):
    """Index where execution continues when FOR_ITER finds its iterator exhausted."""
    skip = versions.FOR_ITER_EXIT_SKIP
    if skip == 0:
        return target
    # Walk the raw instructions: the ones to skip (END_FOR, POP_TOP) may be ignored rows.
    raw = [i for i in dis.get_instructions(code) if i.opname != "CACHE"]
    pos = next(k for k, i in enumerate(raw) if i.offset == target_offset)
    resume_offset = raw[pos + skip].offset if pos + skip < len(raw) else None
    if resume_offset is None:
        return len(rows)
    first_at = {}
    for i, r in enumerate(rows):
        first_at.setdefault(r.offset, i)
    return _index_at_or_after(first_at, resume_offset, rows)
