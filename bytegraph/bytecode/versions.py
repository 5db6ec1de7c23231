"""Everything that differs between CPython 3.11, 3.12 and 3.13, in one place.

The rest of bytegraph sees a normalised instruction stream (see
``instructions.py``); this module says how each version's raw instructions map
onto it. Handlers in ``trace/`` never look at ``sys.version_info``.
"""
import sys

from ..null import NULL

PY = sys.version_info[:2]
SUPPORTED = ((3, 11), (3, 12), (3, 13))

# How many instructions FOR_ITER skips past its jump target when the iterator
# is exhausted: 3.11 jumps straight to the code after the loop; 3.12 jumps over
# END_FOR; 3.13 over END_FOR and the POP_TOP that follows it.
FOR_ITER_EXIT_SKIP = {(3, 11): 0, (3, 12): 1, (3, 13): 2}.get(PY, 2)
# The instructions that skip leaves behind it: code that retargets a FOR_ITER to a place of
# its own puts them there (never run; they keep the static stack depths right).
FOR_ITER_EXIT_PADDING = {(3, 11): (), (3, 12): ("END_FOR",)}.get(PY, ("END_FOR", "POP_TOP"))

# Where LOAD_GLOBAL / LOAD_ATTR put the NULL that marks "no self" for CALL:
# before the callable up to 3.12, after it from 3.13 on.
NULL_AFTER_CALLABLE = PY >= (3, 13)

# 3.13 dropped LOAD_CLOSURE: a LOAD_FAST of a cell variable loads the cell itself.
LOAD_FAST_LOADS_CELLS = PY >= (3, 13)

# LOAD_ATTR's low bit means "method load" from 3.12 on (3.11 has LOAD_METHOD).
LOAD_ATTR_METHOD_FLAG = PY >= (3, 12)

# A conditional jump turned into a forward one (to a tail placed after the code): 3.11 spells
# backward jumps with opcodes of their own.
FORWARD_JUMP = {"POP_JUMP_BACKWARD_IF_FALSE": "POP_JUMP_FORWARD_IF_FALSE",
                "POP_JUMP_BACKWARD_IF_TRUE": "POP_JUMP_FORWARD_IF_TRUE",
                "POP_JUMP_BACKWARD_IF_NONE": "POP_JUMP_FORWARD_IF_NONE",
                "POP_JUMP_BACKWARD_IF_NOT_NONE": "POP_JUMP_FORWARD_IF_NOT_NONE"} if PY == (3, 11) else {}

# Opcodes whose spelling changed but whose meaning did not.
RENAMED = {
    "POP_JUMP_FORWARD_IF_FALSE": "POP_JUMP_IF_FALSE",
    "POP_JUMP_BACKWARD_IF_FALSE": "POP_JUMP_IF_FALSE",
    "POP_JUMP_FORWARD_IF_TRUE": "POP_JUMP_IF_TRUE",
    "POP_JUMP_BACKWARD_IF_TRUE": "POP_JUMP_IF_TRUE",
    "POP_JUMP_FORWARD_IF_NONE": "POP_JUMP_IF_NONE",
    "POP_JUMP_BACKWARD_IF_NONE": "POP_JUMP_IF_NONE",
    "POP_JUMP_FORWARD_IF_NOT_NONE": "POP_JUMP_IF_NOT_NONE",
    "POP_JUMP_BACKWARD_IF_NOT_NONE": "POP_JUMP_IF_NOT_NONE",
    "JUMP_FORWARD": "JUMP",
    "JUMP_BACKWARD": "JUMP",
    "JUMP_BACKWARD_NO_INTERRUPT": "JUMP",
    "JUMP_ABSOLUTE": "JUMP",
    "LOAD_FAST_CHECK": "LOAD_FAST",
    "LOAD_CLOSURE": "LOAD_CLOSURE",
}

# Instructions that do nothing for a symbolic interpreter.
IGNORED = frozenset({"RESUME", "NOP", "CACHE", "PRECALL", "EXTENDED_ARG", "COPY_FREE_VARS",
                     "END_FOR"})

# Raw instructions (3.11/3.12) that set up the CALL right after them without touching the
# stack: native code that runs that CALL alone (a step function) must start at them.
CALL_SETUP = frozenset({"KW_NAMES", "PRECALL"})

# CALL_INTRINSIC_1 (3.12+) operands that have their own opcode in 3.11.
INTRINSICS = {
    "INTRINSIC_UNARY_POSITIVE": "UNARY_POSITIVE",
    "INTRINSIC_LIST_TO_TUPLE": "LIST_TO_TUPLE",
    "INTRINSIC_STOPITERATION_ERROR": "STOPITERATION_ERROR",
}

# Superinstructions (3.13) split into the two plain instructions they fuse. Decoding
# splits them into two rows (sharing the offset); resume and step code splits them too,
# since their two local indices must each fit in 4 bits and a resume function
# renumbers its locals.
SUPERINSTRUCTIONS = {
    "LOAD_FAST_LOAD_FAST": ("LOAD_FAST", "LOAD_FAST"),
    "STORE_FAST_LOAD_FAST": ("STORE_FAST", "LOAD_FAST"),
    "STORE_FAST_STORE_FAST": ("STORE_FAST", "STORE_FAST"),
}


# COMPARE_OP's oparg bit (3.13) that converts the result to bool, so the POP_JUMP_IF_TRUE /
# POP_JUMP_IF_FALSE after it (which on 3.13 test an exact bool by identity) gets one.
# Decoding splits such a COMPARE_OP into COMPARE_OP + TO_BOOL rows sharing its offset.
COMPARE_TO_BOOL_FLAG = 16 if PY >= (3, 13) else 0


def compare_converts_to_bool(instr):
    """True if this raw COMPARE_OP also does TO_BOOL's work (3.13)."""
    return bool(COMPARE_TO_BOOL_FLAG and instr.arg & COMPARE_TO_BOOL_FLAG)


def method_pair(null, attribute):
    """The two stack slots LOAD_ATTR's method form leaves for a plain (non-method) attribute."""
    return (attribute, null) if NULL_AFTER_CALLABLE else (null, attribute)


def kw_names_of(instr, code):
    """The keyword-name tuple of a 3.11/3.12 KW_NAMES instruction."""
    return code.co_consts[instr.arg]


def split_call_prefix(below, above):
    """Given the two stack slots under CALL's arguments, return (callable, self_or_None).

    Up to 3.12 they are [NULL, callable] or [method, self]; from 3.13 on
    [callable, NULL] or [method, self]. The NULL sentinel decides, so this
    works on every version.
    """
    if below is NULL:
        return above, None
    if above is NULL:
        return below, None
    return below, above


def call_sequence(callable_const, arg_names):
    """(opname, arg) pairs that call a constant callable with local variables as arguments."""
    loads = [("LOAD_FAST", n) for n in arg_names]
    n = len(arg_names)
    if PY >= (3, 13):
        return [("LOAD_CONST", callable_const), ("PUSH_NULL", None)] + loads + [("CALL", n)]
    if PY >= (3, 12):
        return [("PUSH_NULL", None), ("LOAD_CONST", callable_const)] + loads + [("CALL", n)]
    return [("PUSH_NULL", None), ("LOAD_CONST", callable_const)] + loads + [("PRECALL", n), ("CALL", n)]


# MATCH_CLASS's TypeError when the called name is not a class.
MATCH_CLASS_NOT_A_CLASS = ("called match pattern must be a type" if PY < (3, 12)
                           else "called match pattern must be a class")


# generator.close() returns what the generator returns on GeneratorExit from 3.13 on (None before).
CLOSE_RETURNS_VALUE = PY >= (3, 13)


# When SEND finds the sub-iterator finished: 3.11 replaces the receiver with the
# return value and jumps past the loop; 3.12+ pushes the value and jumps to
# END_SEND, which then removes the receiver.
SEND_KEEPS_RECEIVER = PY >= (3, 12)


def send_returned(stack, value):
    """Leave ``value`` on ``stack`` the way this version's SEND does when its receiver returns."""
    if SEND_KEEPS_RECEIVER:
        stack.append(value)
    else:
        stack[-1] = value
